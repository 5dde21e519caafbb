"""Issue 13 rule 11, the board-level checks: a partial view is not judged by the 8-GPU board.

One SXM GPU given to a VM (QEMU DMI, no NVSwitch on PCI, no BMC) is a partial view of the HGX board
(`checks._gpu.partial_view`, the one predicate `agent.policy.matching.board_fit` that gpu.count uses too). The
board-level expectations are not in it to judge, so they `skip` with the reason instead of failing as
critical: Fabric Manager (the hypervisor's programs the switches, and writes its log), the GPU's 18
NVLinks to the NVSwitches when none of them trained, its fabric registration short of `completed`, the 8
rail HCAs.
What the visible GPU itself reports stays a finding: some of its NVLinks up and one down, a failed
fabric registration status. The same GPU on the whole board (an NVSwitch on PCI) is judged as before.

The snapshot is the simulated HGX H100 node's recorded NVML reading of its GPU 0, on a VM's sysfs,
audited through the CLI. On the code before this change, fabric.manager, ib.hca.count, gpu.nvlink.links
and gpu.fabric failed as critical on it, and fabric.sxid was `unknown` for the log the VM cannot have.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, RunCli
from tests.factories import write_tree

HEALTHY = REPO / "fixtures" / "nodes" / "hgx-h100-healthy"
BOARD_CHECKS = ("fabric.manager", "ib.hca.count", "gpu.nvlink.links", "gpu.fabric")
NVLINK = "NVML_FI_DEV_NVLINK_GET_STATE:{}"


def _gpu0(links: list[int] | None, fabric_state: int = 3, fabric_status: int = 0) -> dict[str, Any]:
    """The recorded NVML reading of the healthy node's GPU 0, with its NVLink states and fabric info set."""
    recorded = json.loads((HEALTHY / "nvml.json").read_text(encoding="utf-8"))
    device = copy.deepcopy(recorded["devices"][0])
    fields = device["nvmlDeviceGetFieldValues"]
    for link in range(18):
        key = NVLINK.format(link)
        if links is None or link >= len(links):
            fields[key] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
        else:
            fields[key] = links[link]
    device["nvmlDeviceGetGpuFabricInfoV"] = {"cliqueId": 0, "healthMask": 0, "state": fabric_state,
                                            "status": fabric_status}
    system = dict(recorded["system"], nvmlDeviceGetCount=1)
    return {"format": recorded["format"], "system": system, "devices": [device]}


def vm_snapshot(tmp_path: Path, *, links: list[int] | None = None, fabric_state: int = 3, fabric_status: int = 0,
                nvswitch: bool = False) -> Path:
    """A VM given GPU 0 of an HGX H100 (00:19.0) and one ConnectX-7 VF; Fabric Manager not running in it."""
    snap = tmp_path / "vm"
    files: dict[str, str] = {
        "meta.yaml": "hostname: vm-h100-1g\ncaptured_at: '2026-11-20T08:00:00+00:00'\ncaptured: [host, kmsg, nvml]\n",
        "kmsg.txt": "6,1,0,-;Linux version 6.8.0 (gcc) #1 SMP\n",
        "nvml.json": json.dumps(_gpu0(links, fabric_state, fabric_status)),
        "fs/proc/sys/kernel/hostname": "vm-h100-1g\n",
        "fs/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07\n",
        "fs/proc/modules": "nvidia 1 0 - Live 0x0\nmlx5_ib 1 0 - Live 0x0\n",
        "fs/sys/class/dmi/id/sys_vendor": "QEMU\n",
        "fs/sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n",
        # systemd's cgroup tree is there and has no nvidia-fabricmanager.service: the service is not running
        "fs/sys/fs/cgroup/system.slice/": "",
        "fs/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/device": "0x29c0\n",
        "fs/sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
        "fs/sys/bus/pci/devices/0000:19:00.0/vendor": "0x10de\n",
        "fs/sys/bus/pci/devices/0000:19:00.0/device": "0x2330\n",
        "fs/sys/bus/pci/devices/0000:19:00.0/class": "0x030200\n",
        "fs/sys/class/infiniband/mlx5_0/hca_type": "MT4126\n",
        "fs/sys/class/infiniband/mlx5_0/fw_ver": "28.39.1002\n",
        "fs/sys/class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE\n",
        "fs/sys/class/infiniband/mlx5_0/ports/1/phys_state": "5: LinkUp\n",
        "fs/sys/class/infiniband/mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n",
        "fs/sys/class/infiniband/mlx5_0/ports/1/link_layer": "InfiniBand\n",
    }
    if nvswitch:  # bare metal: the board's NVSwitches are on PCI
        files.update({"fs/sys/bus/pci/devices/0000:83:00.0/vendor": "0x10de\n",
                      "fs/sys/bus/pci/devices/0000:83:00.0/device": "0x22a3\n",
                      "fs/sys/bus/pci/devices/0000:83:00.0/class": "0x068000\n"})
    write_tree(snap, files)
    return snap


def board_findings(run_cli: RunCli, snap: Path, config: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--profile", "hgx-h100-sxm",
                     "--format", "json")
    assert result.stdout, result.stderr
    return {(f["check"], f["subject"]): f for f in result.json()["findings"] if f["check"] in BOARD_CHECKS}


def test_a_vm_with_one_sxm_gpu_skips_the_board_level_checks(run_cli: RunCli, tmp_path: Path,
                                                            empty_config: Path) -> None:
    snap = vm_snapshot(tmp_path, links=[0] * 18, fabric_state=2)  # no link trained, registration in progress
    found = board_findings(run_cli, snap, empty_config)
    assert set(found) == {("fabric.manager", "nvidia-fabricmanager"), ("ib.hca.count", "node"),
                          ("gpu.nvlink.links", "gpu0"), ("gpu.fabric", "gpu0")}
    for key, finding in found.items():
        assert finding["status"] == "skip", (key, finding)
        assert "a partial view: 1 of the board's 8 GPUs are visible; board-level checks need the whole board" \
            in finding["message"], finding
    assert found[("fabric.manager", "nvidia-fabricmanager")]["observed"] == "inactive"
    assert found[("ib.hca.count", "node")]["observed"] == 1 and found[("ib.hca.count", "node")]["expected"] == 8
    assert "0 active NVLink(s) of 18" in found[("gpu.nvlink.links", "gpu0")]["message"]
    assert "fabric state is in_progress" in found[("gpu.fabric", "gpu0")]["message"]


def test_fabric_managers_log_is_not_asked_of_a_partial_view(run_cli: RunCli, tmp_path: Path,
                                                            empty_config: Path) -> None:
    """The VM holds no /var/log/fabricmanager.log: the hypervisor's Fabric Manager writes it, so `skip`."""
    result = run_cli("audit", "--snapshot", str(vm_snapshot(tmp_path)), "--config", str(empty_config),
                     "--format", "json", "--only", "fabric.sxid")
    (log,) = [f for f in result.json()["findings"] if f["subject"] == "fabricmanager.log"]
    assert log["status"] == "skip" and "a partial view" in log["message"]


def test_a_vm_whose_gpu_reports_no_nvlink_at_all_skips_too(run_cli: RunCli, tmp_path: Path,
                                                           empty_config: Path) -> None:
    """The hypervisor hid the NVLinks (NVML reports none): a skip (the recording says so), never a fail."""
    found = board_findings(run_cli, vm_snapshot(tmp_path, links=None), empty_config)
    assert found[("gpu.nvlink.links", "gpu0")]["status"] == "skip"
    assert found[("gpu.fabric", "gpu0")]["status"] == "pass"  # completed, success: the GPU's own good word


def test_what_the_visible_gpu_reports_is_still_a_finding(run_cli: RunCli, tmp_path: Path,
                                                         empty_config: Path) -> None:
    """17 links up and link 5 down: the GPU is on a fabric and one of its links failed. A registration
    that completed with an error is the GPU's own failure. Both are findings on gpu0 in any view."""
    links = [1] * 18
    links[5] = 0
    snap = vm_snapshot(tmp_path, links=links, fabric_state=3, fabric_status=999)  # NVML_ERROR_UNKNOWN
    found = board_findings(run_cli, snap, empty_config)
    nvlink = found[("gpu.nvlink.links", "gpu0")]
    assert (nvlink["status"], nvlink["severity"], nvlink["observed"]) == ("fail", "critical", 17)
    assert "links down: 5" in nvlink["message"]
    fabric = found[("gpu.fabric", "gpu0")]
    assert fabric["status"] == "fail" and "fabric status" in fabric["message"]
    # ... while the board's own expectations still skip
    assert found[("fabric.manager", "nvidia-fabricmanager")]["status"] == "skip"
    assert found[("ib.hca.count", "node")]["status"] == "skip"


def test_a_healthy_gpu_in_a_partial_view_passes(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    found = board_findings(run_cli, vm_snapshot(tmp_path, links=[1] * 18), empty_config)
    assert found[("gpu.nvlink.links", "gpu0")]["status"] == "pass"
    assert found[("gpu.fabric", "gpu0")]["status"] == "pass"


@pytest.mark.parametrize("check", BOARD_CHECKS)
def test_the_same_gpu_on_the_whole_board_is_judged(run_cli: RunCli, tmp_path: Path, empty_config: Path,
                                                   check: str) -> None:
    """An NVSwitch on PCI shows the whole board: the board-level expectations fail as critical again."""
    snap = vm_snapshot(tmp_path, links=[0] * 18, fabric_state=2, nvswitch=True)
    failed = [f for f in board_findings(run_cli, snap, empty_config).values() if f["check"] == check]
    assert [(f["status"], f["severity"]) for f in failed] == [("fail", "critical")], failed
