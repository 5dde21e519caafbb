"""BMC event logs from Redfish: open hardware problems, not history and not the BMC's own logs.

Which logs count: hardware event logs only (SEL, HPE IML, Event/EventLog, Dell Lclog and
FaultList, Lenovo ActiveLog/PlatformLog, OpenBMC FaultLog, Supermicro's "Health Event Log").
The BMC's own syslog or journal, audit and security logs, HPE's iLO Event Log (IEL: logins,
iLO resets), dumps (`DiagnosticDataType`), FDR, post codes and debug-token services are not
events. The LogService's id, `LogEntryType`, `DiagnosticDataType` and name decide; inside a
hardware log, entries about security posture and accounts (by MessageId) are left out too.

Whether an entry is still open (`BmcLogEntry.resolved`):
* `Resolved` (LogEntry 1.8+), HPE `Oem.Hpe.Repaired`: what the BMC says, whatever the age;
* Dell iDRAC `FaultList` and Lenovo `ActiveLog` list only active faults: their entries are open;
* a deassertion record (`EntryCode: Deassert`, Supermicro `Oem.Supermicro.RawEventData.EventDirAndType`
  with the direction bit 0x80) clears the earlier assertion of the same sensor, and is not a problem;
* a later entry of the same registry that clears it (`...Detected`/`...Exceeded` ->
  `...Cleared`/`...Corrected`, `ResourceStatusChangedCritical` -> `ResourceStatusChangedOK`) with
  the same arguments, as Cray and DMTF ResourceEvent logs do;
* otherwise unknown (None): the check judges it by its age.
An entry without a date (no `Created`, or `0000-00-00T...`) keeps `created=None`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from agent.core.facts import BmcLogEntry
from agent.sources.redfish_fields import Problems, Res

HARDWARE_LOG_IDS = frozenset({"sel", "iml", "event", "events", "eventlog", "lclog", "faultlog", "faultlist",
                              "activelog", "platformlog", "standardlog"})
ACTIVE_FAULT_LOGS = frozenset({"faultlist", "activelog"})  # Dell iDRAC, Lenovo: only what is active now
_NOT_EVENTS_RE = re.compile(r"syslog|journal|dump|fdr|postcode|debug|token|audit|security|^sl$|^iel$|crash|"
                            r"diagnostic|bootlog|console|session|telemetry", re.IGNORECASE)
# Entries of a hardware log that are about security posture or accounts (HPE's Event log carries
# iLOSecurityEvents.OverallSecAtRisk at Critical): not hardware events.
_NOT_HARDWARE_MESSAGE_RE = re.compile(r"Secur|SecState|SecAtRisk|Login|Logout|Password|Account|Privilege",
                                      re.IGNORECASE)
_EVENT_NAME_RE = re.compile(r"\bevent log\b|\bsystem event\b|\bSEL\b|management log", re.IGNORECASE)
_DETECT_RE = re.compile(r"^(?P<stem>.+?)(Detected|Exceeded|Asserted|Critical|Warning)$")
_CLEAR_RE = re.compile(r"^(?P<stem>.+?)(Cleared|Corrected|Deasserted|Deactivated|OK)$")
_NO_DATE_RE = re.compile(r"^0{4}-0{2}-0{2}")
MAX_ENTRIES_PER_LOG = 500  # bounded per log; a walk reads at most its last 100 anyway


def _service_id(path: str) -> tuple[str, str]:
    """(LogService path, its id) for an entry or Entries path."""
    head, _, _tail = path.partition("/Entries")
    return head, head.rsplit("/", 1)[-1]


def entry_types(res: Mapping[str, dict[str, Any]], service_path: str) -> frozenset[str]:
    """The EntryType values of a log service's entries as read (inline members or entry resources)."""
    prefix = f"{service_path}/Entries"
    found: set[str] = set()
    collection = res.get(prefix)
    members = collection.get("Members") if isinstance(collection, dict) else None
    for member in members if isinstance(members, list) else []:
        if isinstance(member, dict) and isinstance(member.get("EntryType"), str):
            found.add(member["EntryType"])
    for path, body in res.items():
        if path.startswith(prefix + "/") and isinstance(body.get("EntryType"), str):
            found.add(body["EntryType"])
        if len(found) > 8:  # a handful of kinds exist; a hostile tree gets no further
            break
    return frozenset(found)


def is_hardware_log(service_id: str, body: Mapping[str, Any] | None, kinds: frozenset[str] = frozenset()) -> bool:
    """Whether a LogService holds hardware events (see the module notes). `kinds`: the EntryType of the
    entries read, which tell a log by what it holds when neither its id nor its name says (DMTF's
    "System Log Service" of SEL entries)."""
    if _NOT_EVENTS_RE.search(service_id):
        return False
    if service_id.lower() in HARDWARE_LOG_IDS:
        return True
    if body is None:
        return True  # not read: judge its entries rather than drop them unseen
    if body.get("DiagnosticDataType") or body.get("OEMDiagnosticDataType"):
        return False  # dumps and diagnostic data, not events
    if body.get("LogEntryType") in ("SEL", "Event") or kinds & {"SEL", "Event"}:
        return True
    name = body.get("Name")
    return isinstance(name, str) and bool(_EVENT_NAME_RE.search(name)) and not _NOT_EVENTS_RE.search(name)


def _created(entry: Res) -> str | None:
    for key in ("Created", "EventTimestamp"):
        value = entry.text(key)
        if value and not _NO_DATE_RE.match(value):
            return value
    return None


def _message(entry: Res) -> str:
    message = entry.text("Message")
    if message:
        return message
    message_id = entry.text("MessageId")
    if message_id:  # HPE's Event log carries only the registry message and its arguments
        args = ", ".join(entry.texts("MessageArgs"))
        return f"{message_id.rsplit('.', 1)[-1]}({args})" if args else message_id.rsplit(".", 1)[-1]
    return entry.text("Name") or ""


def _deassertion(entry: Res) -> bool:
    if (entry.text("EntryCode") or "").lower() == "deassert":
        return True
    raw = entry.obj("Oem").obj("Supermicro").obj("RawEventData").text("EventDirAndType")
    try:
        return raw is not None and bool(int(raw, 16) & 0x80)  # IPMI event direction: 1 = deassertion
    except ValueError:
        return False


def _explicit(entry: Res, service_id: str) -> bool | None:
    resolved = entry.boolean("Resolved")
    if resolved is not None:
        return resolved
    repaired = entry.obj("Oem").obj("Hpe").boolean("Repaired")
    if repaired is not None:
        return repaired
    if service_id.lower() in ACTIVE_FAULT_LOGS:
        return False
    return None


class _Raw:
    __slots__ = ("args", "created", "deassert", "entry", "explicit", "message_id", "order", "sensor")

    def __init__(self, entry: Res, service_id: str, order: int) -> None:
        self.entry, self.order = entry, order
        self.created = _created(entry)
        self.message_id = entry.text("MessageId")
        self.args = frozenset(entry.texts("MessageArgs"))
        self.explicit = _explicit(entry, service_id)
        self.deassert = _deassertion(entry)
        number = entry.integer("SensorNumber")
        self.sensor = (entry.text("SensorType"), number) if number is not None else None


def _registry_key(message_id: str) -> tuple[str, str]:
    parts = message_id.split(".")
    return parts[0], parts[-1]


def _clearing_key(raw: _Raw) -> str:
    """What a clearing entry is about: its arguments (the sensor or resource), or the IPMI sensor."""
    if raw.args:
        return ", ".join(sorted(raw.args))[:120]
    if raw.sensor is not None:
        return f"{raw.sensor[0] or 'sensor'} {raw.sensor[1]}"
    return ""


def _resolve_by_later_entries(raws: list[_Raw]) -> dict[int, _Raw]:
    """Entries that a later clearing entry (or deassertion) resolved: order -> the clearing entry."""
    resolved: dict[int, _Raw] = {}
    open_by_stem: dict[tuple[str, str], list[_Raw]] = defaultdict(list)
    open_by_sensor: dict[tuple[str | None, int], list[_Raw]] = defaultdict(list)
    for raw in sorted(raws, key=lambda r: (r.created or "", r.order)):
        if raw.deassert:
            resolved[raw.order] = raw
            if raw.sensor is not None:
                resolved.update((r.order, raw) for r in open_by_sensor.pop(raw.sensor, []))
            continue
        if raw.sensor is not None:
            open_by_sensor[raw.sensor].append(raw)
        if not raw.message_id:
            continue
        registry, key = _registry_key(raw.message_id)
        cleared = _CLEAR_RE.match(key)
        if cleared:
            stem = (registry, cleared.group("stem"))
            still_open = []
            for earlier in open_by_stem.get(stem, []):
                if raw.args <= earlier.args:
                    resolved[earlier.order] = raw
                else:
                    still_open.append(earlier)
            open_by_stem[stem] = still_open
            continue
        detected = _DETECT_RE.match(key)
        if detected:
            open_by_stem[(registry, detected.group("stem"))].append(raw)
    return resolved


def _clearer_is_other(raw: _Raw, cleared: Mapping[int, _Raw]) -> bool:
    """A deassertion resolves itself too: only an entry cleared by another one has a clearing time."""
    return cleared[raw.order] is not raw


def log_entries(res: Mapping[str, dict[str, Any]], problems: Problems) -> tuple[BmcLogEntry, ...]:
    """Entries of the hardware event logs, de-duplicated, each with whether it is still open."""
    per_log: dict[str, list[tuple[str, Res]]] = defaultdict(list)
    for path, body in res.items():
        resource = Res(path, body, problems)
        if path.endswith("/Entries"):
            for member in resource.items("Members"):
                if len(member.body) > 2:  # inline entries (not just links)
                    per_log[path].append((member.path, member))
        elif "LogEntry." in resource.odata_type() and "/Entries/" in path:
            per_log[path.rsplit("/Entries/", 1)[0] + "/Entries"].append((path, resource))
    entries: dict[tuple[str, ...], BmcLogEntry] = {}
    for entries_path, members in sorted(per_log.items()):
        service_path, service_id = _service_id(entries_path)
        if not is_hardware_log(service_id, res.get(service_path), entry_types(res, service_path)):
            continue
        seen: dict[str, _Raw] = {}
        for order, (where, entry) in enumerate(members[-MAX_ENTRIES_PER_LOG:]):
            if _NOT_HARDWARE_MESSAGE_RE.search(entry.text("MessageId") or ""):
                continue
            # The resource path identifies an entry; some BMCs reuse Ids (Dell: two entries "1").
            key = where if "#" not in where else (
                f"{service_id}|{entry.text('Id')}|{entry.text('Created')}|{entry.text('Message')}")
            seen.setdefault(key, _Raw(entry, service_id, order))
        raws = list(seen.values())
        cleared = _resolve_by_later_entries(raws)
        for key, raw in zip(seen, raws, strict=True):
            entry = raw.entry
            severity = entry.text("Severity") or entry.text("MessageSeverity")
            resolved = raw.explicit if raw.explicit is not None else (True if raw.order in cleared else None)
            clearer = cleared.get(raw.order) if raw.order in cleared and _clearer_is_other(raw, cleared) else None
            entries[(service_path, key)] = BmcLogEntry(
                log=service_id, entry_id=entry.text("Id") or entry.path.rsplit("/", 1)[-1], severity=severity,
                message=_message(entry), created=raw.created, message_id=raw.message_id, resolved=resolved,
                cleared_at=clearer.created if clearer is not None else None,
                about=_clearing_key(clearer) if clearer is not None else None)
    return tuple(sorted(entries.values(), key=lambda e: (e.log, e.created or "", e.entry_id)))
