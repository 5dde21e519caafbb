"""checks.accept and checks.accept_drift over hand-built recordings (the BMC half, drift's said-not-judged
cases), the HTML picture, and the registry/profile plumbing of the accept.* checks."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from agent.apps.accept.html import MAX_POINTS, render_html, thin
from agent.core.model import Finding, Status
from agent.core.series import BmcTrack, GpuTrack, Recording, from_json
from agent.policy.profiles import ProfileStore
from agent.report.model import Report
from checks import all_checks
from checks.accept import judge
from checks.accept_drift import judge_drift
from tests.conftest import REPO

PROFILE = ProfileStore().profile("hgx-h100-sxm")
N = 50  # samples: t = 0..49 s, steady 10..40


def gpu(index: int, temp: float = 60.0, power: float = 680.0, sm: int = 1830, vbios: str = "96.00.74.00.09",
        uuid: str | None = None, events: int = 4) -> GpuTrack:
    track = GpuTrack(uuid=uuid or f"GPU-{index}", index=index, name="NVIDIA H100 80GB HBM3", vbios=vbios,
                     default_limit_w=700.0, max_sm_mhz=1980, memory_max_c=95,
                     counters_start={"ecc_uncorrected": 0, "pcie_replays": 3},
                     counters_end={"ecc_uncorrected": 0, "pcie_replays": 3})
    series = track.series
    for t in range(N):
        for key, value in (("t", float(t)), ("power_w", power), ("limit_w", 700.0), ("temp_c", temp),
                           ("mem_temp_c", 70.0), ("sm_mhz", sm), ("mem_mhz", 2619), ("util_pct", 99),
                           ("events", events)):
            series[key].append(value)
    return track


def recording(*gpus: GpuTrack, bmc: BmcTrack | None = None, driver: str = "550.163.01") -> Recording:
    return Recording(run_id="r1", started_at="2026-12-03T00:00:00+00:00", interval_s=1.0, hostname="n1",
                     profile="hgx-h100-sxm", driver=driver, load={"kind": "command", "outcome": "ok"},
                     phases={"idle": [0, 5], "ramp": [5, 10], "steady": [10, 40], "cooldown": [40, 49]},
                     gpus=list(gpus or [gpu(i) for i in range(8)]), bmc=bmc, xid_source="nvml events")


def bmc(psu_w: float, redundancy: list[str | None], inlet: float = 25.0) -> BmcTrack:
    t = [float(x) for x in range(0, N, 10)]
    return BmcTrack(firmware="1.2", t=t, inlet_c=[inlet] * len(t), exhaust_c=[45.0] * len(t),
                    psu_input_w=[psu_w] * len(t), redundancy=redundancy, fans_rpm=[9000.0] * len(t))


def by(findings: list[Finding], check: str) -> dict[str, Finding]:
    return {f.subject: f for f in findings if f.check == check}


def test_psu_input_below_the_gpus_draw_and_lost_redundancy_are_findings() -> None:
    healthy = judge(recording(bmc=bmc(6500.0, ["redundant"] * 5)), PROFILE)
    assert [f.status for f in by(healthy, "accept.psu").values()] == [Status.PASS]
    low = judge(recording(bmc=bmc(5000.0, ["redundant", "redundant", "degraded (PSU2)", None, None])), PROFILE)
    psu = [f for f in low if f.check == "accept.psu"]
    assert {(f.status, f.severity.value) for f in psu} == {(Status.FAIL, "critical"), (Status.FAIL, "warning")}
    assert any("redundancy was lost under load (BMC: degraded (PSU2))" in f.message for f in psu)
    assert any("5000 W vs 5440 W" in f.message for f in psu)


def test_thermal_resistance_above_inlet_against_the_envelope() -> None:
    gpus = [gpu(i) for i in range(7)] + [gpu(7, temp=80.0)]  # (80 - 25) / 680 = 0.081 > 0.074
    found = by(judge(recording(*gpus, bmc=bmc(6500.0, ["redundant"] * 5)), PROFILE), "accept.thermal.resistance")
    assert found["gpu7"].status is Status.FAIL and found["gpu7"].observed == round(55 / 680, 5)
    assert found["gpu0"].status is Status.PASS
    assert by(judge(recording(*gpus), PROFILE), "accept.thermal.resistance")["gpu0"].status is Status.SKIP


def test_fault_clock_events_counted_only_in_steady() -> None:
    hot = gpu(4)
    for i in range(2):  # HW slowdown during ramp: not a steady fault
        hot.series["events"][6 + i] = 0x8
    found = by(judge(recording(*[gpu(i) for i in range(4)], hot), PROFILE), "accept.clocks.events")
    assert found["gpu4"].status is Status.PASS
    hot.series["events"][20] = 0x40 | 0x4
    found = by(judge(recording(*[gpu(i) for i in range(4)], hot), PROFILE), "accept.clocks.events")
    assert found["gpu4"].status is Status.FAIL and found["gpu4"].observed == {"hw_thermal": 1}


def test_new_counters_and_xids_are_error_findings_with_the_figures() -> None:
    bad = gpu(2)
    bad.counters_end = {"ecc_uncorrected": 1, "pcie_replays": 40}
    rec = recording(gpu(0), gpu(1), bad)
    rec.xids = [{"t": 12.0, "uuid": "GPU-2", "code": 79}]
    found = by(judge(rec, PROFILE), "accept.errors")
    assert found["gpu2"].status is Status.FAIL and found["gpu2"].observed == {
        "uncorrectable ECC": 1, "PCIe replays": 37, "Xid": 1}
    assert "(Xid 79)" in found["gpu2"].message
    assert found["gpu0"].status is Status.PASS


def test_drift_says_replaced_gpus_and_new_firmware_but_does_not_judge_them() -> None:
    base = recording()
    now_gpus = [gpu(i) for i in range(6)] + [gpu(6, vbios="96.00.99.00.01"), gpu(7, uuid="GPU-new", temp=75.0)]
    found = judge_drift(recording(*now_gpus), base, PROFILE)
    said = {f.subject: f for f in found if f.status is Status.SKIP}
    assert "VBIOS changed since the baseline (96.00.74.00.09 -> 96.00.99.00.01)" in said["gpu6"].message
    assert "not in the baseline r1: replaced since" in said["gpu7"].message
    assert "baseline GPU GPU-7 (then gpu7) is not in this run" in said["node"].message
    assert not [f for f in found if f.status is Status.FAIL]
    hotter = judge_drift(recording(*[gpu(i) for i in range(7)], gpu(7, temp=70.0)), base, PROFILE)
    assert {f.subject for f in hotter if f.status is Status.FAIL} == {"gpu7"}


def test_drift_compares_clocks_only_at_the_same_power() -> None:
    base = recording()
    slower = judge_drift(recording(*[gpu(i, sm=1650 if i == 1 else 1830) for i in range(8)]), base, PROFILE)
    assert {f.subject for f in slower if f.status is Status.FAIL} == {"gpu1"}  # 9.8 % lower at 680 W
    other_power = judge_drift(recording(*[gpu(i, sm=1650, power=600.0) for i in range(8)]), base, PROFILE)
    clock = next(f.message for f in other_power if "SM clock" in f.message)
    assert clock.endswith("power differs from the baseline's")


def test_stored_recording_round_trips() -> None:
    rec = recording(bmc=bmc(6500.0, ["redundant"] * 5))
    back = from_json(copy.deepcopy(rec.to_json()))
    assert back == rec


def test_the_picture_marks_steady_and_the_outliers_and_escapes_names() -> None:
    gpus = [gpu(i) for i in range(7)] + [gpu(7, temp=75.0)]
    rec = recording(*gpus)
    rec.hostname = "<script>alert(1)</script>"
    findings = judge(rec, PROFILE)
    report = Report(node={}, profile="hgx-h100-sxm", profile_chain=(), started_at="", duration_s=1.0, sources={},
                    findings=findings, extra={"acceptance": {"passed": False, "baseline": None}})
    page = render_html(rec, report)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<svg") == 4 and page.count("<title>steady window</title>") == 4
    assert page.count('class="out"') == 4  # gpu7, in each chart
    assert page.count('class="gpu"') == 4 * 7
    assert "NOT ACCEPTED" in page and "accept.temperature.spread" in page


def test_long_runs_are_thinned_for_the_picture() -> None:
    t = [float(i) for i in range(36_000)]
    points = thin(t, [float(i % 10) for i in range(36_000)])
    assert len(points) == MAX_POINTS and abs(points[0][1] - 4.5) < 1e-9


def test_accept_checks_are_registered_with_profile_fragments_and_judge_series_only() -> None:
    """Issue 32.3: each accept.* check declares its input, an acceptance run's series; it has no facts
    evaluator (no stub returning nothing), and running it on facts is refused, never silently empty."""
    accept = [c for c in all_checks() if c.id.startswith("accept.")]
    # a lost GPU is no matter of threshold: accept.gpu.lost has no profile key, every other one has
    with_threshold = [c for c in accept if c.id != "accept.gpu.lost"]
    assert len(accept) == 12 and all(c.schema is not None and c.expect_path[0] == "accept" for c in with_threshold)
    assert not next(c for c in accept if c.id == "accept.gpu.lost").expect_path
    assert all(c.input == "series" and c.evaluate is None and c.evaluate_series is not None for c in accept)
    assert {c.id for c in all_checks() if c.input == "series"} == {c.id for c in accept}
    with pytest.raises(RuntimeError, match="judges an acceptance run's series"):
        accept[0].run(None, PROFILE)  # type: ignore[arg-type]
    assert PROFILE.expectation("accept", "thermal_resistance_c_per_w") is not None


def test_xids_from_the_kernel_log_where_nvml_has_no_event_set(tmp_path: Path) -> None:
    from agent.apps.accept.xid_log import KernelLogXids
    from agent.engine.audit import AuditRequest
    from agent.policy.config import Config
    from agent.sources.node import open_node

    snap = tmp_path / "node"
    snap.mkdir()  # a recorded node's kernel log stands in for /dev/kmsg
    (snap / "meta.yaml").write_text("hostname: n1\ncaptured_at: '2026-12-03T00:00:00+00:00'\ncaptured: [kmsg]\n")
    shutil.copy(REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "kmsg.txt", snap / "kmsg.txt")
    old = "4,900,1000000,-;NVRM: Xid (PCI:0000:1a:00): 13, pid=1, Graphics Exception (an old one)\n"
    with (snap / "kmsg.txt").open("a", encoding="utf-8") as log:
        log.write(old)
    rec = recording(gpu(0), gpu(1))
    rec.gpus[1].pci_bus_id = "0000:1b:00.0"
    rec.xid_source = "unavailable: NVML event set: Not Supported"
    watcher = KernelLogXids(open_node(AuditRequest(config=Config(), snapshot=snap)))
    with (snap / "kmsg.txt").open("a", encoding="utf-8") as log:
        log.write("4,901,2000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus.\n")
    watcher.finish(rec)
    assert rec.xid_source == "kernel log"
    assert rec.xids == [{"t": None, "uuid": "GPU-1", "code": 79}]
    found = by(judge(rec, PROFILE), "accept.errors")
    assert found["gpu1"].status is Status.FAIL and "(Xid 79)" in found["gpu1"].message
    assert found["gpu0"].status is Status.PASS
