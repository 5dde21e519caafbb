"""NVML recorded replay: `RecordedNvml` answers from a snapshot's nvml.json, `RecordingNvml` writes one.

`RecordedNvml` has pynvml's function names, and `nvml_const`'s constants,
structures and exception classes (pynvml's names and values), so replaying a
snapshot never imports the binding. Setters change the recording as NVML
would change the device, so remediation runs against a snapshot exactly as
against a GPU. The format: docs/nvml-recording.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeGuard

from agent.core.errors import SnapshotError
from agent.io.jsonfile import JsonInputError, load_json_file
from agent.sources import nvml_const
from agent.sources.nvml_const import (
    COMPUTE_MODES,
    FIELDS,
    GPU_POWER_FIELDS,
    MODULE_POWER_FIELDS,
    NVLINK_STATE_FIELD,
    RECORD_FORMAT,
    field_value,
)
from agent.sources.nvml_facts import MAX_GPUS, MAX_PROCESSES

RECORDING_MAX_BYTES = 8 << 20  # of nvml.json read back; an import writes no more (agent.sources.importers.base)

# GPU-scope field key <-> the call it stands for ("NVML_FI_DEV_POWER_AVERAGE:0" <-> nvmlDeviceGetPowerUsage).
FIELD_CALLS = {f"{name}:{nvml_const.NVML_POWER_SCOPE_GPU}": call for name, call in GPU_POWER_FIELDS.items()}
CALL_FIELDS = {call: key for key, call in FIELD_CALLS.items()}


def to_jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {name: to_jsonable(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes._SimpleCData):
        return value.value
    if isinstance(value, SimpleNamespace) or type(value).__name__ == "nvmlFriendlyObject":
        # a replayed structure (recording a recording), or pynvml's process entries
        return {k: to_jsonable(v) for k, v in vars(value).items()}
    return repr(value)


def from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: from_jsonable(v) for k, v in value.items()})
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


def error_name(code: int) -> str:
    """NVML_ERROR_* name of a return code."""
    return nvml_const.ERROR_NAMES.get(code, str(code))


def field_key(nvml: Any, field_id: Any) -> str:
    """'NVML_FI_DEV_ECC_DBE_VOL_TOTAL' or 'NVML_FI_DEV_NVLINK_GET_STATE:3' (scope)."""
    fid, scope = (field_id, None) if isinstance(field_id, int) else field_id
    names = _field_names(nvml)
    base = names.get(int(fid), str(fid))
    return base if scope is None else f"{base}:{scope}"


_FIELD_NAME_CACHE: dict[int, dict[int, str]] = {}


def _field_names(nvml: Any) -> dict[int, str]:
    key = id(nvml)
    if key not in _FIELD_NAME_CACHE:
        wanted = {*FIELDS, *MODULE_POWER_FIELDS, *GPU_POWER_FIELDS, NVLINK_STATE_FIELD}
        _FIELD_NAME_CACHE[key] = {int(getattr(nvml, n)): n for n in wanted if hasattr(nvml, n)}
    return _FIELD_NAME_CACHE[key]


def call_key(name: str, extra: tuple[Any, ...]) -> str:
    return name if not extra else f"{name}({','.join(str(a) for a in extra)})"


def _is_error_record(value: Any) -> TypeGuard[dict[str, Any]]:
    """{"error": "NVML_ERROR_..."} with an optional "note": a call that raised."""
    return isinstance(value, dict) and "error" in value and set(value) <= {"error", "note"}


def _as_field(value: Any) -> Any:
    """A recorded call answer as a field value: an integer or an error record; else absent."""
    if _is_error_record(value) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


class RecordedHandle(int):
    """A replayed device handle: just the GPU index."""


class RecordedNvml:
    """Replays nvml.json through pynvml's names, with nvml_const's constants and exception classes."""

    def __init__(self, data: dict[str, Any], source: str = "nvml.json") -> None:
        self._real: Any = nvml_const  # no pynvml: the same names and values, without the import
        self._source = source
        if data.get("format") != RECORD_FORMAT:
            raise SnapshotError(f"not a {RECORD_FORMAT} recording (format: {data.get('format')!r})", path=source)
        self._data = data
        self._system: dict[str, Any] = data.get("system") or {}
        self._devices: list[dict[str, Any]] = data.get("devices") or []
        if not isinstance(self._system, dict) or not isinstance(self._devices, list) or not all(
                isinstance(d, dict) for d in self._devices):
            raise SnapshotError("`system` must be an object and `devices` a list of objects", path=source)
        if len(self._devices) > MAX_GPUS:  # bounded before anything loops over them
            raise SnapshotError(f"{len(self._devices)} devices recorded, more than {MAX_GPUS}", path=source)
        self.calls = 0
        self.calls_per_device: dict[int, int] = {}

    @property
    def attached_gpus(self) -> Any:
        """The node's GPU count where the recording holds only some GPUs (docs/nvml-recording.md)."""
        return self._data.get("attached_gpus")

    @classmethod
    def from_file(cls, path: Path) -> RecordedNvml:
        try:  # 8 GPUs record ~40 KB, 5 levels deep; 8 MB bounds what parsing can allocate
            data = load_json_file(path, max_bytes=RECORDING_MAX_BYTES, max_depth=32)
        except JsonInputError as exc:  # names the line; says which bound or syntax error
            raise SnapshotError(f"unreadable NVML recording: {exc.message}", path=str(path), line=exc.line) from None
        except OSError as exc:
            raise SnapshotError(f"unreadable NVML recording: {exc}", path=str(path)) from None
        if not isinstance(data, dict):
            raise SnapshotError("an NVML recording is a JSON object", path=str(path))
        return cls(data, str(path))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if hasattr(nvml_const, name):
            return getattr(nvml_const, name)  # constants, structures and exception classes
        if name.startswith("nvml"):  # every other nvml* name is a call, answered from the recording
            return lambda *args: self._replay(name, args)
        raise AttributeError(f"NVML has no {name}")

    def to_bytes(self) -> bytes:
        """The recording as nvml.json bytes (the layout capture writes)."""
        return (json.dumps(self._data, indent=2) + "\n").encode()

    # Setters: the recorded device behaves as NVML would after the call, so
    # remediation runs against a snapshot exactly as against a GPU.
    def _set(self, handle: RecordedHandle, getter: str, value: Any, also: tuple[str, ...] = ()) -> None:
        table = self._table(handle, getter)
        fields = table.get("nvmlDeviceGetFieldValues")
        fields = fields if isinstance(fields, dict) else {}
        alias = CALL_FIELDS.get(getter, "")
        if getter not in table and alias not in fields:
            raise self._not_recorded(getter)
        current = table[getter] if getter in table else fields[alias]
        if _is_error_record(current):
            raise self._error(current["error"])
        for key in (getter, *also):  # the value set, and those NVML derives from it
            for where, name in ((table, key), (fields, CALL_FIELDS.get(key, ""))):
                if name in where and (name == getter or not _is_error_record(where[name])):
                    where[name] = value

    def nvmlDeviceSetPersistenceMode(self, handle: RecordedHandle, mode: int) -> None:
        if mode not in (0, 1):
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        self._set(handle, "nvmlDeviceGetPersistenceMode", mode)

    def nvmlDeviceSetPowerManagementLimit(self, handle: RecordedHandle, limit: int) -> None:
        low, high = self._devices[int(handle)].get("nvmlDeviceGetPowerManagementLimitConstraints") or (0, 0)
        if not low <= limit <= high:
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        self._set(handle, "nvmlDeviceGetPowerManagementLimit", limit, also=("nvmlDeviceGetEnforcedPowerLimit",))

    def nvmlDeviceSetComputeMode(self, handle: RecordedHandle, mode: int) -> None:
        if mode not in COMPUTE_MODES:
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        self._set(handle, "nvmlDeviceGetComputeMode", mode)

    def nvmlDeviceSetEccMode(self, handle: RecordedHandle, mode: int) -> None:
        # NVML stages ECC: the pending half changes now, the current half at the next reset/reboot.
        if mode not in (0, 1):
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        current = self._table(handle, "nvmlDeviceGetEccMode").get("nvmlDeviceGetEccMode")
        if not isinstance(current, list) or len(current) != 2:
            raise self._not_recorded("nvmlDeviceGetEccMode")
        self._set(handle, "nvmlDeviceGetEccMode", [current[0], mode])

    def nvmlDeviceSetApplicationsClocks(self, handle: RecordedHandle, memory_mhz: int, graphics_mhz: int) -> None:
        # NVML takes (memory, graphics) and accepts only the board's supported clocks; a recording
        # does not hold that list, so it accepts any positive pair.
        if not (isinstance(memory_mhz, int) and isinstance(graphics_mhz, int) and memory_mhz > 0 and graphics_mhz > 0):
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        self._set(handle, call_key("nvmlDeviceGetApplicationsClock", (self._real.NVML_CLOCK_MEM,)), memory_mhz)
        self._set(handle, call_key("nvmlDeviceGetApplicationsClock", (self._real.NVML_CLOCK_GRAPHICS,)),
                  graphics_mhz)

    def nvmlDeviceResetApplicationsClocks(self, handle: RecordedHandle) -> None:
        clock_mem, clock_gfx = self._real.NVML_CLOCK_MEM, self._real.NVML_CLOCK_GRAPHICS
        table = self._devices[int(handle)]
        memory, graphics = (table.get(call_key("nvmlDeviceGetDefaultApplicationsClock", (c,)))
                            for c in (clock_mem, clock_gfx))
        if not isinstance(memory, int) or not isinstance(graphics, int):
            raise self._not_recorded("nvmlDeviceGetDefaultApplicationsClock")
        self.nvmlDeviceSetApplicationsClocks(handle, memory, graphics)

    # NVML lifecycle calls succeed without a library.
    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetHandleByIndex(self, index: int) -> RecordedHandle:
        self._count(None)
        if not 0 <= index < len(self._devices):
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        recorded = self._devices[index].get("nvmlDeviceGetHandleByIndex")
        if isinstance(recorded, dict) and "error" in recorded:
            raise self._error(recorded["error"])
        return RecordedHandle(index)

    def nvmlDeviceGetFieldValues(self, handle: RecordedHandle, field_ids: list[Any]) -> list[SimpleNamespace]:
        table = self._table(handle, "nvmlDeviceGetFieldValues")
        recorded = table.get("nvmlDeviceGetFieldValues")
        if _is_error_record(recorded):
            raise self._error(recorded["error"])
        values = recorded if isinstance(recorded, dict) else {}
        out = []
        for field_id in field_ids:
            key = field_key(self._real, field_id)
            fid, scope = (field_id, 0) if isinstance(field_id, int) else field_id
            value = values.get(key)
            if value is None and key in FIELD_CALLS:
                # A recording made before the reader asked for this field: NVML answers the field
                # and the call from the same counter, so the call's recorded answer is the field's.
                value = _as_field(table.get(FIELD_CALLS[key]))
            out.append(self._field(fid, scope, value))
        return out

    def _field(self, fid: int, scope: int, value: Any) -> SimpleNamespace:
        real = self._real
        ret, kind = real.NVML_SUCCESS, real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        payload: float = 0
        missing = value is None
        if missing:
            ret = real.NVML_ERROR_NOT_SUPPORTED
        elif isinstance(value, dict):
            ret = getattr(real, str(value.get("error")), real.NVML_ERROR_UNKNOWN)
        elif isinstance(value, float):
            kind, payload = real.NVML_VALUE_TYPE_DOUBLE, value
        elif isinstance(value, int) and value < 0:
            kind, payload = real.NVML_VALUE_TYPE_SIGNED_LONG_LONG, value
        else:
            payload = int(value)
        union = SimpleNamespace(dVal=float(payload), uiVal=int(payload), ulVal=int(payload), ullVal=int(payload),
                                sllVal=int(payload), siVal=int(payload), usVal=int(payload))
        return SimpleNamespace(fieldId=fid, scopeId=scope, timestamp=0, latencyUsec=0, valueType=kind,
                               nvmlReturn=ret, value=union, not_recorded=missing)

    def _count(self, index: int | None) -> None:
        self.calls += 1
        if index is not None:
            self.calls_per_device[index] = self.calls_per_device.get(index, 0) + 1

    def _table(self, handle: Any, name: str) -> dict[str, Any]:
        if not isinstance(handle, RecordedHandle):
            raise self._real.NVMLError(self._real.NVML_ERROR_INVALID_ARGUMENT)
        self._count(int(handle))
        return self._devices[int(handle)]

    def _error(self, name: str) -> BaseException:
        code = getattr(self._real, str(name), None)
        if not isinstance(code, int):
            code = self._real.NVML_ERROR_UNKNOWN
        return self._real.NVMLError(code)  # type: ignore[no-any-return]

    def _not_recorded(self, key: str) -> BaseException:
        exc = self._real.NVMLError(self._real.NVML_ERROR_NOT_SUPPORTED)
        exc.not_recorded = True
        exc.key = key
        return exc  # type: ignore[no-any-return]

    def _replay(self, name: str, args: tuple[Any, ...]) -> Any:
        if args and isinstance(args[0], RecordedHandle):
            table = self._table(args[0], name)
            rest = args[1:]
        else:
            self._count(None)
            table, rest = self._system, args
        outs = [a for a in rest if type(a).__name__ == "CArgObject"]
        extra = tuple(a for a in rest if type(a).__name__ != "CArgObject")
        key = call_key(name, extra)
        if key not in table and not extra and CALL_FIELDS.get(key) in (table.get("nvmlDeviceGetFieldValues") or {}):
            value = table["nvmlDeviceGetFieldValues"][CALL_FIELDS[key]]  # recorded as the field (the reverse)
        elif key not in table:
            raise self._not_recorded(key)
        else:
            value = table[key]
        if _is_error_record(value):
            raise self._error(value["error"])
        if isinstance(value, list) and len(value) > MAX_PROCESSES:  # no NVML list is this long (processes)
            raise self._error("NVML_ERROR_INSUFFICIENT_SIZE")
        if outs:  # the call fills a structure passed with byref()
            target = outs[0]._obj
            for attr, item in (value or {}).items():
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(target, attr, item)
            return self._real.NVML_SUCCESS
        return from_jsonable(value)


class RecordingNvml:
    """Wraps the live binding and records every answer into nvml.json's layout."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.system: dict[str, Any] = {}
        self.devices: dict[int, dict[str, Any]] = {}
        self._handles: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if not (name.startswith("nvml") and callable(attr)) or isinstance(attr, type):
            return attr
        return lambda *args: self._call(name, attr, args)

    def _call(self, name: str, func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        index = self._handles.get(id(args[0])) if args else None
        table = self.devices.setdefault(index, {}) if index is not None else self.system
        rest = args[1:] if index is not None else args
        outs = [a for a in rest if type(a).__name__ == "CArgObject"]
        extra = tuple(a for a in rest if type(a).__name__ != "CArgObject")
        if name == "nvmlDeviceGetFieldValues":
            extra = ()
        key = call_key(name, extra)
        try:
            result = func(*args)
        except self._real.NVMLError as exc:
            record = {"error": error_name(int(getattr(exc, "value", -1)))}
            if name == "nvmlDeviceGetHandleByIndex" and args:
                self.devices.setdefault(int(args[0]), {})[name] = record
            elif name not in ("nvmlInit", "nvmlShutdown"):
                table[key] = record
            raise
        if name == "nvmlDeviceGetHandleByIndex":
            self._handles[id(result)] = int(args[0])
            self.devices.setdefault(int(args[0]), {})
            return result
        if name in ("nvmlInit", "nvmlShutdown"):
            return result
        if name == "nvmlDeviceGetFieldValues":
            table[name] = self._record_fields(result)
        elif outs:
            table[key] = to_jsonable(outs[0]._obj)
        else:
            table[key] = to_jsonable(result)
        return result

    def _record_fields(self, values: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        real = self._real
        scoped = {int(getattr(real, name)) for name in (NVLINK_STATE_FIELD, *MODULE_POWER_FIELDS, *GPU_POWER_FIELDS)}
        for value in values:
            if getattr(value, "not_recorded", False):
                continue  # recording a recording: absent stays absent, not "not supported"
            scope = int(value.scopeId) if int(value.fieldId) in scoped else None
            key = field_key(real, int(value.fieldId) if scope is None else (int(value.fieldId), scope))
            if int(value.nvmlReturn) != real.NVML_SUCCESS:
                out[key] = {"error": error_name(int(value.nvmlReturn))}
            else:
                out[key] = field_value(real, value, key)
        return out

    def to_json(self) -> dict[str, Any]:
        count = self.system.get("nvmlDeviceGetCount")
        size = count if isinstance(count, int) else (max(self.devices) + 1 if self.devices else 0)
        size = max(0, min(size, MAX_GPUS))  # the reader refused more; never a list of 10^8 placeholders
        return {
            "format": RECORD_FORMAT,
            "system": self.system,
            "devices": [self.devices.get(i, {}) for i in range(size)],
        }
