"""Xids during a run from the kernel log, where NVML gives no event set (an old driver, no permission).

The kernel log is read (agent.sources' kmsg source: /dev/kmsg drained, bounded) at the start and at
the end of the run; an Xid record at the end that was not there at the start is new, and goes to the
GPU with its PCI address. Records are compared by (since-boot time, address, code, message), so no
wall-clock conversion is needed and an old Xid is never counted as new.
"""

from __future__ import annotations

from typing import Any

from agent.core.facts import XidEvent
from agent.core.series import MAX_XIDS, Recording
from agent.sources.xid import parse_xids

Key = tuple[int | None, str, int, str]


def _key(event: XidEvent) -> Key:
    return (event.ts_usec, event.pci_bus_id, event.xid, event.message[:200])


class KernelLogXids:
    def __init__(self, node: Any) -> None:
        self.node = node
        self.before, self.error = self._read()

    def _read(self) -> tuple[dict[Key, XidEvent], str | None]:
        from agent.core.model import Unknown
        from agent.sources.registry import KMSG
        from agent.sources.source import ReadOptions

        try:
            records, _status = KMSG.read(self.node, ReadOptions())
        except OSError as exc:
            return {}, f"kernel log: {exc}"
        if isinstance(records, Unknown):
            return {}, f"kernel log: {records.reason}"
        return {_key(e): e for e in parse_xids(records)}, None

    def finish(self, recording: Recording) -> None:
        """Add the Xids new since the start to `recording` (or say why the kernel log could not tell)."""
        if self.error is not None:
            recording.xid_source = f"unavailable: {recording.xid_source}; {self.error}"[:300]
            return
        after, error = self._read()
        if error is not None:
            recording.xid_source = f"unavailable: {error}"[:300]
            return
        by_bus = {g.pci_bus_id: g.uuid for g in recording.gpus if g.pci_bus_id}
        for key, event in after.items():
            if key not in self.before and len(recording.xids) < MAX_XIDS:
                recording.xids.append({"t": None, "uuid": by_bus.get(event.pci_bus_id), "code": event.xid})
        recording.xid_source = "kernel log"
