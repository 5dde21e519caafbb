"""Host source: parse /proc and /sys (live or from a snapshot) into HostFacts.

Every reader turns a missing, unreadable or malformed file into an
`Unknown` with the path and the reason; nothing here raises for bad data.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from agent.core.facts import (
    PCI_ADDRESS_RE,
    PCI_VENDOR_MELLANOX,
    PCI_VENDOR_NVIDIA,
    CpuFacts,
    HostFacts,
    IdleState,
    NetInterface,
    PciFunction,
)
from agent.core.model import Unknown, Unsupported
from agent.core.numbers import MAX_UPTIME_S, finite
from agent.sources.fsroot import FsRoot, describe_os_error, link_name, list_dir, read_value

T = TypeVar("T")

THP_DIR = "/sys/kernel/mm/transparent_hugepage"
DMI_DIR = "/sys/class/dmi/id"
DMI_FIELDS = ("sys_vendor", "product_name", "product_family", "bios_vendor", "bios_version",
              "bios_date", "board_vendor", "board_name", "product_sku")
# The node's identity, bound to the BMC's ComputerSystem UUID/SerialNumber (agent.policy.matching.bind_bmc).
# Root-only on live systems (0400): unreadable is Unknown, and the BMC is then not taken as this host's.
DMI_IDENTITY_FIELDS = ("product_uuid", "product_serial")
EFI_DIR = "/sys/firmware/efi"
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0344c8c3"
NVIDIA_VERSION_FILE = "/proc/driver/nvidia/version"
PCI_DEVICES = "/sys/bus/pci/devices"
NET_DIR = "/sys/class/net"
IB_DIR = "/sys/class/infiniband"
CPU_DIR = "/sys/devices/system/cpu"
NODE_DIR = "/sys/devices/system/node"

# Sysctls every audit reads, whatever the profile asks for.
BASE_SYSCTLS = ("kernel.numa_balancing", "vm.zone_reclaim_mode")

_SYSCTL_PART_RE = re.compile(r"^[A-Za-z0-9_\-:@/]+$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@\-]{1,15}$")
_NVIDIA_VERSION_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)*)")


class InvalidName(ValueError):
    """A name from outside (sysctl key, interface) that must not become a path."""


def sysctl_path(key: str) -> str:
    """Map a dotted sysctl key to its /proc/sys path, refusing anything odd.

    As in sysctl(8), a '/' inside a component stands for a literal dot, so the
    VLAN interface "eth0.100" is spelled net.ipv4.conf.eth0/100.rp_filter.
    """
    parts = key.split(".")
    if len(parts) < 2 or len(key) > 255:
        raise InvalidName(f"not a sysctl key: {key!r}")
    out: list[str] = []
    for part in parts:
        if not _SYSCTL_PART_RE.match(part):
            raise InvalidName(f"not a sysctl key: {key!r}")
        name = part.replace("/", ".")
        if name in (".", ".."):
            raise InvalidName(f"not a sysctl key: {key!r}")
        out.append(name)
    return "/proc/sys/" + "/".join(out)


def _maybe(fs: FsRoot, path: str, parse: Callable[[str], T]) -> T | None:
    value = read_value(fs, path, parse)
    return None if isinstance(value, Unknown) else value


def parse_bracketed(text: str) -> str:
    """'always [madvise] never' -> 'madvise' (the kernel marks the active choice)."""
    match = re.search(r"\[([^\]]+)\]", text)
    if not match:
        raise ValueError(text)
    return match.group(1)


BOOT_ID = "/proc/sys/kernel/random/boot_id"
_BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_boot_id(text: str) -> str:
    """The kernel's boot UUID (lower-case 8-4-4-4-12 hex); anything else is no boot id."""
    value = text.strip().lower()
    if not _BOOT_ID_RE.fullmatch(value):
        raise ValueError(text[:80])
    return value


def parse_uptime(text: str) -> float:
    """/proc/uptime's first field: seconds, finite, 0 to a century (inf, nan or 1e308 is not an uptime)."""
    value = finite((text.split(maxsplit=1) or [""])[0], low=0, high=MAX_UPTIME_S)
    if value is None:
        raise ValueError(text)  # read_value turns it into Unknown naming the file and its content
    return value


MAX_CPU_IDS = 65_536  # the kernel's NR_CPUS tops out at 8,192 (16,384 on a few builds)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if not 0 <= first <= last < MAX_CPU_IDS or len(cpus) + last - first >= MAX_CPU_IDS:
            raise ValueError(text)  # "0-999999999" in a snapshot would be a billion-entry tuple
        cpus.extend(range(first, last + 1))
    return tuple(cpus)


def normalize_sysctl(text: str) -> str:
    # Multi-value sysctls (tcp_rmem) are tab-separated; compare them as words.
    return " ".join(text.split())


def read_sysctls(fs: FsRoot, keys: Iterable[str]) -> dict[str, str | Unknown]:
    values: dict[str, str | Unknown] = {}
    for key in sorted(set(keys)):
        try:
            path = sysctl_path(key)
        except InvalidName as exc:
            values[key] = Unknown(str(exc))
            continue
        values[key] = read_value(fs, path, normalize_sysctl)
    return values


def read_secure_boot(fs: FsRoot) -> str | Unknown:
    if not fs.is_dir(EFI_DIR):
        return "unsupported"  # legacy BIOS boot: there is no Secure Boot
    try:
        data = fs.read_bytes(SECURE_BOOT_VAR)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            if not fs.is_dir(os.path.dirname(SECURE_BOOT_VAR)):
                return Unknown("efivarfs is not mounted at /sys/firmware/efi/efivars")
            return "unsupported"  # UEFI firmware without the SecureBoot variable
        return Unknown(describe_os_error(SECURE_BOOT_VAR, exc))
    # efivarfs: 4 bytes of attributes, then the variable's data (one byte).
    if len(data) < 5:
        return Unknown(f"{SECURE_BOOT_VAR}: {len(data)} bytes, expected 5")
    return "enabled" if data[4] == 1 else "disabled"


def read_nvidia_driver(fs: FsRoot) -> str | Unknown:
    text = read_value(fs, NVIDIA_VERSION_FILE)
    if isinstance(text, Unknown):
        if text.reason.endswith("is absent"):
            return Unknown(f"{NVIDIA_VERSION_FILE} is absent: the NVIDIA kernel module is not loaded")
        return text
    match = _NVIDIA_VERSION_RE.search(text)
    if not match:
        first = text.splitlines()[0][:80] if text else ""
        return Unknown(f"{NVIDIA_VERSION_FILE}: no driver version in {first!r}")
    return match.group(1)


def _int_or_none(text: str) -> int:
    return int(text, 0)


# Functions whose NUMA node, link and driver we read: GPUs, NVSwitches, NICs and
# NVMe. The ~400 chipset functions of a two-socket server need only their ids.
_DETAIL_CLASSES = (0x03, 0x02)  # display, network (Ethernet and InfiniBand)
_DETAIL_SUBCLASSES = (0x0680, 0x0108)  # other bridge (NVSwitch), NVMe


def wants_detail(vendor: int, class_code: int) -> bool:
    return (class_code >> 16) in _DETAIL_CLASSES or (class_code >> 8) in _DETAIL_SUBCLASSES or vendor in (
        PCI_VENDOR_NVIDIA, PCI_VENDOR_MELLANOX)


def parse_pci_uevent(text: str) -> dict[str, str]:
    """'KEY=value' lines of a PCI function's uevent file."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _id_pair(text: str) -> tuple[int, int] | None:
    """'10de:2330' -> (0x10de, 0x2330); None unless it is two hex numbers."""
    first, sep, second = text.partition(":")
    if not sep or ":" in second:
        return None
    try:
        return int(first, 16), int(second, 16)
    except ValueError:
        return None


def _ids_from_uevent(fields: dict[str, str]) -> tuple[int, int, int, int | None, int | None] | None:
    # Called for every PCI function (~500 on a two-socket node): no generators, no context managers.
    ids = _id_pair(fields.get("PCI_ID", ""))
    try:
        class_code = int(fields["PCI_CLASS"], 16)
    except (KeyError, ValueError):
        return None
    if ids is None:
        return None
    subsystem = _id_pair(fields.get("PCI_SUBSYS_ID", ""))
    sub_vendor, sub_device = subsystem if subsystem is not None else (None, None)
    return ids[0], ids[1], class_code, sub_vendor, sub_device


def read_pci_function(fs: FsRoot, address: str) -> PciFunction | Unknown:
    """One function: ids from uevent (one read), details only where they matter."""
    base = f"{PCI_DEVICES}/{address}"
    uevent = read_value(fs, f"{base}/uevent", parse_pci_uevent)
    ids = None if isinstance(uevent, Unknown) else _ids_from_uevent(uevent)
    driver: str | None
    if ids is not None and not isinstance(uevent, Unknown):
        vendor, device, class_code, sub_vendor, sub_device = ids
        driver = uevent.get("DRIVER")
    else:  # older kernels or odd devices: the individual attribute files
        values = [read_value(fs, f"{base}/{n}", _int_or_none) for n in ("vendor", "device", "class")]
        for value in values:
            if isinstance(value, Unknown):
                return value
        vendor, device, class_code = (int(v) for v in values)  # type: ignore[arg-type]
        sub_vendor = _maybe(fs, f"{base}/subsystem_vendor", _int_or_none)
        sub_device = _maybe(fs, f"{base}/subsystem_device", _int_or_none)
        driver = link_name(fs, f"{base}/driver")
    parent: str | None = None
    try:
        up = os.path.basename(os.path.dirname(fs.readlink(base).rstrip("/")))
    except OSError:  # no link: a root-bus device or a flat test tree
        pass
    else:
        parent = up if PCI_ADDRESS_RE.match(up) else None
    function = PciFunction(address=address, vendor=vendor, device=device, class_code=class_code,
                           subsystem_vendor=sub_vendor, subsystem_device=sub_device, driver=driver,
                           parent=parent)
    if not wants_detail(vendor, class_code):
        return function
    numa = _maybe(fs, f"{base}/numa_node", int)
    return function._replace(
        numa_node=None if numa is None or numa < 0 else numa,
        current_link_speed=_maybe(fs, f"{base}/current_link_speed", str),
        current_link_width=_maybe(fs, f"{base}/current_link_width", int),
        max_link_speed=_maybe(fs, f"{base}/max_link_speed", str),
        max_link_width=_maybe(fs, f"{base}/max_link_width", int),
    )


def read_pci(fs: FsRoot) -> tuple[PciFunction, ...] | Unknown:
    names = list_dir(fs, PCI_DEVICES)
    if isinstance(names, Unknown):
        return names
    functions: list[PciFunction] = []
    for name in names:
        if not PCI_ADDRESS_RE.match(name):
            continue  # never build a path from an unexpected name
        function = read_pci_function(fs, name)
        if isinstance(function, PciFunction):
            functions.append(function)
    return tuple(functions)


def read_rdma_ports(fs: FsRoot, devices: tuple[Any, ...] | None = None) -> dict[str, tuple[str, str | None]]:
    """netdev name -> (RDMA device, link layer) from /sys/class/infiniband.

    `devices` (agent.sources.rdma, already read) adds the ports' own netdevs
    (`gid_attrs/ndevs/0`) to what `device/net` lists.
    """
    ports: dict[str, tuple[str, str | None]] = {}
    if devices is not None:
        from agent.sources.rdma import netdev_map

        ports.update(netdev_map(devices))
    devices_found = list_dir(fs, IB_DIR)
    if isinstance(devices_found, Unknown):
        return ports  # no RDMA stack loaded: nothing is RDMA capable
    for ibdev in devices_found:
        if not IFNAME_RE.match(ibdev):
            continue
        link_layer = _maybe(fs, f"{IB_DIR}/{ibdev}/ports/1/link_layer", str)
        netdevs = list_dir(fs, f"{IB_DIR}/{ibdev}/device/net")
        if isinstance(netdevs, Unknown):
            continue
        for netdev in netdevs:
            ports.setdefault(netdev, (ibdev, link_layer))
    return ports


def read_interface(fs: FsRoot, name: str, rdma: dict[str, tuple[str, str | None]]) -> NetInterface:
    base = f"{NET_DIR}/{name}"
    pci_address: str | None = None
    driver: str | None = None
    device = link_name(fs, f"{base}/device")
    if device is not None:
        pci_address = device if PCI_ADDRESS_RE.match(device) else None
        driver = link_name(fs, f"{base}/device/driver")
    ibdev, link_layer = rdma.get(name, (None, None))
    return NetInterface(
        name=name,
        mtu=read_value(fs, f"{base}/mtu", int),
        operstate=read_value(fs, f"{base}/operstate"),
        # Reading speed of a down link fails with EINVAL: that is "no speed".
        speed_mbps=_speed(_maybe(fs, f"{base}/speed", int)),
        arp_type=_maybe(fs, f"{base}/type", int),
        driver=driver,
        pci_address=pci_address,
        bond_master=link_name(fs, f"{base}/master"),
        is_bond=fs.is_dir(f"{base}/bonding"),
        rdma_device=ibdev,
        link_layer=link_layer,
    )


def _speed(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def read_interfaces(fs: FsRoot, rdma_devices: tuple[Any, ...] | None = None) -> tuple[NetInterface, ...] | Unknown:
    names = list_dir(fs, NET_DIR)
    if isinstance(names, Unknown):
        return names
    rdma = read_rdma_ports(fs, rdma_devices)
    return tuple(read_interface(fs, n, rdma) for n in names
                 if IFNAME_RE.match(n) and n not in (".", "..") and _is_interface_entry(fs, n))


def _is_interface_entry(fs: FsRoot, name: str) -> bool:
    # Interfaces are links to (or, in old kernels, directories of) device dirs;
    # bonding_masters is a plain file. A broken link is kept so it shows up.
    path = f"{NET_DIR}/{name}"
    if fs.is_dir(path):
        return True
    try:
        fs.readlink(path)
    except OSError:
        return False
    return True


def read_cpu(fs: FsRoot) -> CpuFacts:
    online = read_value(fs, f"{CPU_DIR}/online", parse_cpu_list)
    if isinstance(online, Unknown):
        return CpuFacts(online, online, online, online, online)
    governors: dict[str, list[int]] = {}
    gov_error: Unknown | None = None
    for cpu in online:
        gov = read_value(fs, f"{CPU_DIR}/cpu{cpu}/cpufreq/scaling_governor")
        if isinstance(gov, Unknown):
            if cpu == online[0] and gov.reason.endswith("is absent"):
                gov_error = Unknown(
                    f"{CPU_DIR}/cpu{cpu}/cpufreq is absent: no cpufreq driver "
                    "(virtual machine, or the firmware owns P-states)"
                )
                break
            governors.setdefault(f"unknown ({gov.reason})", []).append(cpu)
            continue
        governors.setdefault(gov, []).append(cpu)
    scaling_driver = read_value(fs, f"{CPU_DIR}/cpu{online[0]}/cpufreq/scaling_driver")
    idle_driver = read_value(fs, f"{CPU_DIR}/cpuidle/current_driver")
    return CpuFacts(
        online=online,
        governors=gov_error if gov_error is not None else {g: tuple(c) for g, c in governors.items()},
        scaling_driver=scaling_driver,
        idle_driver=idle_driver,
        idle_states=read_idle_states(fs, online),
        offline=read_value(fs, f"{CPU_DIR}/offline", parse_cpu_list),
        smt_control=read_value(fs, f"{CPU_DIR}/smt/control"),
    )


def read_idle_states(fs: FsRoot, online: tuple[int, ...]) -> tuple[IdleState, ...] | Unknown:
    first = f"{CPU_DIR}/cpu{online[0]}/cpuidle"
    names = list_dir(fs, first)
    if isinstance(names, Unknown):
        return Unknown(f"{first} is absent: no cpuidle driver")
    found: list[tuple[int, str, str, int]] = []
    for entry in names:
        if not re.fullmatch(r"state\d+", entry):
            continue
        name = read_value(fs, f"{first}/{entry}/name")
        latency = read_value(fs, f"{first}/{entry}/latency", int)
        if isinstance(name, Unknown):
            return name
        if isinstance(latency, Unknown):
            return latency
        found.append((int(entry[5:]), entry, name, latency))
    # Count, deepest state first, on how many CPUs each state is disabled; stop at
    # the first state enabled somewhere: shallower states cannot change the
    # answer ("the deepest enabled state") and a 224-CPU node saves ~450 reads.
    states: list[IdleState] = []
    deepest_enabled_found = False
    for index, entry, name, latency in sorted(found, key=lambda s: (-s[3], -s[0])):
        if deepest_enabled_found:
            states.append(IdleState(index, name, latency, None, len(online)))
            continue
        disabled = sum(
            1 for cpu in online if _maybe(fs, f"{CPU_DIR}/cpu{cpu}/cpuidle/{entry}/disable", int) == 1
        )
        states.append(IdleState(index, name, latency, disabled, len(online)))
        deepest_enabled_found = disabled < len(online)
    return tuple(sorted(states, key=lambda s: s.index))


def read_modules(fs: FsRoot) -> dict[str, str] | Unknown:
    text = read_value(fs, "/proc/modules")
    if isinstance(text, Unknown):
        if text.reason.endswith("is absent"):
            return Unknown("/proc/modules is absent: kernel built without loadable modules")
        return text
    modules: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            modules[fields[0]] = fields[4]
    return modules


def read_swap_total_kb(fs: FsRoot) -> int | Unknown:
    """KiB of active swap: the Size column of /proc/swaps summed (its header alone: swap is off).

    Read through `fs`, not psutil, so a snapshot records and replays it (docs/decisions.md).
    """
    text = read_value(fs, "/proc/swaps")
    if isinstance(text, Unknown):
        if text.reason.endswith("is absent"):
            return Unsupported("/proc/swaps is absent: a kernel without swap support, or a snapshot "
                               "that did not record it")
        return text
    lines = text.splitlines()
    if not lines or lines[0].split()[:3] != ["Filename", "Type", "Size"]:
        return Unknown("/proc/swaps has no 'Filename Type Size' header")
    total = 0
    for line in lines[1:]:
        fields = line.split()
        if len(fields) < 3 or not fields[-3].isdigit():  # a file name may hold spaces: count from the right
            return Unknown(f"/proc/swaps: unreadable line {line[:60]!r}")
        total += int(fields[-3])
    return total


def read_numa_nodes(fs: FsRoot) -> tuple[int, ...] | Unknown:
    value = read_value(fs, f"{NODE_DIR}/online", parse_cpu_list)
    if isinstance(value, Unknown) and value.reason.endswith("is absent"):
        return (0,)  # kernel without NUMA support: one node
    return value


def read_dmi(fs: FsRoot) -> dict[str, str | Unknown]:
    dmi: dict[str, str | Unknown] = {}
    for name in (*DMI_FIELDS, *DMI_IDENTITY_FIELDS):
        path = f"{DMI_DIR}/{name}"
        try:
            # Firmware strings are free text: keep odd bytes visible, never fail.
            dmi[name] = fs.read_bytes(path).decode("utf-8", "backslashreplace").strip()
        except OSError as exc:
            dmi[name] = Unknown(describe_os_error(path, exc))
    return dmi


def absent_host_facts(reason: str) -> HostFacts:
    """Host facts for a snapshot that holds no host data (e.g. an nvidia-smi import)."""
    gone = Unsupported(reason)
    return HostFacts(
        hostname=gone, kernel_release=gone, sysctl={}, thp_enabled=gone, thp_defrag=gone, numa_nodes=gone,
        cmdline=gone, dmi={}, secure_boot=gone, nvidia_driver=gone, pci=gone, modules=gone, interfaces=gone,
        cpu=CpuFacts(gone, gone, gone, gone, gone), uptime_s=gone, boot_id=gone,
    )


def read_host_facts(fs: FsRoot, sysctl_keys: Iterable[str] = ()) -> HostFacts:
    """Read everything the host checks need from `fs`."""
    from agent.sources.fabric import read_fabric
    from agent.sources.pcie import read_acs_above, read_iommu
    from agent.sources.rdma import read_rdma_devices

    pci = read_pci(fs)
    cmdline = read_value(fs, "/proc/cmdline")
    rdma = read_rdma_devices(fs)
    return HostFacts(
        hostname=read_value(fs, "/proc/sys/kernel/hostname"),
        kernel_release=read_value(fs, "/proc/sys/kernel/osrelease"),
        sysctl=read_sysctls(fs, [*BASE_SYSCTLS, *sysctl_keys]),
        thp_enabled=read_value(fs, f"{THP_DIR}/enabled", parse_bracketed),
        thp_defrag=read_value(fs, f"{THP_DIR}/defrag", parse_bracketed),
        numa_nodes=read_numa_nodes(fs),
        cmdline=cmdline,
        dmi=read_dmi(fs),
        secure_boot=read_secure_boot(fs),
        nvidia_driver=read_nvidia_driver(fs),
        pci=pci,
        modules=read_modules(fs),
        interfaces=read_interfaces(fs, None if isinstance(rdma, Unknown) else rdma),
        cpu=read_cpu(fs),
        uptime_s=read_value(fs, "/proc/uptime", parse_uptime),
        fabric=read_fabric(fs),
        rdma=rdma,
        pcie_acs=read_acs_above(fs, pci, rdma),
        iommu=read_iommu(fs, cmdline),
        swap_total_kb=read_swap_total_kb(fs),
        boot_id=read_value(fs, BOOT_ID, parse_boot_id),
    )
