"""Issue 31.7: tools/build-wheelhouse.sh builds what a GPU machine with no network needs: nodewarden and its
runtime dependencies as wheels, bounded in size, installable with `pip --no-index` into a fresh venv (the
path tools/gpu-live-check.sh takes when no venv is carried). Fetches from the package index pip is
configured with, for this interpreter and platform only (the default fetches CPython 3.10-3.13 on x86_64
and aarch64)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "tools" / "build-wheelhouse.sh"
TARGET = f"{sys.version_info.major}.{sys.version_info.minor}:manylinux2014_{platform.machine()}"


def build(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHON": sys.executable, "TARGETS": TARGET, **env})


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse") / "wheelhouse"
    done = build(out)
    assert done.returncode == 0, done.stderr
    assert "wheels" in done.stdout and "MiB" in done.stdout
    return out


def test_the_wheelhouse_installs_offline_and_runs(wheelhouse: Path, tmp_path: Path) -> None:
    names = sorted(p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl"))
    for package in ("nodewarden", "click", "pyyaml", "psutil", "nvidia_ml_py", "redfish", "pyghmi"):
        assert package in names, names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                              str(wheelhouse), "nodewarden"], capture_output=True, text=True, timeout=300,
                             check=False)
    assert install.returncode == 0, install.stderr
    done = subprocess.run([str(venv / "bin" / "nodewarden"), "--help"], capture_output=True, text=True, timeout=60,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0 and "audit" in done.stdout, done.stderr


def test_a_wheelhouse_over_its_bound_is_refused(wheelhouse: Path) -> None:
    done = build(wheelhouse, MAX_MIB="0")
    assert done.returncode == 1 and "more than 0 MiB" in done.stderr
