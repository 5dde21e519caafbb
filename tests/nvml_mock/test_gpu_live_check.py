"""Issue 31.7: tools/gpu-live-check.sh, the one call a lent GPU machine gets, run here on NVIDIA's mock
NVML: it records nvidia-smi (where installed), our own capture and a live audit under $OUT, lists every
step with its exit status in timings.tsv, stops by its total limit, and changes nothing on the machine.
The capture it writes replays to the live audit's GPU findings (the fixture path docs/nvml-recording.md
describes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.nvml_mock.conftest import mock_config, mock_env

pytestmark = pytest.mark.nvml_mock
SCRIPT = REPO / "tools" / "gpu-live-check.sh"


def run(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    env = {**mock_env(mock_config(tmp_path)), "OUT": str(out),
           "NODEWARDEN": str(Path(sys.executable).with_name("nodewarden")), **extra}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    return done, out


def test_one_call_records_the_node_read_only(tmp_path: Path) -> None:
    done, out = run(tmp_path)
    assert done.returncode == 0, done.stderr
    steps = {line.split("\t")[0]: line.split("\t")[1] for line in (out / "timings.tsv").read_text().splitlines()[1:]}
    assert {"nvidia-smi-q-x", "nvidia-smi-topo", "lspci", "dmesg", "snapshot", "audit", "total"} <= set(steps)
    assert steps["snapshot"] == "0" and steps["audit"] in ("0", "1"), steps
    nvml = json.loads((out / "snapshot" / "nvml.json").read_text())
    assert len(nvml["devices"]) == 8  # the mock's eight H100s, through our own reader
    live = json.loads((out / "audit.json").read_text())
    replay = subprocess.run([str(Path(sys.executable).with_name("nodewarden")), "audit", "--snapshot",
                             str(out / "snapshot"), "--format", "json"], capture_output=True, text=True,
                            timeout=300, check=False, env={k: v for k, v in os.environ.items()
                                                          if not k.startswith("MOCK_NVML")})
    assert replay.returncode in (0, 1), replay.stderr
    gpu = {(f["check"], f["subject"], f["status"]) for f in live["findings"] if f["check"].startswith("gpu.")}
    assert gpu and gpu == {(f["check"], f["subject"], f["status"]) for f in json.loads(replay.stdout)["findings"]
                           if f["check"].startswith("gpu.")}


def test_the_whole_run_is_bounded(tmp_path: Path) -> None:
    done, out = run(tmp_path, TOTAL_S="3")
    assert done.returncode == 0, done.stderr
    assert "skipped (total time spent)" in (out / "timings.tsv").read_text()
