"""NVML source: the GPUs as the driver's management library sees them.

One reader (`read_nvml`) runs against a backend with pynvml's exact names:
the real `pynvml` module (live), `RecordedNvml` (a snapshot's nvml.json) or
`RecordingNvml` (live, remembering every answer for `snapshot capture`).
Everything above the binding is shared, so recorded data exercises the code
that runs on a real GPU.

Failure handling, per NVML semantics:
* NotSupported -> the fact is `Unsupported` (its check skips with the reason);
* GpuIsLost -> that GPU is marked lost ("fallen off the bus"), others go on;
* FunctionNotFound -> the older call is tried (clock event vs throttle
  reasons, GetTemperatureV vs GetTemperature, fabric info V vs plain);
* library missing or driver not loaded -> the source is down;
* a call that hangs -> the whole read runs in one worker thread under a
  deadline; GPUs not finished become unknown with the call that hung.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeGuard

from agent.errors import SnapshotError
from agent.facts import GpuFacts, NvmlFacts
from agent.jsonfile import JsonInputError, load_json_file
from agent.model import SourceStatus, Unknown, Unsupported

DEFAULT_TIMEOUT_S = 10.0
RECORD_FORMAT = "nodewarden.nvml/v1"
NVLINK_SCOPES = 18  # NVLink4/5 GPUs have 18 links; A100 has 12 (the rest answer "invalid")

# One nvmlDeviceGetFieldValues call replaces ~30 separate calls per GPU.
FIELDS = (
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    "NVML_FI_DEV_RETIRED_SBE",
    "NVML_FI_DEV_RETIRED_DBE",
    "NVML_FI_DEV_RETIRED_PENDING",
    "NVML_FI_DEV_REMAPPED_COR",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
)
NVLINK_STATE_FIELD = "NVML_FI_DEV_NVLINK_GET_STATE"
# Grace Hopper/Blackwell module (CPU + GPU + memory) power limits, in mW, asked at NVML_POWER_SCOPE_MODULE.
MODULE_POWER_FIELDS = ("NVML_FI_DEV_POWER_CURRENT_LIMIT", "NVML_FI_DEV_POWER_REQUESTED_LIMIT")
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


class CallTimeout(Exception):
    """An NVML call did not return within its deadline."""


class GpuLost(Exception):
    """NVML says the GPU is lost (fallen off the bus)."""


class FunctionMissing(Exception):
    """The driver's NVML lacks this function (NVMLError_FunctionNotFound)."""


def call_with_deadline(func: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Run `func` in a daemon thread; give up (not kill) after `timeout_s`.

    A thread stuck inside the driver cannot be killed, but a daemon thread
    does not keep the process alive, so the audit can still finish and exit.
    """
    result: list[Any] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(func())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            error.append(exc)

    thread = threading.Thread(target=runner, name=f"nvml:{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CallTimeout(f"{what} did not return within {timeout_s:g} s")
    if error:
        raise error[0]
    return result[0]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' (NVML) -> '0000:19:00.0' (sysfs)."""
    text = _text(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else text


def cuda_version_text(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


@dataclass
class _Progress:
    """What the worker has done so far; read by the caller if it times out."""

    gpus: list[GpuFacts] = field(default_factory=list)
    current: str = "nvmlInit"
    calls: int = 0


class NvmlReader:
    """Reads every GPU through `nvml`, turning NVML errors into facts."""

    def __init__(self, nvml: Any, progress: _Progress) -> None:
        self.nvml = nvml
        self.progress = progress
        self._gpu_calls = 0

    # -- one call -------------------------------------------------------------------------------

    def call(self, name: str, *args: Any, fallback: bool = False) -> Any:
        """One NVML call; errors become Unknown/Unsupported, lost GPUs raise GpuLost.

        With `fallback`, a function the driver lacks raises FunctionMissing so the
        caller can try an older one; otherwise it is simply unsupported.
        """
        nvml = self.nvml
        self.progress.current = name
        self.progress.calls += 1
        self._gpu_calls += 1
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost(f"{name}: GPU is lost (fallen off the bus)") from None
        except nvml.NVMLError_FunctionNotFound:
            if fallback:
                raise FunctionMissing(name) from None
            return Unsupported(f"the driver's NVML has no {name} (older driver)")
        except nvml.NVMLError_NotSupported as exc:
            if getattr(exc, "not_recorded", False):
                return Unsupported(f"{getattr(exc, 'key', name)} is not in this recording")
            return Unsupported(f"not supported by this GPU or driver ({name})")
        except nvml.NVMLError_NoPermission:
            return Unknown(f"{name}: insufficient permissions (run as root)")
        except nvml.NVMLError as exc:
            return Unknown(f"{name}: {exc}")

    def first(self, *attempts: tuple[str, tuple[Any, ...]]) -> Any:
        """Try newer NVML calls first, falling back when the driver lacks them."""
        missing = []
        for name, args in attempts:
            try:
                return self.call(name, *args, fallback=True)
            except FunctionMissing:
                missing.append(name)
        return Unsupported(f"the driver's NVML has none of {', '.join(missing)}")

    # -- the whole node --------------------------------------------------------------------------

    def read(self) -> NvmlFacts:
        driver = self.call("nvmlSystemGetDriverVersion")
        cuda = self.first(("nvmlSystemGetCudaDriverVersion_v2", ()), ("nvmlSystemGetCudaDriverVersion", ()))
        nvml_version = self.call("nvmlSystemGetNVMLVersion")
        count = self.call("nvmlDeviceGetCount")
        if isinstance(count, Unknown):
            raise RuntimeError(f"cannot count GPUs: {count.reason}")
        for index in range(int(count)):
            self._gpu_calls = 0
            try:
                gpu = self.read_gpu(index)
            except GpuLost as exc:
                gpu = GpuFacts(index=index, lost=str(exc), calls=self._gpu_calls)
            self.progress.gpus.append(gpu)
        return NvmlFacts(
            driver_version=_map(driver, _text),
            cuda_driver_version=_map(cuda, lambda v: cuda_version_text(int(v))),
            nvml_version=_map(nvml_version, _text),
            device_count=int(count),
            gpus=tuple(self.progress.gpus),
            calls=self.progress.calls,
            attached=_attached(getattr(self.nvml, "attached_gpus", None), int(count)),
        )

    # -- one GPU ----------------------------------------------------------------------------------

    def read_gpu(self, index: int) -> GpuFacts:
        nvml = self.nvml
        handle = self.call("nvmlDeviceGetHandleByIndex", index)
        if isinstance(handle, Unknown):
            return GpuFacts(index=index, lost=None, name=handle, calls=self._gpu_calls)
        pci = self.call("nvmlDeviceGetPciInfo", handle)
        ecc = self.call("nvmlDeviceGetEccMode", handle)
        mig = self.call("nvmlDeviceGetMigMode", handle)
        limits = self.call("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        fields = self.read_fields(handle)
        thresholds = {
            key: self.call("nvmlDeviceGetTemperatureThreshold", handle, getattr(nvml, const))
            for key, const in (("shutdown", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
                               ("slowdown", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                               ("gpu_max", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
                               ("mem_max", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"))
        }
        temperature = self.first(
            ("nvmlDeviceGetTemperatureV", (handle, nvml.NVML_TEMPERATURE_GPU)),
            ("nvmlDeviceGetTemperature", (handle, nvml.NVML_TEMPERATURE_GPU)),
        )
        clock_events = self.first(
            ("nvmlDeviceGetCurrentClocksEventReasons", (handle,)),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", (handle,)),
        )
        inforom = self.call("nvmlDeviceValidateInforom", handle)
        app_clocks = self.clock_pair("nvmlDeviceGetApplicationsClock", handle)
        default_app_clocks = self.clock_pair("nvmlDeviceGetDefaultApplicationsClock", handle)
        utilization = self.call("nvmlDeviceGetUtilizationRates", handle)
        return GpuFacts(
            index=index,
            name=_map(self.call("nvmlDeviceGetName", handle), _text),
            uuid=_map(self.call("nvmlDeviceGetUUID", handle), _text),
            serial=_map(self.call("nvmlDeviceGetSerial", handle), _text),
            pci_bus_id=_map(pci, lambda p: normalize_bus_id(p.busId)),
            pci_id=_map(pci, lambda p: f"{int(p.pciDeviceId) & 0xFFFF:04x}:{int(p.pciDeviceId) >> 16:04x}"),
            architecture=_map(self.call("nvmlDeviceGetArchitecture", handle), int),
            compute_capability=_map(self.call("nvmlDeviceGetCudaComputeCapability", handle),
                                    lambda cc: f"{cc[0]}.{cc[1]}"),
            vbios=_map(self.call("nvmlDeviceGetVbiosVersion", handle), _text),
            inforom_image=_map(self.call("nvmlDeviceGetInforomImageVersion", handle), _text),
            inforom_valid=_inforom_state(inforom),
            persistence_mode=_map(self.call("nvmlDeviceGetPersistenceMode", handle), _enabled),
            compute_mode=_map(self.call("nvmlDeviceGetComputeMode", handle),
                              lambda m: COMPUTE_MODES.get(int(m), f"mode {m}")),
            mig_mode=_map(mig, lambda m: _enabled(m[0])),
            mig_pending=_map(mig, lambda m: _enabled(m[1])),
            ecc_mode=_map(ecc, lambda m: _enabled(m[0])),
            ecc_pending=_map(ecc, lambda m: _enabled(m[1])),
            ecc_volatile_corrected=fields["NVML_FI_DEV_ECC_SBE_VOL_TOTAL"],
            ecc_volatile_uncorrected=fields["NVML_FI_DEV_ECC_DBE_VOL_TOTAL"],
            ecc_aggregate_corrected=fields["NVML_FI_DEV_ECC_SBE_AGG_TOTAL"],
            ecc_aggregate_uncorrected=fields["NVML_FI_DEV_ECC_DBE_AGG_TOTAL"],
            retired_sbe=fields["NVML_FI_DEV_RETIRED_SBE"],
            retired_dbe=fields["NVML_FI_DEV_RETIRED_DBE"],
            retired_pending=_map(fields["NVML_FI_DEV_RETIRED_PENDING"], bool),
            remapped_correctable=fields["NVML_FI_DEV_REMAPPED_COR"],
            remapped_uncorrectable=fields["NVML_FI_DEV_REMAPPED_UNC"],
            remap_pending=_map(fields["NVML_FI_DEV_REMAPPED_PENDING"], bool),
            remap_failure=_map(fields["NVML_FI_DEV_REMAPPED_FAILURE"], bool),
            pcie_replays=fields["NVML_FI_DEV_PCIE_REPLAY_COUNTER"],
            memory_temperature_c=fields["NVML_FI_DEV_MEMORY_TEMP"],
            recovery_action=fields["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"],
            nvlink_states=fields["nvlink_states"],
            nvlink_errors=_nvlink_errors(fields),
            temperature_c=_map(temperature, int),
            shutdown_c=_map(thresholds["shutdown"], int),
            slowdown_c=_map(thresholds["slowdown"], int),
            gpu_max_c=_map(thresholds["gpu_max"], int),
            memory_max_c=_map(thresholds["mem_max"], int),
            power_w=_map(self.call("nvmlDeviceGetPowerUsage", handle), _watts),
            power_limit_w=_map(self.call("nvmlDeviceGetPowerManagementLimit", handle), _watts),
            default_limit_w=_map(self.call("nvmlDeviceGetPowerManagementDefaultLimit", handle), _watts),
            min_limit_w=_map(limits, lambda lim: _watts(lim[0])),
            max_limit_w=_map(limits, lambda lim: _watts(lim[1])),
            enforced_limit_w=_map(self.call("nvmlDeviceGetEnforcedPowerLimit", handle), _watts),
            module_limit_w=_map(fields["NVML_FI_DEV_POWER_CURRENT_LIMIT"], _watts),
            module_requested_limit_w=_map(fields["NVML_FI_DEV_POWER_REQUESTED_LIMIT"], _watts),
            clock_events=_map(clock_events, int),
            app_clocks_mhz=app_clocks,
            default_app_clocks_mhz=default_app_clocks,
            pcie_gen=_map(self.call("nvmlDeviceGetCurrPcieLinkGeneration", handle), int),
            pcie_gen_max=_map(self.call("nvmlDeviceGetMaxPcieLinkGeneration", handle), int),
            pcie_width=_map(self.call("nvmlDeviceGetCurrPcieLinkWidth", handle), int),
            pcie_width_max=_map(self.call("nvmlDeviceGetMaxPcieLinkWidth", handle), int),
            **self.read_fabric(handle),
            utilization_gpu_pct=_map(utilization, lambda u: int(u.gpu)),
            utilization_memory_pct=_map(utilization, lambda u: int(u.memory)),
            sm_clock_mhz=_map(self.call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM), int),
            memory_clock_mhz=_map(self.call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM), int),
            compute_processes=_map(self.call("nvmlDeviceGetComputeRunningProcesses", handle), _pids),
            calls=self._gpu_calls,
        )

    def clock_pair(self, name: str, handle: Any) -> tuple[int, int] | Unknown:
        """(graphics, memory) MHz from a per-clock-type getter; Unknown if either fails."""
        graphics = self.call(name, handle, self.nvml.NVML_CLOCK_GRAPHICS)
        memory = self.call(name, handle, self.nvml.NVML_CLOCK_MEM)
        for part in (graphics, memory):
            if isinstance(part, Unknown):
                return part
        return int(graphics), int(memory)

    def read_fields(self, handle: Any) -> dict[str, Any]:
        """All counters in one nvmlDeviceGetFieldValues call."""
        nvml = self.nvml
        request: list[Any] = [getattr(nvml, name) for name in FIELDS]
        request += [(getattr(nvml, name), nvml.NVML_POWER_SCOPE_MODULE) for name in MODULE_POWER_FIELDS]
        state_id = getattr(nvml, NVLINK_STATE_FIELD)
        request += [(state_id, link) for link in range(NVLINK_SCOPES)]
        values = self.call("nvmlDeviceGetFieldValues", handle, request)
        out: dict[str, Any] = {}
        named = (*FIELDS, *MODULE_POWER_FIELDS)
        if isinstance(values, Unknown):
            out = {name: values for name in named}
            out["nvlink_states"] = values
            return out
        states: list[int] = []
        missing: list[Unknown] = []
        for name, value in zip(named, values[: len(named)], strict=True):
            out[name] = _field_value(nvml, value, name)
        for value in values[len(named):]:
            state = _field_value(nvml, value, NVLINK_STATE_FIELD)
            if isinstance(state, int):
                states.append(state)
            else:
                missing.append(state)
        if states:
            out["nvlink_states"] = tuple(states)
        elif missing and "recording" in missing[0].reason:
            out["nvlink_states"] = Unsupported("NVLink link states are not in this recording")
        else:
            out["nvlink_states"] = Unsupported("no NVLink on this GPU, or the driver does not report link state")
        return out

    def read_fabric(self, handle: Any) -> dict[str, Any]:
        """Fabric (NVSwitch) registration: Hopper and later."""
        nvml = self.nvml
        info: Any = nvml.c_nvmlGpuFabricInfoV_t()
        info.version = nvml.nvmlGpuFabricInfo_v2
        try:
            result = self.call("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info), fallback=True)
        except FunctionMissing:
            info = nvml.c_nvmlGpuFabricInfo_t()
            result = self.call("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
        if isinstance(result, Unknown):
            return {"fabric_state": result, "fabric_status": result}
        state = FABRIC_STATES.get(int(info.state), f"state {info.state}")
        if state == "not_supported":
            gone = Unsupported("this GPU is not part of an NVLink fabric")
            return {"fabric_state": gone, "fabric_status": gone}
        status = "success" if int(info.status) == 0 else _error_text(nvml, int(info.status))
        return {"fabric_state": state, "fabric_status": status}


def _map(value: Any, func: Callable[[Any], Any]) -> Any:
    if isinstance(value, Unknown):
        return value
    try:
        return func(value)
    except AttributeError as exc:  # a partly recorded structure (e.g. an imported dump)
        return Unsupported(f"not in this recording ({exc})")
    except (TypeError, ValueError, IndexError) as exc:
        return Unknown(f"unexpected NVML value {value!r}: {exc}")


def _enabled(value: Any) -> str:
    return "enabled" if int(value) == 1 else "disabled"


def _pids(processes: Any) -> tuple[int, ...]:
    """PIDs from NVML's process list (objects with `pid`; dicts in hand-written recordings)."""
    return tuple(sorted({int(p["pid"] if isinstance(p, dict) else p.pid) for p in processes}))


def _watts(milliwatts: Any) -> float:
    return round(int(milliwatts) / 1000.0, 3)


def _inforom_state(result: Any) -> Any:
    if isinstance(result, Unsupported):
        return result
    if isinstance(result, Unknown):
        return result.reason  # e.g. "nvmlDeviceValidateInforom: Corrupted infoROM"
    return "valid"


def _error_text(nvml: Any, code: int) -> str:
    try:
        return str(nvml.NVMLError(code))
    except Exception:  # noqa: BLE001 - any failure here just means an unknown code
        return f"NVML error {code}"


def _field_value(nvml: Any, value: Any, name: str) -> Any:
    if getattr(value, "not_recorded", False):
        return Unsupported(f"{name} is not in this recording")
    ret = int(value.nvmlReturn)
    if ret == nvml.NVML_ERROR_NOT_SUPPORTED:
        return Unsupported(f"not supported by this GPU or driver ({name})")
    if ret != nvml.NVML_SUCCESS:
        return Unknown(f"{name}: {_error_text(nvml, ret)}")
    kind = int(value.valueType)
    attr = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }.get(kind, "ullVal")
    result = getattr(value.value, attr)
    return float(result) if attr == "dVal" else int(result)


def _nvlink_errors(fields: dict[str, Any]) -> Any:
    names = {"crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
             "crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
             "replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
             "recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"}
    counts = {key: fields[field_name] for key, field_name in names.items()}
    known = {k: v for k, v in counts.items() if isinstance(v, int)}
    if not known:
        return next(iter(counts.values()))
    return known


# --- reading with a deadline ------------------------------------------------------------------


def read_nvml(nvml: Any, timeout_s: float = DEFAULT_TIMEOUT_S, initialized: bool = False
              ) -> tuple[NvmlFacts | Unknown, SourceStatus]:
    """Read all GPUs; never raises, never blocks longer than `timeout_s`."""
    start = time.monotonic()
    progress = _Progress()
    reader = NvmlReader(nvml, progress)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            if not initialized:
                nvml.nvmlInit()
            try:
                outcome["facts"] = reader.read()
            finally:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            outcome["error"] = _describe_init_error(nvml, exc)
        except Exception as exc:  # noqa: BLE001 - a reader bug must not kill the audit
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=work, name="nvml-reader", daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed = time.monotonic() - start
    if thread.is_alive():
        why = (f"NVML did not answer within {timeout_s:g} s (stuck in {progress.current} "
               f"after {len(progress.gpus)} GPU(s))")
        if not progress.gpus:
            return Unknown(why), SourceStatus("nvml", ok=False, error=why, duration_s=elapsed)
        facts = NvmlFacts(Unknown(why), Unknown(why), Unknown(why), len(progress.gpus),
                          tuple(progress.gpus), progress.calls, incomplete=why)
        return facts, SourceStatus("nvml", ok=False, error=why, duration_s=elapsed)
    if "error" in outcome:
        error = outcome["error"]
        return Unknown(error), SourceStatus("nvml", ok=False, error=error, duration_s=elapsed)
    facts = outcome["facts"]
    detail = {"gpu_count": facts.device_count, "calls": facts.calls}
    if isinstance(facts.driver_version, str):
        detail["driver_version"] = facts.driver_version
    return facts, SourceStatus("nvml", ok=True, duration_s=elapsed, detail=detail)


def _describe_init_error(nvml: Any, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        return f"{text} (libnvidia-ml.so.1 is missing: is the NVIDIA driver installed?)"
    if isinstance(exc, nvml.NVMLError_DriverNotLoaded):
        return f"{text} (the nvidia kernel module is not loaded)"
    return text


def load_live_nvml() -> Any:
    """The real binding; ImportError if nvidia-ml-py is not installed."""
    import pynvml

    return pynvml


def probe_live_nvml(timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[NvmlFacts | Unknown, SourceStatus]:
    try:
        nvml = load_live_nvml()
    except ImportError as exc:
        error = f"pynvml (nvidia-ml-py) is not installed: {exc}"
        return Unknown(error), SourceStatus("nvml", ok=False, error=error)
    return read_nvml(nvml, timeout_s)


# --- recording and replay -----------------------------------------------------------------------


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {name: _to_jsonable(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes._SimpleCData):
        return value.value
    if isinstance(value, SimpleNamespace) or type(value).__name__ == "nvmlFriendlyObject":
        # a replayed structure (recording a recording), or pynvml's process entries
        return {k: _to_jsonable(v) for k, v in vars(value).items()}
    return repr(value)


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _from_jsonable(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value


def _error_name(nvml: Any, code: int) -> str:
    """NVML_ERROR_* name of a return code (from the real binding's constants)."""
    import pynvml  # wrapped backends expose constants via __getattr__, so dir() misses them

    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return str(name)
    return str(code)


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
        wanted = {*FIELDS, *MODULE_POWER_FIELDS, NVLINK_STATE_FIELD}
        _FIELD_NAME_CACHE[key] = {int(getattr(nvml, n)): n for n in wanted if hasattr(nvml, n)}
    return _FIELD_NAME_CACHE[key]


def _attached(value: Any, count: int) -> int | None:
    """A recording's `attached_gpus` (an nvidia-smi dump of selected GPUs) when it exceeds the GPUs recorded."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > count else None


def call_key(name: str, extra: tuple[Any, ...]) -> str:
    return name if not extra else f"{name}({','.join(str(a) for a in extra)})"


def _is_error_record(value: Any) -> TypeGuard[dict[str, Any]]:
    """{"error": "NVML_ERROR_..."} with an optional "note": a call that raised."""
    return isinstance(value, dict) and "error" in value and set(value) <= {"error", "note"}


class RecordedHandle(int):
    """A replayed device handle: just the GPU index."""


class RecordedNvml:
    """Replays nvml.json through pynvml's names, constants and exception classes."""

    def __init__(self, data: dict[str, Any], source: str = "nvml.json") -> None:
        import pynvml  # the real exception classes and constants

        self._real = pynvml
        self._source = source
        if data.get("format") != RECORD_FORMAT:
            raise SnapshotError(f"not a {RECORD_FORMAT} recording (format: {data.get('format')!r})", path=source)
        self._data = data
        self._system: dict[str, Any] = data.get("system") or {}
        self._devices: list[dict[str, Any]] = data.get("devices") or []
        if not isinstance(self._system, dict) or not isinstance(self._devices, list) or not all(
                isinstance(d, dict) for d in self._devices):
            raise SnapshotError("`system` must be an object and `devices` a list of objects", path=source)
        self.calls = 0
        self.calls_per_device: dict[int, int] = {}

    @property
    def attached_gpus(self) -> Any:
        """The node's GPU count where the recording holds only some GPUs (docs/nvml-recording.md)."""
        return self._data.get("attached_gpus")

    @classmethod
    def from_file(cls, path: Path) -> RecordedNvml:
        try:  # 8 GPUs record ~40 KB, 5 levels deep
            data = load_json_file(path, max_bytes=32 << 20, max_depth=32)
        except JsonInputError as exc:  # names the line; says which bound or syntax error
            raise SnapshotError(f"unreadable NVML recording: {exc.message}", path=str(path), line=exc.line) from None
        except OSError as exc:
            raise SnapshotError(f"unreadable NVML recording: {exc}", path=str(path)) from None
        if not isinstance(data, dict):
            raise SnapshotError("an NVML recording is a JSON object", path=str(path))
        return cls(data, str(path))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name.startswith("nvml") and callable(attr) and not isinstance(attr, type):
            return lambda *args: self._replay(name, args)
        return attr  # constants, structures and exception classes are the real ones

    def to_bytes(self) -> bytes:
        """The recording as nvml.json bytes (the layout capture writes)."""
        return (json.dumps(self._data, indent=2) + "\n").encode()

    # Setters: the recorded device behaves as NVML would after the call, so
    # remediation runs against a snapshot exactly as against a GPU.
    def _set(self, handle: RecordedHandle, getter: str, value: Any, also: tuple[str, ...] = ()) -> None:
        table = self._table(handle, getter)
        current = table.get(getter)
        if getter not in table:
            raise self._not_recorded(getter)
        if _is_error_record(current):
            raise self._error(current["error"])
        table[getter] = value
        for key in also:  # values NVML derives from the one set
            if key in table and not _is_error_record(table[key]):
                table[key] = value

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
            out.append(self._field(fid, scope, values.get(key)))
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
        if key not in table:
            raise self._not_recorded(key)
        value = table[key]
        if _is_error_record(value):
            raise self._error(value["error"])
        if outs:  # the call fills a structure passed with byref()
            target = outs[0]._obj
            for attr, item in (value or {}).items():
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(target, attr, item)
            return self._real.NVML_SUCCESS
        return _from_jsonable(value)


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
            record = {"error": _error_name(self._real, int(getattr(exc, "value", -1)))}
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
            table[key] = _to_jsonable(outs[0]._obj)
        else:
            table[key] = _to_jsonable(result)
        return result

    def _record_fields(self, values: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        real = self._real
        scoped = {int(getattr(real, name)) for name in (NVLINK_STATE_FIELD, *MODULE_POWER_FIELDS)}
        for value in values:
            if getattr(value, "not_recorded", False):
                continue  # recording a recording: absent stays absent, not "not supported"
            scope = int(value.scopeId) if int(value.fieldId) in scoped else None
            key = field_key(real, int(value.fieldId) if scope is None else (int(value.fieldId), scope))
            if int(value.nvmlReturn) != real.NVML_SUCCESS:
                out[key] = {"error": _error_name(real, int(value.nvmlReturn))}
            else:
                out[key] = _field_value(real, value, key)
        return out

    def to_json(self) -> dict[str, Any]:
        count = self.system.get("nvmlDeviceGetCount")
        size = count if isinstance(count, int) else (max(self.devices) + 1 if self.devices else 0)
        return {
            "format": RECORD_FORMAT,
            "system": self.system,
            "devices": [self.devices.get(i, {}) for i in range(size)],
        }
