"""PCIe paths: ACS on the bridges between GPUs and RDMA NICs, the IOMMU, and topology levels.

ACS lives in PCI config space, read through sysfs (`/sys/bus/pci/devices/ADDR/config`,
binary). The extended capability list starts at 0x100; each header is 32
bits: capability id (16), version (4), next offset (12). The ACS capability
(id 0x000D) holds its Control register at capability + 6 (16 bits): bit 0
Source Validation, bit 2 P2P Request Redirect, bit 3 P2P Completion Redirect.
Only root may read past the first 64 bytes of config space; a short read is
reported as such, never guessed.

Topology levels follow `nvidia-smi topo -m`: PIX (one PCIe switch between the
two), PXB (several bridges, no host bridge), PHB (through a root port / host
bridge), NODE (across host bridges in one NUMA node), SYS (across sockets).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from agent.core.facts import PCI_ADDRESS_RE, AcsControl, IommuFacts, PciFunction, RdmaDevice, parse_kernel_cmdline
from agent.core.model import Unknown
from agent.sources.fsroot import FsRoot

PCI_DEVICES = "/sys/bus/pci/devices"
IOMMU_CLASS = "/sys/class/iommu"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
ACS_CAP_ID = 0x000D
EXT_CAP_START = 0x100
CONFIG_SPACE_PCIE = 4096
CONFIG_SPACE_PCI = 256
CONFIG_UNPRIVILEGED = 64  # what the kernel gives a process without CAP_SYS_ADMIN
ACS_CTRL_OFFSET = 6
ACS_REDIRECT_BITS = 0x000C  # P2P request redirect | P2P completion redirect
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first


class ConfigSpaceError(ValueError):
    """Config space that cannot be walked: too short to hold the list, or a malformed list."""


def find_ext_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of extended capability `cap_id`, None when the device has none.

    Raises ConfigSpaceError when the bytes stop before the list does, or the
    list is malformed (a loop, or a pointer back into the legacy header).
    """
    if len(config) <= CONFIG_UNPRIVILEGED:
        raise ConfigSpaceError(f"config space not readable: needs root ({len(config)} of {CONFIG_SPACE_PCIE} "
                               "bytes readable)")
    if len(config) == CONFIG_SPACE_PCI:
        return None  # conventional PCI (or a bridge without extended config space): no extended capabilities
    offset = EXT_CAP_START
    seen: set[int] = set()
    while True:
        if offset + 4 > len(config):
            raise ConfigSpaceError(f"config space is short: {len(config)} bytes, the capability list "
                                   f"continues at 0x{offset:03x}")
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None  # empty list (or a device that stopped answering)
        if header & 0xFFFF == cap_id:
            return offset
        seen.add(offset)
        offset = (header >> 20) & 0xFFC
        if offset == 0:
            return None
        if offset < EXT_CAP_START or offset in seen:
            raise ConfigSpaceError(f"malformed extended capability list (next pointer 0x{offset:03x})")


def parse_acs(config: bytes) -> AcsControl | None:
    """The ACS Control register from raw config-space bytes; None without an ACS capability."""
    offset = find_ext_capability(config, ACS_CAP_ID)
    if offset is None:
        return None
    if offset + ACS_CTRL_OFFSET + 2 > len(config):
        raise ConfigSpaceError(f"config space is short: ACS capability at 0x{offset:03x} is cut off")
    (control,) = struct.unpack_from("<H", config, offset + ACS_CTRL_OFFSET)
    return AcsControl(offset, control)


def config_path(address: str) -> str:
    if not PCI_ADDRESS_RE.match(address):
        raise ValueError(f"not a PCI address: {address!r}")
    return f"{PCI_DEVICES}/{address}/config"


def read_acs(fs: FsRoot, address: str) -> AcsControl | Unknown | None:
    from agent.sources.fsroot import describe_os_error

    path = config_path(address)
    try:
        data = fs.read_bytes(path, CONFIG_SPACE_PCIE)
    except OSError as exc:
        return Unknown(describe_os_error(path, exc))
    try:
        return parse_acs(data)
    except ConfigSpaceError as exc:
        return Unknown(f"{path}: {exc}")


# --- topology -----------------------------------------------------------------------------------


def ancestors(address: str, by_address: Mapping[str, PciFunction]) -> list[str]:
    """The bridges above `address`, nearest first (stops at a root bus or an unknown function)."""
    chain: list[str] = []
    current = by_address.get(address)
    while current is not None and current.parent is not None and len(chain) < 32:
        chain.append(current.parent)
        current = by_address.get(current.parent)
    return chain


def _root_bus(address: str, chain: list[str]) -> str:
    top = chain[-1] if chain else address
    return top.rsplit(":", 1)[0]  # "0000:15:01.0" -> "0000:15"


def path_between(a: str, b: str, by_address: Mapping[str, PciFunction]) -> tuple[str, list[str]]:
    """(level, bridges strictly below the common switch on both sides) between two functions.

    The bridges are the switch ports P2P traffic between the two passes, where ACS
    redirect would send it up to the root complex instead; empty unless PIX/PXB.
    """
    up_a, up_b = ancestors(a, by_address), ancestors(b, by_address)
    common = next((x for x in up_a if x in up_b), None)
    if common is not None and by_address.get(common) is not None and by_address[common].parent is not None:
        below = [x for x in up_a[: up_a.index(common)]] + [x for x in up_b[: up_b.index(common)]]
        one_switch = len(up_a) > 1 and len(up_b) > 1 and up_a[1] == common and up_b[1] == common
        return ("PIX" if one_switch else "PXB"), below
    if common is not None or _root_bus(a, up_a) == _root_bus(b, up_b):
        return "PHB", []
    fa, fb = by_address.get(a), by_address.get(b)
    if fa is not None and fb is not None and fa.numa_node is not None and fa.numa_node == fb.numa_node:
        return "NODE", []
    return "SYS", []


def rdma_nic_addresses(rdma: Iterable[RdmaDevice]) -> list[str]:
    return sorted({d.pci_address for d in rdma if d.pci_address})


def peer_bridges(pci: Iterable[PciFunction], rdma: Iterable[RdmaDevice]) -> dict[str, list[tuple[str, str]]]:
    """Bridge -> the (GPU, NIC) pairs whose P2P path crosses it inside a PCIe switch."""
    functions = list(pci)
    by_address = {f.address: f for f in functions}
    nics = [n for n in rdma_nic_addresses(rdma) if n in by_address]
    bridges: dict[str, list[tuple[str, str]]] = {}
    for gpu in sorted(f.address for f in functions if f.is_nvidia_gpu):
        for nic in nics:
            level, below = path_between(gpu, nic, by_address)
            if level in ("PIX", "PXB"):
                for bridge in below:
                    bridges.setdefault(bridge, []).append((gpu, nic))
    return bridges


def read_acs_above(fs: FsRoot, pci: tuple[PciFunction, ...] | Unknown,
                   rdma: tuple[RdmaDevice, ...] | Unknown) -> dict[str, AcsControl | Unknown | None] | Unknown:
    """ACS of every bridge on a GPU <-> RDMA NIC peer path (one config read each)."""
    if isinstance(pci, Unknown):
        return pci
    if isinstance(rdma, Unknown):
        return rdma
    return {bridge: read_acs(fs, bridge) for bridge in sorted(peer_bridges(pci, rdma))}


# --- IOMMU --------------------------------------------------------------------------------------

_ON = ("1", "on", "y", "yes", "true")
_OFF = ("0", "off", "n", "no", "false")


def iommu_mode(units: tuple[str, ...], params: Mapping[str, str | None], group_type: str | None) -> tuple[str, str]:
    """(off | passthrough | translated, why)."""
    if not units:
        switched = [f"{k}={params[k]}" for k in ("intel_iommu", "amd_iommu", "iommu") if params.get(k) == "off"]
        hint = f" ({', '.join(switched)} on the kernel command line)" if switched else ""
        return "off", f"no IOMMU unit registered in {IOMMU_CLASS}{hint}"
    listed = ", ".join(units[:4]) + (f" and {len(units) - 4} more" if len(units) > 4 else "")
    if group_type is not None:  # the kernel's own answer: the default domain of the IOMMU groups
        mode = "passthrough" if group_type == "identity" else "translated"
        return mode, f"IOMMU units {listed}; iommu_groups default domain type {group_type}"
    if params.get("iommu") == "pt" or (params.get("iommu.passthrough") or "").lower() in _ON:
        flag = "iommu=pt" if params.get("iommu") == "pt" else f"iommu.passthrough={params['iommu.passthrough']}"
        return "passthrough", f"IOMMU units {listed}; {flag} on the kernel command line"
    if params.get("iommu") == "nopt" or (params.get("iommu.passthrough") or "").lower() in _OFF:
        return "translated", f"IOMMU units {listed}; pass-through switched off on the kernel command line"
    return "translated", f"IOMMU units {listed} and no pass-through on the kernel command line (DMA is translated)"


def read_iommu(fs: FsRoot, cmdline: str | Unknown) -> IommuFacts | Unknown:
    from agent.sources.fsroot import list_dir, read_value

    names = list_dir(fs, IOMMU_CLASS)
    if isinstance(names, Unknown):
        if not names.reason.endswith("is absent"):
            return names
        names = []  # no IOMMU driver ever registered a unit
    units = tuple(n for n in names if n not in (".", "..") and "/" not in n)
    group_type: str | None = None
    if units:
        groups = list_dir(fs, IOMMU_GROUPS)
        if not isinstance(groups, Unknown):
            numbers = sorted(int(g) for g in groups if g.isdigit())
            if numbers:
                value = read_value(fs, f"{IOMMU_GROUPS}/{numbers[0]}/type")
                group_type = value if isinstance(value, str) and value else None
    if isinstance(cmdline, Unknown) and units and group_type is None:
        return Unknown(f"IOMMU units present but the mode cannot be told: {cmdline.reason}")
    params = {} if isinstance(cmdline, Unknown) else parse_kernel_cmdline(cmdline)
    mode, why = iommu_mode(units, params, group_type)
    return IommuFacts(units, mode, why)
