"""Contract: every NVML name the agent uses exists in the real pynvml (nvidia-ml-py).

The recorded NVML backend replays through an object with pynvml's names, so
a typo or a function missing from the binding would only show on a real GPU.
This test reads the agent's source and checks each name against the module.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml

from tests.conftest import REPO

_NAME = re.compile(r"\bpynvml\.(nvml\w+|NVML\w+)")


def used_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for folder in ("agent", "checks", "remediations"):
        for path in (REPO / folder).rglob("*.py"):
            for match in _NAME.finditer(path.read_text(encoding="utf-8")):
                names.setdefault(match.group(1), set()).add(str(path.relative_to(REPO)))
    return names


def test_agent_uses_nvml() -> None:
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount"} <= set(used_names())


def test_every_nvml_name_exists_in_the_real_binding() -> None:
    missing = {name: sorted(files) for name, files in used_names().items() if not hasattr(pynvml, name)}
    assert missing == {}


def test_nvml_functions_called_without_arguments_accept_none() -> None:
    # The availability probe calls these with no argument.
    for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlSystemGetDriverVersion"):
        params = [p for p in inspect.signature(getattr(pynvml, name)).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind is not p.VAR_POSITIONAL]
        assert params == [], name


def test_the_deprecated_pynvml_distribution_is_not_what_we_import() -> None:
    # nvidia-ml-py ships pynvml.py itself; the `pynvml` distribution is a wrapper with a FutureWarning.
    assert Path(pynvml.__file__).name == "pynvml.py"
