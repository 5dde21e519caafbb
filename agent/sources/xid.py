"""Xid events from the kernel log.

The NVIDIA driver logs `NVRM: Xid (PCI:0000:19:00): 79, pid=..., name=..., <text>`.
The PCI address has no function number; GPUs are function 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from agent.facts import KmsgRecord, XidEvent

_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?\): "
                     r"(\d+),\s*(.*)$")


def parse_xid(record: KmsgRecord) -> XidEvent | None:
    match = _XID_RE.search(record.message)
    if not match:
        return None
    domain, bus, device, function, code, rest = match.groups()
    address = f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"
    return XidEvent(pci_bus_id=address, xid=int(code), message=rest.strip(), ts_usec=record.ts_usec)


def parse_xids(records: Iterable[KmsgRecord]) -> tuple[XidEvent, ...]:
    return tuple(event for event in (parse_xid(r) for r in records) if event is not None)
