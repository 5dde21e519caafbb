"""GPU facts as NVML reports them (agent.sources.nvml fills them), and Xids from the kernel log.

Re-exported by agent.core.facts, where callers import them from.
"""

from __future__ import annotations

from typing import NamedTuple

from agent.core.facts_base import NOT_READ, Maybe
from agent.core.model import Unknown, Unsupported

CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}


class GpuFacts(NamedTuple):
    """One GPU as NVML describes it. Every value may be Unknown or Unsupported."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose
    lost: str | None = None  # why the GPU is gone (NVML GpuIsLost), None if present
    name: Maybe[str] = NOT_READ
    uuid: Maybe[str] = NOT_READ
    serial: Maybe[str] = NOT_READ
    pci_bus_id: Maybe[str] = NOT_READ  # normalised: 0000:19:00.0
    pci_id: Maybe[str] = NOT_READ  # vendor:device, e.g. 10de:2330
    architecture: Maybe[int] = NOT_READ  # NVML_DEVICE_ARCH_*
    brand: Maybe[int] = NOT_READ  # NVML_BRAND_* (agent.core.gpu_family places the GPU in a family by it)
    compute_capability: Maybe[str] = NOT_READ
    vbios: Maybe[str] = NOT_READ
    inforom_image: Maybe[str] = NOT_READ
    inforom_valid: Maybe[str] = NOT_READ  # "valid" or the NVML error text
    persistence_mode: Maybe[str] = NOT_READ  # enabled | disabled
    compute_mode: Maybe[str] = NOT_READ  # Default | Exclusive_Process | Prohibited
    mig_mode: Maybe[str] = NOT_READ  # current: enabled | disabled
    mig_pending: Maybe[str] = NOT_READ
    ecc_mode: Maybe[str] = NOT_READ  # current: enabled | disabled
    ecc_pending: Maybe[str] = NOT_READ
    ecc_volatile_uncorrected: Maybe[int] = NOT_READ
    ecc_volatile_corrected: Maybe[int] = NOT_READ
    ecc_aggregate_uncorrected: Maybe[int] = NOT_READ
    ecc_aggregate_corrected: Maybe[int] = NOT_READ
    retired_sbe: Maybe[int] = NOT_READ
    retired_dbe: Maybe[int] = NOT_READ
    retired_pending: Maybe[bool] = NOT_READ
    remapped_correctable: Maybe[int] = NOT_READ
    remapped_uncorrectable: Maybe[int] = NOT_READ
    remap_pending: Maybe[bool] = NOT_READ
    remap_failure: Maybe[bool] = NOT_READ
    temperature_c: Maybe[int] = NOT_READ
    memory_temperature_c: Maybe[int] = NOT_READ
    shutdown_c: Maybe[int] = NOT_READ
    slowdown_c: Maybe[int] = NOT_READ
    gpu_max_c: Maybe[int] = NOT_READ
    memory_max_c: Maybe[int] = NOT_READ
    power_w: Maybe[float] = NOT_READ
    power_limit_w: Maybe[float] = NOT_READ  # requested (nvmlDeviceGetPowerManagementLimit, "power.limit")
    default_limit_w: Maybe[float] = NOT_READ
    min_limit_w: Maybe[float] = NOT_READ
    max_limit_w: Maybe[float] = NOT_READ
    enforced_limit_w: Maybe[float] = NOT_READ  # what the GPU obeys: the lowest of every cap on it
    # Grace Hopper / Grace Blackwell: the module (CPU + GPU + memory) power limit, current and requested
    # (field values NVML_FI_DEV_POWER_{CURRENT,REQUESTED}_LIMIT at NVML_POWER_SCOPE_MODULE); Unsupported elsewhere.
    module_limit_w: Maybe[float] = NOT_READ
    module_requested_limit_w: Maybe[float] = NOT_READ
    clock_events: Maybe[int] = NOT_READ  # bitmask, see CLOCK_EVENT_BITS
    app_clocks_mhz: Maybe[tuple[int, int]] = NOT_READ  # application clocks (graphics, memory)
    default_app_clocks_mhz: Maybe[tuple[int, int]] = NOT_READ
    pcie_gen: Maybe[int] = NOT_READ
    pcie_gen_max: Maybe[int] = NOT_READ
    pcie_width: Maybe[int] = NOT_READ
    pcie_width_max: Maybe[int] = NOT_READ
    pcie_replays: Maybe[int] = NOT_READ
    nvlink_states: Maybe[tuple[int, ...]] = NOT_READ  # per link: 1 active, 0 not
    nvlink_errors: Maybe[dict[str, int]] = NOT_READ  # crc_flit, crc_data, replay, recovery
    fabric_state: Maybe[str] = NOT_READ  # not_started | in_progress | completed
    fabric_status: Maybe[str] = NOT_READ  # success or the NVML error text
    recovery_action: Maybe[int] = NOT_READ  # NVML_GPU_RECOVERY_ACTION_*
    utilization_gpu_pct: Maybe[int] = NOT_READ  # % of the last sample period a kernel ran
    utilization_memory_pct: Maybe[int] = NOT_READ  # % of it memory was read or written
    sm_clock_mhz: Maybe[int] = NOT_READ  # current SM clock
    memory_clock_mhz: Maybe[int] = NOT_READ  # current memory clock
    compute_processes: Maybe[tuple[int, ...]] = NOT_READ  # PIDs of compute processes on the GPU
    calls: int = 0

    @property
    def label(self) -> str:
        bus = self.pci_bus_id if isinstance(self.pci_bus_id, str) else "?"
        return f"GPU {self.index} ({bus})"


IDLE_UTILIZATION_MAX_PCT = 5  # at or below this, a GPU counts as idle (baselines)


def gpu_activity(gpu: GpuFacts) -> Maybe[str | None]:
    """Why `gpu` is not idle (utilization above 5 % or compute processes), None when idle.

    Unknown when the utilization cannot be read. A process list that cannot be
    read does not decide anything: the utilization does.
    """
    if gpu.lost is not None:
        return Unknown(gpu.lost)
    busy = []
    if isinstance(gpu.compute_processes, tuple) and gpu.compute_processes:
        pids = ", ".join(str(p) for p in gpu.compute_processes[:5])
        more = f" and {len(gpu.compute_processes) - 5} more" if len(gpu.compute_processes) > 5 else ""
        busy.append(f"compute processes running (PID {pids}{more})")
    utilization = gpu.utilization_gpu_pct
    if isinstance(utilization, Unknown):
        if busy:
            return "; ".join(busy)
        kind = Unsupported if isinstance(utilization, Unsupported) else Unknown
        return kind(f"its utilization cannot be read ({utilization.reason})")
    if utilization > IDLE_UTILIZATION_MAX_PCT:
        busy.insert(0, f"utilization {utilization} % (idle is <= {IDLE_UTILIZATION_MAX_PCT} %)")
    return "; ".join(busy) if busy else None


class NvmlFacts(NamedTuple):
    driver_version: Maybe[str]
    cuda_driver_version: Maybe[str]  # "12.4"
    nvml_version: Maybe[str]
    device_count: int
    gpus: tuple[GpuFacts, ...]
    calls: int = 0  # NVML calls made for this reading (batched reads count once)
    incomplete: str | None = None  # why some GPUs were not read (a hung call)
    # The node's GPU count when the recording holds only some of its GPUs: an nvidia-smi dump of
    # selected GPUs (`nvidia-smi -q -i 0` prints "Attached GPUs : 8" and one GPU). None: all are here.
    attached: int | None = None


class XidEvent(NamedTuple):
    """An Xid reported by the NVIDIA driver in the kernel log."""

    pci_bus_id: str  # 0000:19:00.0 (the log prints domain:bus:device; function 0 assumed)
    xid: int
    message: str
    ts_usec: int | None = None
    wall: str | None = None  # the record's wall-clock stamp, as printed
