"""Xid events from the kernel log.

The NVIDIA driver logs `NVRM: Xid (PCI:0000:19:00): 79, pid=..., name=..., <text>`.
The PCI address has no function number; GPUs are function 0.

`parse_xids` keeps the last boot of a log that concatenates several (the
since-boot clock going back, `kmsg.boot_start`); records with a wall-clock
stamp are judged against the boot time by the check (`kmsg.predates_boot`).
NVLink5 Xids (144-150) carry their sub-code in the text, which
`parse_nvlink5` reads for the catalogue's decode (agent.core.xid_catalog).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from agent.core.facts import KmsgRecord, XidEvent
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
