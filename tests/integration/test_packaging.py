"""The wheel carries the profiles and simulated nodes, and works from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
                   check=True, timeout=300)
    (path,) = out.glob("nodewarden-*.whl")
    return path


def test_wheel_contains_code_profiles_and_simulated_nodes(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("agent/apps/cli/main.py", "checks/host_sysctl.py", "agent/_data/profiles/schema.json",
                     "agent/_data/profiles/hgx-h100-sxm.yaml", "agent/_data/fixtures/nodes/hgx-h100-drifted/meta.yaml",
                     "agent/_data/fixtures/nodes/hgx-h100-healthy/fs_links.json"):
        assert expected in names, expected
    assert not any(n.startswith(("tests/", "fixtures/tools")) for n in names)
    assert "nodewarden-0.1.0.data/data/share/man/man1/nodewarden.1" in names  # `man nodewarden` from the venv
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "nodewarden = agent.apps.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_audits_a_simulated_node_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import sys, agent; assert agent.__file__.startswith(sys.argv[1]), agent.__file__; "
            "from agent.apps.cli.main import main; sys.argv = ['nodewarden', 'audit', '--simulate', 'hgx-h100-drifted', "
            "'--format', 'json']; main()")
    result = subprocess.run([sys.executable, "-c", code, str(target)], check=False, cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    # 30 host/GPU/BMC drifts + fabric.manager + 3 interconnect drifts (ib.port.rate, ib.port.errors, pcie.acs)
    assert report["profile"] == "hgx-h100-sxm" and report["summary"]["fail"] == 34
