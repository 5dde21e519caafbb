"""The `lspci` kind: `lspci -vvv` (also with `-nn`, `-D`, `-xxx`) as the sysfs files the live reader reads.

Each function becomes what Linux shows under /sys for it, exactly as the
simulated nodes hold it (fixtures/tools/build_nodes.py builds them with this
parser): `vendor`, `device`, `class`, `subsystem_*`, `revision`, `numa_node`,
`uevent`, the link's `max_link_speed`/`max_link_width` (LnkCap) and
`current_link_speed`/`current_link_width` (LnkSta), in its canonical folder
under sys/devices (a function hangs under the bridge whose secondary bus is its
bus), with the sys/bus/pci/devices and driver links in fs_links.json.

IDs: with `-nn` lspci prints them ("NVIDIA Corporation GA100 [A100 SXM4 80GB]
[10de:20b2]"); without, only names, which are turned into IDs through the
tables below (names lspci printed for real machines, checked against pci.ids).
A function whose names are not in them is left out and named, never guessed.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text
from agent.sources.importers.pci_ids import system_pci_names, system_vendors_longest_first

# Name -> ID tables for what lspci printed as names (checked against pci.ids
# 2023.04.10; see the report for the guessed subsystem IDs).
# ---------------------------------------------------------------------------
VENDORS = {
    "Intel Corporation": 0x8086,
    "NVIDIA Corporation": 0x10DE,
    "Mellanox Technologies": 0x15B3,
    "Broadcom / LSI": 0x1000,
    "Broadcom Inc. and subsidiaries": 0x14E4,
    "Micron Technology Inc": 0x1344,
    "Matrox Electronics Systems Ltd.": 0x102B,
    "PLDA": 0x1556,
    "PMC-Sierra Inc.": 0x11F8,
    "Dell": 0x1028,
}
DEVICES = {
    (0x15B3, "MT2910 Family [ConnectX-7]"): 0x1021,
    (0x15B3, "MT2892 Family [ConnectX-6 Dx]"): 0x101D,
    (0x1000, "PEX890xx PCIe Gen 5 Switch"): 0xC030,
    (0x1000, "PCIe Switch management endpoint"): 0x00B2,
    (0x14E4, "NetXtreme BCM5720 Gigabit Ethernet PCIe"): 0x165F,
    (0x102B, "Integrated Matrox G200eW3 Graphics Controller"): 0x0536,
    (0x8086, "NVMe DC SSD [3DNAND, Sentinel Rock Controller]"): 0x0B60,
    (0x1556, "PCI Express Bridge"): 0xBE00,
}
# lspci printed these subsystems by name. libpci falls back to the device's
# own name (subsystem == device, or udev hwdb), so the ID is not in the dump:
#  - same vendor as the device: assume subsystem device == device ID;
#  - Dell onboard parts: Dell gives onboard functions the platform's ID, which
#    the chipset functions in this dump show as 1028:0b73;
#  - the PEX890xx management endpoint: the switch's bridges carry 1028:224b.
SUBSYSTEMS = {
    (0x15B3, "MT2910 Family [ConnectX-7]"): 0x1021,
    (0x15B3, "MT2892 Family [ConnectX-6 Dx]"): 0x101D,
    (0x8086, "NVMe DC SSD [3DNAND, Sentinel Rock Controller]"): 0x0B60,
    (0x1028, "NetXtreme BCM5720 Gigabit Ethernet PCIe"): 0x0B73,
    (0x1028, "Integrated Matrox G200eW3 Graphics Controller"): 0x0B73,
    (0x1028, "PCIe Switch management endpoint"): 0x224B,
}
# lspci class name -> (base class, subclass); prog-if comes from the line.
CLASSES = {
    "Non-Volatile memory controller": 0x0108,
    "SATA controller": 0x0106,
    "Serial Attached SCSI controller": 0x0107,
    "Ethernet controller": 0x0200,
    "VGA compatible controller": 0x0300,
    "3D controller": 0x0302,
    "RAM memory": 0x0500,
    "Memory controller": 0x0580,
    "Host bridge": 0x0600,
    "ISA bridge": 0x0601,
    "PCI bridge": 0x0604,
    "Bridge": 0x0680,
    "Communication controller": 0x0780,
    "Generic system peripheral [0807]": 0x0807,
    "System peripheral": 0x0880,
    "USB controller": 0x0C03,
    "SMBus": 0x0C05,
    "Serial bus controller": 0x0C80,
    "Performance counters": 0x1101,
}
# lspci "Speed 32GT/s" -> sysfs current_link_speed / max_link_speed text.
LINK_SPEEDS = {
    "2.5": "2.5 GT/s PCIe",
    "5": "5.0 GT/s PCIe",
    "8": "8.0 GT/s PCIe",
    "16": "16.0 GT/s PCIe",
    "32": "32.0 GT/s PCIe",
}

# ---------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------


@dataclass
class PciFunction:
    """One function of the lspci -vvv dump, with names turned into IDs."""

    bdf: str  # "19:00.0" (the domain is `domain`)
    class_code: int  # 24 bits: base class, subclass, prog-if
    vendor: int
    device: int
    revision: int
    subsystem: tuple[int, int] = (0, 0)
    numa_node: int = -1
    driver: str | None = None
    secondary_bus: int | None = None  # bridges only
    lnk_cap: tuple[str, int] | None = None  # (speed GT/s, width)
    lnk_sta: tuple[str, int] | None = None
    vpd_v3: str | None = None
    serial: str | None = None  # Device Serial Number capability
    path: str = ""  # canonical sysfs dir, filled by build_pci_tree
    ext_caps: list[tuple[int, int, str]] = field(default_factory=list)  # (offset, version, lspci name), list order
    acs: tuple[int, int] | None = None  # (ACS capability register, ACS control register) from ACSCap/ACSCtl
    domain: str = "0000"

    @property
    def address(self) -> str:
        return f"{self.domain}:{self.bdf}"

    @property
    def bus(self) -> int:
        return int(self.bdf[:2], 16)


_HEADER_RE = re.compile(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) "
                        r"([^:]+?)(?: \[([0-9a-f]{4})\])?: (.*)$")
_PROGIF_RE = re.compile(r" \(prog-if ([0-9a-f]{2})(?: \[[^\]]*\])?\)$")
_REV_RE = re.compile(r" \(rev ([0-9a-f]{2})\)$")
_IDS_RE = re.compile(r" \[([0-9a-f]{4}):([0-9a-f]{4})\]$")  # -nn
_SUBSYS_RE = re.compile(r"^\t(?:Capabilities: \[[0-9a-f]+\] )?Subsystem: (.*)$")
_BUS_RE = re.compile(r"^\tBus: primary=[0-9a-f]{2}, secondary=([0-9a-f]{2}),")
_LNKCAP_RE = re.compile(r"^\t\tLnkCap:\tPort #\d+, Speed ([\d.]+)GT/s, Width x(\d+)")
_LNKSTA_RE = re.compile(r"^\t\tLnkSta:\tSpeed ([\d.]+)GT/s[^,]*, Width x(\d+)")
_V3_RE = re.compile(r"\[V3\] Vendor specific: ([0-9a-f]{32})")
_DSN_RE = re.compile(r"Device Serial Number ((?:[0-9a-f]{2}-){7}[0-9a-f]{2})")
_EXTCAP_RE = re.compile(r"^\tCapabilities: \[([0-9a-f]{3}) v(\d+)\] (.*)$")  # extended capabilities (>= 0x100)
_HEXDUMP_RE = re.compile(r"^[0-9a-f]{2,3}: [0-9a-f]{2}( [0-9a-f]{2})*$")  # -xxx config space lines
ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")


NAMES_ONLY = "capture `lspci -nn -vvv` (ids beside the names)"


def split_vendor(text: str) -> tuple[int, str]:
    """'Intel Corporation Device 09a2' -> (0x8086, 'Device 09a2'): our table, then the system's pci.ids."""
    for name in sorted(VENDORS, key=len, reverse=True):
        if text.startswith(name + " "):
            return VENDORS[name], text[len(name) + 1 :]
    for name, vendor in system_vendors_longest_first():
        if text.startswith(name + " "):
            return vendor, text[len(name) + 1 :]
    raise ValueError(f"no pci.ids here names the vendor of {text[:40]!r}; {NAMES_ONLY}")


def device_id(vendor: int, name: str, table: dict[tuple[int, str], int], *, subsystem: bool = False) -> int:
    """'Device 2330' -> 0x2330; a named device goes through `table`, then the system's pci.ids."""
    match = re.fullmatch(r"Device ([0-9a-f]{4})", name)
    if match:
        return int(match.group(1), 16)
    if (vendor, name) in table:
        return table[(vendor, name)]
    names = system_pci_names()
    found = (names.subsystems if subsystem else names.devices).get((vendor, name)) if names else None
    if found is None:
        raise ValueError(f"no pci.ids here names {'subsystem' if subsystem else 'device'} {name[:40]!r} of "
                         f"{vendor:04x}; {NAMES_ONLY}")
    return found


def _ids(text: str, table: dict[tuple[int, str], int]) -> tuple[int, int]:
    """(vendor, device) of "NAME [vvvv:dddd]" (-nn) or of a name in the tables (or pci.ids)."""
    if m := _IDS_RE.search(text):
        return int(m.group(1), 16), int(m.group(2), 16)
    vendor, name = split_vendor(text)
    return vendor, device_id(vendor, name, table, subsystem=table is SUBSYSTEMS)


def parse_header(line: str) -> PciFunction:
    """'19:00.0 3D controller: NVIDIA Corporation Device 2330 (rev a1)' (or with -nn / -D)."""
    match = _HEADER_RE.match(line)
    if not match:
        raise ValueError(f"not an lspci header: {line!r}")
    domain, bdf, class_name, class_hex, rest = match.groups()
    prog_if = 0
    if m := _PROGIF_RE.search(rest):
        prog_if = int(m.group(1), 16)
        rest = rest[: m.start()]
    revision = 0
    if m := _REV_RE.search(rest):
        revision = int(m.group(1), 16)
        rest = rest[: m.start()]
    if class_hex is not None:
        base = int(class_hex, 16)
    elif class_name in CLASSES:
        base = CLASSES[class_name]
    elif m := re.fullmatch(r".*\[([0-9a-f]{4})\]", class_name):
        base = int(m.group(1), 16)
    elif (names := system_pci_names()) is not None and class_name in names.classes:
        base = names.classes[class_name]
    else:
        raise ValueError(f"no pci.ids here names the class {class_name[:40]!r}; {NAMES_ONLY}")
    vendor, device = _ids(rest, DEVICES)
    return PciFunction(bdf=bdf, class_code=(base << 8) | prog_if, vendor=vendor, device=device, revision=revision,
                       domain=(domain or "0000").rjust(4, "0"))


def _parse_block(lines: list[str]) -> PciFunction:
    fn = parse_header(lines[0])
    for line in lines[1:]:
        if m := _SUBSYS_RE.match(line):
            fn.subsystem = _ids(m.group(1), SUBSYSTEMS)
        elif line.startswith("\tNUMA node: "):
            fn.numa_node = int(line.split(":")[1])
        elif line.startswith("\tKernel driver in use: "):
            fn.driver = line.split(": ", 1)[1].strip()
        elif m := _BUS_RE.match(line):
            fn.secondary_bus = int(m.group(1), 16)
        elif m := _LNKCAP_RE.match(line):
            fn.lnk_cap = (m.group(1), int(m.group(2)))
        elif m := _LNKSTA_RE.match(line):
            fn.lnk_sta = (m.group(1), int(m.group(2)))
        elif m := _V3_RE.search(line):
            fn.vpd_v3 = m.group(1)
        elif m := _DSN_RE.search(line):
            fn.serial = m.group(1)
        if m := _EXTCAP_RE.match(line):
            fn.ext_caps.append((int(m.group(1), 16), int(m.group(2)), m.group(3)))
        elif line.startswith(("\t\tACSCap:", "\t\tACSCtl:")):
            bits = acs_bits(line)
            fn.acs = (bits, 0) if "ACSCap" in line else ((fn.acs or (0, 0))[0], bits)
    return fn


def _blocks(text: str) -> list[list[str]]:
    """Blank-line separated blocks; a dump without blank lines (`lspci`, `lspci -nn`) is one header a line."""
    blocks: list[list[str]] = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not _HEXDUMP_RE.match(line)]
        if lines and all(_HEADER_RE.match(line) for line in lines):
            blocks.extend([line] for line in lines)
        elif lines:
            blocks.append(lines)
    return blocks


def parse_lspci(text: str) -> list[PciFunction]:
    """Parse every function of an `lspci -vvv` dump (blank-line separated blocks); ValueError on any unknown."""
    return [_parse_block(lines) for lines in _blocks(text)]


def parse_lspci_lenient(text: str) -> tuple[list[PciFunction], list[str]]:
    """Every function that can be read, and why each other block was left out."""
    functions: list[PciFunction] = []
    skipped: list[str] = []
    for lines in _blocks(text):
        try:
            functions.append(_parse_block(lines))
        except (ValueError, IndexError) as exc:
            skipped.append(f"{lines[0][:80]!r}: {exc}"[:240])
    return functions, skipped


def acs_bits(line: str) -> int:
    """'ACSCtl:\tSrcValid+ TransBlk- ReqRedir- ...' -> the register's bits."""
    flags = dict(re.findall(r"(\w+)([+-])", line.split(":", 1)[1]))
    return sum(1 << i for i, name in enumerate(ACS_FLAGS) if flags.get(name) == "+")


# ---------------------------------------------------------------------------
# sysfs
# ---------------------------------------------------------------------------


def build_pci_tree(functions: list[PciFunction]) -> None:
    """Give every function its canonical dir under sys/devices.

    A function on bus B hangs under the bridge whose secondary bus is B;
    a bus no bridge leads to is a root bus, sys/devices/pciDDDD:BB.
    """
    by_secondary = {(f.domain, f.secondary_bus): f for f in functions if f.secondary_bus is not None}

    def path_of(fn: PciFunction, depth: int = 0) -> str:
        if not fn.path:
            parent = by_secondary.get((fn.domain, fn.bus))
            if parent is fn or depth > 64:  # a bridge whose secondary bus is its own: a broken dump
                parent = None
            base = path_of(parent, depth + 1) if parent else f"sys/devices/pci{fn.domain}:{fn.bdf[:2]}"
            fn.path = f"{base}/{fn.address}"
        return fn.path

    for fn in functions:
        path_of(fn)


def pci_uevent(fn: PciFunction) -> str:
    """The function's uevent file exactly as drivers/pci/pci-driver.c prints it."""
    lines = [f"DRIVER={fn.driver}"] if fn.driver else []
    lines += [
        f"PCI_CLASS={fn.class_code:X}",
        f"PCI_ID={fn.vendor:04X}:{fn.device:04X}",
        f"PCI_SUBSYS_ID={fn.subsystem[0]:04X}:{fn.subsystem[1]:04X}",
        f"PCI_SLOT_NAME={fn.address}",
        f"MODALIAS=pci:v{fn.vendor:08X}d{fn.device:08X}sv{fn.subsystem[0]:08X}"
        f"sd{fn.subsystem[1]:08X}bc{fn.class_code >> 16:02X}sc{(fn.class_code >> 8) & 0xFF:02X}"
        f"i{fn.class_code & 0xFF:02X}",
    ]
    return "\n".join(lines)


def link_speed(speed: str) -> str:
    """lspci "32" (GT/s) -> sysfs "32.0 GT/s PCIe"."""
    return LINK_SPEEDS.get(speed) or f"{float(speed):.1f} GT/s PCIe"


@dataclass
class SysfsFunction:
    """One function's sysfs files (values without the kernel's trailing newline), links and folders."""

    files: list[tuple[str, str]]
    links: list[tuple[str, str]]  # (link path, canonical dir it points to), both relative to fs/
    dirs: list[str]


def function_sysfs(fn: PciFunction) -> SysfsFunction:
    """The sysfs attributes of one function, its bus link and its driver link."""
    d = fn.path
    files = [
        (f"{d}/vendor", f"0x{fn.vendor:04x}"),
        (f"{d}/device", f"0x{fn.device:04x}"),
        (f"{d}/class", f"0x{fn.class_code:06x}"),
        (f"{d}/subsystem_vendor", f"0x{fn.subsystem[0]:04x}"),
        (f"{d}/subsystem_device", f"0x{fn.subsystem[1]:04x}"),
        (f"{d}/revision", f"0x{fn.revision:02x}"),
        (f"{d}/numa_node", str(fn.numa_node)),
        (f"{d}/uevent", pci_uevent(fn)),
    ]
    if fn.lnk_cap and fn.lnk_sta:
        files += [
            (f"{d}/max_link_speed", link_speed(fn.lnk_cap[0])),
            (f"{d}/max_link_width", str(fn.lnk_cap[1])),
            (f"{d}/current_link_speed", link_speed(fn.lnk_sta[0])),
            (f"{d}/current_link_width", str(fn.lnk_sta[1])),
        ]
    links = [(f"sys/bus/pci/devices/{fn.address}", d)]
    dirs = []
    if fn.driver:
        drv = f"sys/bus/pci/drivers/{fn.driver}"
        dirs.append(drv)
        links += [(f"{d}/driver", drv), (f"{drv}/{fn.address}", d)]
    return SysfsFunction(files, links, dirs)


def kernfs_relpath(link_dir: str, target: str) -> str:
    """Relative link text as sysfs writes it (fs/kernfs/symlink.c): up to the nearest strict ancestor."""
    base = [p for p in link_dir.split("/") if p]
    dest = [p for p in target.split("/") if p]
    ups = 0
    while not (len(base) < len(dest) and dest[: len(base)] == base):
        base.pop()
        ups += 1
    return "../" * ups + "/".join(dest[len(base) :])


# ---------------------------------------------------------------------------
# the importer
# ---------------------------------------------------------------------------

_DETECT_RE = re.compile(r"^(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] [^:\n]+: \S", re.MULTILINE)
MAX_BYTES = 64 << 20  # `lspci -vvvxxxx` of a 300-function node is ~3 MB


class LspciImporter:
    kind = "lspci"

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head)
        first = next((line for line in text.splitlines() if line.strip()), "")
        return bool(_DETECT_RE.match(first)) and len(_DETECT_RE.findall(text)) >= 1

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an lspci dump", path=builder.current)
        functions, skipped = parse_lspci_lenient(decode_text(data).replace("\r\n", "\n"))
        if not functions:
            raise InputError("no PCI function could be read" + (f" ({skipped[0]})" if skipped else ""),
                             path=builder.current)
        result.skipped += skipped
        build_pci_tree(functions)
        builder.add_dir("sys/bus/pci/devices")
        written = links = 0
        for fn in functions:
            sysfs = function_sysfs(fn)
            for path, value in sysfs.files:
                written += builder.put_fs(path, value, result, newline=True)
            for link, target in sysfs.links:
                links += builder.put_link(link, kernfs_relpath(posixpath.dirname(link), target), result)
            for directory in sysfs.dirs:
                builder.add_dir(directory)
        with_link = sum(1 for fn in functions if fn.lnk_cap and fn.lnk_sta)
        numa = sum(1 for fn in functions if fn.numa_node >= 0)
        result.contributed.append(f"sysfs PCI: {len(functions)} function(s) ({with_link} with link speed/width, "
                                  f"{numa} with a NUMA node), {written} file(s), {links} link(s)")
        if not with_link:
            result.skipped.append("PCIe link speed and width: not in this dump (run `lspci -vvv` as root)")
        return result
