"""Every stock mock config through the live NVML path: its model's profile, no critical (issue 23, items 1-2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nvml_mock.conftest import EXPECTED_PROFILE, STOCK, TRAY_GPUS, audit, findings, mock_config

pytestmark = pytest.mark.nvml_mock


@pytest.mark.parametrize("name", STOCK)
def test_stock_config_matches_its_profile_and_has_no_critical(tmp_path: Path, name: str) -> None:
    report = audit(mock_config(tmp_path, name))
    assert report["sources"]["nvml"]["ok"], report["sources"]["nvml"]
    assert report["profile"] == EXPECTED_PROFILE[name]
    critical = [f for f in report["findings"] if f["severity"] == "critical" and f["status"] in ("fail", "warn",
                                                                                               "unknown")]
    assert critical == []
    assert report["sources"]["nvml"]["gpu_count"] == (TRAY_GPUS if name in ("gb200", "gb300")
                                                               else 4 if name == "t4" else 8)


def test_b200_driver_560_is_older_than_blackwell_needs(tmp_path: Path) -> None:
    """The mock's B200 reports driver 560: a warning, not a critical, and not a pass."""
    driver = findings(audit(mock_config(tmp_path, "b200")), "gpu.driver")["node"]
    assert (driver["status"], driver["severity"]) == ("fail", "warning")
    assert "560.35.03" in driver["message"]
