"""Names back to ids: the system's pci.ids (pciutils' database, the one lspci itself printed the names
from), read when a plain `lspci` (no `-nn`) names a vendor, device, subsystem or class the importer's
own tables do not (issue 31.5). The tables refine; this reads what the tool that wrote the text used.

The file is outside input too: bounded (MAX_BYTES), parsed by its grammar (`vvvv  name`, a tab and
`dddd  name`, two tabs and `ssss ssss  name`, `C cc  name` and a tab and `ss  name`), anything else
ignored; a name that two entries share keeps the first (pci.ids lists each vendor once).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

PCI_IDS_PATHS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"), Path("/usr/share/pci.ids"))
MAX_BYTES = 8 << 20  # today's file is ~1.4 MB

_VENDOR_RE = re.compile(r"^([0-9a-f]{4})  (.+)$")
_DEVICE_RE = re.compile(r"^\t([0-9a-f]{4})  (.+)$")
_SUBSYS_RE = re.compile(r"^\t\t([0-9a-f]{4}) ([0-9a-f]{4})  (.+)$")
_CLASS_RE = re.compile(r"^C ([0-9a-f]{2})  (.+)$")
_SUBCLASS_RE = re.compile(r"^\t([0-9a-f]{2})  (.+)$")


class PciNames(NamedTuple):
    vendors: dict[str, int]  # "NVIDIA Corporation" -> 0x10de
    devices: dict[tuple[int, str], int]  # (0x10de, "GH100 [H100 SXM5 80GB]") -> 0x2330
    subsystems: dict[tuple[int, str], int]  # (subvendor, subsystem name) -> subsystem device
    classes: dict[str, int]  # "3D controller" -> 0x0302, "Display controller" -> 0x0300
    source: str


def parse_pci_ids(text: str, source: str = "pci.ids") -> PciNames:
    names = PciNames({}, {}, {}, {}, source)
    vendor: int | None = None
    klass: int | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if m := _CLASS_RE.match(line):
            klass, vendor = int(m.group(1), 16), None
            names.classes.setdefault(m.group(2), klass << 8)
        elif m := _VENDOR_RE.match(line):
            vendor, klass = int(m.group(1), 16), None
            names.vendors.setdefault(m.group(2), vendor)
        elif klass is not None and (m := _SUBCLASS_RE.match(line)):
            names.classes.setdefault(m.group(2), (klass << 8) | int(m.group(1), 16))
        elif vendor is not None and (m := _DEVICE_RE.match(line)):
            names.devices.setdefault((vendor, m.group(2)), int(m.group(1), 16))
        elif vendor is not None and (m := _SUBSYS_RE.match(line)):
            names.subsystems.setdefault((int(m.group(1), 16), m.group(3)), int(m.group(2), 16))
    return names


@functools.cache
def system_pci_names() -> PciNames | None:
    """This machine's pci.ids, or None where it has none (or only one past MAX_BYTES)."""
    for path in PCI_IDS_PATHS:
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_BYTES + 1)
        except OSError:
            continue
        if len(data) <= MAX_BYTES:
            return parse_pci_ids(data.decode("utf-8", "replace"), str(path))
    return None


@functools.cache
def system_vendors_longest_first() -> tuple[tuple[str, int], ...]:
    """The system's vendor names, longest first (a name may start another: "Intel" / "Intel Corporation")."""
    names = system_pci_names()
    return tuple(sorted(names.vendors.items(), key=lambda kv: -len(kv[0]))) if names else ()
