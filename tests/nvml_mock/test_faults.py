"""Faults through the real NVML ABI reach the right finding with the right action (issue 23, item 3).

The mock answers through the same C calls a driver does: a lost GPU is NVML_ERROR_GPU_IS_LOST from
its next call, an unsupported counter NVML_ERROR_NOT_SUPPORTED, ECC/power/throttle/PCIe/NVLink/fabric
are the values the getters return. Per-device PCIe values only take in the overrides file (a map by
index); a config's `devices:` entries ignore a `pcie:` block.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_mock.conftest import audit, bad, device, findings, mock_config, write_config

pytestmark = pytest.mark.nvml_mock


def faulty(doc: dict[str, Any]) -> None:
    """One GPU per fault on an HGX H100 (gpu0 carries the two fabric-side ones)."""
    defaults = doc["device_defaults"]
    device(doc, 1)["failure"] = {"mode": "lost"}
    device(doc, 3)["failure"] = {"mode": "fallen_off_bus"}
    device(doc, 5)["failure"] = {"mode": "ecc_uncorrectable", "xid": {"code": 48}}
    device(doc, 6)["ecc"] = dict(copy.deepcopy(defaults["ecc"]), mode_current="disabled", mode_pending="disabled")
    device(doc, 2)["power"] = dict(copy.deepcopy(defaults["power"]), enforced_limit_mw=500_000)
    device(doc, 4)["clocks_throttle_reasons"] = dict(defaults["clocks_throttle_reasons"], gpu_idle=False,
                                                     hw_thermal_slowdown=True)
    device(doc, 0)["fabric"] = dict(defaults["fabric"], state="in_progress")
    doc["nvlink"]["device_links"] = [{"index": 0, "links": [{"link": i, "state": "inactive" if i < 4 else "active"}
                                                            for i in range(18)]}]


def test_each_fault_reaches_its_finding_with_its_action(tmp_path: Path) -> None:
    overrides = write_config(tmp_path / "overrides.yaml",
                             {"devices": {"7": {"pcie": {"current_link_gen": 3, "current_link_width": 8}}}})
    report = audit(mock_config(tmp_path, "h100", faulty), overrides=overrides)
    got = {(f["check"], f["subject"]): (f["status"], f["severity"], f["action"]) for f in report["findings"]
           if f["status"] not in ("pass", "skip") and f["check"] != "crosscheck.gpu_views"}
    assert got == {
        ("gpu.lost", "gpu1"): ("fail", "critical", "drain"),
        ("gpu.lost", "gpu3"): ("fail", "critical", "drain"),
        ("gpu.ecc.uncorrected", "gpu5"): ("fail", "critical", "reset_gpu"),
        ("gpu.row_remap", "gpu5"): ("fail", "critical", "contact_support"),  # the mock's ECC mode also fails a remap
        ("gpu.ecc.mode", "gpu6"): ("fail", "critical", "reboot"),
        ("gpu.power.limit", "gpu2"): ("fail", "warning", None),  # remediable: `remediation` names the fix
        ("gpu.clocks.events", "gpu4"): ("fail", "critical", "check_cooling"),
        ("gpu.pcie.link", "gpu7"): ("fail", "warning", "reseat_or_contact_support"),
        ("gpu.nvlink.links", "gpu0"): ("fail", "critical", "reset_gpu"),
        ("gpu.fabric", "gpu0"): ("fail", "critical", "check_fabric_manager"),
    }
    assert findings(report, "gpu.power.limit")["gpu2"]["remediation"] == "gpu_power_limit"
    assert findings(report, "gpu.nvlink.links")["gpu0"]["observed"] == 14
    assert "GPU is lost" in findings(report, "gpu.lost")["gpu1"]["message"]


def test_fallen_off_bus_mid_read_loses_that_gpu_only(tmp_path: Path) -> None:
    """`after_calls` trips GPU 3 in the middle of its own read: it is lost, the seven others are whole."""
    def edit(doc: dict[str, Any]) -> None:
        device(doc, 3)["failure"] = {"mode": "fallen_off_bus", "after_calls": 12}

    report = audit(mock_config(tmp_path, "h100", edit))
    lost = {s: f for s, f in findings(report, "gpu.lost").items() if f["status"] == "fail"}
    assert set(lost) == {"gpu3"} and lost["gpu3"]["action"] == "drain"
    assert "nvmlDeviceGetHandleByIndex" not in lost["gpu3"]["message"]  # tripped mid-read, not at the handle
    assert bad(report) - {("crosscheck.gpu_views", "node", "warn")} == {("gpu.lost", "gpu3", "fail")}
    temperature = findings(report, "gpu.temperature")
    assert {s for s, f in temperature.items() if f["status"] == "pass"} == {f"gpu{i}" for i in range(8) if i != 3}


def test_not_supported_is_a_skip_saying_so(tmp_path: Path) -> None:
    """NVML_ERROR_NOT_SUPPORTED from the ABI (the mock has no recovery-action field): skip, with the reason."""
    recovery = findings(audit(mock_config(tmp_path, "h100")), "gpu.recovery_action")
    assert {f["status"] for f in recovery.values()} == {"skip"} and len(recovery) == 8
    assert "not supported by this GPU or driver" in recovery["gpu0"]["message"]


def test_default_power_limit_of_zero_is_not_a_pass(tmp_path: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["device_defaults"]["power"]["default_limit_mw"] = 0

    limit = findings(audit(mock_config(tmp_path, "h100", edit)), "gpu.power.limit")
    assert {f["status"] for f in limit.values()} == {"unknown"}
    assert "0 W" in limit["gpu0"]["message"]
