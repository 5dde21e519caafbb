"""bmc.events: warning and critical BMC log entries (SEL, IML, Event) within a window."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from agent.facts import BmcLogEntry, NodeFacts
from agent.model import Finding, Severity, Status
from agent.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, with_source

EVENTS = Check("bmc.events", "BMC log entries", source="bmc", action="check_bmc_events")
_SEVERITY = {"Critical": Severity.CRITICAL, "Warning": Severity.WARNING}


def _when(entry: BmcLogEntry) -> dt.datetime | None:
    if not entry.created:
        return None
    try:
        stamp = dt.datetime.fromisoformat(entry.created.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)


@EVENTS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "events")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(EVENTS, facts, expectation, "events")
    if bmc is None:
        return findings
    assert isinstance(bmc.events, tuple)
    window = dt.timedelta(days=float(expectation.option("window_days", 7)))
    now = facts.observed_at or dt.datetime.now(dt.timezone.utc)
    relevant = [e for e in bmc.events if e.severity in _SEVERITY]
    recent = [e for e in relevant if (_when(e) is None or now - window <= _when(e) <= now + dt.timedelta(days=1))]  # type: ignore[operator]
    grouped: dict[tuple[str, str], list[BmcLogEntry]] = defaultdict(list)
    for entry in recent:
        grouped[(entry.severity or "", entry.message)].append(entry)
    if not grouped:
        older = len(relevant) - len(recent)
        note = f" ({older} older ones outside the window)" if older else ""
        return [with_source(EVENTS.finding("log", Status.PASS, expectation.severity,
                                           f"no warning or critical BMC log entry in the last {window.days} days{note}",
                                           observed=0, expected=expectation.expected), facts)]
    for (severity, message), entries in sorted(grouped.items(), key=lambda kv: (kv[0][0] != "Critical", kv[0][1])):
        latest = max(entries, key=lambda e: e.created or "")
        times = f" x{len(entries)}" if len(entries) > 1 else ""
        finding = EVENTS.compare(f"{latest.log}:{latest.message_id or latest.entry_id}", expectation, len(entries),
                                 f"{severity} {latest.log} entry{times} {message!r} (last {latest.created or '?'})")
        finding.severity = _SEVERITY[severity]
        if finding.status is Status.FAIL and finding.severity is Severity.WARNING:
            finding.status = Status.WARN
        findings.append(with_source(finding, facts))
    return findings
