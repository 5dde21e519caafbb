"""Typed facts about one node. Plain values: checks never do I/O.

Immutable records are NamedTuples rather than frozen dataclasses: creating a
dataclass costs ~0.5 ms at import (it compiles generated code), a NamedTuple
a tenth of that, and every command imports these.

A fact that could not be read is an `Unknown` carrying the reason, so a check
can turn it into an `unknown` finding that says why.

This module holds the host's facts, the node that gathers every source, and the
baseline; the GPU (NVML) facts live in agent.core.facts_nvml and the BMC's in
agent.core.facts_bmc. Every name is importable from here, as callers do.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from agent.core.facts_base import NOT_READ, Maybe, T
from agent.core.facts_bmc import (
    BiosSettings,
    BmcBinding,
    BmcDrive,
    BmcFacts,
    BmcFan,
    BmcGpu,
    BmcLeakDetector,
    BmcLogEntry,
    BmcPowerLimit,
    BmcPsu,
    BmcRedundancy,
    BmcSwitch,
    BmcTemperature,
    BmcVoltage,
    BmcVolume,
    FirmwareItem,
)
from agent.core.facts_nvml import (
    CLOCK_EVENT_BITS,
    IDLE_UTILIZATION_MAX_PCT,
    GpuFacts,
    NvmlFacts,
    XidEvent,
    gpu_activity,
)
from agent.core.history import History
from agent.core.model import SourceStatus, Unknown, Unsupported

__all__ = [  # what callers import from here: this module's records and those of facts_base/_nvml/_bmc
    "CLOCK_EVENT_BITS", "IDLE_UTILIZATION_MAX_PCT", "NOT_READ", "NO_BASELINE", "NO_FABRIC", "PCI_ADDRESS_RE",
    "PCI_VENDOR_MELLANOX", "PCI_VENDOR_NVIDIA", "AcsControl", "Baseline", "BaselineGpu", "BiosSettings", "BmcBinding",
    "BmcDrive", "BmcFacts", "BmcFan", "BmcGpu", "BmcLeakDetector", "BmcLogEntry", "BmcPowerLimit", "BmcPsu",
    "BmcRedundancy", "BmcSwitch", "BmcTemperature", "BmcVoltage", "BmcVolume", "CpuFacts", "FabricFacts",
    "FirmwareItem", "GpuFacts", "HostFacts", "IdleState", "IommuFacts", "KernelEvent",
    "KmsgRecord", "Maybe", "NetInterface", "NodeFacts", "NvSwitchError", "NvmlFacts", "PciFunction", "ProfileMatch",
    "RdmaDevice", "RdmaPort", "T", "XidEvent", "gpu_activity", "parse_kernel_cmdline",
]

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
    offline: Maybe[tuple[int, ...]] = NOT_READ  # /sys/devices/system/cpu/offline (issue 31.5)
    smt_control: Maybe[str] = NOT_READ  # /sys/devices/system/cpu/smt/control: on, off, forceoff, notsupported


class KmsgRecord(NamedTuple):
    """One kernel log record (from /dev/kmsg, kmsg.txt or a dmesg dump)."""

    message: str
    priority: int | None = None
    seq: int | None = None
    ts_usec: int | None = None  # monotonic time since boot (/dev/kmsg, plain dmesg)
    wall: str | None = None  # wall-clock stamp as printed (dmesg -T/--time-format=iso, journalctl); see kmsg.wall_time
    boot: str | None = None  # the boot it belongs to, where the log says (journalctl's "-- Boot ID --" lines)


class KernelEvent(NamedTuple):
    """A catalogued kernel event (agent.sources.kernel_events): the rule it matched and the record."""

    rule: str  # Rule.id
    record: KmsgRecord
    key: str = ""  # the value of the rule's `per` group (the port), "" for node-wide rules


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
    boot_id: Maybe[str] = NOT_READ  # /proc/sys/kernel/random/boot_id: which boot the ledger files an incident under

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
    misfit: str = ""  # forced: what of the hardware the profile's `match:` does not fit (matching.forced_misfit)
    id_conflicts: tuple[str, ...] = ()  # the GPU's own report over its PCI id (matching.Identity.id_conflicts)


@dataclass
class NodeFacts:
    """Everything known about one node, from all sources."""

    host: HostFacts
    kmsg: Maybe[tuple[KmsgRecord, ...]]
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    profile_match: ProfileMatch | None = None
    nvml: Maybe[NvmlFacts] = NOT_READ
    xids: Maybe[tuple[XidEvent, ...]] = ()
    # Parsed from `kmsg` before any check runs (issue 32.4; agent.sources.kernel_log.parse_kernel_log):
    # the kernel's NVSwitch errors and its catalogued fault events.
    sxids: Maybe[tuple[NvSwitchError, ...]] = ()
    kernel_events: Maybe[tuple[KernelEvent, ...]] = ()
    bmc: Maybe[BmcFacts] = NOT_READ
    observed_at: dt.datetime | None = None  # when the node was read (a snapshot's captured_at)
    baseline: Maybe[Baseline] = NO_BASELINE  # the node's recorded baseline (agent.apps.cli.baseline)
    binding: BmcBinding | None = None  # None: not judged (facts built by hand): the BMC is taken as the host's
    # The node's ledger within the longest rule window (issue 33; agent.engine.history); None: no ledger read.
    history: History | None = None


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


# --- Baseline (what the node read when it arrived; agent.apps.cli.baseline records and loads it) ---------


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
