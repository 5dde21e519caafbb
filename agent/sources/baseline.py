"""The node baseline file reader: `baseline.json` (`nodewarden.baseline/v1`) -> `Baseline`.

Where a node's baseline lives: inside its snapshot for a recorded node, else
`<config.state_dir>/baseline.json`. The audit and the daemon load it into
`NodeFacts.baseline` through `load_node_baseline`, which never raises; the
`nodewarden baseline` commands (agent.apps.cli.baseline) write and show it. Hostile input
like any other file: size- and depth-bounded, every field type-checked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.core.errors import NodewardenError
from agent.state.layout import BASELINE_FILE
from agent.state.layout import baseline_path as baseline_path_in

if TYPE_CHECKING:
    from agent.core.facts import Baseline
    from agent.core.model import Unknown
    from agent.policy.config import Config


class _HasSnapshot(Protocol):
    @property
    def snapshot(self) -> Any: ...


BASELINE_SCHEMA = "nodewarden.baseline/v1"
MAX_BASELINE_BYTES = 4 << 20  # 8 GPUs' baseline is ~5 KB



class BaselineError(NodewardenError):
    """A baseline file that is missing, unreadable or not `nodewarden.baseline/v1`."""


def baseline_path(node: _HasSnapshot, config: Config) -> Path:
    """Where this node's baseline lives: inside its snapshot, else in the state directory."""
    if node.snapshot is not None:
        return Path(node.snapshot.path) / BASELINE_FILE
    return baseline_path_in(config.state_dir)


def load_node_baseline(node: _HasSnapshot, config: Config) -> Baseline | Unknown:
    """The node's baseline for `NodeFacts.baseline`; never raises."""
    return load_baseline(baseline_path(node, config))


def load_baseline(path: Path) -> Baseline | Unknown:
    """The baseline in `path`: Unsupported when none was recorded, Unknown when it cannot be used."""
    from agent.core.facts import NO_BASELINE
    from agent.core.model import Unknown

    try:
        return parse_baseline(read_document(path), str(path))
    except FileNotFoundError:
        return NO_BASELINE
    except BaselineError as exc:
        return Unknown(f"baseline unusable: {exc}")


def read_document(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (FileNotFoundError when there is none)."""
    from agent.io.jsonfile import JsonInputError, load_json_bytes, read_bounded

    try:
        data = read_bounded(path, MAX_BASELINE_BYTES)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BaselineError(f"cannot read: {exc}", path=str(path)) from None
    try:
        doc = load_json_bytes(data, what=str(path), max_bytes=MAX_BASELINE_BYTES, max_depth=16)
    except JsonInputError as exc:
        raise BaselineError(exc.message, path=str(path), line=exc.line) from None
    if not isinstance(doc, dict):
        raise BaselineError("a baseline is a JSON object", path=str(path))
    return doc


# --- parsing ----------------------------------------------------------------------------------


def _fail(path: str, where: str, what: str) -> BaselineError:
    return BaselineError(f"{where}: {what}", path=path)


def _number(entry: dict[str, Any], key: str, path: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(path, f"{where}.{key}", f"expected a number or null, got {value!r}")
    return float(value)


def _integer(entry: dict[str, Any], key: str, path: str, where: str) -> int | None:
    value = _number(entry, key, path, where)
    return None if value is None else round(value)


def _text(entry: dict[str, Any], key: str, path: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise _fail(path, f"{where}.{key}", f"expected a string or null, got {value!r}")
    return value


def _object(value: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected an object, got {type(value).__name__}")
    return value


def _readings(section: dict[str, Any], key: str, path: str, value_key: str | None = None) -> dict[str, float]:
    """{name: number} (or {name: {value_key: number}}); null readings are left out."""
    out: dict[str, float] = {}
    for name, value in _object(section.get(key) or {}, path, f"bmc.{key}").items():
        entry = _object(value, path, f"bmc.{key}.{name}") if value_key else {"v": value}
        number = _number(entry, value_key or "v", path, f"bmc.{key}.{name}")
        if number is not None:
            out[str(name)] = number
    return out


def parse_baseline(doc: dict[str, Any], path: str) -> Baseline:
    """A `nodewarden.baseline/v1` document -> Baseline. Unknown keys are ignored (newer writers)."""
    from agent.core.facts import Baseline, BaselineGpu

    if doc.get("schema") != BASELINE_SCHEMA:
        raise BaselineError(f"not a {BASELINE_SCHEMA} file (schema: {doc.get('schema')!r})", path=path)
    recorded_at = doc.get("recorded_at")
    if not isinstance(recorded_at, str):
        raise _fail(path, "recorded_at", "missing")
    node = _object(doc.get("node") or {}, path, "node")
    gpus = []
    for key, value in _object(doc.get("gpus") or {}, path, "gpus").items():
        where = f"gpus.{key}"
        if not str(key).isdigit():
            raise _fail(path, where, "GPU keys are NVML indices (0, 1, ...)")
        entry = _object(value, path, where)
        gpus.append(BaselineGpu(
            index=int(key), uuid=_text(entry, "uuid", path, where), serial=_text(entry, "serial", path, where),
            name=_text(entry, "name", path, where), pci_bus_id=_text(entry, "pci_bus_id", path, where),
            power_w=_number(entry, "power_w", path, where),
            temperature_c=_number(entry, "temperature_c", path, where),
            memory_temperature_c=_number(entry, "memory_temperature_c", path, where),
            sm_clock_mhz=_integer(entry, "sm_clock_mhz", path, where),
            memory_clock_mhz=_integer(entry, "memory_clock_mhz", path, where),
            utilization_gpu_pct=_integer(entry, "utilization_gpu_pct", path, where),
            lost=_text(entry, "lost", path, where)))
    bmc = _object(doc.get("bmc") or {}, path, "bmc")
    return Baseline(
        path=path, recorded_at=recorded_at, hostname=_text(node, "hostname", path, "node"),
        model=_text(node, "model", path, "node"), profile=_text(node, "profile", path, "node"),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        bmc_temperatures_c=_readings(bmc, "temperatures_c", path),
        bmc_fans=_readings(bmc, "fans", path, "reading"),
        psu_output_w=_readings(bmc, "psu_output_w", path),
        power_consumed_w=_number(bmc, "power_consumed_w", path, "bmc"),
        forced=doc.get("forced") is True,
    )
