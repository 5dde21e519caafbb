"""RDMA devices and ports from /sys/class/infiniband (live or a snapshot's fs/).

Formats are the kernel's (Documentation/ABI/stable/sysfs-class-infiniband):
`ports/N/state` "4: ACTIVE", `phys_state` "5: LinkUp", `rate` "400 Gb/sec
(4X NDR)", `link_layer` "InfiniBand" or "Ethernet", one decimal number per
file under `counters/` and `hw_counters/`. A counter the PMA cannot answer
reads "N/A (no PMA)"; it is kept as that text so a check can say why it has
no number. A missing class folder means no RDMA stack is loaded: that is no
RDMA device, not an error.
"""

from __future__ import annotations

import re

from agent.core.facts import PCI_ADDRESS_RE, RdmaDevice, RdmaPort
from agent.core.model import Unknown
from agent.sources.fsroot import FsRoot

IB_DIR = "/sys/class/infiniband"
IBDEV_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")
_COUNTER_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_STATE_RE = re.compile(r"^\d+:\s*(\S.*)$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*Gb/sec")
MAX_COUNTERS = 256  # a port exposes ~20 counters and ~60 hw_counters; never read an odd tree whole


def parse_port_state(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'."""
    match = _STATE_RE.match(text.strip())
    if not match:
        raise ValueError(text)
    return match.group(1).strip()


def rate_gbps(rate: str) -> float:
    """'400 Gb/sec (4X NDR)' -> 400.0; '2.5 Gb/sec (1X SDR)' -> 2.5."""
    match = _RATE_RE.match(rate.strip())
    if not match:
        raise ValueError(rate)
    return float(match.group(1))


def parse_counter(text: str) -> int | str:
    """A counter's value, or its text when it is not a number ('N/A (no PMA)')."""
    value = text.strip()
    return int(value) if value.isdigit() else value


def _read(fs: FsRoot, path: str) -> str | Unknown:
    from agent.sources.fsroot import read_value

    return read_value(fs, path)


def read_counters(fs: FsRoot, folder: str) -> dict[str, int | str] | Unknown:
    from agent.sources.fsroot import list_dir, read_value

    names = list_dir(fs, folder)
    if isinstance(names, Unknown):
        return names
    counters: dict[str, int | str] = {}
    for name in names[:MAX_COUNTERS]:
        if not _COUNTER_RE.match(name):
            continue
        text = read_value(fs, f"{folder}/{name}")
        counters[name] = f"unreadable ({text.reason})" if isinstance(text, Unknown) else parse_counter(text)
    return counters


def _first_netdev(fs: FsRoot, device: str, port: int, device_netdevs: list[str]) -> str | None:
    # ndevs/N exists for RoCE ports (and IPoIB on recent kernels); device/net lists
    # the HCA function's netdevs, one per port on mlx5 (a function carries one port).
    ndev = _read(fs, f"{device}/ports/{port}/gid_attrs/ndevs/0")
    if isinstance(ndev, str) and ndev and IBDEV_RE.match(ndev):
        return ndev
    if len(device_netdevs) >= port:
        return device_netdevs[port - 1]
    return None


def read_port(fs: FsRoot, device: str, port: int, device_netdevs: list[str], counters: bool = True) -> RdmaPort:
    base = f"{device}/ports/{port}"
    state = _read(fs, f"{base}/state")
    phys = _read(fs, f"{base}/phys_state")
    problems = []
    parsed: dict[str, str | Unknown] = {}
    for name, value in (("state", state), ("phys_state", phys)):
        if isinstance(value, Unknown):
            parsed[name] = value
            problems.append(value.reason)
            continue
        try:
            parsed[name] = parse_port_state(value)
        except ValueError:
            parsed[name] = Unknown(f"{base}/{name}: unexpected content {value[:40]!r}")
    rate = _read(fs, f"{base}/rate")
    link_layer = _read(fs, f"{base}/link_layer")
    for value in (rate, link_layer):
        if isinstance(value, Unknown):
            problems.append(value.reason)
    return RdmaPort(
        port=port, state=parsed["state"], phys_state=parsed["phys_state"], rate=rate, link_layer=link_layer,
        counters=read_counters(fs, f"{base}/counters") if counters else Unknown("not read"),
        hw_counters=read_counters(fs, f"{base}/hw_counters") if counters else Unknown("not read"),
        netdev=_first_netdev(fs, device, port, device_netdevs), problems=tuple(problems),
    )


def read_rdma_device(fs: FsRoot, name: str, counters: bool = True) -> RdmaDevice:
    from agent.sources.fsroot import link_name, list_dir

    base = f"{IB_DIR}/{name}"
    pci = link_name(fs, f"{base}/device")
    physfn = link_name(fs, f"{base}/device/physfn")  # present on an SR-IOV VF whose PF is on this host
    netdevs = list_dir(fs, f"{base}/device/net")
    device_netdevs = [] if isinstance(netdevs, Unknown) else [n for n in netdevs if IBDEV_RE.match(n)]
    port_names = list_dir(fs, f"{base}/ports")
    ports: tuple[RdmaPort, ...] | Unknown
    if isinstance(port_names, Unknown):
        ports = port_names
    else:
        numbers = sorted(int(p) for p in port_names if p.isdigit() and 0 < int(p) < 256)
        ports = tuple(read_port(fs, base, n, device_netdevs, counters) for n in numbers)
    return RdmaDevice(
        name=name, hca_type=_read(fs, f"{base}/hca_type"), board_id=_read(fs, f"{base}/board_id"),
        fw_ver=_read(fs, f"{base}/fw_ver"), pci_address=pci if pci and PCI_ADDRESS_RE.match(pci) else None,
        ports=ports, physfn=physfn if physfn and PCI_ADDRESS_RE.match(physfn) else None,
    )


def read_rdma_devices(fs: FsRoot, counters: bool = True) -> tuple[RdmaDevice, ...] | Unknown:
    """Every RDMA device; () when /sys/class/infiniband is absent (no RDMA stack loaded)."""
    from agent.sources.fsroot import list_dir

    names = list_dir(fs, IB_DIR)
    if isinstance(names, Unknown):
        return () if names.reason.endswith("is absent") else names
    return tuple(read_rdma_device(fs, n, counters) for n in names if IBDEV_RE.match(n) and n not in (".", ".."))


def netdev_map(devices: tuple[RdmaDevice, ...]) -> dict[str, tuple[str, str | None]]:
    """netdev -> (RDMA device, link layer), as the interface reader wants it."""
    ports: dict[str, tuple[str, str | None]] = {}
    for device in devices:
        if isinstance(device.ports, Unknown):
            continue
        for port in device.ports:
            if port.netdev:
                link_layer = port.link_layer if isinstance(port.link_layer, str) else None
                ports.setdefault(port.netdev, (device.name, link_layer))
    return ports
