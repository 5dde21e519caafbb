"""End to end through the real click CLI on the shipped simulated nodes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import junitparser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunCli

HOST_DRIFTS = {
    ("host.thp.enabled", "node"),
    ("host.numa.balancing", "node"),
    ("host.sysctl", "net.core.rmem_max"),
    ("net.mtu", "enp156s0np0"),
    ("host.cpu.governor", "node"),
    ("host.driver.version", "node"),
}
GPU_DRIFTS = {
    *{("gpu.persistence_mode", f"gpu{i}") for i in range(7)},  # GPU 7 is lost: gpu.lost speaks for it
    ("gpu.power.limit", "gpu2"),  # capped at 500 W
    ("gpu.thermal.imbalance", "gpu4"),  # +9 C over the median
    ("gpu.thermal.imbalance", "gpu5"),  # +10 C
    ("gpu.nvlink.links", "gpu6"),  # 16 of 18 links
    ("gpu.lost", "gpu7"),  # fallen off the bus
    ("gpu.xid", "gpu7"),  # Xid 79
    ("gpu.driver", "node"),  # R535 below the profile's R550, as NVML reports it
    ("gpu.cuda", "node"),  # CUDA 12.2 from the R535 driver
}
BMC_DRIFTS = {
    ("bios.attribute", "SysProfile"),  # PerfPerWattOptimizedOs: the "Balanced" power mode
    ("bios.attribute", "ProcCStates"),
    ("bmc.firmware", "bmc"),  # iDRAC 6.10.80.00, below the profile's 7.00
    ("firmware.consistency", "psu.slot.#|power supply.slot.#"),  # PSU 5 on other firmware
    ("bmc.psu", "PS3 Status"),  # failed
    ("bmc.psu", "System Board PS Redundancy"),  # redundancy lost
    ("bmc.health_rollup", "system"),
    ("bmc.events", "Sel:PSU0003"),  # "PS3 failure detected."
    ("bmc.events", "Sel:RDU0012"),  # "The power supply redundancy is lost."
}
FABRIC_DRIFTS = {("fabric.manager", "nvidia-fabricmanager")}  # stopped after NVSwitch errors
INTERCONNECT_DRIFTS = {
    ("ib.port.rate", "mlx5_3/1"),  # ConnectX-7 trained at HDR 200
    ("ib.port.errors", "mlx5_4/1"),  # link_downed 7, link_error_recovery 12
    ("pcie.acs", "0000:b9:02.0"),  # ACS redirect on the switch port above GPU bb:00.0's NIC
}
DRIFTED_FAILS = HOST_DRIFTS | GPU_DRIFTS | BMC_DRIFTS | FABRIC_DRIFTS | INTERCONNECT_DRIFTS
DRIFTED_WARNS = {("gpu.ecc.mode", "gpu3"), ("gpu.row_remap", "gpu5"),  # reboot / GPU reset pending
                 ("bmc.events", "Sel:PCI3000"),  # a warning-level SEL entry
                 ("fabric.sxid", "nvswitch2:link32"), ("fabric.sxid", "nvswitch3:link61")}  # non-fatal SXids
FINDING_KEYS = {"check", "subject", "status", "waiver", "action", "severity", "observed", "expected", "message",
                "reason", "remediation", "source"}


def audit(run_cli: RunCli, node: str, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = run_cli("audit", "--simulate", node, "--format", "json", *extra)
    assert result.stderr == "", result.stderr
    return result.code, result.json()


def fails(report: dict) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(f["check"], f["subject"]) for f in report["findings"] if f["status"] == "fail" and not f["waiver"]}


def test_healthy_node_passes(run_cli: RunCli) -> None:
    code, report = audit(run_cli, "hgx-h100-healthy")
    assert code == 0
    assert report["profile"] == "hgx-h100-sxm"
    assert fails(report) == set()
    statuses = {f["status"] for f in report["findings"]}
    assert statuses == {"pass", "skip"}  # skips: IPMI not in the snapshot; retired pages N/A on Hopper
    checks = {f["check"] for f in report["findings"]}
    assert {"host.sysctl", "host.thp.enabled", "host.thp.defrag", "host.numa.balancing", "host.numa.affinity",
            "net.mtu", "host.cpu.governor", "host.cpu.cstates", "host.kernel.cmdline", "host.secureboot",
            "host.driver.version", "host.modules", "host.gpu.pci_count", "profile.match",
            "source.available", "fabric.manager", "fabric.nvswitch.count", "fabric.sxid", "ib.hca.count",
            "ib.port.state", "ib.port.rate", "ib.port.errors", "ib.firmware", "pcie.link", "pcie.acs", "host.iommu",
            "topology.gpu_nic"} <= checks
    assert {c for c in checks if c.startswith("gpu.")} == {
        "gpu.count", "gpu.lost", "gpu.ecc.mode", "gpu.ecc.uncorrected", "gpu.ecc.corrected", "gpu.retired_pages",
        "gpu.row_remap", "gpu.persistence_mode", "gpu.compute_mode", "gpu.app_clocks", "gpu.mig_mode", "gpu.power.limit",
        "gpu.clocks.events", "gpu.temperature", "gpu.memory_temperature", "gpu.thermal.imbalance", "gpu.pcie.link",
        "gpu.pcie.replay", "gpu.nvlink.links", "gpu.nvlink.errors", "gpu.fabric", "gpu.firmware.vbios",
        "gpu.inforom", "gpu.driver", "gpu.cuda", "gpu.xid", "gpu.recovery_action"}
    mtu = {f["subject"] for f in report["findings"] if f["check"] == "net.mtu"}
    assert mtu == {"enp26s0np0", "enp60s0np0", "enp77s0np0", "enp94s0np0", "enp156s0np0", "enp188s0np0",
                   "enp204s0np0", "enp220s0np0"}  # the 8 RoCE rails, not the bond members or tg3 ports


def test_drifted_node_fails_exactly_the_drifts(run_cli: RunCli) -> None:
    code, report = audit(run_cli, "hgx-h100-drifted")
    assert code == 1
    assert fails(report) == DRIFTED_FAILS
    by_key = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert by_key[("host.thp.enabled", "node")]["observed"] == "always"
    assert by_key[("host.numa.balancing", "node")]["observed"] == "1"
    assert by_key[("host.sysctl", "net.core.rmem_max")]["observed"] == "4194304"
    assert by_key[("net.mtu", "enp156s0np0")]["observed"] == 1500
    assert by_key[("host.cpu.governor", "node")]["observed"] == "powersave"
    assert by_key[("host.driver.version", "node")]["observed"] == "535.129.03"
    assert by_key[("host.driver.version", "node")]["expected"] == {"version_min": "550.54.15"}
    warns = {(f["check"], f["subject"]) for f in report["findings"] if f["status"] == "warn"}
    assert warns == DRIFTED_WARNS
    assert "reboot to apply" in by_key[("gpu.ecc.mode", "gpu3")]["message"]
    assert by_key[("gpu.row_remap", "gpu5")]["action"] == "reset_gpu"
    assert by_key[("gpu.power.limit", "gpu2")]["observed"] == 500.0
    assert by_key[("gpu.nvlink.links", "gpu6")]["observed"] == 16
    assert by_key[("gpu.xid", "gpu7")]["action"] == "drain"
    assert by_key[("gpu.lost", "gpu7")]["severity"] == "critical"


def test_report_follows_the_v1_contract(run_cli: RunCli) -> None:
    _, report = audit(run_cli, "hgx-h100-drifted")
    assert report["schema"] == "nodewarden.report/v1"
    assert {"node", "profile", "started_at", "duration_s", "sources", "findings", "summary"} <= set(report)
    assert report["node"]["hostname"] == "gpu-h100-drifted-01"
    assert report["node"]["model"] == "Dell Inc. PowerEdge XE9680"
    assert report["node"]["gpus"] == {"pci_count": 8, "pci_ids": ["10de:2330"]}
    assert report["sources"]["host"]["ok"] is True
    nvml = report["sources"]["nvml"]
    assert nvml["ok"] is True and nvml["recorded"] is True and nvml["gpu_count"] == 8
    assert nvml["driver_version"] == "535.129.03"
    for finding in report["findings"]:
        is_gpu = finding["subject"].startswith("gpu") and finding["subject"][3:].isdigit()
        assert set(finding) == FINDING_KEYS | ({"gpu"} if is_gpu else set())  # a GPU's finding names the GPU
        if is_gpu:
            assert finding["gpu"]["index"] == int(finding["subject"][3:])
            assert set(finding["gpu"]) <= {"index", "uuid", "pci_bus_id", "serial", "source"}
        assert finding["status"] in {"pass", "warn", "fail", "unknown", "skip", "fixed"}
        assert finding["severity"] in {"info", "warning", "critical"}
        assert finding["source"] in {"host", "nvml", "redfish", "ipmi", "kmsg", "crosscheck"}
    summary = report["summary"]
    assert sum(summary.values()) == len(report["findings"])
    assert summary["fail"] == len(DRIFTED_FAILS)


def test_junit_output_loads_in_a_junit_reader(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "report.xml"
    result = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "junit", "--output", str(out))
    assert result.code == 1 and result.stdout == ""
    xml = junitparser.JUnitXml.fromfile(str(out))
    failed = set()
    total = 0
    for suite in xml:
        for case in suite:
            total += 1
            if any(isinstance(r, junitparser.Failure) for r in case.result):
                failed.add((case.classname, case.name))
    assert failed == DRIFTED_FAILS
    _, report = audit(run_cli, "hgx-h100-drifted")
    assert total == len(report["findings"])


def test_prom_output_is_textfile_format_one_series_per_problem(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "textfile" / "nodewarden.prom"
    out.parent.mkdir()  # the textfile folder exists; nodewarden never creates a folder it is told to write into
    result = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "prom", "--output", str(out))
    assert result.code == 1
    assert sorted(os.listdir(out.parent)) == ["nodewarden.prom"]  # no temp file left behind
    text = out.read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # One series per finding that does not pass, its status in the value (5 fail, 3 warn): ...
    samples = families["nodewarden_check_status"].samples
    codes = {(s.labels["check"], s.labels["subject"]): s.value for s in samples}
    # subjects as the table names them (issue 26.9): a firmware group's name, not its grouping key
    named = {("firmware.consistency", "psu.slot.#|power supply.slot.#"): ("firmware.consistency",
                                                                          "Power Supply.Slot.1\u20136")}
    assert {key for key, code in codes.items() if code == 5} == {named.get(key, key) for key in DRIFTED_FAILS}
    assert {key for key, code in codes.items() if code == 3} == DRIFTED_WARNS
    assert set(codes.values()) == {3, 5}  # passes and skips have no series of their own
    rmem = next(s for s in samples if s.labels["subject"] == "net.core.rmem_max")
    assert rmem.labels == {"check": "host.sysctl", "subject": "net.core.rmem_max", "severity": "warning",
                           "remediation": "sysctl"}  # no action: no `action=""` label (issue 26.9)
    psu = next(s for s in samples if s.labels["check"] == "bmc.psu")
    assert psu.labels["action"] == "replace_psu"
    # ... and every finding counted per check and status, passing ones included.
    report = audit(run_cli, "hgx-h100-drifted")[1]
    checks = {(s.labels["check"], s.labels["status"]): s.value for s in families["nodewarden_checks"].samples}
    assert sum(checks.values()) == len(report["findings"])
    assert checks[("gpu.persistence_mode", "fail")] == 7 and checks[("gpu.temperature", "pass")] == 7
    assert 0 not in checks.values()
    totals = {(s.labels["status"], s.labels["severity"]): s.value for s in families["nodewarden_findings"].samples}
    assert totals[("fail", "critical")] + totals[("fail", "warning")] == len(DRIFTED_FAILS)
    assert totals[("unknown", "critical")] == 0  # the problem statuses are always there, 0 or not
    assert len([line for line in text.splitlines() if line and not line.startswith("#")]) <= 200
    up = {s.labels["source"]: s.value for s in families["nodewarden_source_up"].samples}
    assert up == {"host": 1, "kmsg": 1, "nvml": 1, "redfish": 1}  # unconfigured sources export no up series
    assert families["nodewarden_profile_info"].samples[0].labels == {"profile": "hgx-h100-sxm"}


def test_table_shows_fails_first_and_a_summary(run_cli: RunCli) -> None:
    result = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "table")
    assert result.code == 1
    lines = result.stdout.splitlines()
    summary = audit(run_cli, "hgx-h100-drifted")[1]["summary"]
    assert summary["fail"] == len(DRIFTED_FAILS) and summary["warn"] == len(DRIFTED_WARNS)
    assert lines[-1].startswith(f"{summary['fail']} fail, {summary['warn']} warn, 0 unknown, {summary['pass']} pass, "
                                f"{summary['skip']} skip, 0 waived")
    assert "\x1b[" not in result.stdout  # no colour when stdout is not a terminal
    statuses = [line.split()[0] for line in lines if line.startswith("  ") and line.split()[0] in
                {"fail", "pass", "skip", "warn", "unknown"}]
    assert "pass" not in statuses  # passes hidden without -v
    verbose = run_cli("-v", "audit", "--simulate", "hgx-h100-drifted", "--format", "table")
    # -v shows every passing check; identical results on several GPUs or ports are one row (gpu0-6).
    passing = {f["check"] for f in audit(run_cli, "hgx-h100-drifted")[1]["findings"] if f["status"] == "pass"}
    pass_rows = [line.split() for line in verbose.stdout.splitlines() if line.startswith("  pass ")]
    assert {row[2] for row in pass_rows} == passing
    assert 0 < len(pass_rows) < summary["pass"]
    assert "  pass    critical gpu.ecc.uncorrected" in verbose.stdout
    host_block = verbose.stdout.split("HOST\n", 1)[1].split("\n\n", 1)[0].splitlines()
    first_pass = next(i for i, line in enumerate(host_block) if line.split()[0] == "pass")
    assert all(line.split()[0] != "fail" for line in host_block[first_pass:])


def test_only_and_skip_select_checks(run_cli: RunCli) -> None:
    _, report = audit(run_cli, "hgx-h100-drifted", "--only", "host.thp.*", "--only", "net.*")
    assert {f["check"] for f in report["findings"]} == {"host.thp.enabled", "host.thp.defrag", "net.mtu",
                                                         "profile.match", "source.available"}
    _, skipped = audit(run_cli, "hgx-h100-drifted", *(arg for area in ("host", "source", "gpu", "crosscheck", "bmc",
                                                                          "bios", "firmware", "baseline", "fabric",
                                                                          "ib", "pcie", "topology")
                                                       for arg in ("--skip", f"{area}.*")))
    assert {f["check"] for f in skipped["findings"]} == {"net.mtu", "profile.match"}
    assert skipped["sources"]["nvml"]["configured"] is False  # no GPU check selected: NVML is not read


def test_forced_profile_is_reported(run_cli: RunCli) -> None:
    _, report = audit(run_cli, "hgx-h100-drifted", "--profile", "generic-nvidia")
    match = next(f for f in report["findings"] if f["check"] == "profile.match")
    assert match["status"] == "pass" and "--profile" in match["message"]
    assert not any(f["check"] == "net.mtu" for f in report["findings"])  # generic has no MTU rules


def waiver_config(tmp_path: Path, entries: str) -> Path:
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text(entries)
    config = tmp_path / "config.yaml"
    config.write_text(f"waivers_file: {waivers}\n")
    return config


def test_waived_findings_never_fail_the_exit_code(run_cli: RunCli, tmp_path: Path) -> None:
    config = waiver_config(tmp_path, "waivers:\n" + "".join(
        f"  - {{check: '{c}', subject: '{s}', reason: 'accepted for the test', expires: '2099-01-01'}}\n"
        for c, s in sorted(DRIFTED_FAILS)))
    code, report = audit(run_cli, "hgx-h100-drifted", "--config", str(config))
    assert code == 0
    assert report["summary"]["waived"] == len(DRIFTED_FAILS) and report["summary"]["fail"] == 0
    waived = [f for f in report["findings"] if f["waiver"]]
    assert {f["status"] for f in waived} == {"fail"}  # evaluated status is kept
    assert waived[0]["waiver"] == {"reason": "accepted for the test", "expires": "2099-01-01"}


def test_waiver_globs_and_expired_waivers(run_cli: RunCli, tmp_path: Path) -> None:
    config = waiver_config(tmp_path, """
waivers:
  - check: "host.*"
    reason: host tuning is owned by another team
    expires: "2099-12-31"
  - check: net.mtu
    subject: "enp156*"
    reason: cable swap pending
    expires: "2020-01-01"
""")
    code, report = audit(run_cli, "hgx-h100-drifted", "--config", str(config))
    assert code == 1  # the expired waiver no longer covers the MTU fail
    assert fails(report) == {("net.mtu", "enp156s0np0")} | GPU_DRIFTS | BMC_DRIFTS | INTERCONNECT_DRIFTS | FABRIC_DRIFTS
    expired = [f for f in report["findings"] if f["check"] == "waiver.expired"]
    assert len(expired) == 1 and expired[0]["status"] == "warn"
    assert "expired 2020-01-01" in expired[0]["message"] and f"{tmp_path / 'waivers.yaml'}:6" in expired[0]["message"]


@pytest.mark.parametrize(("body", "line", "text"), [
    ("waivers:\n  - {check: x, reason: r}\n", 2, "missing required key 'expires'"),
    ("waivers:\n  - {check: x, reason: r, expires: 'soon'}\n", 2, "does not match"),
    ("waivers:\n  - {check: x, reason: r, expires: '2025-02-30'}\n", 2, "is not a date"),
    ("waivers: [\n", 2, "invalid YAML"),
    # a glob matching every check would silence criticals wholesale: a waiver names a check or area
    ("waivers:\n  - {check: '*', reason: r, expires: '2099-01-01'}\n", 2, "matches every check"),
    ("waivers:\n  - {check: x, reason: r, expires: '2099-01-01'}\n  - {check: '*.*', reason: r, expires: '2099-01-01'}\n",
     3, "matches every check"),
    ("waivers:\n  - {check: '?*', reason: r, expires: '2099-01-01'}\n", 2, "matches every check"),
])
def test_bad_waiver_file_exits_2_with_location(run_cli: RunCli, tmp_path: Path, body: str, line: int,
                                               text: str) -> None:
    config = waiver_config(tmp_path, body)
    result = run_cli("audit", "--simulate", "hgx-h100-healthy", "--config", str(config), "--format", "json")
    assert result.code == 2
    assert f"{tmp_path / 'waivers.yaml'}:{line}:" in result.stderr and text in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_config_exits_2(run_cli: RunCli, tmp_path: Path) -> None:
    missing = run_cli("audit", "--simulate", "hgx-h100-healthy", "--config", str(tmp_path / "nope.yaml"))
    assert missing.code == 2 and "config file does not exist" in missing.stderr
    config = tmp_path / "config.yaml"
    config.write_text("profile: auto\nbmc:\n  url: http://x\n  pasword_file: /x\n")
    typo = run_cli("audit", "--simulate", "hgx-h100-healthy", "--config", str(config))
    assert typo.code == 2
    assert f"{config}:4: bmc.pasword_file: unknown key 'pasword_file'" in typo.stderr


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def copy_node(tmp_path: Path, name: str = "hgx-h100-drifted", writable_fs: bool = False) -> Path:
    """A copy of a simulated node; fs/ hard-links the original's files unless it must be edited.

    (Not a symlink: a snapshot whose fs/ is a symlink is refused, it could lead anywhere.)"""
    from agent.sources.snapshot import simulated_path

    source = simulated_path(name)
    target = tmp_path / "snap"
    if writable_fs:
        shutil.copytree(source, target)
        return target
    target.mkdir()
    for item in source.iterdir():
        if item.name == "fs":
            shutil.copytree(item, target / "fs", copy_function=_link_or_copy)
        elif item.is_dir():
            shutil.copytree(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)
    return target


def test_snapshot_capture_of_a_simulated_node_replays_identically(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out))
    assert result.code == 0 and "captured host, kmsg" in result.stdout
    _, original = audit(run_cli, "hgx-h100-drifted")
    replayed = run_cli("audit", "--snapshot", str(out), "--format", "json")
    replay = replayed.json()
    assert replayed.code == 1
    strip = [{k: v for k, v in f.items() if k != "message" or f["check"] not in ("source.available", "bmc.reachable")}
             for f in original["findings"]]
    assert [{k: v for k, v in f.items() if k != "message" or f["check"] not in ("source.available", "bmc.reachable")}
            for f in replay["findings"]] == strip
    again = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out))
    assert again.code == 2 and "refusing to overwrite" in again.stderr


@pytest.mark.parametrize(("breakage", "text"), [
    ("no_meta", "meta.yaml is missing"),
    ("broken_meta", "meta.yaml:3"),
    ("no_fs", "fs/ is missing"),
    ("bad_links", "fs_links.json"),
    ("missing_dir", "does not exist"),
])
def test_broken_snapshot_exits_2(run_cli: RunCli, tmp_path: Path, breakage: str, text: str) -> None:
    snap = copy_node(tmp_path)
    if breakage == "no_meta":
        (snap / "meta.yaml").unlink()
    elif breakage == "broken_meta":
        (snap / "meta.yaml").write_text("hostname: x\ncaptured: [host\n")
    elif breakage == "no_fs":
        shutil.rmtree(snap / "fs")
    elif breakage == "bad_links":
        (snap / "fs_links.json").write_text("{not json")
    elif breakage == "missing_dir":
        shutil.rmtree(snap)
    result = run_cli("audit", "--snapshot", str(snap), "--format", "json")
    assert result.code == 2, result.stderr
    assert text in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_snapshot_without_host_data_cannot_run(run_cli: RunCli, tmp_path: Path) -> None:
    snap = copy_node(tmp_path)
    (snap / "meta.yaml").write_text("hostname: x\ncaptured: []\n")
    result = run_cli("audit", "--snapshot", str(snap), "--format", "json")
    assert result.code == 3 and "holds neither host nor NVML data" in result.stderr
    # A kernel log alone is a customer's dmesg: its Xids, SXids and kernel events are judged, nothing else
    # runs (tests/oracle/test_corpus.py).
    (snap / "meta.yaml").write_text("hostname: x\ncaptured: [kmsg]\n")
    result = run_cli("audit", "--snapshot", str(snap), "--format", "json")
    assert result.code in (0, 1), result.stderr
    assert {f["check"] for f in result.json()["findings"]} <= {"gpu.xid", "fabric.sxid", "host.kernel.events",
                                                                "profile.match", "source.available"}


def test_partial_and_corrupt_kernel_files_become_unknown_findings(run_cli: RunCli, tmp_path: Path) -> None:
    snap = copy_node(tmp_path, writable_fs=True)
    (snap / "fs/sys/kernel/mm/transparent_hugepage/enabled").write_bytes(b"always \xff[madvise] never\n")
    (snap / "fs/proc/sys/net/core/rmem_max").unlink()
    result = run_cli("audit", "--snapshot", str(snap), "--format", "json")
    report = result.json()
    by_key = {(f["check"], f["subject"]): f for f in report["findings"]}
    thp = by_key[("host.thp.enabled", "node")]
    assert thp["status"] == "unknown"
    assert "/sys/kernel/mm/transparent_hugepage/enabled is not valid UTF-8" in thp["message"]
    rmem = by_key[("host.sysctl", "net.core.rmem_max")]
    assert rmem["status"] == "unknown" and "/proc/sys/net/core/rmem_max is absent" in rmem["message"]
    assert result.code == 1  # the other drifts still fail


def test_version_and_help(run_cli: RunCli) -> None:
    version = run_cli("--version")
    assert version.code == 0 and version.stdout.strip() == "nodewarden, version 0.1.0"
    helptext = run_cli("audit", "--help")
    assert helptext.code == 0 and "--simulate" in helptext.stdout and "--only" in helptext.stdout


def test_json_report_is_stable_json(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run_cli("audit", "--simulate", "hgx-h100-healthy", "--format", "json", "--output", str(out))
    assert result.code == 0 and result.stdout == ""
    assert json.loads(out.read_text())["summary"]["fail"] == 0


def test_table_colours_statuses_only_when_asked() -> None:
    from agent.engine.audit import AuditRequest, run_audit
    from agent.policy.config import Config
    from agent.report import render

    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))
    coloured = render(report, "table", color=True)
    assert "\x1b[31m\x1b[1mfail" in coloured  # red, bold
    assert "\x1b[" not in render(report, "table", color=False)


def test_dgx_a100_node_is_healthy_under_its_own_profile(run_cli: RunCli) -> None:
    code, report = audit(run_cli, "dgx-a100-healthy")
    assert code == 0 and report["profile"] == "dgx-a100"
    assert {f["status"] for f in report["findings"]} <= {"pass", "skip"}
    links = {f["subject"]: f["observed"] for f in report["findings"] if f["check"] == "gpu.nvlink.links"}
    assert links == {f"gpu{i}": 12 for i in range(8)}
    assert not any(f["check"] == "gpu.fabric" for f in report["findings"])  # A100 has no fabric API: no expectation


IMPORTED_FAILS = {*{("gpu.clocks.events", f"gpu{i}") for i in range(8)}, ("gpu.driver", "node"), ("gpu.cuda", "node")}


def test_node_imported_from_a_real_nvidia_smi_dump(run_cli: RunCli) -> None:
    code, report = audit(run_cli, "hgx-h100-nvsmi-import")
    assert code == 1 and report["profile"] == "hgx-h100-sxm"
    assert fails(report) == IMPORTED_FAILS
    brake = next(f for f in report["findings"] if f["check"] == "gpu.clocks.events" and f["subject"] == "gpu0")
    assert brake["severity"] == "critical" and brake["action"] == "check_power_delivery"
    assert {"hw_power_brake", "hw_slowdown"} <= set(brake["observed"])
    # What nvidia-smi -q does not contain is skipped with the reason, never passed.
    links = next(f for f in report["findings"] if f["check"] == "gpu.nvlink.links" and f["subject"] == "gpu0")
    assert links["status"] == "skip" and "not in this recording" in links["message"]
    assert not any(f["check"].startswith(("host.", "net.")) for f in report["findings"])
    assert report["sources"]["host"]["configured"] is False


def test_import_nvidia_smi_cli(run_cli: RunCli, tmp_path: Path) -> None:
    from tests.conftest import REPO

    dumps = REPO / "fixtures" / "nvidia-smi"
    out = tmp_path / "a100"
    result = run_cli("snapshot", "import-nvidia-smi", str(dumps / "thamada-gls" / "A100SXMx4.q.txt"), "--out", str(out))
    assert result.code == 0 and "imported 4 GPU(s)" in result.stdout
    report = run_cli("audit", "--snapshot", str(out), "--format", "json").json()
    remap = {f["subject"]: f for f in report["findings"] if f["check"] == "gpu.row_remap"}
    assert [s for s, f in remap.items() if f["status"] == "warn"] == ["gpu1"]  # 9E:00.0, the second GPU
    corrupt = run_cli("snapshot", "import-nvidia-smi",
                      str(dumps / "gpud" / "nvidia-smi-query.535.183.01.out.0.invalid.txt"), "--out",
                      str(tmp_path / "bad"))
    assert corrupt.code == 2 and "8 attached GPUs but holds 1 GPU section" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr and not (tmp_path / "bad").exists()
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 8)
    nope = run_cli("snapshot", "import-nvidia-smi", str(garbage), "--out", str(tmp_path / "g"))
    assert nope.code == 2 and "Traceback" not in nope.stderr


def test_skipping_gpu_checks_does_not_read_nvml(run_cli: RunCli) -> None:
    # baseline.drift uses NVML only when another selected check has it read (issue 16).
    result = run_cli("audit", "--simulate", "hgx-h100-healthy", "--skip", "gpu.*", "--format", "json")
    report = result.json()
    assert report["sources"]["nvml"]["configured"] is False
    drift = [f for f in report["findings"] if f["check"] == "baseline.drift"]
    assert drift and all(f["source"] != "nvml" for f in drift)  # its BMC half is still judged
