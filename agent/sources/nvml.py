"""NVML source: the GPUs as the driver's management library sees them.

One reader (`read_nvml`) runs against a backend with pynvml's exact names:
the real `pynvml` module (live), `RecordedNvml` (a snapshot's nvml.json) or
`RecordingNvml` (live, remembering every answer for `snapshot capture`).
Everything above the binding is shared, so recorded data exercises the code
that runs on a real GPU.

This module is the source's public face; the code lives along its seams:
* `nvml_const`: NVML's constants, structures and exception classes, and the
  fields the reader asks for (so a replay never imports `pynvml`);
* `nvml_facts`: the reader (`NvmlReader`, `read_nvml`), its failure handling
  and the per-GPU `StaticCache` a daemon keeps between polls;
* `nvml_replay`: `RecordedNvml` and `RecordingNvml`, the nvml.json format;
* `nvml_live`: the real binding, and the daemon's `NvmlSession`.
"""

from __future__ import annotations

from agent.sources.deadline import DeadlineExceeded
from agent.sources.nvml_const import (
    COMPUTE_MODES,
    DEFAULT_TIMEOUT_S,
    FABRIC_STATES,
    FIELDS,
    GPU_POWER_FIELDS,
    MODULE_POWER_FIELDS,
    NVLINK_SCOPES,
    NVLINK_STATE_FIELD,
    RECORD_FORMAT,
)
from agent.sources.nvml_facts import (
    STATIC_FACTS,
    FunctionMissing,
    GpuLost,
    GpuStatics,
    NvmlReader,
    StaticCache,
    cuda_version_text,
    normalize_bus_id,
    read_nvml,
)
from agent.sources.nvml_live import NvmlSession, load_live_nvml, probe_live_nvml
from agent.sources.nvml_replay import (
    RecordedHandle,
    RecordedNvml,
    RecordingNvml,
    call_key,
    field_key,
    from_jsonable,
    to_jsonable,
)

CallTimeout = DeadlineExceeded  # the name this module's deadline error had; one class now
_to_jsonable = to_jsonable  # imported by name in tests/unit/checks/test_baseline.py
_from_jsonable = from_jsonable


__all__ = [
    "COMPUTE_MODES", "DEFAULT_TIMEOUT_S", "FABRIC_STATES", "FIELDS", "GPU_POWER_FIELDS", "MODULE_POWER_FIELDS",
    "NVLINK_SCOPES", "NVLINK_STATE_FIELD", "RECORD_FORMAT", "STATIC_FACTS", "CallTimeout", "FunctionMissing",
    "GpuLost", "GpuStatics", "NvmlReader", "NvmlSession", "RecordedHandle", "RecordedNvml", "RecordingNvml",
    "StaticCache", "call_key", "cuda_version_text", "field_key", "load_live_nvml",
    "normalize_bus_id", "probe_live_nvml", "read_nvml",
]
