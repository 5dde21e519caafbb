"""An imported snapshot holds only the host parts its inputs describe (issue 15, 2): whatever no
input provided is "not in this snapshot" (`skip`), never a `fail` because a file is absent."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO, RunCli

LSPCI = REPO / "fixtures" / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt"


def test_an_lspci_alone_judges_pci_and_skips_the_rest(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    out = tmp_path / "snap"
    assert run_cli("snapshot", "import", str(LSPCI), "--out", str(out)).code == 0
    assert yaml.safe_load((out / "meta.yaml").read_text())["host_parts"] == ["pci", "pci_links"]  # -vvv has LnkSta
    result = run_cli("audit", "--snapshot", str(out), "--config", str(empty_config), "--format", "json")
    report = result.json()
    assert result.code == 0, [f for f in report["findings"] if f["status"] == "fail"]
    by = {(f["check"], f["subject"]): f for f in report["findings"]}
    for key in [("host.thp.enabled", "node"), ("ib.hca.count", "node")]:
        found = [f for k, f in by.items() if k[0] == key[0]]
        assert found and all(f["status"] == "skip" and "not in this snapshot" in f["message"] for f in found), found
    assert any(f["check"] == "pcie.link" and f["status"] in ("pass", "warn") for f in report["findings"])
