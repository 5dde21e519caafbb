"""NVML facts reading: `NvmlReader` turns one backend's answers into GpuFacts, under one deadline.

The backend has pynvml's names (the real binding, `RecordedNvml`, `RecordingNvml`).
Failure handling, per NVML semantics:
* NotSupported -> the fact is `Unsupported` (its check skips with the reason);
* GpuIsLost -> that GPU is marked lost ("fallen off the bus"), others go on;
* FunctionNotFound -> the older call is tried (clock event vs throttle
  reasons, GetTemperatureV vs GetTemperature, fabric info V vs plain);
* library missing or driver not loaded -> the source is down;
* a call that hangs -> the whole read runs in one worker thread under a
  deadline (`agent.sources.deadline`); GPUs not finished become unknown with
  the call that hung, and the worker stops at its next NVML call (`Cancel`);
* a GPU count over MAX_GPUS (a hostile recording) -> the source is down, before any loop.

Calls per GPU. The counters and the GPU's power draw and limits come in one
`nvmlDeviceGetFieldValues` batch (the single call is the fallback where the
driver does not answer a field). With a `StaticCache` (the daemon's, kept
between polls) the values that do not change while the driver is loaded -
identity, PCI, VBIOS, InfoROM, thresholds, limit constraints, defaults, max
PCIe - and the handle itself are read once per GPU and re-read when the
driver version changes, when NVML is initialised again, when the GPU count
changes, and when the daemon sees a new Xid for that GPU (`invalidate_bus`).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.core.facts import GpuFacts, NvmlFacts
from agent.core.model import SourceStatus, Unknown, Unsupported
from agent.sources.deadline import Cancel, DeadlineExceeded, call_with_deadline
from agent.sources.nvml_const import (
    COMPUTE_MODES,
    DEFAULT_TIMEOUT_S,
    FABRIC_STATES,
    FIELDS,
    GPU_POWER_FIELDS,
    MODULE_POWER_FIELDS,
    NVLINK_SCOPES,
    NVLINK_STATE_FIELD,
    error_text,
    field_value,
)

# The facts read once per GPU while the driver stays loaded (see the module docstring).
STATIC_FACTS = ("name", "uuid", "serial", "pci_bus_id", "pci_id", "architecture", "brand", "compute_capability",
                "vbios", "inforom_image", "inforom_valid", "shutdown_c", "slowdown_c", "gpu_max_c", "memory_max_c",
                "default_limit_w", "min_limit_w", "max_limit_w", "default_app_clocks_mhz", "pcie_gen_max",
                "pcie_width_max")
GPU_SCOPE = 0  # NVML_POWER_SCOPE_GPU
MAX_GPUS, MAX_PROCESSES = 64, 4096  # bounds before a count drives a loop (nodes: <= 16 GPUs; MPS: 48 clients)


class GpuLost(Exception):
    """NVML says the GPU is lost (fallen off the bus)."""


class FunctionMissing(Exception):
    """The driver's NVML lacks this function (NVMLError_FunctionNotFound)."""


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' (NVML) -> '0000:19:00.0' (sysfs)."""
    lowered = text(bus_id).strip().lower()
    domain, _, rest = lowered.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else lowered


def cuda_version_text(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


# --- the static cache ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuStatics:
    handle: Any
    values: dict[str, Any]  # STATIC_FACTS -> fact

    @property
    def bus_id(self) -> str | None:
        bus = self.values.get("pci_bus_id")
        return bus if isinstance(bus, str) else None


class StaticCache:
    """Per-GPU static values (and handles) between reads of one NVML session; thread-safe.

    The reader runs in a deadline thread, the daemon's kernel-log follower
    calls `invalidate_bus`: every invalidation moves `epoch` on, and a reader
    only stores what it read within the epoch it started in, so statics read
    before an Xid are never kept after it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[int, GpuStatics] = {}
        self._addresses: dict[int, str] = {}  # kept when a GPU is lost: its Xid is still judged as its own
        self._driver: Any = None
        self._count: int | None = None
        self.epoch = 0
        self.initialized = False  # nvmlInit done and not known to be undone
        self.rereads = 0  # how many times the statics were dropped (tests, logs)

    def _clear(self) -> None:
        self._gpus.clear()
        self.epoch += 1
        self.rereads += 1

    def reinitialized(self) -> None:
        """nvmlInit ran (again): handles from before may be stale."""
        with self._lock:
            self._clear()
            self._driver, self._count = None, None
            self.initialized = True

    def lost_session(self) -> None:
        """A read failed or hung: initialise again (and so re-read everything) next time."""
        with self._lock:
            self.initialized = False
            self._clear()

    def begin(self, driver_version: Any, count: int) -> int:
        """The start of one read: a driver reload (another version) or another GPU count drops all."""
        with self._lock:
            if (self._driver, self._count) != (driver_version, count):
                if self._driver is not None or self._count is not None:
                    self._clear()
                    self._addresses.clear()
                self._driver, self._count = driver_version, count
            return self.epoch

    def get(self, index: int) -> GpuStatics | None:
        with self._lock:
            return self._gpus.get(index)

    def put(self, index: int, statics: GpuStatics, epoch: int) -> None:
        with self._lock:
            if epoch == self.epoch:
                self._gpus[index] = statics
            if statics.bus_id is not None:
                self._addresses[index] = statics.bus_id

    def address(self, index: int) -> str | None:
        with self._lock:
            return self._addresses.get(index)

    def drop(self, index: int) -> None:
        with self._lock:
            if self._gpus.pop(index, None) is not None:
                self.epoch += 1

    def invalidate_bus(self, pci_bus_id: str) -> bool:
        """A new Xid on this GPU (sysfs form, '0000:19:00.0'): re-read its statics next time."""
        bus = pci_bus_id.lower()
        with self._lock:
            hit = [i for i, s in self._gpus.items() if s.bus_id == bus]
            for index in hit:
                del self._gpus[index]
            self.epoch += 1
            self.rereads += bool(hit)
            return bool(hit)

    def cached(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._gpus))


def _cacheable(values: dict[str, Any]) -> bool:
    """Unsupported is for good; any other Unknown (a timeout, an error) is asked again."""
    return not any(isinstance(v, Unknown) and not isinstance(v, Unsupported) for v in values.values())


# --- the reader ----------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the worker has done so far; read by the caller if it times out."""

    gpus: list[GpuFacts] = field(default_factory=list)
    current: str = "nvmlInit"
    calls: int = 0


class NvmlReader:
    """Reads every GPU through `nvml`, turning NVML errors into facts."""

    def __init__(self, nvml: Any, progress: _Progress, cache: StaticCache | None = None,
                 cancel: Cancel | None = None) -> None:
        self.nvml = nvml
        self.cancel = cancel or Cancel()
        self.progress = progress
        self.cache = cache
        self._gpu_calls = 0
        self._bus: str | None = None  # the GPU being read's address, once known

    # -- one call -------------------------------------------------------------------------------

    def call(self, name: str, *args: Any, fallback: bool = False) -> Any:
        """One NVML call; errors become Unknown/Unsupported, lost GPUs raise GpuLost.

        With `fallback`, a function the driver lacks raises FunctionMissing so the
        caller can try an older one; otherwise it is simply unsupported.
        """
        nvml = self.nvml
        self.cancel.check()  # the caller's deadline passed: stop here, not after every GPU
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
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_GPUS:
            raise RuntimeError(f"NVML reports {str(count)[:40]!r} GPUs, not 0 to {MAX_GPUS}: not believed")
        epoch = self.cache.begin(driver, int(count)) if self.cache is not None else 0
        for index in range(int(count)):
            self._gpu_calls, self._bus = 0, None
            try:
                gpu = self.read_gpu(index, epoch)
            except GpuLost as exc:
                if self.cache is not None:
                    self._bus = self._bus or self.cache.address(index)
                    self.cache.drop(index)
                # Its address, where read before it went: its Xid (79) and the others' keep their gpuN subjects.
                known: dict[str, Any] = {"pci_bus_id": self._bus} if self._bus else {}
                gpu = GpuFacts(index=index, lost=str(exc), calls=self._gpu_calls, **known)
            self.progress.gpus.append(gpu)
        return NvmlFacts(
            driver_version=_map(driver, text),
            cuda_driver_version=_map(cuda, lambda v: cuda_version_text(int(v))),
            nvml_version=_map(nvml_version, text),
            device_count=int(count),
            gpus=tuple(self.progress.gpus),
            calls=self.progress.calls,
            attached=_attached(getattr(self.nvml, "attached_gpus", None), int(count)),
        )

    # -- one GPU ----------------------------------------------------------------------------------

    def read_gpu(self, index: int, epoch: int = 0) -> GpuFacts:
        cached = self.cache.get(index) if self.cache is not None else None
        if cached is not None:
            handle = cached.handle
        else:
            handle = self.call("nvmlDeviceGetHandleByIndex", index)
            if isinstance(handle, Unknown):
                return GpuFacts(index=index, lost=None, name=handle, calls=self._gpu_calls)
        statics = cached.values if cached is not None else self.read_statics(handle)
        self._bus = statics["pci_bus_id"] if isinstance(statics["pci_bus_id"], str) else None
        dynamic = self.read_dynamic(handle)
        if self.cache is not None and cached is None and _cacheable(statics):
            self.cache.put(index, GpuStatics(handle, statics), epoch)
        return GpuFacts(index=index, **statics, **dynamic, calls=self._gpu_calls)

    def read_statics(self, handle: Any) -> dict[str, Any]:
        """What does not change while the driver is loaded (STATIC_FACTS)."""
        nvml = self.nvml
        pci = self.call("nvmlDeviceGetPciInfo", handle)
        limits = self.call("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        thresholds = {
            key: self.call("nvmlDeviceGetTemperatureThreshold", handle, getattr(nvml, const))
            for key, const in (("shutdown", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
                               ("slowdown", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                               ("gpu_max", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
                               ("mem_max", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"))
        }
        inforom = self.call("nvmlDeviceValidateInforom", handle)
        values = {
            "name": _map(self.call("nvmlDeviceGetName", handle), text),
            "uuid": _map(self.call("nvmlDeviceGetUUID", handle), text),
            "serial": _map(self.call("nvmlDeviceGetSerial", handle), text),
            "pci_bus_id": _map(pci, lambda p: normalize_bus_id(p.busId)),
            "pci_id": _map(pci, lambda p: f"{int(p.pciDeviceId) & 0xFFFF:04x}:{int(p.pciDeviceId) >> 16:04x}"),
            "architecture": _map(self.call("nvmlDeviceGetArchitecture", handle), int),
            "brand": _map(self.call("nvmlDeviceGetBrand", handle), int),
            "compute_capability": _map(self.call("nvmlDeviceGetCudaComputeCapability", handle),
                                       lambda cc: f"{cc[0]}.{cc[1]}"),
            "vbios": _map(self.call("nvmlDeviceGetVbiosVersion", handle), text),
            "inforom_image": _map(self.call("nvmlDeviceGetInforomImageVersion", handle), text),
            "inforom_valid": _inforom_state(inforom),
            "shutdown_c": _map(thresholds["shutdown"], int),
            "slowdown_c": _map(thresholds["slowdown"], int),
            "gpu_max_c": _map(thresholds["gpu_max"], int),
            "memory_max_c": _map(thresholds["mem_max"], int),
            "default_limit_w": _map(self.call("nvmlDeviceGetPowerManagementDefaultLimit", handle), _limit_watts),
            "min_limit_w": _map(limits, lambda lim: _watts(lim[0])),
            "max_limit_w": _map(limits, lambda lim: _watts(lim[1])),
            "default_app_clocks_mhz": self.clock_pair("nvmlDeviceGetDefaultApplicationsClock", handle),
            "pcie_gen_max": _map(self.call("nvmlDeviceGetMaxPcieLinkGeneration", handle), int),
            "pcie_width_max": _map(self.call("nvmlDeviceGetMaxPcieLinkWidth", handle), int),
        }
        assert set(values) == set(STATIC_FACTS)
        return values

    def read_dynamic(self, handle: Any) -> dict[str, Any]:
        """What is read every time: modes and settings, counters, temperatures, power, links, load."""
        nvml = self.nvml
        ecc = self.call("nvmlDeviceGetEccMode", handle)
        mig = self.call("nvmlDeviceGetMigMode", handle)
        fields = self.read_fields(handle)
        temperature = self.first(
            ("nvmlDeviceGetTemperatureV", (handle, nvml.NVML_TEMPERATURE_GPU)),
            ("nvmlDeviceGetTemperature", (handle, nvml.NVML_TEMPERATURE_GPU)),
        )
        clock_events = self.first(
            ("nvmlDeviceGetCurrentClocksEventReasons", (handle,)),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", (handle,)),
        )
        app_clocks = self.clock_pair("nvmlDeviceGetApplicationsClock", handle)
        utilization = self.call("nvmlDeviceGetUtilizationRates", handle)
        return {
            "persistence_mode": _map(self.call("nvmlDeviceGetPersistenceMode", handle), _enabled),
            "compute_mode": _map(self.call("nvmlDeviceGetComputeMode", handle),
                                 lambda m: COMPUTE_MODES.get(int(m), f"mode {m}")),
            "mig_mode": _map(mig, lambda m: _enabled(m[0])),
            "mig_pending": _map(mig, lambda m: _enabled(m[1])),
            "ecc_mode": _map(ecc, lambda m: _enabled(m[0])),
            "ecc_pending": _map(ecc, lambda m: _enabled(m[1])),
            "ecc_volatile_corrected": fields["NVML_FI_DEV_ECC_SBE_VOL_TOTAL"],
            "ecc_volatile_uncorrected": fields["NVML_FI_DEV_ECC_DBE_VOL_TOTAL"],
            "ecc_aggregate_corrected": fields["NVML_FI_DEV_ECC_SBE_AGG_TOTAL"],
            "ecc_aggregate_uncorrected": fields["NVML_FI_DEV_ECC_DBE_AGG_TOTAL"],
            "retired_sbe": fields["NVML_FI_DEV_RETIRED_SBE"],
            "retired_dbe": fields["NVML_FI_DEV_RETIRED_DBE"],
            "retired_pending": _map(fields["NVML_FI_DEV_RETIRED_PENDING"], bool),
            "remapped_correctable": fields["NVML_FI_DEV_REMAPPED_COR"],
            "remapped_uncorrectable": fields["NVML_FI_DEV_REMAPPED_UNC"],
            "remap_pending": _map(fields["NVML_FI_DEV_REMAPPED_PENDING"], bool),
            "remap_failure": _map(fields["NVML_FI_DEV_REMAPPED_FAILURE"], bool),
            "pcie_replays": fields["NVML_FI_DEV_PCIE_REPLAY_COUNTER"],
            "memory_temperature_c": fields["NVML_FI_DEV_MEMORY_TEMP"],
            "recovery_action": fields["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"],
            "nvlink_states": fields["nvlink_states"],
            "nvlink_errors": _nvlink_errors(fields),
            "temperature_c": _map(temperature, int),
            "power_w": _map(self.field_or_call(fields, "NVML_FI_DEV_POWER_AVERAGE", handle), _watts),
            "power_limit_w": _map(self.field_or_call(fields, "NVML_FI_DEV_POWER_REQUESTED_LIMIT", handle), _watts),
            "enforced_limit_w": _map(self.field_or_call(fields, "NVML_FI_DEV_POWER_CURRENT_LIMIT", handle), _watts),
            "module_limit_w": _map(fields["NVML_FI_DEV_POWER_CURRENT_LIMIT"], _watts),
            "module_requested_limit_w": _map(fields["NVML_FI_DEV_POWER_REQUESTED_LIMIT"], _watts),
            "clock_events": _map(clock_events, int),
            "app_clocks_mhz": app_clocks,
            "pcie_gen": _map(self.call("nvmlDeviceGetCurrPcieLinkGeneration", handle), int),
            "pcie_width": _map(self.call("nvmlDeviceGetCurrPcieLinkWidth", handle), int),
            **self.read_fabric(handle),
            "utilization_gpu_pct": _map(utilization, lambda u: int(u.gpu)),
            "utilization_memory_pct": _map(utilization, lambda u: int(u.memory)),
            "sm_clock_mhz": _map(self.call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM), int),
            "memory_clock_mhz": _map(self.call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM), int),
            "compute_processes": _map(self.call("nvmlDeviceGetComputeRunningProcesses", handle), _pids),
        }

    def field_or_call(self, fields: dict[str, Any], name: str, handle: Any) -> Any:
        """A GPU-scope power field from the batch; its single call where the driver did not answer it."""
        value = fields[f"{name}:{GPU_SCOPE}"]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        return self.call(GPU_POWER_FIELDS[name], handle)

    def clock_pair(self, name: str, handle: Any) -> tuple[int, int] | Unknown:
        """(graphics, memory) MHz from a per-clock-type getter; Unknown if either fails."""
        graphics = self.call(name, handle, self.nvml.NVML_CLOCK_GRAPHICS)
        memory = self.call(name, handle, self.nvml.NVML_CLOCK_MEM)
        for part in (graphics, memory):
            if isinstance(part, Unknown):
                return part
        return int(graphics), int(memory)

    def read_fields(self, handle: Any) -> dict[str, Any]:
        """All counters, NVLink states and power values in one nvmlDeviceGetFieldValues call."""
        nvml = self.nvml
        request: list[Any] = [getattr(nvml, name) for name in FIELDS]
        request += [(getattr(nvml, name), nvml.NVML_POWER_SCOPE_MODULE) for name in MODULE_POWER_FIELDS]
        request += [(getattr(nvml, name), nvml.NVML_POWER_SCOPE_GPU) for name in GPU_POWER_FIELDS]
        state_id = getattr(nvml, NVLINK_STATE_FIELD)
        request += [(state_id, link) for link in range(NVLINK_SCOPES)]
        values = self.call("nvmlDeviceGetFieldValues", handle, request)
        named = (*FIELDS, *MODULE_POWER_FIELDS, *(f"{name}:{GPU_SCOPE}" for name in GPU_POWER_FIELDS))
        out: dict[str, Any] = {}
        if isinstance(values, Unknown):
            out = {name: values for name in named}
            out["nvlink_states"] = values
            return out
        states: list[int] = []
        missing: list[Unknown] = []
        for name, value in zip(named, values[: len(named)], strict=True):
            out[name] = field_value(nvml, value, name)
        for value in values[len(named):]:
            state = field_value(nvml, value, NVLINK_STATE_FIELD)
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
        status = "success" if int(info.status) == 0 else error_text(nvml, int(info.status))
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
    if len(processes) > MAX_PROCESSES:
        raise ValueError(f"{len(processes)} processes, more than {MAX_PROCESSES}")
    return tuple(sorted({int(p["pid"] if isinstance(p, dict) else p.pid) for p in processes}))


def _watts(milliwatts: Any) -> float:
    return round(int(milliwatts) / 1000.0, 3)


def _limit_watts(milliwatts: Any) -> float:
    """A default power limit of 0 W is no limit to judge against (it would pass `>= @default_limit_w`)."""
    if int(milliwatts) <= 0:
        raise ValueError("a power limit of 0 W or less is not believed")
    return _watts(milliwatts)


def _inforom_state(result: Any) -> Any:
    if isinstance(result, Unsupported):
        return result
    if isinstance(result, Unknown):
        return result.reason  # e.g. "nvmlDeviceValidateInforom: Corrupted infoROM"
    return "valid"


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


def _attached(value: Any, count: int) -> int | None:
    """A recording's `attached_gpus` (an nvidia-smi dump of selected GPUs) when it exceeds the GPUs recorded."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > count else None


# --- reading with a deadline ------------------------------------------------------------------


def read_nvml(nvml: Any, timeout_s: float = DEFAULT_TIMEOUT_S, initialized: bool = False,
              cache: StaticCache | None = None) -> tuple[NvmlFacts | Unknown, SourceStatus]:
    """Read all GPUs; never raises, never blocks longer than `timeout_s`.

    Without `cache` (an audit): nvmlInit (unless `initialized`), read, nvmlShutdown.
    With one (the daemon's session): nvmlInit once, kept between reads, statics cached.
    """
    start = time.monotonic()
    progress, cancel = _Progress(), Cancel()
    reader = NvmlReader(nvml, progress, cache, cancel)

    def work() -> NvmlFacts | str:
        try:
            if cache is None:
                if not initialized:
                    nvml.nvmlInit()
                try:
                    return reader.read()
                finally:
                    with contextlib.suppress(Exception):
                        nvml.nvmlShutdown()
            if not cache.initialized:
                nvml.nvmlInit()
                cache.reinitialized()
            return reader.read()
        except Exception as exc:  # noqa: BLE001 - an NVML error or a reader bug must not kill the audit
            if cache is not None:
                cache.lost_session()
            return _describe_error(nvml, exc)

    try:
        outcome = call_with_deadline(work, timeout_s=timeout_s, name="nvml-reader", cancel=cancel)
    except DeadlineExceeded:
        if cache is not None:
            cache.lost_session()
        elapsed = time.monotonic() - start
        why = (f"NVML did not answer within {timeout_s:g} s (stuck in {progress.current} "
               f"after {len(progress.gpus)} GPU(s))")
        if not progress.gpus:
            return Unknown(why), SourceStatus("nvml", ok=False, error=why, duration_s=elapsed)
        facts = NvmlFacts(Unknown(why), Unknown(why), Unknown(why), len(progress.gpus),
                          tuple(progress.gpus), progress.calls, incomplete=why)
        return facts, SourceStatus("nvml", ok=False, error=why, duration_s=elapsed)
    elapsed = time.monotonic() - start
    if isinstance(outcome, str):
        return Unknown(outcome), SourceStatus("nvml", ok=False, error=outcome, duration_s=elapsed)
    detail: dict[str, Any] = {"gpu_count": outcome.device_count, "calls": outcome.calls}
    if isinstance(outcome.driver_version, str):
        detail["driver_version"] = outcome.driver_version
    return outcome, SourceStatus("nvml", ok=True, duration_s=elapsed, detail=detail)


def _describe_error(nvml: Any, exc: BaseException) -> str:
    """An NVML error (any binding's: the code decides) with what to do about it; anything else as is."""
    text_ = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "value", None)
    if not (type(exc).__name__.startswith("NVMLError") and isinstance(code, int)):
        return text_
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return f"{text_} (libnvidia-ml.so.1 is missing: is the NVIDIA driver installed?)"
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return f"{text_} (the nvidia kernel module is not loaded)"
    return text_
