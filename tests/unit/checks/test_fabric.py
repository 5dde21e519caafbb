"""NVSwitch fabric: Fabric Manager state and log, SXid parsing, the fabric.* checks, end to end."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.core.facts import FabricFacts, KmsgRecord, NvSwitchError, PciFunction
from agent.core.model import Severity, Status, Unknown
from agent.policy.profiles import ProfileStore
from agent.sources import fabric
from agent.sources.fabric import (
    FM_CGROUP_PROCS,
    FM_LOG,
    FM_LOG_TAIL_BYTES,
    parse_fm_log,
    parse_sxid,
    parse_sxids,
    read_fabric,
    read_manager,
    read_tail,
)
from agent.sources.fsroot import LiveFs
from agent.sources.fsroot_recording import RecordingFs
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.kmsg import parse_kmsg_line
from checks.fabric import MANAGER, NVSWITCH_COUNT, SXID
from tests.factories import exp, host, node, profile

REPO = Path(__file__).resolve().parents[3]
REAL_FM_LOG = REPO / "fixtures" / "fabric" / "fabricmanager.log"
FM_ERROR = ("[{when}] [ERROR] [tid 12727] detected NVSwitch {kind} error {code} on fid 0 on NVSwitch pci bus id "
            "00000000:{bus}:00.0 physical id 3 port {port}\n")
CAPTURED = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.timezone.utc)
UPTIME_S = 3 * 86400.0  # booted Nov 17 2026 08:00 UTC


def nvswitch(address: str, width: int = 2, max_width: int = 2) -> PciFunction:
    return PciFunction(address=address, vendor=0x10DE, device=0x22A3, class_code=0x068000, numa_node=1,
                       current_link_speed="16.0 GT/s PCIe", current_link_width=width,
                       max_link_speed="16.0 GT/s PCIe", max_link_width=max_width, driver="nvidia-nvswitch")


SWITCHES = tuple(nvswitch(f"0000:{bus}:00.0") for bus in ("83", "84", "85", "86"))
FABRIC_PROFILE = {"fabric": {"manager": exp("critical", equals="active"),
                             "nvswitch": {"count": exp("critical", equals=4)},
                             "sxid": {"fatal": exp("critical", max=0), "non_fatal": exp("warning", max=0)}}}


def sxid_line(switch: int, bus: str, code: int, rest: str) -> str:
    return f"nvidia-nvswitch{switch}: SXid (PCI:0000:{bus}:00.0): {code}, {rest}"


def fabric_node(kmsg: list[str] | None = None, log: tuple[NvSwitchError, ...] | Unknown = (),
                manager: str | Unknown = "active", switches: tuple[PciFunction, ...] = SWITCHES) -> Any:
    facts = FabricFacts(manager=manager, manager_how="PID 2861 in cgroup.procs", log_errors=log)
    records = tuple(KmsgRecord(message=m) for m in (kmsg or []))
    h = host(pci=(*host().pci, *switches), fabric=facts, uptime_s=UPTIME_S)  # type: ignore[union-attr]
    facts_node = node(h, observed_at=CAPTURED)
    facts_node.kmsg = records
    return parse_kernel_log(facts_node)


# --- parsers on real log lines ----------------------------------------------------------------


def test_real_fabric_manager_log_yields_its_one_nvswitch_error() -> None:
    errors = parse_fm_log(REAL_FM_LOG.read_text())
    assert errors == (NvSwitchError(
        sxid=12028, fatal=False, switch=None, pci_address="0000:86:00.0", link=61,
        message="detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 "
                "physical id 3 port 61", source="fmlog", when="Feb 27 2025 15:10:02"),)


def test_fatal_fabric_manager_line_and_lines_without_errors() -> None:
    text = FM_ERROR.format(when="Jul 23 2024 07:53:55", kind="fatal", code=20034, bus="86", port=33)
    (error,) = parse_fm_log("[Jul 23 2024 07:53:54] [INFO] [tid 841] multicast group 0 is freed.\n" + text)
    assert (error.sxid, error.fatal, error.link, error.pci_address) == (20034, True, 33, "0000:86:00.0")
    assert parse_fm_log("[Jul 23 2024 07:53:54] [INFO] [tid 1] nothing here\n") == ()


@pytest.mark.parametrize(("line", "expected"), [
    ("nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
     (12028, False, "nvswitch2", "0000:85:00.0", 32, "egress non-posted PRIV error")),
    ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
     (20034, True, "nvswitch1", "0000:06:00.0", 48, "LTSSM Fault Up")),
    ("nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate",
     (20009, False, "nvswitch0", "0000:06:00.0", 4, "RX Short Error Rate")),
    ("nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 10001, Non-fatal, PRI WRITE SYSB error, instance=3",
     (10001, False, "nvswitch0", "0000:07:00.0", None, "PRI WRITE SYSB error, instance=3")),
    ("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED",
     (26006, None, "nvswitch0", "0004:00:00.0", None, "SOE HALTED")),
    ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Li",  # truncated by the ring buffer
     (20009, False, "nvswitch1", "0000:06:00.0", None, "Li")),
])
def test_sxid_lines(line: str, expected: tuple[Any, ...]) -> None:
    error = parse_sxid(KmsgRecord(message=line, ts_usec=7))
    assert error is not None
    assert (error.sxid, error.fatal, error.switch, error.pci_address, error.link, error.message) == expected
    assert error.source == "kmsg" and error.ts_usec == 7


@pytest.mark.parametrize("line", [
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
    "nvidia-nvswitch2: open (major=510)",
    "NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
])
def test_follow_on_and_other_lines_are_not_errors(line: str) -> None:
    assert parse_sxid(KmsgRecord(message=line)) is None


def test_sxid_from_every_kernel_log_format() -> None:
    lines = ["[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack "
             "timeout error (First)",
             "4,82,201774310118,-;nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack "
             "timeout error"]
    records = [r for r in (parse_kmsg_line(line) for line in lines) if r is not None]
    errors = parse_sxids(records)
    assert [(e.sxid, e.fatal, e.link, e.message) for e in errors] == [(24007, True, 28, "sourcetrack timeout error")] * 2
    assert errors[0].ts_usec == 1_108_858_286 and errors[1].ts_usec == 201_774_310_118


# --- reading: cgroup and the log's tail ---------------------------------------------------------


def write(root: Path, path: str, data: bytes | str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    return target


def test_cgroup_v2_with_a_pid_is_active(tmp_path: Path) -> None:
    write(tmp_path, FM_CGROUP_PROCS[0], "2861\n2874\n")
    assert read_manager(LiveFs(str(tmp_path))) == ("active", f"PID 2861 in {FM_CGROUP_PROCS[0]}")


def test_cgroup_v1_is_read_too(tmp_path: Path) -> None:
    write(tmp_path, FM_CGROUP_PROCS[1], "1203\n")
    assert read_manager(LiveFs(str(tmp_path)))[0] == "active"


def test_empty_cgroup_or_no_cgroup_is_inactive(tmp_path: Path) -> None:
    write(tmp_path, "/sys/fs/cgroup/system.slice/ssh.service/cgroup.procs", "911\n")
    state, how = read_manager(LiveFs(str(tmp_path)))
    assert state == "inactive" and "no cgroup for nvidia-fabricmanager.service" in how
    write(tmp_path, FM_CGROUP_PROCS[0], "")
    state, how = read_manager(LiveFs(str(tmp_path)))
    assert state == "inactive" and "lists no process" in how


def test_without_systemd_cgroups_a_bounded_proc_scan_decides(tmp_path: Path) -> None:
    fs = LiveFs(str(tmp_path))
    state, _ = read_manager(fs)
    assert isinstance(state, Unknown) and "cannot tell" in state.reason  # no cgroup, no /proc: never "inactive"
    write(tmp_path, "/proc/1/comm", "systemd\n")
    assert read_manager(fs)[0] == "inactive"
    write(tmp_path, "/proc/4242/comm", "nv-fabricmanager\n")
    assert read_manager(fs) == ("active", "process 4242 is nv-fabricmanager (no systemd cgroup under /sys/fs/cgroup)")


def test_proc_scan_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabric, "MAX_PROC_SCAN", 3)
    for pid in range(1, 5):
        write(tmp_path, f"/proc/{pid}/comm", "bash\n")
    state, _ = read_manager(LiveFs(str(tmp_path)))
    assert isinstance(state, Unknown) and "more than the 3" in state.reason


class DenyingFs(LiveFs):
    """A root where chosen paths fail with EACCES (root ignores chmod)."""

    def __init__(self, root: str, denied: set[str]) -> None:
        super().__init__(root)
        self.denied = denied

    def read_bytes(self, path: str, limit: int = 4 << 20) -> bytes:
        if path in self.denied:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return super().read_bytes(path, limit)


def test_unreadable_cgroup_file_is_unknown_with_the_reason(tmp_path: Path) -> None:
    write(tmp_path, FM_CGROUP_PROCS[0], "2861\n")
    state, _ = read_manager(DenyingFs(str(tmp_path), {FM_CGROUP_PROCS[0]}))
    assert isinstance(state, Unknown) and "not readable" in state.reason


def test_fifty_megabyte_log_is_read_from_the_tail_only(tmp_path: Path) -> None:
    early = FM_ERROR.format(when="Nov 17 2026 09:00:00", kind="fatal", code=20034, bus="83", port=1)
    late = FM_ERROR.format(when="Nov 19 2026 09:00:00", kind="non-fatal", code=12028, bus="86", port=61)
    filler = b"[Nov 18 2026 10:00:00] [INFO] [tid 1808] multicast group 0 is allocated.\n" * 700_000
    log = write(tmp_path, FM_LOG, early.encode() + filler + late.encode())
    assert log.stat().st_size > 50_000_000
    facts = read_fabric(LiveFs(str(tmp_path)))
    assert facts.log_size == log.stat().st_size
    assert 0 < facts.log_read_bytes <= FM_LOG_TAIL_BYTES  # bounded: never the whole file
    assert isinstance(facts.log_errors, tuple)
    assert [(e.sxid, e.link) for e in facts.log_errors] == [(12028, 61)]  # the early one is outside the tail


def test_tail_starts_at_a_full_line(tmp_path: Path) -> None:
    write(tmp_path, "/var/log/x.log", b"".join(b"line %06d\n" % i for i in range(1000)))
    data, size, read = read_tail(LiveFs(str(tmp_path)), "/var/log/x.log", 100)
    assert size == 12000 and read == 100 and data.startswith(b"line ") and data.endswith(b"line 000999\n")
    assert len(data) < 100 and all(len(line) == 11 for line in data.splitlines())


def test_missing_or_odd_logs_are_unknown(tmp_path: Path) -> None:
    facts = read_fabric(LiveFs(str(tmp_path)))
    assert facts.log_errors == Unknown(f"{FM_LOG} is absent") and facts.log_read_bytes == 0
    (tmp_path / "var/log/fabricmanager.log").mkdir(parents=True)
    assert isinstance(read_fabric(LiveFs(str(tmp_path))).log_errors, Unknown)
    (tmp_path / "var/log/fabricmanager.log").rmdir()
    os.mkfifo(tmp_path / "var/log/fabricmanager.log")  # a FIFO must not hang the audit
    fifo = read_fabric(LiveFs(str(tmp_path))).log_errors
    assert isinstance(fifo, Unknown) and "not a regular file" in fifo.reason


def test_unreadable_log_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, FM_LOG, "x\n")
    real_open = os.open

    def deny(path: Any, flags: int, *args: Any) -> int:
        if str(path).endswith("fabricmanager.log"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(fabric.os, "open", deny)
    errors = read_fabric(LiveFs(str(tmp_path))).log_errors
    assert errors == Unknown(f"{FM_LOG} is not readable by this user (needs root)")


def test_snapshot_replays_the_tail_and_recorded_errors(tmp_path: Path) -> None:
    live = tmp_path / "live"
    write(live, FM_CGROUP_PROCS[0], "2861\n")
    late = FM_ERROR.format(when="Nov 19 2026 09:00:00", kind="non-fatal", code=12028, bus="86", port=61)
    write(live, FM_LOG, b"x" * 100 + b"\n" + b"[Nov 18 2026 10:00:00] [INFO] [tid 1] ok\n" * 40_000 + late.encode())
    recording = RecordingFs(LiveFs(str(live)))
    recorded = read_fabric(recording)
    stored = recording.files["var/log/fabricmanager.log"]
    assert len(stored) <= FM_LOG_TAIL_BYTES and stored.endswith(late.encode())  # the snapshot keeps the tail
    snap = tmp_path / "snap"
    for rel, data in recording.files.items():
        write(snap / "fs", rel, data)
    replayed = read_fabric(SnapshotFs(snap))
    assert (replayed.manager, replayed.log_errors) == (recorded.manager, recorded.log_errors) == (
        "active", recorded.log_errors)
    assert isinstance(replayed.log_errors, tuple) and len(replayed.log_errors) == 1
    (snap / "fs_errors.json").write_text(json.dumps({"var/log/fabricmanager.log": "EACCES"}))
    denied = read_fabric(SnapshotFs(snap)).log_errors
    assert isinstance(denied, Unknown) and "not readable" in denied.reason


# --- checks on hand-made facts ------------------------------------------------------------------


def test_manager_active_passes_inactive_fails_unknown_stays_unknown() -> None:
    prof = profile(FABRIC_PROFILE)
    (ok,) = MANAGER.run(fabric_node(), prof)
    assert ok.status is Status.PASS and ok.subject == "nvidia-fabricmanager" and "PID 2861" in ok.message
    (bad,) = MANAGER.run(fabric_node(manager="inactive"), prof)
    assert bad.status is Status.FAIL and bad.severity is Severity.CRITICAL
    assert bad.action == "start_fabric_manager" and bad.observed == "inactive" and bad.expected == "active"
    assert "start nvidia-fabricmanager: without it NVLink P2P across the NVSwitch fabric is down" in bad.message
    (unknown,) = MANAGER.run(fabric_node(manager=Unknown("cgroup.procs is not readable")), prof)
    assert unknown.status is Status.UNKNOWN and "not readable" in unknown.message
    assert MANAGER.run(fabric_node(manager="inactive"), profile({})) == []  # not expected: nothing


def test_nvswitch_count() -> None:
    prof = profile(FABRIC_PROFILE)
    (ok,) = NVSWITCH_COUNT.run(fabric_node(), prof)
    assert ok.status is Status.PASS and ok.observed == 4 and "0000:86:00.0 x2 16.0 GT/s" in ok.message
    three = (*SWITCHES[:2], nvswitch("0000:85:00.0", width=1), )
    (bad,) = NVSWITCH_COUNT.run(fabric_node(switches=three), prof)
    assert bad.status is Status.FAIL and bad.observed == 3 and "degraded from x2" in bad.message
    assert NVSWITCH_COUNT.run(fabric_node(), profile({})) == []


def test_sxids_are_deduplicated_per_switch_port_with_a_count() -> None:
    kmsg = [sxid_line(2, "85", 12028, "Non-fatal, Link 32 egress non-posted PRIV error (First)"),
            sxid_line(2, "85", 12028, "Severity 0 Engine instance 32 Sub-engine instance 00"),
            sxid_line(2, "85", 12028, "Non-fatal, Link 32 egress non-posted PRIV error"),
            sxid_line(3, "86", 12028, "Non-fatal, Link 61 egress non-posted PRIV error (First)")]
    findings = {f.subject: f for f in SXID.run(fabric_node(kmsg), profile(FABRIC_PROFILE))}
    assert set(findings) == {"nvswitch2:link32", "nvswitch3:link61"}
    port32 = findings["nvswitch2:link32"]
    assert port32.status is Status.WARN and port32.severity is Severity.WARNING
    assert port32.observed == {"12028 non-fatal": 2} and "SXid 12028 x2" in port32.message
    assert "0000:85:00.0" in port32.message and port32.action != "reset_fabric"
    assert findings["nvswitch3:link61"].observed == {"12028 non-fatal": 1}


def test_fatal_sxid_is_critical_with_reset_fabric() -> None:
    kmsg = [sxid_line(1, "84", 20034, "Fatal, Link 48 LTSSM Fault Up"),
            sxid_line(1, "84", 20009, "Non-fatal, Link 48 RX Short Error Rate")]
    (finding,) = SXID.run(fabric_node(kmsg), profile(FABRIC_PROFILE))
    assert (finding.subject, finding.status, finding.severity) == ("nvswitch1:link48", Status.FAIL, Severity.CRITICAL)
    assert finding.action == "reset_fabric" and "reset the fabric" in finding.message and "or reboot" in finding.message
    assert finding.observed == {"20034": 1, "20009 non-fatal": 1}


def test_fabric_manager_log_adds_what_the_kernel_log_lacks_since_boot() -> None:
    def fm(when: str, bus: str, port: int, code: int = 12028, fatal: bool = False) -> NvSwitchError:
        return NvSwitchError(sxid=code, fatal=fatal, switch=None, pci_address=f"0000:{bus}:00.0", link=port,
                             message="detected ...", source="fmlog", when=when)

    kmsg = [sxid_line(3, "86", 12028, "Non-fatal, Link 61 egress non-posted PRIV error")]
    log = (fm("Nov 19 2026 01:00:00", "86", 61),  # the same error the kernel logged: counted once
           fm("Nov 19 2026 02:00:00", "84", 7, 20034, fatal=True),  # only in Fabric Manager's log
           fm("Nov 10 2026 02:00:00", "83", 9))  # a week before this boot
    findings = {f.subject: f for f in SXID.run(fabric_node(kmsg, log=log), profile(FABRIC_PROFILE))}
    assert set(findings) == {"nvswitch1:link7", "nvswitch3:link61"}  # the switch named by PCI order
    assert findings["nvswitch3:link61"].observed == {"12028 non-fatal": 1}
    only_fm = findings["nvswitch1:link7"]
    assert only_fm.status is Status.FAIL and "Fabric Manager log" in only_fm.message
    (clean,) = SXID.run(fabric_node(log=log[2:]), profile(FABRIC_PROFILE))
    assert clean.status is Status.PASS and "1 older entries" in clean.message


def test_sxid_check_without_errors_or_sources() -> None:
    prof = profile(FABRIC_PROFILE)
    (clean,) = SXID.run(fabric_node(), prof)
    assert (clean.subject, clean.status) == ("node", Status.PASS)
    no_log = {f.subject: f for f in SXID.run(fabric_node(log=Unknown(f"{FM_LOG} is absent")), prof)}
    assert no_log["fabricmanager.log"].status is Status.UNKNOWN and "is absent" in no_log["fabricmanager.log"].message
    assert no_log["node"].status is Status.PASS
    no_kmsg = fabric_node()
    no_kmsg.kmsg = Unknown("/dev/kmsg is not readable (needs root or CAP_SYSLOG)")
    no_kmsg = parse_kernel_log(no_kmsg)
    assert [f.status for f in SXID.run(no_kmsg, prof)] == [Status.UNKNOWN]
    assert SXID.run(fabric_node(), profile({})) == []  # nothing expected, nothing seen
    # Nothing expected but an error seen: reported with the built-in severities.
    (seen,) = SXID.run(fabric_node([sxid_line(0, "83", 20034, "Fatal, Link 1 x")]), profile({}))
    assert seen.status is Status.FAIL and seen.severity is Severity.CRITICAL


def test_shipped_profiles_set_the_fabric_expectations() -> None:
    store = ProfileStore()

    def count(name: str) -> Any:
        expectation = store.profile(name).expectation("fabric", "nvswitch", "count")
        return None if expectation is None else expectation.expected

    assert {n: count(n) for n in ("hgx-h100-sxm", "hgx-h200-sxm", "hgx-b200", "dgx-a100", "gb200-nvl-tray",
                                  "generic-nvidia")} == {
        "hgx-h100-sxm": 4, "hgx-h200-sxm": 4, "hgx-b200": 2, "dgx-a100": 6, "gb200-nvl-tray": None,
        "generic-nvidia": None}
    for name in ("hgx-h100-sxm", "hgx-h200-sxm", "hgx-b200", "dgx-a100"):
        assert store.profile(name).expectation("fabric", "manager") is not None, name
    for name in ("gb200-nvl-tray", "generic-nvidia"):
        assert store.profile(name).section("fabric") == {}, name


# --- end to end through the CLI -----------------------------------------------------------------


def audit(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["audit", *args, "--format", "json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def test_drifted_node_fails_fabric_manager_and_warns_sxids() -> None:
    code, report = audit("--simulate", "hgx-h100-drifted", "--only", "fabric.*")
    assert code == 1
    found = {(f["check"], f["subject"]): f for f in report["findings"] if f["check"].startswith("fabric.")}
    assert {k: f["status"] for k, f in found.items()} == {
        ("fabric.manager", "nvidia-fabricmanager"): "fail",
        ("fabric.nvswitch.count", "node"): "pass",
        ("fabric.sxid", "nvswitch2:link32"): "warn",
        ("fabric.sxid", "nvswitch3:link61"): "warn",
    }
    manager = found[("fabric.manager", "nvidia-fabricmanager")]
    assert manager["severity"] == "critical" and manager["source"] == "host"
    assert manager["observed"] == "inactive" and manager["expected"] == "active" and manager["reason"]
    assert found[("fabric.sxid", "nvswitch2:link32")]["observed"] == {"12028 non-fatal": 2}  # de-duplicated
    assert found[("fabric.sxid", "nvswitch3:link61")]["observed"] == {"12028 non-fatal": 1}
    assert found[("fabric.nvswitch.count", "node")]["observed"] == 4


@pytest.mark.parametrize(("name", "switches"), [("hgx-h100-healthy", 4), ("dgx-a100-healthy", 6)])
def test_healthy_nodes_pass_every_fabric_check(name: str, switches: int) -> None:
    code, report = audit("--simulate", name, "--only", "fabric.*")
    assert code == 0
    found = {(f["check"], f["subject"]): f for f in report["findings"] if f["check"].startswith("fabric.")}
    assert set(found) == {("fabric.manager", "nvidia-fabricmanager"), ("fabric.nvswitch.count", "node"),
                          ("fabric.sxid", "node")}
    assert {f["status"] for f in found.values()} == {"pass"}
    assert found[("fabric.nvswitch.count", "node")]["observed"] == switches
