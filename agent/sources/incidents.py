"""Incidents in a node's facts, ready for the ledger (issue 33): the kernel log's Xids, SXids and
catalogued events, each keyed to the GPU that had it (index, UUID and serial from NVML, matched by
PCI address) and to the boot it happened in.

Identity (the digest) is what the record is, never when we read it: the boot, the record's own time
(monotonic since boot, else its printed wall time) and its text. The same line read by the follower
and again by a restarted daemon re-reading the log is one incident; an Xid that returns at another
time is another. A record without any time is identified by its text within its boot: two identical
untimed lines are one incident (said in the incident's detail).
"""

from __future__ import annotations

import datetime as dt
import time

from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.facts_nvml import NvmlFacts
from agent.core.history import GpuRef, Incident, digest
from agent.core.model import Unknown
from agent.core.xid_catalog import classify
from agent.sources.kmsg import boot_time, predates_boot, wall_time
from agent.sources.nvml_events import EVENT_XID_NOTE


def gpu_refs(facts: NodeFacts) -> dict[str, GpuRef]:
    """Each GPU NVML read, by PCI address (lower case, with domain)."""
    nvml = facts.nvml
    if not isinstance(nvml, NvmlFacts):
        return {}
    refs = {}
    for gpu in nvml.gpus:
        if isinstance(gpu.pci_bus_id, str):
            refs[gpu.pci_bus_id.lower()] = GpuRef(gpu.index, gpu.uuid if isinstance(gpu.uuid, str) else "",
                                                  gpu.serial if isinstance(gpu.serial, str) else "")
    return refs


def _pci(address: str | None) -> str:
    if not address:
        return ""
    address = address.lower()
    return address if address.count(":") == 2 else f"0000:{address}"


class _Clock:
    """A record's time in Unix seconds: its wall stamp, else boot time + its monotonic stamp, else `now`."""

    def __init__(self, facts: NodeFacts, now: float) -> None:
        self.now = now
        self.reference = facts.observed_at
        observed = facts.observed_at.timestamp() if facts.observed_at is not None else now
        uptime = facts.host.uptime_s
        self.boot_time = observed - uptime if isinstance(uptime, float | int) and uptime >= 0 else None

    def at(self, ts_usec: int | None, wall: str | None) -> tuple[float, str]:
        stamp = wall_time(wall, self.reference) if wall else None
        if stamp is not None:
            return stamp.timestamp(), wall or ""  # naive: local time, as dmesg -T printed it
        if ts_usec is not None and self.boot_time is not None:
            return self.boot_time + ts_usec / 1e6, f"{ts_usec}us"
        if ts_usec is not None:
            return self.now, f"{ts_usec}us"
        return self.now, ""


def _record_time(clock: _Clock, record: KmsgRecord) -> tuple[float, str]:
    return clock.at(record.ts_usec, record.wall)


def incidents_from_facts(facts: NodeFacts, *, boot_id: str, source: str, now: float | None = None,
                         by_slot: bool = False) -> list[Incident]:
    """The incidents the facts show (empty where the log was not read: no evidence, no incident).

    `by_slot`: a GPU is keyed by its NVML index alone (an earlier boot's record in an imported log: the
    board then may not be today's, whose serial NVML gives)."""
    clock = _Clock(facts, time.time() if now is None else now)
    gpus = gpu_refs(facts)
    if by_slot:
        gpus = {pci: GpuRef(ref.index) for pci, ref in gpus.items()}
    out: list[Incident] = []
    uptime = facts.host.uptime_s
    booted = boot_time(facts.observed_at, uptime if isinstance(uptime, float | int) else None)
    if not isinstance(facts.xids, Unknown):
        companions: dict[str, set[int]] = {}
        for xid in facts.xids:
            companions.setdefault(_pci(xid.pci_bus_id), set()).add(xid.xid)
        for xid in facts.xids:
            if xid.message.endswith(EVENT_XID_NOTE):
                continue  # the NVML event set saw it first; the driver's own log line, when it comes, is the record
            ts, when = clock.at(xid.ts_usec, xid.wall)
            pci = _pci(xid.pci_bus_id)
            gpu = gpus.get(pci, GpuRef())
            # A wall-stamped line older than this boot is an earlier boot's: which one, the log does not say.
            boot = "" if predates_boot(xid.wall, booted, facts.observed_at) else boot_id
            severity = classify(xid.xid, xid.message, companions[pci] - {xid.xid}).severity.value
            out.append(Incident(ts=ts, kind="xid", source=source, code=str(xid.xid), gpu=gpu, subject=pci,
                                severity=severity, boot_id=boot, detail=xid.message if when else
                                f"{xid.message} (the log gives no time: one incident per boot)",
                                digest=digest("xid", boot, pci, xid.xid, when, xid.message)))
    if not isinstance(facts.sxids, Unknown):
        for sxid in facts.sxids:
            where = sxid.switch or _pci(sxid.pci_address)
            ts, when = clock.at(sxid.ts_usec, sxid.when)
            subject = where if sxid.link is None else f"{where} link {sxid.link}"
            out.append(Incident(ts=ts, kind="sxid", source=source, code=str(sxid.sxid), subject=subject,
                                severity="fatal" if sxid.fatal else "", boot_id=boot_id, detail=sxid.message,
                                digest=digest("sxid", boot_id, sxid.source, subject, sxid.sxid, when, sxid.message)))
    if not isinstance(facts.kernel_events, Unknown):
        for event in facts.kernel_events:
            ts, when = _record_time(clock, event.record)
            out.append(Incident(ts=ts, kind="kernel_event", source=source, code=event.rule, subject=event.key,
                                boot_id=boot_id, detail=event.record.message,
                                digest=digest("kernel_event", boot_id, event.rule, when, event.record.message)))
    return out


def boot_time_text(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")
