"""Issue 31.6: the GPU's own word beats a stale id, on the real NVML ABI. NVIDIA's mock gives its GB200 the
H100's PCI id (0x2330) and its B200 an id nodewarden does not know (0x2340); NVML's name and
architecture say Blackwell. The profile follows the GPU (a GB200 tray, an HGX B200), and a state
finding says which id was overruled; a GPU whose id and name agree (the stock H100) says nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.nvml_mock.conftest import audit, mock_config

pytestmark = pytest.mark.nvml_mock




def identity_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == "profile.match" and f["subject"] == "gpu identity"]


@pytest.mark.parametrize(("name", "profile", "said"), [
    ("gb200", "gb200-nvl-tray", "PCI id 10de:2330 is an NVIDIA H100 80GB HBM3 (Hopper), the GPU says 'NVIDIA GB200'"),
    ("b200", "hgx-b200", "PCI id 10de:2340 is no model nodewarden knows, the GPU says 'NVIDIA B200'"),
])
def test_the_profile_follows_the_gpus_own_report(tmp_path: Path, name: str, profile: str, said: str) -> None:
    def placeholder(doc: dict[str, Any]) -> None:  # back to the id the mock's own config file gives
        shipped = (Path(__file__).resolve().parents[3] / "shared/peers/nvml-mock/configs" / f"{name}.yaml")
        import yaml
        doc["device_defaults"]["pci"]["device_id"] = yaml.safe_load(shipped.read_text())["device_defaults"]["pci"][
            "device_id"]

    report = audit(mock_config(tmp_path, name, placeholder), checks=("--only", "profile.match"))
    assert report["profile"] == profile, report["profile"]
    [finding] = identity_findings(report)
    assert finding["status"] == "warn" and said in finding["message"], finding["message"]


def test_an_id_and_a_name_that_agree_say_nothing(tmp_path: Path) -> None:
    report = audit(mock_config(tmp_path, "h100"), checks=("--only", "profile.match"))
    assert report["profile"] == "hgx-h100-sxm" and identity_findings(report) == []
