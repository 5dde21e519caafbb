"""Issue 13, "Judgements operators can trust": oracle disagreements that were product bugs.

* A Tesla V100-PCIE (10de:1db4, the azhpc-diagnostics dump) is a data-centre PCIe board: nvidia-pcie
  judges it by its PCI id, V100 SXM2/SXM3/DGXS ids and consumer cards are not caught.
* A link that flaps is a `bmc.events` warning even when every entry is OK and repaired (the HPE
  DL360 Gen10 Plus tree: ~25 "Connectivity status changed to OK" IML entries per port in a week),
  one finding per log and message id, naming the ports and their counts.
* A node without GPUs (no-nvidia-gpu) is not judged on the GPU fleet's BIOS performance settings.
* `firmware.consistency` leaves GPU VBIOS to `gpu.firmware.vbios`: one mixed VBIOS, one fault.

On the code before this change: the V100 dump fell back to generic-nvidia (profile.match warn); the
DL360 tree had no link finding and failed bios.attribute on three HPE power settings; a mixed H100
NVL VBIOS on the DL380a Gen11 tree also failed firmware.consistency ("nvidia h100 nvl|10de2321..."),
and mixed HGX_FW_GPU_SXM_N images failed it as group "hgx_fw_gpu_sxm_#".
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts, BmcGpu, BmcLogEntry, FirmwareItem
from agent.core.model import Finding, SourceStatus, Status
from agent.policy.matching import Identity, identify_bmc, select
from agent.policy.profiles import ProfileStore
from checks.bmc_events import EVENTS, LINK_FLAPS_MAX
from checks.bmc_firmware import CONSISTENCY, is_gpu_vbios_image
from tests.conftest import REPO, RunCli
from tests.factories import edit_resource, nvml_node, plant_firmware_inventory
from tests.oracle.test_corpus import _redfish_snapshot as redfish_snapshot

FIXTURES = REPO / "fixtures"
V100_DUMP = FIXTURES / "nvidia-smi" / "azhpc-diagnostics" / "nvidia-smi-q.4xV100-PCIE-16GB.txt"
DL360 = FIXTURES / "redfish" / "hpe-ilo5-dl360-gen10plus"
DL380A = FIXTURES / "redfish" / "hpe-dl380a-gen11"  # 2x H100 NVL, VBIOS in FirmwareInventory/21 and /22
HGX = FIXTURES / "redfish" / "gpu_info_unknown_multi"  # HGX B200 baseboard behind a Supermicro BMC
NOW = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.timezone.utc)


def bmc_snapshot(tmp_path: Path, tree: Path, when: str) -> Path:
    """A BMC-only snapshot of a recorded Redfish tree, built the way the oracle (tests/oracle/test_corpus.py)
    builds it: collections the mockup held back are rebuilt from their members."""
    snap = tmp_path / "snap"
    redfish_snapshot(tree, snap, when)
    return snap


def audit(run_cli: RunCli, snap: Path, config: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", "json", *extra)
    assert result.stdout, result.stderr
    return result.code, result.json()


def findings_of(report: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"] if f["check"] == check}


edit = edit_resource  # one resource's fields set, the file replaced (never written through a link)


# --- V100 PCIe is judged by nvidia-pcie --------------------------------------------------------------------


def test_the_v100_pcie_dump_is_judged_by_nvidia_pcie(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    imported = run_cli("snapshot", "import-nvidia-smi", str(V100_DUMP), "--out", str(tmp_path / "snap"))
    assert imported.code == 0, imported.stderr
    _code, report = audit(run_cli, tmp_path / "snap", empty_config)
    assert report["profile"] == "nvidia-pcie"
    match = findings_of(report, "profile.match")["node"]
    assert match["status"] == "pass" and "gpu_pci_ids=10de:1db4" in match["message"]


def ids(*pci_ids: str) -> Identity:
    return Identity(pci_ids, len(pci_ids), {})


@pytest.mark.parametrize(("pci_ids", "profile"), [
    (("10de:1db4",) * 4, "nvidia-pcie"),  # Tesla V100 PCIe 16GB (the azhpc dump)
    (("10de:1db6",), "nvidia-pcie"),  # V100 PCIe 32GB
    (("10de:1df6",), "nvidia-pcie"),  # V100S PCIe 32GB
    (("10de:1db4", "10de:1eb8"), "nvidia-pcie"),  # a V100 and a T4: both PCIe boards
    (("10de:1db1",) * 8, "generic-nvidia"),  # V100 SXM2 16GB (DGX-1): not a PCIe board
    (("10de:1db5",) * 8, "generic-nvidia"),  # V100 SXM2 32GB
    (("10de:1db8",) * 16, "generic-nvidia"),  # V100 SXM3 32GB (DGX-2)
    (("10de:1db4", "10de:1db5"), "generic-nvidia"),  # PCIe and SXM mixed: no one profile fits
    (("10de:2684",), "nvidia-geforce"),  # RTX 4090 stays a consumer card
])
def test_pcie_matching_is_exact(pci_ids: tuple[str, ...], profile: str) -> None:
    assert select(ids(*pci_ids), ProfileStore()).profile.name == profile


def test_a_bmc_naming_v100_pcie_boards_matches_nvidia_pcie() -> None:
    bmc = BmcFacts(protocol="redfish", gpus=tuple(BmcGpu(f"GPU{i}", "Tesla V100-PCIE-16GB", None, None, "Enabled",
                                                         "OK") for i in range(4)))
    identity = identify_bmc(bmc)
    assert identity.gpu_pci_ids == ("10de:1db4",) * 4
    assert select(identity, ProfileStore()).profile.name == "nvidia-pcie"


# --- a flapping link is a warning even when every entry recovered -----------------------------------------


def test_the_dl360s_flapping_25gbe_ports_are_one_warning_per_log(run_cli: RunCli, tmp_path: Path,
                                                                   empty_config: Path) -> None:
    _code, report = audit(run_cli, bmc_snapshot(tmp_path, DL360, "2025-05-29T09:00:00+00:00"), empty_config)
    events = findings_of(report, "bmc.events")
    iml, event = events["IML:17.10"], events["Event:iLOEvents.3.15.NicConnectivityRestored"]
    for finding in (iml, event):
        assert (finding["status"], finding["severity"], finding["action"]) == ("warn", "warning", "check_bmc_events")
        assert "link flapping: 2 component(s)" in finding["message"]
    assert sorted(iml["observed"].values()) == [25, 25]
    assert "slot 1, port 1' x25" in iml["message"] and "slot 1, port 2' x25" in iml["message"]
    assert event["observed"] == {"NicConnectivityRestored(1, 1)": 17, "NicConnectivityRestored(1, 2)": 17}
    # The other OK recoveries of the window (Volume 1 back to OK x4, discovery, POST) are no finding.
    assert not [s for s in events if "19.33" in s or "DeviceDiscovery" in s or "Post" in s]


def link_up(entry_id: int, port: int, when: dt.datetime, log: str = "Lclog") -> BmcLogEntry:
    return BmcLogEntry(log, str(entry_id), "OK", f"The network link for NIC.Slot.3-{port} is up.",
                       when.isoformat(), "NIC101", resolved=None)


def run_events(entries: list[BmcLogEntry]) -> dict[str, Finding]:
    facts = nvml_node()
    facts.bmc = BmcFacts(protocol="redfish", events=tuple(entries))
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    facts.observed_at = NOW
    return {f.subject: f for f in EVENTS.run(facts, ProfileStore().profile("generic-nvidia"))}


def test_more_than_the_limit_for_one_port_warns_and_the_series_does_not_grow() -> None:
    hours = [NOW - dt.timedelta(hours=h) for h in range(1, LINK_FLAPS_MAX + 3)]
    at_limit = run_events([link_up(n, 1, when) for n, when in enumerate(hours[:LINK_FLAPS_MAX])])
    assert set(at_limit) == {"log"} and at_limit["log"].status is Status.PASS
    over = run_events([link_up(n, 1, when) for n, when in enumerate(hours[:LINK_FLAPS_MAX + 1])])
    assert over["Lclog:NIC101"].status is Status.WARN
    assert over["Lclog:NIC101"].observed == {"The network link for NIC.Slot.3-1 is up.": LINK_FLAPS_MAX + 1}
    more = run_events([link_up(n + 100, 1, when) for n, when in enumerate(hours)])
    assert set(more) == set(over)  # a new entry raises the count, never adds a subject


def test_flaps_are_counted_per_component_and_inside_the_window() -> None:
    spread = [link_up(n, 1 + n % 2, NOW - dt.timedelta(hours=n + 1)) for n in range(LINK_FLAPS_MAX + 2)]
    assert "Lclog:NIC101" not in run_events(spread)  # 6 on each of two ports is not one port flapping
    old = [link_up(n, 1, NOW - dt.timedelta(days=30, hours=n)) for n in range(LINK_FLAPS_MAX * 3)]
    assert "Lclog:NIC101" not in run_events(old)  # history outside the window


def test_an_open_link_down_warning_stays_its_own_finding() -> None:
    downs = [BmcLogEntry("Lclog", str(n), "Warning", "The network link for NIC.Slot.3-1 is down.",
                         (NOW - dt.timedelta(hours=n + 1)).isoformat(), "NIC100") for n in range(LINK_FLAPS_MAX + 2)]
    found = run_events(downs)
    assert set(found) == {"Lclog:NIC100"}  # counted once, by the open-entry rule, with its count
    assert found["Lclog:NIC100"].observed == LINK_FLAPS_MAX + 2


# --- no GPU, no GPU-node BIOS tuning ------------------------------------------------------------------------


def test_a_node_without_gpus_is_not_judged_on_gpu_bios_tuning(run_cli: RunCli, tmp_path: Path,
                                                              empty_config: Path) -> None:
    snap = bmc_snapshot(tmp_path, DL360, "2025-05-29T09:00:00+00:00")
    code, report = audit(run_cli, snap, empty_config)
    assert report["profile"] == "no-nvidia-gpu" and code == 0
    assert findings_of(report, "bios.attribute") == {}
    # The same BMC judged as a GPU node (forced) still gets them: the rule is the profile's, not the BMC's.
    _code, forced = audit(run_cli, snap, empty_config, "--profile", "generic-nvidia")
    bios = findings_of(forced, "bios.attribute")
    assert {s: f["status"] for s, f in bios.items()} == {
        "MinProcIdlePower": "fail", "PowerRegulator": "fail", "WorkloadProfile": "fail"}


def test_no_nvidia_gpu_drops_every_bios_attribute() -> None:
    store = ProfileStore()
    assert store.profile("no-nvidia-gpu").expectations_under("bios", "attributes", "HPE") == {}
    assert store.profile("generic-nvidia").expectations_under("bios", "attributes", "HPE")


# --- one mixed VBIOS, one fault -------------------------------------------------------------------------------


def test_mixed_h100_nvl_vbios_is_gpu_firmware_vbioss_alone(run_cli: RunCli, tmp_path: Path,
                                                           empty_config: Path) -> None:
    snap = bmc_snapshot(tmp_path, DL380A, "2026-01-01T00:00:00+00:00")
    edit(snap, "redfish/v1/UpdateService/FirmwareInventory/22", Version="96.00.AF.00.01")
    _code, report = audit(run_cli, snap, empty_config)
    vbios = findings_of(report, "gpu.firmware.vbios")
    assert {f["status"] for f in vbios.values()} == {"fail"} and len(vbios) == 2
    consistency = findings_of(report, "firmware.consistency")
    assert consistency and not [s for s in consistency if "nvidia" in s or "10de" in s]
    assert {f["status"] for f in consistency.values()} == {"pass"}  # the drives, PSUs, CPUs still compared


def test_hgx_gpu_images_are_left_out_but_their_erot_is_compared(run_cli: RunCli, tmp_path: Path,
                                                               empty_config: Path) -> None:
    snap = bmc_snapshot(tmp_path, HGX, "2026-01-01T00:00:00+00:00")
    processors = "redfish/v1/Systems/HGX_Baseboard_0/Processors"
    images = {"HGX_FW_GPU_SXM_1": ("97.00.82.00.0F", "GPU_SXM_1"), "HGX_FW_GPU_SXM_2": ("97.00.82.00.0E", "GPU_SXM_2"),
              "HGX_FW_ERoT_GPU_SXM_1": ("01.03.0250.0000_n04", "GPU_SXM_1"),
              "HGX_FW_ERoT_GPU_SXM_2": ("01.03.0240.0000_n04", "GPU_SXM_2")}
    plant_firmware_inventory(snap, images, processors)
    _code, report = audit(run_cli, snap, empty_config)
    assert {s: f["status"] for s, f in findings_of(report, "gpu.firmware.vbios").items()} == {
        "GPU_SXM_1": "fail", "GPU_SXM_2": "fail"}
    consistency = findings_of(report, "firmware.consistency")
    assert {s: f["status"] for s, f in consistency.items()} == {"hgx_fw_erot_gpu_sxm_#|b200 180gb hbm3e": "fail"}


def test_what_counts_as_a_gpu_vbios_image() -> None:
    assert is_gpu_vbios_image(FirmwareItem("Software Inventory", "97.00.82.00.0F", "HGX_FW_GPU_SXM_3"))
    assert is_gpu_vbios_image(FirmwareItem("HGX_FW_GPU_0", "97.00.82.00.0F", "HGX_FW_GPU_0"))  # GB200
    assert is_gpu_vbios_image(FirmwareItem("NVIDIA H100 NVL", "96.00.AF.00.02", "21"))  # HPE: named after the GPU
    assert is_gpu_vbios_image(FirmwareItem("GPU", "96.00.AF.00.02", "22", software_id="10de232110de1839"))
    for other in (FirmwareItem("x", "1", "HGX_FW_ERoT_GPU_SXM_1"), FirmwareItem("x", "1", "HGX_InfoROM_GPU_SXM_1"),
                  FirmwareItem("NVSwitch", "1", "HGX_FW_NVSwitch_0", software_id="10de22a3"),
                  FirmwareItem("ConnectX-7", "28.39.1002", "9", software_id="15b31021")):
        assert not is_gpu_vbios_image(other), other
    # The check itself: the GPU Processors' FirmwareVersion is not grouped here either.
    facts = nvml_node()
    facts.bmc = BmcFacts(protocol="redfish", firmware=(FirmwareItem("PSU 1", "1.0", "PSU.Slot.1"),),
                         gpus=(BmcGpu("GPU1", "NVIDIA H100 80GB HBM3", "96.00.74.00.0D", None, "Enabled", "OK"),
                               BmcGpu("GPU2", "NVIDIA H100 80GB HBM3", "96.00.74.00.0E", None, "Enabled", "OK")))
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    assert CONSISTENCY.run(facts, ProfileStore().profile("hgx-h100-sxm")) == []
