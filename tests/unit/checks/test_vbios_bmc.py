"""Issue 13 rule 4 (second half): a VBIOS mismatch across the node's GPUs, from the BMC too.

`gpu.firmware.vbios` names the GPUs whose VBIOS differs from the rest of their model. NVML is its
first view; in a BMC-only audit (`audit --snapshot DIR` with `redfish/` and meta.yaml, as
tests/oracle/test_corpus.py audits Redfish trees) it reads the BMC's: the GPU Processors' FirmwareVersion
(HGX baseboards), else the firmware inventory's GPU entries (HGX_FW_GPU_SXM_N linked by RelatedItem;
HPE names the entry after the GPU model and says its slot). ERoT and InfoROM images are not VBIOS.

Real trees from fixtures/redfish are copied and one GPU's version altered. On the code before this
change the check did not run at all without NVML: none of these audits had a gpu.firmware.vbios finding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import REPO, RunCli
from tests.factories import edit_resource, plant_firmware_inventory

TREES = REPO / "fixtures" / "redfish"
HPE = "hpe-dl380a-gen11"  # iLO 6, 2x H100 NVL: VBIOS in UpdateService/FirmwareInventory/21 and /22
HGX = "gpu_info_unknown_multi"  # Supermicro with an HGX B200 baseboard: Systems/HGX_Baseboard_0/Processors/GPU_SXM_N
PROCESSORS = "redfish/v1/Systems/HGX_Baseboard_0/Processors"


def bmc_snapshot(tmp_path: Path, tree: str) -> Path:
    snap = tmp_path / "snap"
    shutil.copytree(TREES / tree / "redfish", snap / "redfish")
    (snap / "meta.yaml").write_text("hostname: bmc\ncaptured_at: '2026-01-01T00:00:00+00:00'\n"
                                    "nodewarden_version: test\ncaptured: [redfish]\n", encoding="utf-8")
    return snap


edit = edit_resource  # one resource's fields set, the file replaced (never written through a link)


def vbios(run_cli: RunCli, snap: Path, config: Path) -> dict[str, dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", "json")
    assert result.stdout, result.stderr
    return {f["subject"]: f for f in result.json()["findings"] if f["check"] == "gpu.firmware.vbios"}


def test_hpe_inventory_gpus_on_one_vbios_pass(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    found = vbios(run_cli, bmc_snapshot(tmp_path, HPE), empty_config)
    assert {s: (f["status"], f["observed"], f["source"]) for s, f in found.items()} == {
        "NVIDIA H100 NVL [PCI-E Slot 14]": ("pass", "96.00.AF.00.02", "redfish"),
        "NVIDIA H100 NVL [PCI-E Slot 16]": ("pass", "96.00.AF.00.02", "redfish"),
    }


def test_hpe_two_gpus_on_two_vbioses_are_both_named(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    """Two GPUs, two versions: no majority says which is odd, so both are findings."""
    snap = bmc_snapshot(tmp_path, HPE)
    edit(snap, "redfish/v1/UpdateService/FirmwareInventory/22", Version="96.00.AF.00.01")
    found = vbios(run_cli, snap, empty_config)
    assert {s: f["status"] for s, f in found.items()} == {"NVIDIA H100 NVL [PCI-E Slot 14]": "fail",
                                                         "NVIDIA H100 NVL [PCI-E Slot 16]": "fail"}
    odd = found["NVIDIA H100 NVL [PCI-E Slot 16]"]
    assert odd["action"] == "update_firmware" and odd["observed"] == "96.00.AF.00.01"
    assert "no majority (96.00.AF.00.01 on 1, 96.00.AF.00.02 on 1)" in odd["message"]


def _eight_hgx_gpus(snap: Path, versions: list[str]) -> None:
    """The tree's two B200 Processors, made the baseboard's eight (copies of GPU_SXM_2), with FirmwareVersion."""
    template = json.loads((snap / PROCESSORS / "GPU_SXM_2" / "index.json").read_text(encoding="utf-8"))
    members = [{"@odata.id": f"/{PROCESSORS}/FPGA_0"}]
    for n, version in enumerate(versions, start=1):
        gpu = f"GPU_SXM_{n}"
        doc = json.loads((snap / PROCESSORS / gpu / "index.json").read_text(encoding="utf-8")) if n <= 2 else \
            json.loads(json.dumps(template).replace("GPU_SXM_2", gpu).replace("SXM2", f"SXM{n}"))
        doc["FirmwareVersion"] = version
        (snap / PROCESSORS / gpu).mkdir(exist_ok=True)
        (snap / PROCESSORS / gpu / "index.json").write_text(json.dumps(doc), encoding="utf-8")
        members.append({"@odata.id": f"/{PROCESSORS}/{gpu}"})
    edit(snap, PROCESSORS, Members=members, **{"Members@odata.count": len(members)})


def test_hgx_baseboard_names_the_one_odd_gpu(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    snap = bmc_snapshot(tmp_path, HGX)
    _eight_hgx_gpus(snap, ["97.00.82.00.0F"] * 5 + ["97.00.82.00.0E"] + ["97.00.82.00.0F"] * 2)
    found = vbios(run_cli, snap, empty_config)
    assert sorted(found) == [f"GPU_SXM_{n}" for n in range(1, 9)]
    assert [s for s, f in found.items() if f["status"] != "pass"] == ["GPU_SXM_6"]
    odd = found["GPU_SXM_6"]
    assert (odd["status"], odd["severity"], odd["action"], odd["source"]) == ("fail", "warning", "update_firmware",
                                                                            "redfish")
    assert "GPU_SXM_6 (SXM6, BMC) VBIOS 97.00.82.00.0E differs from 97.00.82.00.0F on 7 other B200 180GB HBM3e" \
        in odd["message"]


def test_hgx_firmware_inventory_gpu_images_not_erot_or_inforom(run_cli: RunCli, tmp_path: Path,
                                                               empty_config: Path) -> None:
    """No FirmwareVersion on the Processors: HGX_FW_GPU_SXM_N, linked to its GPU, is the VBIOS."""
    snap = bmc_snapshot(tmp_path, HGX)
    images = {"HGX_FW_GPU_SXM_1": ("97.00.82.00.0F", "GPU_SXM_1"), "HGX_FW_GPU_SXM_2": ("97.00.82.00.0E", "GPU_SXM_2"),
              "HGX_FW_ERoT_GPU_SXM_1": ("01.03.0250.0000_n04", "GPU_SXM_1"),
              "HGX_InfoROM_GPU_SXM_1": ("G525.0220.00.01", "GPU_SXM_1")}
    plant_firmware_inventory(snap, images, PROCESSORS, name="Software Inventory")
    found = vbios(run_cli, snap, empty_config)
    assert {s: (f["status"], f["observed"]) for s, f in found.items()} == {
        "GPU_SXM_1": ("fail", "97.00.82.00.0F"), "GPU_SXM_2": ("fail", "97.00.82.00.0E")}
    assert "B200 180GB HBM3e GPUs run 2 versions with no majority" in found["GPU_SXM_2"]["message"]
