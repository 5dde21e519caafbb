"""bmc.events: open warning and critical entries of the BMC's hardware event logs.

An entry the BMC marks unresolved (Resolved false, HPE Repaired false, Dell FaultList, Lenovo
ActiveLog) stays a finding whatever its age; a resolved one (or one a later entry cleared) is none;
one the BMC says nothing about counts inside the window; an undated one is not recent. Which logs
are hardware event logs is decided by the parser (agent.sources.redfish_logs).

A link that flaps is a fault even when every entry says it recovered: link or connectivity state
entries (down/up, lost/restored, HPE "Connectivity status changed to OK", NicConnectivityRestored)
that are not already an open warning, resolved or OK alike, repeated more than LINK_FLAPS_MAX times in
the window for one component (one message text: it names the adapter and port) are one warning per
log and message id, naming the components and their counts. Keyed by the message id like every
other finding here: a new entry raises the count, never adds a series. Other OK-severity
recoveries (a volume back to OK, POST or discovery complete) repeat with every reset and say
nothing by themselves.

A fault that clears itself is not a pass when it comes back (issue 22 item 8): a Critical entry that a
later entry cleared within SELF_CLEARING_S (`HardwareFatalFaultDetected` -> `...Cleared` ten seconds
later, an IPMI assertion and its deassertion) and that recurs on the same sensor or resource (what the
clearing entry names) at least twice in the window is one warning per log and message id, "recurring,
self-clearing", with the count per sensor. Once is history: the BMC cleared it, nothing came back.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict

from agent.core.digest import sha256_hex
from agent.core.facts import BmcLogEntry, NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.core.numbers import parse_iso_time
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, entry_time, event_window, open_entries, with_source

EVENTS = Check("bmc.events", "BMC log entries", source="bmc", action="check_bmc_events",
               evidence=("unresolved warning/critical entries of hardware event logs (SEL, IML, Event, Lclog, "
                         "FaultLog) in the window or marked open; resolved, undated and BMC syslog/dump entries are "
                         "not evidence"), parts=("redfish", "ipmi.sel"))
_SEVERITY = {"Critical": Severity.CRITICAL, "Warning": Severity.WARNING}
# An operator's action the BMC logs at a fault's severity: an HPE drive "status changed to Erasing"
# (iLO IML 19.20, Event DrvArrPhysDrvErasing) is a secure erase someone started, not a drive failure.
OPERATOR_ACTIONS = re.compile(r"status changed to (Erasing|Sanitizing)|DrvArrPhysDrvErasing|\bsanitiz", re.IGNORECASE)
# Link state entries, by message id or text: "link is down", "Link Up", NetworkDevice LinkDown,
# "Connectivity status changed to OK" (HPE IML 17.10), NicConnectivityRestored/Lost, ConnectionDropped.
LINK_STATE = re.compile(r"\blinks?\b[^;]{0,60}?\b(up|down|lost|restored|recovered|established|flapp\w*)\b|"
                        r"link_?(up|down|status|state)|connectivity|connection_?(dropped|established|lost|restored)|"
                        r"\bcarrier\b", re.IGNORECASE)
# More link state changes than this for one component in the window is a flapping link. A reboot
# takes each port down and up once or twice; ten in a week is more than a node's maintenance does.
LINK_FLAPS_MAX = 10
# A critical fault the BMC itself clears within this many seconds is self-clearing; recurring from this count.
SELF_CLEARING_S = 300
SELF_CLEARING_RECURS = 2


def _message_key(message: str) -> str:
    """A stable short key for an event without a MessageId: its text without numbers, hashed."""
    shape = re.sub(r"\d+", "#", message.strip().lower())
    return "msg-" + sha256_hex(shape.encode("utf-8", "surrogatepass"))[:10]


@EVENTS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "events")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(EVENTS, facts, expectation, "events")
    if bmc is None:
        return findings
    assert isinstance(bmc.events, tuple)
    window = event_window(expectation)
    now = facts.observed_at or dt.datetime.now(dt.timezone.utc)
    counted, older, undated = open_entries(bmc.events, now, window)
    # One finding per kind of event: a switch whose 40 ports flapped in one second is one event.
    grouped: dict[tuple[str, str, str, bool], list[BmcLogEntry]] = defaultdict(list)
    for entry in counted:
        grouped[(entry.severity or "", entry.log, entry.message_id or entry.message,
                 bool(OPERATOR_ACTIONS.search(entry.message)))].append(entry)
    if undated:  # no usable date (IPMI "Pre-Init", 0000-00-00): not recent, and not to be hidden either
        worst = min(undated, key=lambda e: (e.severity != "Critical", e.log))
        findings.append(with_source(EVENTS.unknown(
            "undated", expectation,
            f"{len(undated)} warning or critical BMC log entr{'y has' if len(undated) == 1 else 'ies have'} no usable "
            f"date, so whether they are recent is unknown; e.g. {worst.severity} {worst.log} entry "
            f"{worst.message!r}"), facts))
    flaps = _flapping(bmc.events, counted, {(log, kind) for _sev, log, kind, _op in grouped}, now, window)
    flaps += _self_clearing(bmc.events, now, window)
    if not grouped:
        resolved = sum(1 for e in bmc.events if e.resolved is True and e.severity in _SEVERITY)
        notes = [f"{n} {what}" for n, what in ((older, "older ones outside the window"), (resolved, "resolved")) if n]
        note = f" ({'; '.join(notes)})" if notes else ""
        findings.append(with_source(EVENTS.finding("log", Status.PASS, expectation.severity,
                                                   f"no open warning or critical BMC log entry in the last "
                                                   f"{window.days} days{note}", observed=0,
                                                   expected=expectation.expected), facts))
        return findings + [with_source(f, facts) for f in flaps]
    subjects: dict[str, int] = {}
    for (severity, log, _kind, operator), entries in sorted(grouped.items(), key=lambda kv: (
            kv[0][0] != "Critical", kv[0][1], kv[0][2], kv[0][3])):
        latest = max(entries, key=lambda e: e.created or "")
        times = f" x{len(entries)}" if len(entries) > 1 else ""
        others = len({e.message for e in entries}) - 1
        quoted = repr(latest.message) + (f" (and {others} more like it on other parts)" if others else "")
        # Keyed by what happened, never by entry id: a repeat of the same event keeps its subject
        # (one metrics series), whatever number the BMC gave the newest entry.
        subject = f"{log}:{latest.message_id or _message_key(latest.message)}"
        subjects[subject] = subjects.get(subject, 0) + 1
        if subjects[subject] > 1:
            subject = f"{subject} #{subjects[subject]}"
        still_open = " not marked resolved by the BMC" if any(e.resolved is False for e in entries) else ""
        finding = EVENTS.compare(subject, expectation, len(entries),
                                 f"{severity} {log} entry{times} {quoted} (last {latest.created or 'undated'})"
                                 f"{still_open}")
        finding.severity = _SEVERITY[severity]
        if operator:
            finding.severity = Severity.INFO
            finding.message += ": a secure erase an operator started, not a drive failure (mark it repaired once done)"
        if finding.status is Status.FAIL and finding.severity is not Severity.CRITICAL:
            finding.status = Status.WARN
        findings.append(with_source(finding, facts))
    return findings + [with_source(f, facts) for f in flaps]


def _flapping(events: tuple[BmcLogEntry, ...], counted: list[BmcLogEntry], reported: set[tuple[str, str]],
              now: dt.datetime, window: dt.timedelta) -> list[Finding]:
    """One warning per log and message id whose link state entries repeat more than LINK_FLAPS_MAX
    times in the window for one component (see the module notes)."""
    already = {id(e) for e in counted}
    per_kind: dict[tuple[str, str], dict[str, list[BmcLogEntry]]] = defaultdict(lambda: defaultdict(list))
    for entry in events:
        if id(entry) in already or (entry.log, entry.message_id or entry.message) in reported:
            continue  # an open warning entry is its own finding, with its count
        if not LINK_STATE.search(entry.message_id or "") and not LINK_STATE.search(entry.message):
            continue
        when = entry_time(entry)
        if when is None or not now - window <= when <= now + dt.timedelta(days=1):
            continue
        per_kind[(entry.log, entry.message_id or _message_key(entry.message))][entry.message].append(entry)
    findings = []
    for (log, key), components in sorted(per_kind.items()):
        flapping = {message: entries for message, entries in components.items() if len(entries) > LINK_FLAPS_MAX}
        if not flapping:
            continue
        ranked = sorted(flapping.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        shown = ", ".join(f"{message!r} x{len(entries)}" for message, entries in ranked[:3])
        more = f" and {len(ranked) - 3} more" if len(ranked) > 3 else ""
        every = [e for _message, entries in ranked for e in entries]
        severities = "/".join(sorted({e.severity or "no severity" for e in every}))
        first = min(e.created or "" for e in every)[:10]
        last = max(e.created or "" for e in every)[:10]
        findings.append(EVENTS.finding(
            f"{log}:{key}", Status.WARN, Severity.WARNING,
            f"link flapping: {len(flapping)} component(s) changed link state more than {LINK_FLAPS_MAX} times in "
            f"the last {window.days} days ({severities} {log} entries, {first} to {last}): {shown}{more}",
            observed={message: len(entries) for message, entries in ranked},
            expected=f"at most {LINK_FLAPS_MAX} link state changes per component in {window.days} days",
            reason="A link that keeps dropping and coming back is a cable, optic, switch port or NIC fault even "
                   "when every entry says it recovered"))
    return findings


def _self_clearing(events: tuple[BmcLogEntry, ...], now: dt.datetime, window: dt.timedelta) -> list[Finding]:
    """One warning per log and message id whose Critical entries the BMC cleared within SELF_CLEARING_S and
    that came back on one sensor at least SELF_CLEARING_RECURS times in the window (see the module notes)."""
    per_kind: dict[tuple[str, str], dict[str, list[BmcLogEntry]]] = defaultdict(lambda: defaultdict(list))
    for entry in events:
        if entry.severity != "Critical" or entry.resolved is not True or not entry.cleared_at:
            continue
        start, end = entry_time(entry), parse_iso_time(entry.cleared_at)
        if start is None or end is None or not now - window <= start <= now + dt.timedelta(days=1):
            continue
        if not 0 <= (end - start).total_seconds() <= SELF_CLEARING_S:
            continue  # cleared minutes or days later: an outage that was repaired, not a self-clearing fault
        key = entry.message_id or _message_key(entry.message)
        per_kind[(entry.log, key)][entry.about or entry.message].append(entry)
    findings = []
    for (log, key), sensors in sorted(per_kind.items()):
        recurring = {about: entries for about, entries in sensors.items() if len(entries) >= SELF_CLEARING_RECURS}
        if not recurring:
            continue
        ranked = sorted(recurring.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        every = [e for _about, entries in ranked for e in entries]
        latest = max(every, key=lambda e: e.created or "")
        longest = max((parse_iso_time(e.cleared_at or "") or now) - (entry_time(e) or now) for e in every)
        shown = ", ".join(f"{about!r} x{len(entries)}" for about, entries in ranked[:3])
        more = f" and {len(ranked) - 3} more" if len(ranked) > 3 else ""
        findings.append(EVENTS.finding(
            f"{log}:{key}:recurring", Status.WARN, Severity.WARNING,
            f"recurring, self-clearing: Critical {log} entry {latest.message!r} came back {len(every)} times in the "
            f"last {window.days} days on {shown}{more}, each cleared by the BMC within "
            f"{int(longest.total_seconds())} s (last {latest.created})",
            observed={about: len(entries) for about, entries in ranked},
            expected=f"a critical fault at most once per sensor in {window.days} days",
            reason="A critical fault the BMC clears within seconds and that comes back is a marginal part (sensor, "
                   "regulator, cable) on its way to failing for good; a pass would hide it"))
    return findings
