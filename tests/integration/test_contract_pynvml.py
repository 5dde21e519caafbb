"""Contract: every NVML name the agent uses exists in the real pynvml (nvidia-ml-py),
and every call the reader makes binds to the real function's signature.

The recorded backend replays through an object with pynvml's names, so a typo
or a function missing from the binding would otherwise only show on a real GPU.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pynvml

from agent.sources.nvml import RecordedNvml, read_nvml
from tests.conftest import REPO

_NAMES = re.compile(r"""(?:\bnvml\.|["'])((?:nvml[A-Z]\w+)|(?:NVML_\w*[A-Za-z0-9])|(?:NVMLError\w*)|(?:c_nvml\w+))\b""")


def used_names() -> dict[str, set[str]]:
    """NVML names referenced as attributes (nvml.X) or string literals ("nvmlX")."""
    names: dict[str, set[str]] = {}
    for folder in ("agent", "checks", "remediations"):
        for path in (REPO / folder).rglob("*.py"):
            for match in _NAMES.finditer(path.read_text(encoding="utf-8")):
                names.setdefault(match.group(1), set()).add(str(path.relative_to(REPO)))
    return names


def test_the_reader_uses_nvml_names() -> None:
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetFieldValues",
            "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NVMLError_GpuIsLost"} <= set(used_names())
    # agent.apps.accept.sampler: once per run and per tick on top of the reader (bound to the real ABI in
    # tests/accept/test_accept_nvml_mock.py)
    assert {"nvmlDeviceGetMaxClockInfo", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2",
            "nvmlEventSetFree", "nvmlEventTypeXidCriticalError", "NVMLError_Timeout"} <= set(used_names())


def test_every_nvml_name_exists_in_the_real_binding() -> None:
    missing = {name: sorted(files) for name, files in used_names().items() if not hasattr(pynvml, name)}
    assert missing == {}


class SignatureSpy:
    """Replays a recording, but first binds each call to the real pynvml signature."""

    def __init__(self, recorded: RecordedNvml) -> None:
        self.recorded = recorded
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.recorded, name)
        real = getattr(pynvml, name)
        if not (name.startswith("nvml") and callable(real)) or isinstance(real, type):
            return target

        def call(*args: Any) -> Any:
            inspect.signature(real).bind(*args)  # TypeError if the agent's call does not fit
            self.called.add(name)
            return target(*args)

        return call


def simulated_recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "fixtures" / "nodes" / name / "nvml.json").read_text())
    return data


def test_every_call_the_reader_makes_binds_to_the_real_signature() -> None:
    spy = SignatureSpy(RecordedNvml(simulated_recording("hgx-h100-healthy")))
    facts, status = read_nvml(spy)
    assert status.ok, status.error
    assert {"nvmlDeviceGetFieldValues", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetGpuFabricInfoV",
            "nvmlDeviceGetEccMode", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetClockInfo", "nvmlDeviceGetComputeRunningProcesses"} <= spy.called
    gpu = facts.gpus[0]  # type: ignore[union-attr]
    assert (gpu.utilization_gpu_pct, gpu.sm_clock_mhz, gpu.memory_clock_mhz, gpu.compute_processes) == (
        0, 345, 2619, ())
    # Fallback paths too: an old driver without the newer calls.
    old = simulated_recording("hgx-h100-healthy")
    for device in old["devices"]:
        for newer in ("nvmlDeviceGetTemperatureV(0)", "nvmlDeviceGetCurrentClocksEventReasons",
                      "nvmlDeviceGetGpuFabricInfoV"):
            device[newer] = {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
        device["nvmlDeviceGetTemperature(0)"] = 40
        device["nvmlDeviceGetCurrentClocksThrottleReasons"] = 1
        device["nvmlDeviceGetGpuFabricInfo"] = {"state": 3, "status": 0, "cliqueId": 0}
    spy = SignatureSpy(RecordedNvml(old))
    facts, status = read_nvml(spy)
    assert status.ok and not isinstance(facts, Exception)
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetGpuFabricInfo"} <= spy.called
    assert {g.temperature_c for g in facts.gpus} == {40}  # type: ignore[union-attr]


def test_the_deprecated_pynvml_distribution_is_not_what_we_import() -> None:
    # nvidia-ml-py ships pynvml.py itself; the `pynvml` distribution is a wrapper with a FutureWarning.
    assert Path(pynvml.__file__).name == "pynvml.py"


def test_the_event_thread_calls_bind_to_the_real_signatures() -> None:
    """agent/sources/nvml_events.py calls the live binding only (no replay exists for the event set): each
    `nvml.nvmlX(...)` there must exist in pynvml and take that many arguments."""
    import ast

    tree = ast.parse((REPO / "agent" / "sources" / "nvml_events.py").read_text(encoding="utf-8"))
    calls = {(node.func.attr, len(node.args)) for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "nvml"
             and node.func.attr.startswith("nvml")}
    assert {"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree",
            "nvmlDeviceGetSupportedEventTypes"} <= {name for name, _ in calls}
    for name, count in calls:
        inspect.signature(getattr(pynvml, name)).bind(*[None] * count)  # TypeError if the call does not fit


_LOADED = """
import sys
from agent.apps.cli.main import cli
try:
    cli.main(args=sys.argv[1:], prog_name="nodewarden")
except SystemExit:
    pass
print("pynvml" in sys.modules, file=sys.stderr)
"""


def _loads_pynvml(*args: str) -> bool:
    """`nodewarden audit ARGS` on this machine, live, in a fresh interpreter: was pynvml imported?"""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOCK_NVML", "LD_LIBRARY_PATH"))}
    done = subprocess.run([sys.executable, "-c", _LOADED, "audit", "--format", "json", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    return done.stderr.strip().splitlines()[-1] == "True"


def test_skipping_the_gpu_checks_loads_no_pynvml() -> None:
    """`--skip 'gpu.*'` with a named profile reads no NVML: accept.* (silent in audits) and matching (no
    profile to match) used to make the audit load the binding anyway."""
    assert not _loads_pynvml("--profile", "hgx-h100-sxm", "--skip", "gpu.*")
    assert _loads_pynvml("--profile", "hgx-h100-sxm")  # the GPU checks do load it: the probe can tell
