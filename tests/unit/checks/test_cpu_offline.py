"""Issue 31.5: offline CPUs are a finding (the node runs on fewer cores than it has), judged through the
real CLI on a copy of a simulated node; SMT switched off explains its siblings; not recorded, nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, RunCli

NODE = REPO / "fixtures" / "nodes" / "hgx-h100-healthy"
CPU = "fs/sys/devices/system/cpu"


def offline_findings(run_cli: RunCli, tmp_path: Path, offline: str | None, smt: str | None = None) -> list[dict]:
    snap = tmp_path / "node"
    shutil.copytree(NODE, snap, symlinks=True)
    if offline is not None:
        (snap / CPU / "offline").write_text(offline + "\n")
    if smt is not None:
        (snap / CPU / "smt").mkdir(exist_ok=True)
        (snap / CPU / "smt" / "control").write_text(smt + "\n")
    result = run_cli("audit", "--snapshot", str(snap), "--format", "json", "--only", "host.cpu.*")
    assert result.code in (0, 1), result.stderr
    return [f for f in json.loads(result.stdout)["findings"] if f["check"] == "host.cpu.offline"]


@pytest.mark.parametrize(("offline", "smt", "status"), [
    ("", None, "pass"), ("96-103", None, "warn"), ("112-223", "off", "pass"), ("224-500", "off", "warn")])
def test_offline_cpus(run_cli: RunCli, tmp_path: Path, offline: str, smt: str | None, status: str) -> None:
    [finding] = offline_findings(run_cli, tmp_path, offline, smt)
    assert finding["status"] == status, finding
    if offline and status == "warn":
        assert offline in finding["message"] and finding["severity"] == "warning"


def test_a_recording_without_the_file_says_nothing(run_cli: RunCli, tmp_path: Path) -> None:
    assert offline_findings(run_cli, tmp_path, None) == []
