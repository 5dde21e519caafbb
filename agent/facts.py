"""Typed facts about one node. Plain values: checks never do I/O.

Immutable records are NamedTuples rather than frozen dataclasses: creating a
dataclass costs ~0.5 ms at import (it compiles generated code), a NamedTuple
a tenth of that, and every command imports these.

A fact that could not be read is an `Unknown` carrying the reason, so a check
can turn it into an `unknown` finding that says why.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias, TypeVar, Union

from agent.model import SourceStatus, Unknown, Unsupported

T = TypeVar("T")
# A fact or the reason it is unknown. Union[] because mypy rejects `T | X` aliases.
Maybe: TypeAlias = Union[T, Unknown]  # noqa: UP007

NOT_READ = Unknown("not read")  # immutable, so one shared default is safe
NO_BASELINE = Unsupported("no baseline recorded")

PCI_VENDOR_NVIDIA = 0x10DE
PCI_VENDOR_MELLANOX = 0x15B3
_PCI_CLASS_DISPLAY_VGA = 0x0300
_PCI_CLASS_DISPLAY_3D = 0x0302
_PCI_CLASS_BRIDGE_OTHER = 0x0680
_PCI_CLASS_NETWORK = 0x02

PCI_ADDRESS_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class PciFunction(NamedTuple):
    """One PCI function as sysfs describes it."""

    address: str
    vendor: int
    device: int
    class_code: int  # 24 bits: base class, subclass, programming interface
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    numa_node: int | None = None  # None where the firmware reports -1
    current_link_speed: str | None = None  # kernel text, e.g. "32.0 GT/s PCIe"
    current_link_width: int | None = None
    max_link_speed: str | None = None
    max_link_width: int | None = None
    driver: str | None = None
    parent: str | None = None  # upstream bridge's address; None on a root bus

    @property
    def pci_id(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"

    @property
    def subclass(self) -> int:
        return self.class_code >> 8

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == PCI_VENDOR_NVIDIA and self.subclass in (
            _PCI_CLASS_DISPLAY_VGA,
            _PCI_CLASS_DISPLAY_3D,
        )

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == PCI_VENDOR_NVIDIA and self.subclass == _PCI_CLASS_BRIDGE_OTHER

    @property
    def is_network(self) -> bool:
        return (self.class_code >> 16) == _PCI_CLASS_NETWORK


class NetInterface(NamedTuple):
    """A network interface from /sys/class/net."""

    name: str
    mtu: Maybe[int]
    operstate: Maybe[str]
    speed_mbps: int | None = None  # None: link down or speed not reported
    arp_type: int | None = None  # ARPHRD_*: 1 Ethernet, 32 InfiniBand, 772 loopback
    driver: str | None = None
    pci_address: str | None = None  # None for virtual interfaces
    bond_master: str | None = None
    is_bond: bool = False
    rdma_device: str | None = None  # e.g. mlx5_0 when the port is RDMA capable
    link_layer: str | None = None  # "Ethernet" (RoCE) or "InfiniBand" for RDMA ports

    @property
    def is_virtual(self) -> bool:
        return self.pci_address is None


class RdmaPort(NamedTuple):
    """One port of an RDMA device (/sys/class/infiniband/DEV/ports/N), in the kernel's formats."""

    port: int
    state: Maybe[str] = NOT_READ  # "ACTIVE" (sysfs "4: ACTIVE")
    phys_state: Maybe[str] = NOT_READ  # "LinkUp" (sysfs "5: LinkUp")
    rate: Maybe[str] = NOT_READ  # "400 Gb/sec (4X NDR)"
    link_layer: Maybe[str] = NOT_READ  # InfiniBand | Ethernet
    counters: Maybe[dict[str, int | str]] = NOT_READ  # name -> value, or the text when not a number ("N/A")
    hw_counters: Maybe[dict[str, int | str]] = NOT_READ
    netdev: str | None = None  # the netdev this port carries (device/net or gid_attrs/ndevs/0)
    problems: tuple[str, ...] = ()  # attributes missing from a half-populated port directory


class RdmaDevice(NamedTuple):
    """An RDMA device (HCA) from /sys/class/infiniband."""

    name: str
    hca_type: Maybe[str] = NOT_READ  # MT4129 (ConnectX-7), MT4123 (ConnectX-6), ...
    board_id: Maybe[str] = NOT_READ  # the PSID, e.g. MT_0000000838
    fw_ver: Maybe[str] = NOT_READ
    pci_address: str | None = None
    ports: Maybe[tuple[RdmaPort, ...]] = NOT_READ
    # A virtual function's physical function on this host (sysfs device/physfn): SR-IOV VFs made
    # for containers, never rails. None for physical functions and for VFs passed through to a VM.
    physfn: str | None = None


class AcsControl(NamedTuple):
    """The ACS Control register of a bridge (PCIe extended capability 0x000D)."""

    offset: int  # of the ACS capability in config space
    control: int  # 16 bits: 0 source validation, 2 P2P request redirect, 3 P2P completion redirect

    @property
    def redirects(self) -> bool:
        return bool(self.control & 0x000C)

    def describe(self) -> str:
        names = (("SrcValid", 0x1), ("TransBlk", 0x2), ("ReqRedir", 0x4), ("CmpltRedir", 0x8),
                 ("UpstreamFwd", 0x10), ("EgressCtrl", 0x20), ("DirectTrans", 0x40))
        return " ".join(f"{name}{'+' if self.control & bit else '-'}" for name, bit in names)


class IommuFacts(NamedTuple):
    """IOMMU units the kernel registered (/sys/class/iommu) and what the command line asks for."""

    units: tuple[str, ...]  # dmar0, ivhd0, smmu3.0x..., empty: no IOMMU driver active
    mode: str  # off | passthrough | translated
    why: str  # how the mode was decided


class IdleState(NamedTuple):
    """One cpuidle state and on how many online CPUs it is disabled.

    `disabled_cpus` is None for states shallower than the deepest state that
    is enabled somewhere: the reader does not count those (nothing depends on it).
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose
    name: str
    latency_us: int
    disabled_cpus: int | None
    total_cpus: int

    @property
    def enabled_anywhere(self) -> bool | None:
        return None if self.disabled_cpus is None else self.disabled_cpus < self.total_cpus


class CpuFacts(NamedTuple):
    online: Maybe[tuple[int, ...]]
    governors: Maybe[dict[str, tuple[int, ...]]]  # governor -> CPUs using it
    scaling_driver: Maybe[str]
    idle_driver: Maybe[str]
    idle_states: Maybe[tuple[IdleState, ...]]


class KmsgRecord(NamedTuple):
    """One kernel log record (from /dev/kmsg, kmsg.txt or a dmesg dump)."""

    message: str
    priority: int | None = None
    seq: int | None = None
    ts_usec: int | None = None  # monotonic time since boot (/dev/kmsg, plain dmesg)
    wall: str | None = None  # wall-clock stamp as printed (dmesg -T/--time-format=iso, journalctl); see kmsg.wall_time


class NvSwitchError(NamedTuple):
    """An NVSwitch error (SXid), from the kernel log or Fabric Manager's log (agent.sources.fabric)."""

    sxid: int
    fatal: bool | None  # None: the line does not say (e.g. "SOE HALTED")
    switch: str | None  # driver instance, "nvswitch2" (kernel log only)
    pci_address: str | None  # 0000:85:00.0
    link: int | None  # NVSwitch port; None for switch-wide errors
    message: str
    source: str = "kmsg"  # kmsg | fmlog
    when: str | None = None  # Fabric Manager's time stamp as printed ("Nov 19 2026 14:02:11")
    ts_usec: int | None = None  # kernel time stamp (since boot)


class FabricFacts(NamedTuple):
    """NVSwitch fabric as the host sees it; NVSwitch PCI functions are in HostFacts.pci (is_nvswitch)."""

    manager: Maybe[str] = NOT_READ  # nvidia-fabricmanager: active | inactive
    manager_how: str = ""  # what showed it: the cgroup file and a PID, or why it counts as not running
    log_errors: Maybe[tuple[NvSwitchError, ...]] = NOT_READ  # in the tail of /var/log/fabricmanager.log
    log_read_bytes: int = 0  # bytes read from the log (bounded: the tail only)
    log_size: int | None = None  # the log's size when read


NO_FABRIC = FabricFacts()  # immutable: one shared default (nothing read)


@dataclass
class HostFacts:
    hostname: Maybe[str]
    kernel_release: Maybe[str]
    sysctl: dict[str, Maybe[str]]
    thp_enabled: Maybe[str]
    thp_defrag: Maybe[str]
    numa_nodes: Maybe[tuple[int, ...]]
    cmdline: Maybe[str]
    dmi: dict[str, Maybe[str]]
    secure_boot: Maybe[str]  # enabled | disabled | unsupported
    nvidia_driver: Maybe[str]
    pci: Maybe[tuple[PciFunction, ...]]
    modules: Maybe[dict[str, str]]  # name -> state (Live, Loading, Unloading)
    interfaces: Maybe[tuple[NetInterface, ...]]
    cpu: CpuFacts
    uptime_s: Maybe[float] = NOT_READ
    fabric: FabricFacts = NO_FABRIC  # Fabric Manager and its log (agent.sources.fabric)
    rdma: Maybe[tuple[RdmaDevice, ...]] = NOT_READ  # /sys/class/infiniband; () without an RDMA stack
    pcie_acs: Maybe[dict[str, Maybe[AcsControl | None]]] = NOT_READ  # bridge -> ACS (None: no capability)
    iommu: Maybe[IommuFacts] = NOT_READ
    swap_total_kb: Maybe[int] = NOT_READ  # KiB of active swap areas, /proc/swaps (0: swap off)
    pci_links: Maybe[bool] = True  # Unsupported: this view of PCI has no link speeds/widths (lspci -nn)

    @property
    def kernel_params(self) -> Maybe[dict[str, str | None]]:
        if isinstance(self.cmdline, Unknown):
            return self.cmdline
        return parse_kernel_cmdline(self.cmdline)

    @property
    def nvidia_gpus(self) -> Maybe[tuple[PciFunction, ...]]:
        if isinstance(self.pci, Unknown):
            return self.pci
        return tuple(f for f in self.pci if f.is_nvidia_gpu)


class ProfileMatch(NamedTuple):
    """How the profile for this node was chosen (input of profile.match)."""

    profile: str
    how: str  # auto | forced | fallback | no_gpu
    identity: str  # human description of the hardware that was matched
    matched_on: tuple[str, ...] = ()
    also_matched: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


class BmcBinding(NamedTuple):
    """Whether the BMC that was read describes this host (agent.matching.bind_bmc).

    `state`: bound (Redfish UUID or serial equals DMI's), remote (they differ), unknown (one side has
    no usable identity), bmc_only (no host in this audit: the BMC is the node), no_bmc.
    """

    state: str
    message: str
    observed: dict[str, str | None] = {}

    @property
    def describes_node(self) -> bool:
        """The BMC's view is this node's: cross-checks may compare it with the host's."""
        return self.state in ("bound", "bmc_only")


@dataclass
class NodeFacts:
    """Everything known about one node, from all sources."""

    host: HostFacts
    kmsg: Maybe[tuple[KmsgRecord, ...]]
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    profile_match: ProfileMatch | None = None
    nvml: Maybe[NvmlFacts] = NOT_READ
    xids: Maybe[tuple[XidEvent, ...]] = ()
    bmc: Maybe[BmcFacts] = NOT_READ
    observed_at: dt.datetime | None = None  # when the node was read (a snapshot's captured_at)
    baseline: Maybe[Baseline] = NO_BASELINE  # the node's recorded baseline (agent.baseline)
    binding: BmcBinding | None = None  # None: not judged (facts built by hand): the BMC is taken as the host's


def parse_kernel_cmdline(cmdline: str) -> dict[str, str | None]:
    """Kernel parameters before `--` (what follows goes to init). Last one wins."""
    params: dict[str, str | None] = {}
    for token in _split_cmdline(cmdline):
        if token == "--":  # noqa: S105 - the init-arguments separator
            break
        key, sep, value = token.partition("=")
        params[key] = value if sep else None
    return params


def _split_cmdline(cmdline: str) -> list[str]:
    # The kernel honours double quotes around values with spaces; nothing else.
    tokens: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in cmdline.strip():
        if ch == '"':
            quoted = not quoted
        elif ch.isspace() and not quoted:
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


# --- GPUs (NVML) -------------------------------------------------------------------------------

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


# --- BMC (Redfish or IPMI) ---------------------------------------------------------------------


class BmcTemperature(NamedTuple):
    """A temperature sensor with its own thresholds (°C). None: not reported."""

    name: str
    reading: float | None
    upper_caution: float | None = None
    upper_critical: float | None = None
    upper_fatal: float | None = None
    state: str | None = None  # Redfish Status.State: Enabled, Absent, ...; IPMI: present/absent
    health: str | None = None  # OK, Warning, Critical
    context: str | None = None  # PhysicalContext: Intake, CPU, GPU, ...
    where: str = ""  # the Redfish resource or IPMI sensor it came from


class BmcFan(NamedTuple):
    name: str
    reading: float | None
    units: str | None = None  # RPM or Percent
    lower_critical: float | None = None
    state: str | None = None
    health: str | None = None
    where: str = ""


class BmcPsu(NamedTuple):
    name: str
    state: str | None = None  # Enabled, Absent, StandbySpare, UnavailableOffline, ...
    health: str | None = None
    model: str | None = None
    firmware: str | None = None
    capacity_w: float | None = None
    output_w: float | None = None
    where: str = ""


class BmcRedundancy(NamedTuple):
    name: str
    mode: str | None = None  # N+m, Failover, ...
    state: str | None = None
    health: str | None = None
    min_needed: int | None = None
    members: int | None = None
    where: str = ""


class BmcLeakDetector(NamedTuple):
    name: str
    detector_state: str | None = None  # OK, Warning, Critical
    state: str | None = None
    health: str | None = None
    where: str = ""


class BiosSettings(NamedTuple):
    """Where a BMC takes BIOS changes: the `@Redfish.Settings` object of the Bios resource.

    `pending` is what the settings object holds now: on iDRAC only the staged
    changes, on iLO and others the full set the next boot will use.
    """

    bios_path: str
    settings_path: str
    apply_times: tuple[str, ...] = ()  # SupportedApplyTimes, e.g. OnReset
    pending: Maybe[dict[str, Any]] = NOT_READ
    etag: str | None = None  # of the settings object, for If-Match


class FirmwareItem(NamedTuple):
    """One entry of the firmware inventory (or what IPMI reports for the BMC)."""

    name: str
    version: str
    component_id: str = ""  # the inventory member id, e.g. "iDRAC", "BIOS", "PSU.Slot.1"
    updateable: bool | None = None
    where: str = ""
    # What the item is, for comparing like with like (never the positional id): the inventory's
    # Description (HPE puts the part family there: "MO006400KYDND", "PowerSupplies"), SoftwareId,
    # and the Model of the hardware its RelatedItem links to, when that was read.
    description: str | None = None
    software_id: str | None = None
    model: str | None = None
    state: str | None = None  # Status.State: UnavailableOffline = the BMC could not read this image
    # Which part the image runs on, for naming it: the resources its RelatedItem links to (an HGX
    # baseboard's GPU Processor), and where the vendor says the device sits (HPE: "PCI-E Slot 14").
    related: tuple[str, ...] = ()
    location: str | None = None

    @property
    def stable_id(self) -> str:
        """An id that survives updates (Dell's ids carry the version: "Installed-159-2.3.5__BIOS.Setup.1-1")."""
        ident = self.component_id or self.name
        return ident.split("__", 1)[1] if "__" in ident else ident

    @property
    def installed(self) -> bool:
        """False for the inventory's previous or staged images (Dell: "Previous-…", "Available-…")."""
        return not (self.component_id or "").startswith(("Previous-", "Available-"))


class BmcLogEntry(NamedTuple):
    log: str  # SEL, IML, Event, ...
    entry_id: str
    severity: str | None  # OK, Warning, Critical
    message: str
    created: str | None = None  # ISO timestamp as the BMC reports it
    message_id: str | None = None
    # True: resolved (Redfish Resolved, HPE Oem.Hpe.Repaired, a later clearing entry, a deassertion);
    # False: open whatever its age (Resolved false, Repaired false, an active-fault list); None: not said.
    resolved: bool | None = None


class BmcGpu(NamedTuple):
    """A GPU as the BMC sees it (Processors with ProcessorType GPU, HGX baseboard)."""

    name: str
    model: str | None = None
    firmware: str | None = None
    serial: str | None = None
    state: str | None = None
    health: str | None = None
    temperature_c: float | None = None
    where: str = ""
    # Which view it is (issue 13 rule 9): the ComputerSystem it is listed under, and whether that is an
    # NVIDIA HGX baseboard (`Systems/HGX_Baseboard_N`) rather than the host system. uuid and slot
    # (Location.PartLocation.ServiceLabel, e.g. "SXM3") pair the same GPU across the two views.
    system: str = ""
    baseboard: bool = False
    uuid: str | None = None
    slot: str | None = None


class BmcSwitch(NamedTuple):
    """A fabric switch the BMC manages (NVSwitch on HGX baseboards, PCIe switches)."""

    name: str
    switch_type: str | None = None  # NVLink, PCIe, MultiProtocol, ...
    model: str | None = None
    firmware: str | None = None
    state: str | None = None
    health: str | None = None
    where: str = ""


class BmcFacts(NamedTuple):
    """The node as its BMC reports it. Each part may be Unknown with the resource and reason."""

    protocol: str  # redfish | ipmi
    vendor: Maybe[str] = NOT_READ
    redfish_version: Maybe[str] = NOT_READ
    manufacturer: Maybe[str] = NOT_READ
    model: Maybe[str] = NOT_READ
    bios_version: Maybe[str] = NOT_READ
    health: Maybe[str] = NOT_READ
    health_rollup: Maybe[str] = NOT_READ
    health_causes: tuple[str, ...] = ()  # what the BMC blames, when it says (Conditions, sub-resources)
    manager_model: Maybe[str] = NOT_READ
    manager_firmware: Maybe[str] = NOT_READ
    power_state: Maybe[str] = NOT_READ
    firmware: Maybe[tuple[FirmwareItem, ...]] = NOT_READ
    temperatures: Maybe[tuple[BmcTemperature, ...]] = NOT_READ
    fans: Maybe[tuple[BmcFan, ...]] = NOT_READ
    psus: Maybe[tuple[BmcPsu, ...]] = NOT_READ
    redundancy: Maybe[tuple[BmcRedundancy, ...]] = NOT_READ
    leak_detectors: Maybe[tuple[BmcLeakDetector, ...]] = NOT_READ
    power_consumed_w: Maybe[float] = NOT_READ
    bios_attributes: Maybe[dict[str, Any]] = NOT_READ
    bios_settings: Maybe[BiosSettings] = NOT_READ  # Unsupported: the BMC takes no BIOS changes over Redfish
    events: Maybe[tuple[BmcLogEntry, ...]] = NOT_READ
    gpus: Maybe[tuple[BmcGpu, ...]] = NOT_READ  # each GPU once: the HGX baseboard's view where there is one
    switches: Maybe[tuple[BmcSwitch, ...]] = NOT_READ
    problems: tuple[str, ...] = ()  # resources that failed, with the reason
    insecure: bool = False  # TLS verification was switched off (--bmc-insecure)
    requests: int = 0
    # The BIOS AttributeRegistry's enumerations, attribute -> {ValueName: ValueDisplayName}
    # (agent.sources.bios_registry); NOT_READ where the BMC offers none or it was not fetched.
    bios_registry: Maybe[dict[str, dict[str, str]]] = NOT_READ
    # The host ComputerSystem's identity (issue 13 rule 2: binding the BMC to the host it describes).
    system_uuid: Maybe[str] = NOT_READ
    system_serial: Maybe[str] = NOT_READ
    system_sku: Maybe[str] = NOT_READ  # Dell: the service tag (DMI product_serial); HPE: the product number
    # Every GPU Processor the BMC lists, in every view: the host system's own and the HGX baseboard's
    # (a GPU can appear twice); NOT_READ where the parser did not set it (then `gpus` is all there is).
    gpu_views: Maybe[tuple[BmcGpu, ...]] = NOT_READ


# --- Baseline (what the node read when it arrived; agent.baseline records and loads it) ---------


class BaselineGpu(NamedTuple):
    """One GPU's idle readings in the baseline. None: not readable when recorded."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose
    uuid: str | None  # the GPU's identity: entries are matched by UUID, never by index
    serial: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    lost: str | None = None  # the GPU was lost when the baseline was recorded


class Baseline(NamedTuple):
    """A node's baseline (`nodewarden.baseline/v1`), as loaded from baseline.json."""

    path: str
    recorded_at: str  # UTC, ISO 8601
    hostname: str | None
    model: str | None
    profile: str | None
    gpus: tuple[BaselineGpu, ...]
    bmc_temperatures_c: dict[str, float]  # BMC sensor name -> reading
    bmc_fans: dict[str, float]  # fan name -> reading (RPM or %)
    psu_output_w: dict[str, float]  # PSU name -> output power
    power_consumed_w: float | None = None
    forced: bool = False  # recorded with --force on a GPU that was not idle

    def gpu_by_uuid(self, uuid: str) -> BaselineGpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)
