"""A node under load through the real NVML ABI: NVIDIA's mock libnvidia-ml (../shared/peers/nvml-mock).

`mock_config(...)` writes an edited copy of the mock's HGX H100 profile with `dynamic_metrics` (busy
utilization, power near the 700 W limit, a steady temperature); `run_accept(...)` runs the real
`nodewarden accept` in a child process with LD_LIBRARY_PATH/MOCK_NVML_CONFIG set (the library reads
its config once per process) and returns the exit code and the JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

MOCK = REPO.parent / "shared" / "peers" / "nvml-mock"
FAST = ("--duration", "10s", "--interval", "0.2s", "--idle", "1s", "--ramp", "20s", "--cooldown", "1s",
        "--grace", "2s")


def busy(temp_c: int = 60, power_mw: int = 680_000) -> dict[str, Any]:
    return {"seed": 7, "temperature": {"base_c": temp_c, "variance_c": 1},
            "power": {"base_mw": power_mw, "variance_mw": 5_000},
            "utilization": {"pattern": "busy", "gpu_min": 90, "gpu_max": 100, "memory_min": 40, "memory_max": 60}}


def base_config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((MOCK / "configs" / "h100.yaml").read_text(encoding="utf-8"))
    defaults = doc["device_defaults"]
    defaults["dynamic_metrics"] = busy()
    defaults["clocks_throttle_reasons"].update(gpu_idle=False, sw_power_cap=True)
    defaults["clocks"]["sm_current"] = 1830
    defaults["thermal"]["temperature_memory_c"] = 55
    return doc


def device(doc: dict[str, Any], index: int) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in doc["devices"] if d["index"] == index)
    return found


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def env_for(config: Path, overrides: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML")}
    env.update(LD_LIBRARY_PATH=str(MOCK / "lib"), MOCK_NVML_CONFIG=str(config), PYTHONPATH=str(REPO))
    if overrides is not None:
        env["MOCK_NVML_OVERRIDES"] = str(overrides)
    return env


def start_accept(tmp: Path, config: Path, *extra: str, overrides: Path | None = None,
                 state: Path | None = None) -> subprocess.Popen[str]:
    state = state or tmp / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    argv = [sys.executable, "-m", "agent", "accept", "--profile", "hgx-h100-sxm", *FAST, "--state-dir", str(state),
            "--format", "json", *extra]
    return subprocess.Popen(argv, cwd=REPO, env=env_for(config, overrides), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout_s: float = 180) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout_s)
    assert out.strip(), f"no report (exit {proc.returncode}): {err[-2000:]}"
    return proc.returncode, json.loads(out)


def run_accept(tmp: Path, config: Path, *extra: str, state: Path | None = None) -> tuple[int, dict[str, Any]]:
    return finish(start_accept(tmp, config, *extra, state=state))


def findings(report: dict[str, Any], check: str, status: str | None = None) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"]
            if f["check"] == check and (status is None or f["status"] == status)}


def failed(report: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["check"], f["subject"]) for f in report["findings"] if f["status"] == "fail"}


def wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
