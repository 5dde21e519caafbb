"""bmc.voltages: each voltage rail the BMC reads, against the rail's own thresholds (issue 31.2).

The evidence is the BMC's own numbers: a reading at or beyond its critical (or fatal) threshold, upper
or lower, is critical; beyond its caution threshold, a warning. What is not evidence (skip, said once):
* a rail the BMC lists Absent/offline/disabled, or with no reading (an empty socket, a PSU bay);
* a threshold of exactly 0 V (Supermicro lists every unused threshold as 0), and a rail that reads
  exactly one of its own thresholds while reporting no health (a placeholder echo, as on Cray NBM ADCs);
* a rail below its lower thresholds while the host is powered off (its rails are meant to be down);
* a rail with no usable threshold, unless the BMC itself calls it Warning/Critical (then a warning,
  since nodewarden cannot see why).
A rail past a critical threshold that the BMC itself reports `Health: OK` is a warning, not a
critical: the BMC and its thresholds disagree, and a critical needs a side that is not contradicted.
"""

from __future__ import annotations

from agent.core.facts import BmcFacts, BmcVoltage, NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.core.numbers import finite
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import NOT_MEASURING, unusable, with_source

VOLTAGES = Check("bmc.voltages", "BMC voltage rails", source="bmc", action="contact_support",
                 parts=("redfish", "ipmi.sensors"),
                 evidence=("Power.Voltages, Voltage Sensors and IPMI voltage sensors against their own upper and lower "
                           "thresholds; 0 V thresholds, absent rails and a powered-off host's low rails are not "
                           "compared"))
LEVELS = ("fatal", "critical", "caution")  # worst first


def _usable(value: float | None) -> float | None:
    return value if value is not None and finite(value) is not None and value != 0 else None


def _thresholds(rail: BmcVoltage) -> dict[tuple[str, str], float]:
    """(level, side) -> threshold, placeholders left out."""
    raw = {("fatal", "upper"): rail.upper_fatal, ("critical", "upper"): rail.upper_critical,
           ("caution", "upper"): rail.upper_caution, ("fatal", "lower"): rail.lower_fatal,
           ("critical", "lower"): rail.lower_critical, ("caution", "lower"): rail.lower_caution}
    return {key: value for key, raw_value in raw.items() if (value := _usable(raw_value)) is not None}


def not_compared(rail: BmcVoltage, host_off: bool) -> str | None:
    """Why a rail is not compared with its thresholds (None: compare it)."""
    if rail.state in NOT_MEASURING:
        return rail.state
    if rail.reading is None:
        return "no reading"
    limits = _thresholds(rail)
    if rail.health is None and any(rail.reading == value for value in limits.values()):
        return "reads exactly one of its thresholds and reports no health (a placeholder)"
    if not limits and rail.health not in ("Warning", "Critical"):
        return "no thresholds"
    if host_off and any(side == "lower" and rail.reading <= value for (_, side), value in limits.items()):
        return "below its lower threshold with the host powered off"
    return None


def level_of(rail: BmcVoltage) -> tuple[str, str, float] | None:
    """The worst threshold the reading is at or beyond: (level, side, threshold), None within all."""
    assert rail.reading is not None
    limits = _thresholds(rail)
    for level in LEVELS:
        upper, lower = limits.get((level, "upper")), limits.get((level, "lower"))
        if upper is not None and rail.reading >= upper:
            return level, "upper", upper
        if lower is not None and rail.reading <= lower:
            return level, "lower", lower
    return None


def _judge(rail: BmcVoltage) -> Finding | None:
    """A finding for a rail out of range (or flagged by the BMC with no thresholds); None when within."""
    assert rail.reading is not None
    found = level_of(rail)
    observed = {"reading_v": rail.reading, "health": rail.health}
    if found is None:
        if _thresholds(rail) or rail.health not in ("Warning", "Critical"):
            return None
        return VOLTAGES.finding(rail.name, Status.WARN, Severity.WARNING,
                                f"{rail.name} reads {rail.reading:g} V; the BMC reports it {rail.health} and gives "
                                "no threshold to tell why", observed=observed, expected="within its thresholds")
    level, side, limit = found
    beyond = "at or above" if side == "upper" else "at or below"
    message = f"{rail.name} reads {rail.reading:g} V, {beyond} its {side} {level} threshold {limit:g} V"
    severity = Severity.CRITICAL if level in ("critical", "fatal") else Severity.WARNING
    if severity is Severity.CRITICAL and rail.health == "OK":
        severity = Severity.WARNING
        message += " (the BMC itself reports the rail OK: its thresholds and its health disagree)"
    status = Status.FAIL if severity is Severity.CRITICAL else Status.WARN
    return VOLTAGES.finding(rail.name, status, severity, message, observed={**observed, "level": level},
                            expected="within its thresholds")


@VOLTAGES.evaluator
def evaluate_voltages(facts: NodeFacts, profile: Profile) -> list[Finding]:
    bmc = facts.bmc
    if not isinstance(bmc, BmcFacts) or not isinstance(bmc.voltages, tuple) or not bmc.voltages:
        return []  # no BMC (source.available), down (bmc.reachable), or no voltage rail reported
    host_off = isinstance(bmc.power_state, str) and bmc.power_state.lower() == "off"
    findings: list[Finding] = []
    within: list[str] = []
    skipped: dict[str, list[str]] = {}
    for rail in bmc.voltages:
        problem = unusable(bmc, rail.where)
        if rail.reading is not None and finite(rail.reading) is None:
            problem = problem or f"reading {rail.reading!r} is not a finite number"
        if problem is not None and rail.state not in NOT_MEASURING:
            findings.append(with_source(VOLTAGES.finding(
                rail.name, Status.UNKNOWN, Severity.WARNING,
                f"{rail.name} not compared: the BMC's answer is unusable ({problem})"), facts))
            continue
        why = not_compared(rail, host_off)
        if why is not None:
            skipped.setdefault(why, []).append(rail.name)
            continue
        judged = _judge(rail)
        if judged is None:
            within.append(rail.name)
        else:
            findings.append(with_source(judged, facts))
    if within:
        findings.append(with_source(VOLTAGES.finding(
            "rails", Status.PASS, Severity.CRITICAL, f"{len(within)} voltage rail(s) within their thresholds",
            observed=len(within), expected="within their thresholds"), facts))
    if skipped:
        parts = [f"{len(names)} {reason} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                 for reason, names in sorted(skipped.items(), key=lambda kv: -len(kv[1]))]
        findings.append(with_source(VOLTAGES.finding(
            "not compared", Status.SKIP, Severity.INFO,
            f"{sum(map(len, skipped.values()))} voltage rail(s) not compared: " + "; ".join(parts),
            observed={reason: len(names) for reason, names in skipped.items()}), facts))
    return findings
