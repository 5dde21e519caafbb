"""Xid events from the kernel log.

The NVIDIA driver logs `NVRM: Xid (PCI:0000:19:00): 79, pid=..., name=..., <text>`.
The PCI address has no function number; GPUs are function 0.

`parse_xids` keeps the last boot of a log that concatenates several (the
since-boot clock going back, `kmsg.boot_start`); records with a wall-clock
stamp are judged against the boot time by the check (`kmsg.predates_boot`).
NVLink5 Xids (144-150) carry their sub-code in the text, which
`parse_nvlink5` reads for the catalogue's decode (agent.xid_catalog).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from agent.facts import KmsgRecord, XidEvent
from agent.lazyre import lazy_compile
from agent.sources.kmsg import boot_start

_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?\): "
                     r"(\d+),\s*(.*)$")


def parse_xid(record: KmsgRecord) -> XidEvent | None:
    match = _XID_RE.search(record.message)
    if not match:
        return None
    domain, bus, device, function, code, rest = match.groups()
    address = f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"
    return XidEvent(pci_bus_id=address, xid=int(code), message=rest.strip(), ts_usec=record.ts_usec,
                    wall=record.wall)


def parse_xids(records: Iterable[KmsgRecord]) -> tuple[XidEvent, ...]:
    """The Xids of the log's last boot (all of it unless its since-boot clock restarts)."""
    kept = records if isinstance(records, (list, tuple)) else tuple(records)
    kept = kept[boot_start(kept):]
    return tuple(event for event in (parse_xid(r) for r in kept) if event is not None)


class NvLink5Fields(NamedTuple):
    """The fields of an NVLink5 Xid's text (R565+): `<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<regs>)`."""

    unit: str  # as printed: "RLW_REMAP", "NETIR_LINK_EVT", "MSE degraded"
    fatal: bool  # the driver's own word
    cross_contained: bool
    injected: bool
    link: int
    intr_info: int | None  # first register
    error_status: int | None  # second register


# RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)
_NVLINK5_RE = lazy_compile(r"(?P<unit>[A-Za-z][A-Za-z0-9_/]*(?: [Dd]egraded)?)\s+"
                           r"(?P<word>Fatal|Nonfatal|Non-fatal)\s+"
                           r"XC(?P<xc>\d+)\s+i(?P<inj>\d+)\s+Link\s+(?P<link>-?\d+)(?:\s*\((?P<regs>[^)]*)\))?")
_HEX_RE = lazy_compile(r"0x([0-9a-fA-F]+)")


def parse_nvlink5(message: str) -> NvLink5Fields | None:
    """The sub-code fields of an NVLink5 Xid's text; None where the text has another shape."""
    match = _NVLINK5_RE().search(message)
    if not match:
        return None
    regs = [int(value, 16) for value in _HEX_RE().findall(match["regs"] or "")]
    return NvLink5Fields(unit=match["unit"], fatal=match["word"] == "Fatal", cross_contained=match["xc"] != "0",
                         injected=match["inj"] != "0", link=int(match["link"]),
                         intr_info=regs[0] if regs else None, error_status=regs[1] if len(regs) > 1 else None)
