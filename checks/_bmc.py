"""Helpers shared by the BMC checks, and the one place that decides what counts as evidence.

A critical finding needs positive evidence: the BMC reporting a fault, or a reading beyond the
sensor's own threshold. Absence, placeholders and "not reported" are `skip` or `unknown` with the
reason, never a `fail`:
* a sensor whose Status.State is Absent, UnavailableOffline, Disabled or StandbyOffline, or whose
  reading is null, is not compared;
* a threshold at or below 0 °C is a placeholder and is ignored; a reading exactly equal to one of
  the sensor's own thresholds on a sensor that reports no health is the BMC echoing its threshold
  (Cray Slingshot cable sensors, EX4252 NBM ADC sensors), not a measurement;
* a PSU, fan or switch with no Status and no reading is a placeholder (an empty slot the BMC
  lists); a PSU in StandbySpare/StandbyOffline/Standby is standby, not failed; a present part
  whose health is not reported is `unknown`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from agent.core.expect import Expectation
from agent.core.facts import BmcFacts, BmcFan, BmcLogEntry, BmcPsu, BmcSwitch, BmcTemperature, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.core.numbers import finite, parse_iso_time
from checks import Check

PRESENT_STATES_SKIPPED = ("Absent", "StandbySpare", "StandbyOffline", "Standby", "Disabled")
NOT_MEASURING = ("Absent", "UnavailableOffline", "Disabled", "StandbyOffline")
EVENT_SEVERITIES = ("Critical", "Warning")


def usable_threshold(value: float | None) -> float | None:
    """A temperature threshold, or None when missing or a placeholder (at or below 0 °C)."""
    return value if value is not None and value > 0 else None


def temperature_not_compared(sensor: BmcTemperature) -> str | None:
    """Why a temperature sensor is not compared with its thresholds (None: compare it)."""
    if sensor.state in NOT_MEASURING:
        return sensor.state
    if sensor.reading is None:
        return "no reading"
    if sensor.health is None:
        for level, value in (("caution", sensor.upper_caution), ("critical", sensor.upper_critical),
                             ("fatal", sensor.upper_fatal)):
            if usable_threshold(value) is not None and sensor.reading == value:
                return f"reads exactly its {level} threshold and reports no health (a placeholder)"
    return None


def part_not_judged(part: BmcPsu | BmcFan | BmcSwitch) -> str | None:
    """Why a PSU, fan or switch is not judged: an empty bay, standby, or a placeholder entry."""
    if part.state in PRESENT_STATES_SKIPPED:
        return f"{part.state} (empty bay or standby, not a fault)"
    readings: tuple[Any, ...] = ()
    if isinstance(part, BmcPsu):
        readings = (part.output_w, part.capacity_w)
    elif isinstance(part, BmcFan):
        readings = (part.reading,)
    if part.state is None and part.health is None and all(r is None for r in readings):
        return "listed with no Status and no reading (a placeholder, not a part)"
    return None


def unusable(bmc: BmcFacts, where: str) -> str | None:
    """The parser's problem with the resource (or the array member) a part came from, if any."""
    base, _, fragment = where.partition("#")
    head, marker = f"{base}: unusable field ", f"{fragment.strip('/')}." if fragment.strip("/") else ""
    for problem in bmc.problems:
        if problem.startswith(head) and problem[len(head):].startswith(marker):
            return problem[len(base) + 2:]
    return None


def judge_part(check: Check, part: BmcPsu | BmcFan | BmcSwitch, expectation: Expectation, what: str,
               bmc: BmcFacts, facts: NodeFacts) -> Finding | None:
    """A PSU, fan or switch: None when it is not judged (empty bay, standby, placeholder), else a finding.

    Health missing because the BMC's answer had the wrong type is `unknown` naming the field.
    """
    problem = unusable(bmc, part.where)
    if problem is not None and part.health is None:
        return with_source(check.unknown(part.name, expectation,
                                         f"{what} not judged: the BMC's answer is unusable ({problem})"), facts)
    if part_not_judged(part) is not None:
        return None
    finding = compare_health(check, part.name, expectation, part.health, what, facts)
    if finding.status is Status.FAIL and finding.severity is Severity.CRITICAL and part.health == "Warning":
        # The BMC's own rating bounds ours: a part it calls Warning (a PSU's fan, a predictive fault) is
        # evidence of a warning, not of a failed part; Critical stays critical.
        finding.status, finding.severity = Status.WARN, Severity.WARNING
        finding.message += " (the BMC rates it Warning, not Critical)"
    return finding


def compare_health(check: Check, subject: str, expectation: Expectation, health: str | None, what: str,
                   facts: NodeFacts) -> Finding:
    """A part's reported health against the expectation; not reported is `unknown`, never a fail."""
    if health is None:
        return with_source(check.unknown(subject, expectation, f"{what} is not reported by the BMC"), facts)
    return with_source(check.compare(subject, expectation, health, what), facts)


def entry_time(entry: BmcLogEntry) -> dt.datetime | None:
    if not entry.created:
        return None
    return parse_iso_time(entry.created)  # year 1 or 9999 (+ an offset) is undated, not an overflow


MAX_WINDOW_DAYS = 36_500.0  # a century: `window_days: 1e308` in a profile must not overflow timedelta


def event_window(expectation: Expectation | None) -> dt.timedelta:
    """The profile's `window_days` (default 7) as a timedelta, clamped to a century (never an overflow)."""
    days = finite(expectation.option("window_days", 7) if expectation else 7, low=0, high=float("inf"))
    return dt.timedelta(days=7 if days is None else min(days, MAX_WINDOW_DAYS))


def open_entries(events: tuple[BmcLogEntry, ...], now: dt.datetime, window: dt.timedelta
                 ) -> tuple[list[BmcLogEntry], int, list[BmcLogEntry]]:
    """Warning/critical entries that are open problems, how many older ones, and the undated ones.

    An entry the BMC marks unresolved counts whatever its age; a resolved one never does; one the
    BMC says nothing about counts when it is dated inside the window. Undated is not recent.
    """
    counted: list[BmcLogEntry] = []
    undated: list[BmcLogEntry] = []
    older = 0
    try:  # `now` is a snapshot's captured_at: year 1 minus the window overflows
        since, until = now - window, now + dt.timedelta(days=1)
    except OverflowError:
        since, until = dt.datetime.min.replace(tzinfo=dt.timezone.utc), dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    for entry in events:
        if entry.severity not in EVENT_SEVERITIES or entry.resolved is True:
            continue
        if entry.resolved is False:
            counted.append(entry)
            continue
        when = entry_time(entry)
        if when is None:
            undated.append(entry)
        elif since <= when <= until:
            counted.append(entry)
        else:
            older += 1
    return counted, older, undated


def not_judged_summary(check: Check, expectation: Expectation, reasons: dict[str, list[str]], what: str,
                       facts: NodeFacts) -> Finding:
    """One `skip` naming what was not compared and why (not one finding per empty bay)."""
    parts = []
    for reason, names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{len(names)} {reason} ({shown})")
    total = sum(len(n) for n in reasons.values())
    return with_source(check.finding("not compared", Status.SKIP, expectation.severity,
                                     f"{total} {what} not compared: " + "; ".join(parts),
                                     observed={r: len(n) for r, n in reasons.items()}), facts)


def bmc_facts(check: Check, facts: NodeFacts, expectation: Expectation | None,
              part: str | None = None) -> tuple[BmcFacts | None, list[Finding]]:
    """The BMC's facts, or the one finding that says why there are none.

    No BMC configured: nothing (source.available says so). BMC down: one
    `unknown`. A part the BMC does not expose: `skip` with the reason.
    """
    bmc = facts.bmc
    if isinstance(bmc, Unsupported):
        return None, []
    if isinstance(bmc, Unknown):
        return None, [with_source(check.unknown("bmc", expectation, f"BMC unavailable: {bmc.reason}"), facts)]
    if part is not None:
        value = getattr(bmc, part)
        if isinstance(value, Unknown):
            return None, [with_source(check.missing("bmc", expectation, value, part.replace("_", " ")), facts)]
    return bmc, []


def with_source(finding: Finding, facts: NodeFacts) -> Finding:
    """BMC findings name the protocol the data came from."""
    bmc = facts.bmc
    finding.source = bmc.protocol if isinstance(bmc, BmcFacts) else "redfish"
    return finding
