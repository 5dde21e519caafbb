"""Issue 13 rule 2: node identity before cross-checks, and the BMC audited alone.

The BMC is bound to the host by the ComputerSystem UUID (or serial) against DMI's product_uuid (or
product_serial). A BMC of another node, or one that cannot be bound, is never compared with the local
PCI/NVML view; a BMC-only snapshot (meta.yaml `captured: [redfish]`) audits from what was read, with the
profile matched from Redfish. Each test drives the real CLI on snapshots built from shipped fixtures.

On the code before this change: the BMC-only snapshot exited 3 ("holds neither host nor NVML data"); a
remote BMC (an HPE DL380a with 2 H100 NVL as the BMC of the simulated 8-GPU Dell) failed
`crosscheck.gpu_count` as critical, read live or recorded; `crosscheck.identity` did not exist; a jump
host without GPUs judged a remote BMC by `no-nvidia-gpu`; `agent.core.binding` did not exist.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.binding import bind_bmc
from agent.core.facts import BmcFacts
from agent.core.model import Unknown
from tests.conftest import REPO, RunCli
from tests.factories import host, write_tree
from tests.peers.redfish import sushy_static

HPE = REPO / "fixtures" / "redfish" / "hpe-dl380a-gen11"
HPE_UUID = "39343550-3330-4d32-3244-324a30304c34"  # its ComputerSystem UUID
DELL_SYSTEM = "redfish/v1/Systems/System.Embedded.1/index.json"
DMI = "fs/sys/devices/virtual/dmi/id"  # /sys/class/dmi/id links here in the simulated snapshots
HOST_UUID = "4c4c4544-0048-5110-8032-b7c04f4b3534"


def audit(run_cli: RunCli, config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("audit", *args, "--config", str(config), "--format", "json")
    assert result.stdout, result.stderr
    return result.code, result.json()


def by_key(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["check"], f["subject"]): f for f in report["findings"]}


def exit_from_findings(report: dict[str, Any]) -> int:
    return 1 if any(f["status"] == "fail" and not f["waiver"] for f in report["findings"]) else 0


def critical_crosscheck_fails(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"].startswith("crosscheck.") and f["status"] == "fail"
            and f["severity"] == "critical"]


@pytest.fixture(scope="module")
def healthy_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A writable copy of the simulated Dell XE9680 (8x H100), made as operators make it."""
    from click.testing import CliRunner

    from agent.apps.cli.main import cli

    out = tmp_path_factory.mktemp("healthy") / "node"
    result = CliRunner().invoke(cli, ["snapshot", "capture", "--simulate", "hgx-h100-healthy", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def node_copy(tmp_path: Path, capture: Path, *, uuid: str | None = HOST_UUID, bmc: Path | None = None) -> Path:
    """The healthy node with DMI product_uuid `uuid` and, if given, another Redfish tree as its BMC."""
    snap = Path(shutil.copytree(capture, tmp_path / "node", symlinks=True))
    if uuid is not None:
        write_tree(snap, {f"{DMI}/product_uuid": uuid + "\n"})
    if bmc is not None:
        shutil.rmtree(snap / "redfish")
        shutil.copytree(bmc / "redfish", snap / "redfish")
    return snap


def set_redfish_system(snap: Path, **fields: str) -> None:
    path = snap / DELL_SYSTEM
    body = json.loads(path.read_text())
    body.update(fields)
    path.write_text(json.dumps(body))


# --- a BMC alone ---------------------------------------------------------------------------------


def bmc_only_snapshot(tmp_path: Path) -> Path:
    snap = tmp_path / "dl380a-bmc"
    shutil.copytree(HPE / "redfish", snap / "redfish")
    (snap / "meta.yaml").write_text("hostname: ds03-worker\ncaptured_at: '2026-11-20T08:00:00Z'\n"
                                    "captured: [redfish]\n")
    return snap


def test_a_bmc_only_snapshot_audits_from_what_was_read(run_cli: RunCli, tmp_path: Path,
                                                       empty_config: Path) -> None:
    snap = bmc_only_snapshot(tmp_path)
    code, report = audit(run_cli, empty_config, "--snapshot", str(snap))
    # HPE's power-saving BIOS settings fail (warning severity): the exit code comes from the BMC's findings.
    assert code == exit_from_findings(report) == 1
    assert {f["check"] for f in report["findings"] if f["status"] == "fail"} == {"bios.attribute"}
    # Matched from Redfish: iLO names the GPUs "NVIDIA H100 NVL" (10de:2321), a PCIe data-center board.
    assert report["profile"] == "nvidia-pcie"
    found = by_key(report)
    match = found[("profile.match", "node")]
    assert match["status"] == "pass" and "10de:2321" in match["message"] and "(from the BMC)" in match["message"]
    assert "HPE ProLiant DL380a Gen11" in match["message"]
    for source in ("host", "nvml", "kmsg"):
        skipped = found[("source.available", source)]
        assert skipped["status"] == "skip" and "not in this audit" in skipped["message"]
    # gpu.firmware.vbios is the one GPU check a BMC answers (issue 13 rule 4): the BMC's GPU inventory.
    assert not [f for f in report["findings"] if f["check"].split(".")[0] in ("host", "gpu", "net", "ib", "pcie",
                                                                             "fabric", "topology")
                and f["check"] != "gpu.firmware.vbios"]
    assert {f["subject"] for f in report["findings"] if f["check"] == "gpu.firmware.vbios"} == {
        "NVIDIA H100 NVL [PCI-E Slot 14]", "NVIDIA H100 NVL [PCI-E Slot 16]"}
    identity = found[("crosscheck.identity", "bmc")]
    assert identity["status"] == "skip" and "BMC-only audit" in identity["message"]
    assert not [f for f in report["findings"] if f["check"].startswith("crosscheck.gpu")]
    assert report["node"]["model"] == "HPE ProLiant DL380a Gen11 -- SIMULATED"
    assert report["node"]["hostname"] == "ds03-worker" and report["node"]["bmc_binding"] == "bmc_only"
    assert report["node"]["gpus"]["pci_ids"] == ["10de:2321"] and report["node"]["gpus"]["bmc_count"] == 2
    matched = run_cli("profiles", "match", "--snapshot", str(snap))
    assert matched.code == 0 and "nvidia-pcie (auto)" in matched.stdout, matched.stdout + matched.stderr


def test_a_jump_host_without_gpus_audits_the_remote_bmc_alone(run_cli: RunCli, tmp_path: Path,
                                                             empty_config: Path) -> None:
    """A CPU-only host (PCI read, no NVIDIA function, no driver) that read another node's BMC."""
    snap = tmp_path / "jump"
    write_tree(snap, {
        "meta.yaml": "hostname: jump1\ncaptured_at: '2026-11-20T08:00:00Z'\ncaptured: [host, kmsg, redfish]\n",
        "kmsg.txt": "6,1,0,-;Linux version 6.1.0 (gcc) #1 SMP\n",
        "fs/proc/sys/kernel/hostname": "jump1\n",
        "fs/sys/class/dmi/id/product_uuid": HOST_UUID + "\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/device": "0x09a2\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
    })
    shutil.copytree(HPE / "redfish", snap / "redfish")
    code, report = audit(run_cli, empty_config, "--snapshot", str(snap))
    assert code == exit_from_findings(report)
    assert report["profile"] == "nvidia-pcie"  # the BMC's node, not the jump host's no-nvidia-gpu
    identity = by_key(report)[("crosscheck.identity", "bmc")]
    assert identity["status"] == "skip" and "from a host without NVIDIA GPUs" in identity["message"]
    assert "describes another node" in identity["message"] and HPE_UUID in identity["message"]
    assert by_key(report)[("source.available", "host")]["status"] == "skip"
    assert not [f for f in report["findings"] if f["check"].startswith(("host.", "gpu.", "crosscheck.gpu"))
                and f["check"] != "gpu.firmware.vbios"]  # the BMC's GPU inventory answers that one


# --- a BMC of another node, read with the host -----------------------------------------------------


def test_a_live_bmc_of_another_node_is_not_cross_checked(run_cli: RunCli, tmp_path: Path, empty_config: Path,
                                                         healthy_capture: Path) -> None:
    """The simulated host (8x H100) audited with `--bmc` pointing at an HPE DL380a (2x H100 NVL) served
    by sushy-static: before, crosscheck.gpu_count failed critical (bmc 2, nvml 8, pci 8)."""
    snap = node_copy(tmp_path, healthy_capture)
    (snap / "meta.yaml").write_text("hostname: gpu-h100-healthy-01\ncaptured_at: '2026-11-20T08:00:00Z'\n"
                                    "captured: [host, kmsg, nvml]\n")
    shutil.rmtree(snap / "redfish")
    password = tmp_path / "bmc-password"
    password.write_text("secret\n")
    password.chmod(0o600)
    with sushy_static(HPE) as peer:
        code, report = audit(run_cli, empty_config, "--snapshot", str(snap), "--bmc", peer.url, "--bmc-user",
                             "monitor", "--bmc-password-file", str(password))
    assert report["sources"]["redfish"]["ok"] is True
    assert critical_crosscheck_fails(report) == []
    found = by_key(report)
    identity = found[("crosscheck.identity", "bmc")]
    assert identity["status"] == "warn" and "describes another node" in identity["message"]
    assert HPE_UUID in identity["message"] and HOST_UUID in identity["message"]
    assert [f for f in report["findings"] if "describes another node" in f["message"]
            and f["check"] == "crosscheck.identity"] == [identity]
    for check in ("crosscheck.gpu_count", "crosscheck.gpu_temperature", "crosscheck.gpu_health"):
        assert found[(check, "node")]["status"] == "skip"
    assert report["profile"] == "hgx-h100-sxm" and report["node"]["bmc_binding"] == "remote"
    assert found[("gpu.count", "node")]["status"] == "pass"  # the host is still audited as itself
    assert code == exit_from_findings(report)


def test_a_host_whose_identity_cannot_be_read_is_not_cross_checked(run_cli: RunCli, tmp_path: Path,
                                                                    empty_config: Path,
                                                                    healthy_capture: Path) -> None:
    """product_uuid is root-only on live systems: unreadable means not bound, with the reason."""
    snap = node_copy(tmp_path, healthy_capture, uuid=None, bmc=HPE)
    errors = snap / "fs_errors.json"
    recorded = json.loads(errors.read_text()) if errors.is_file() else {}
    recorded.update({"sys/devices/virtual/dmi/id/product_uuid": "EACCES",
                     "sys/devices/virtual/dmi/id/product_serial": "EACCES"})
    errors.write_text(json.dumps(recorded))
    _code, report = audit(run_cli, empty_config, "--snapshot", str(snap))
    assert critical_crosscheck_fails(report) == []
    identity = by_key(report)[("crosscheck.identity", "bmc")]
    assert identity["status"] == "skip" and "cannot tell whether the BMC is this host's" in identity["message"]
    assert "needs root" in identity["message"]
    assert by_key(report)[("crosscheck.gpu_count", "node")]["status"] == "skip"


# --- the host's own BMC ---------------------------------------------------------------------------


@pytest.mark.parametrize(("redfish", "how"), [
    ({"UUID": HOST_UUID.upper()}, "= DMI product_uuid"),
    # SMBIOS < 2.6 byte order for the first three fields, as some BMCs print it
    ({"UUID": "44454c4c-4800-1051-8032-b7c04f4b3534"}, "other byte order"),
    ({"SKU": "7HQ2K54"}, "serial 7HQ2K54 = DMI product_serial"),  # Dell: the service tag, no UUID
])
def test_a_bound_bmc_is_cross_checked(run_cli: RunCli, tmp_path: Path, empty_config: Path, healthy_capture: Path,
                                      redfish: dict[str, str], how: str) -> None:
    snap = node_copy(tmp_path, healthy_capture, uuid=None if "SKU" in redfish else HOST_UUID)
    if "SKU" in redfish:
        write_tree(snap, {f"{DMI}/product_serial": "7HQ2K54\n"})
    set_redfish_system(snap, **redfish)
    code, report = audit(run_cli, empty_config, "--snapshot", str(snap))
    assert code == 0
    found = by_key(report)
    identity = found[("crosscheck.identity", "bmc")]
    assert identity["status"] == "pass" and how in identity["message"], identity["message"]
    count = found[("crosscheck.gpu_count", "node")]
    assert count["status"] == "pass" and count["observed"] == {"bmc": 8, "nvml": 8, "pci": 8}
    assert {f["status"] for f in report["findings"] if f["check"] == "crosscheck.gpu_temperature"} == {"pass"}
    assert report["node"]["bmc_binding"] == "bound"


def test_firmware_placeholders_never_bind() -> None:
    """Two whitebox boards shipping the AMI default UUID and "To Be Filled By O.E.M." are not one machine."""
    ami = "03000200-0400-0500-0006-000700080009"
    placeholder = host(dmi={"product_uuid": ami, "product_serial": "To Be Filled By O.E.M."})
    bmc = BmcFacts(protocol="redfish", system_uuid=ami, system_serial="To Be Filled By O.E.M.")
    binding = bind_bmc(placeholder, bmc)
    assert binding.state == "unknown" and "placeholder" in binding.message
    zeros = BmcFacts(protocol="redfish", system_uuid="00000000-0000-0000-0000-000000000000")
    assert bind_bmc(host(dmi={"product_uuid": "00000000-0000-0000-0000-000000000000"}), zeros).state == "unknown"
    unreadable = host(dmi={"product_uuid": Unknown("/sys/class/dmi/id/product_uuid is not readable by this user "
                                                    "(needs root)")})
    assert bind_bmc(unreadable, BmcFacts(protocol="redfish", system_uuid=HPE_UUID)).state == "unknown"
    # UUID decides over serial when both sides have one
    other = BmcFacts(protocol="redfish", system_uuid=HPE_UUID, system_serial="ABC1234")
    assert bind_bmc(host(dmi={"product_uuid": HOST_UUID, "product_serial": "ABC1234"}), other).state == "remote"
    assert bind_bmc(host(), Unknown("no BMC configured")).state == "no_bmc"
