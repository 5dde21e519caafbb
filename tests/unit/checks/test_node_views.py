"""The views of a node agree or say so (issue 22 item 9).

Real captures: the HPE DL380a Gen11 Redfish mockup (2x H100 NVL, fixtures/redfish/hpe-dl380a-gen11), the
LambdaLabs HGX B200 tree whose baseboard alone lists the GPUs (fixtures/redfish/gpu_info_unknown_multi), and
telegraf's `ipmitool sdr` of an IBM System x (fixtures/real/ipmi/telegraf). The states put into them (a fan
in `nr`, a baseboard GPU InTest or Warning) are written the way the BMC prints them.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts, NodeFacts
from agent.core.model import SourceStatus, Status
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.importers.bug_report import SEPARATOR
from agent.sources.importers.ipmitool import parse_sensor_line
from agent.sources.ipmi_const import PARTS, RECORD_FORMAT
from agent.sources.ipmi_parse import facts_and_status
from agent.sources.redfish import RecordedRedfish, read_redfish
from checks.bmc_health import FANS
from checks.crosscheck_hgx import HGX_HEALTH
from tests.conftest import REPO, RunCli
from tests.factories import host, nvml_node, write_tree

SDR = REPO / "fixtures" / "real" / "ipmi" / "telegraf" / "ipmitool-sdr.v1-ibm-systemx.txt"
TREES = REPO / "fixtures" / "redfish"
HPE = TREES / "hpe-dl380a-gen11"
MULTI = TREES / "gpu_info_unknown_multi"
BOARD_GPU = Path("redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_1/index.json")


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


# --- ipmitool: a fan in `nr` is critical -------------------------------------------------------------------


def _ipmi_facts(text: str) -> BmcFacts:
    sensors = [s for s in (parse_sensor_line(line) for line in text.splitlines()) if s is not None]
    raw: dict[str, Any] = {"format": RECORD_FORMAT, "requests": 1,
                           **{part: {"not_captured": "not in this capture"} for part in PARTS}, "sensors": sensors}
    bmc, status = facts_and_status(raw, 0.0)
    assert isinstance(bmc, BmcFacts) and status.ok, status.error
    return bmc


def _fans(bmc: BmcFacts, profile: Profile) -> dict[str, Any]:
    facts = NodeFacts(host=host(), kmsg=(), bmc=bmc, sources={"ipmi": SourceStatus("ipmi", ok=True)})
    return {f.subject: f for f in FANS.run(facts, profile)}


def test_a_fan_in_nr_is_critical_and_drains(generic: Profile) -> None:
    text = SDR.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("Fan 1A Tach"))
    broken = text.replace(line, line.replace("2610 RPM", "0 RPM").replace("| ok", "| nr"))
    fans = _fans(_ipmi_facts(broken), generic)
    fan = fans["Fan 1A Tach"]
    assert (fan.status, fan.severity.value, fan.action) == (Status.FAIL, "critical", "replace_fan")
    assert "non-recoverable" in fan.message
    assert fans["Fan 1B Tach"].status is Status.PASS  # its neighbour, ok in the capture, stays a pass


def test_a_fan_past_its_critical_threshold_keeps_the_profile_severity(generic: Profile) -> None:
    text = SDR.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("Fan 1A Tach"))
    fans = _fans(_ipmi_facts(text.replace(line, line.replace("| ok", "| nr"))), generic)
    cr = _fans(_ipmi_facts(text.replace(line, line.replace("| ok", "| cr"))), generic)
    assert fans["Fan 1A Tach"].severity.value == "critical"
    assert cr["Fan 1A Tach"].status is Status.FAIL and cr["Fan 1A Tach"].severity.value != "critical"


# --- the HGX baseboard alone -------------------------------------------------------------------------------


def _board(tmp_path: Path, status: dict[str, str]) -> BmcFacts:
    base = tmp_path / "tree"
    shutil.copytree(MULTI, base)
    path = base / BOARD_GPU
    body = json.loads(path.read_text(encoding="utf-8"))
    body["Status"] = status
    path.write_text(json.dumps(body), encoding="utf-8")
    bmc, read, _ = read_redfish(lambda: RecordedRedfish(base), deadline_s=60)
    assert isinstance(bmc, BmcFacts) and read.ok
    return bmc


def _hgx(bmc: BmcFacts, profile: Profile) -> dict[str, Any]:
    facts: NodeFacts = nvml_node()
    facts.bmc = bmc
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    return {f.subject: f for f in HGX_HEALTH.run(facts, profile)}


@pytest.mark.parametrize(("status", "expected"), [
    ({"State": "InTest", "Health": "OK"}, (Status.WARN, "check_bmc_events")),  # a test running: look again
    ({"State": "Enabled", "Health": "Warning"}, (Status.FAIL, "check_bmc_events")),  # the profile's severity
    ({"State": "Enabled", "Health": "Critical"}, (Status.FAIL, "drain")),
])
def test_a_gpu_only_the_baseboard_lists_is_judged(status: dict[str, str], expected: tuple[Status, str],
                                                  tmp_path: Path, generic: Profile) -> None:
    found = _hgx(_board(tmp_path, status), generic)
    gpu = found["GPU_SXM_1"]
    assert (gpu.status, gpu.action) == expected
    assert "HGX baseboard reports" in gpu.message and "no GPU processors to compare with" in gpu.message
    assert "GPU_SXM_2" not in found  # the healthy one alone is not a finding; the node's skip says why


# --- a host without GPUs and without a readable identity, whose BMC lists GPUs --------------------------


def test_unreadable_identity_and_a_bmc_with_gpus_is_a_bmc_only_audit(run_cli: RunCli, tmp_path: Path,
                                                                     empty_config: Path) -> None:
    """A CPU-only host (PCI read, no NVIDIA function, no driver, no DMI: not root) that read a BMC listing
    2 H100 NVL: the BMC's node is audited, not the host under no-nvidia-gpu."""
    snap = tmp_path / "jump"
    write_tree(snap, {
        "meta.yaml": "hostname: jump1\ncaptured_at: '2026-11-20T08:00:00Z'\ncaptured: [host, kmsg, redfish]\n",
        "kmsg.txt": "6,1,0,-;Linux version 6.1.0 (gcc) #1 SMP\n",
        "fs/proc/sys/kernel/hostname": "jump1\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/device": "0x09a2\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
    })
    shutil.copytree(HPE / "redfish", snap / "redfish")
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(empty_config), "--format", "json")
    report = result.json()
    assert report["profile"] == "nvidia-pcie"  # the BMC's node (2x H100 NVL), not no-nvidia-gpu
    assert report["node"]["bmc_binding"] == "bmc_only"
    identity = next(f for f in report["findings"] if f["check"] == "crosscheck.identity")
    assert "lists 2 GPU(s) this host does not have" in identity["message"]


# --- nvidia-bug-report: `*** /sys/...` and `*** /proc/...` sections are the files -----------------------


def _section(header: str, body: str, *, file: bool = False) -> bytes:
    lines = [SEPARATOR, "", header]
    if file:
        lines += [f"*** ls: -r--r--r-- 1 root root 0 2024-07-31 11:22:39.000000000 +0000 {header[4:]}",
                  body.rstrip("\n")]
    else:
        lines += ["", body.rstrip("\n")]
    return gzip.compress(("\n".join(lines) + "\n\n").encode())


def test_bug_report_sys_and_proc_sections_are_read_as_files(tmp_path: Path, run_cli: RunCli) -> None:
    prologue = (f"{SEPARATOR}\n\nStart of NVIDIA bug report log file.  Please include this file, along\n"
                "with a detailed description of your problem.\n\nnvidia-bug-report.sh Version: 34097112\n\n")
    gpu_info = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nBus Location: \t 0000:19:00.0\n"
    report = (gzip.compress(prologue.encode())
              + _section("*** /sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n", file=True)
              + _section("*** /proc/driver/nvidia/./gpus/0000:19:00.0/information", gpu_info, file=True)
              + _section("*** /proc/sys/vm/swappiness", "60\n", file=True)
              + _section("*** /proc/../etc/shadow", "root:x:0:0\n", file=True)  # hostile: no host file
              + _section("*** /etc/issue", "Ubuntu 22.04.4 LTS\n", file=True))
    path = tmp_path / "nvidia-bug-report.log.gz"
    path.write_bytes(report)
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(path), "--out", str(out))
    assert result.code == 0, result.stderr
    fs = out / "fs"
    assert (fs / "sys" / "kernel" / "mm" / "transparent_hugepage" / "enabled").read_text() == "always [madvise] never\n"
    assert (fs / "proc" / "driver" / "nvidia" / "gpus" / "0000:19:00.0" / "information").read_text() == gpu_info
    assert (fs / "proc" / "sys" / "vm" / "swappiness").read_text() == "60\n"
    assert not (fs / "etc").exists() and not (out / "etc").exists()
