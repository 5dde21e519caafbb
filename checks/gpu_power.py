"""GPU power limit and clock event (throttle) reasons."""

from __future__ import annotations

from agent.facts import CLOCK_EVENT_BITS, NodeFacts
from agent.model import Finding, Severity, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._gpu import nvml_gpus, per_gpu, subject

POWER_LIMIT = Check("gpu.power.limit", "Power limit", source="nvml", remediation="gpu_power_limit")
CLOCK_EVENTS = Check("gpu.clocks.events", "Clock event (throttle) reasons", source="nvml")

_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_ACTIONS = {"hw_power_brake": "check_power_delivery", "hw_slowdown": "check_cooling_and_power",
            "hw_thermal": "check_cooling", "sw_thermal": "check_cooling", "sw_power_cap": None}


@POWER_LIMIT.evaluator
def evaluate_power_limit(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = per_gpu(POWER_LIMIT, facts, profile.expectation("gpu", "power", "limit"),
                       lambda g: g.power_limit_w, "power limit (W)")
    gpus = {subject(g): g for g in nvml_gpus(POWER_LIMIT, facts, None)[0]}
    for finding in findings:
        gpu = gpus.get(finding.subject)
        if gpu and finding.status is Status.FAIL and isinstance(gpu.default_limit_w, float):
            finding.message += f" (default {gpu.default_limit_w:g} W: the GPU is capped)"
    return findings


def active_reasons(mask: int) -> list[str]:
    return [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]


@CLOCK_EVENTS.evaluator
def evaluate_clock_events(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectations = profile.expectations_under("gpu", "clocks", "events")
    if not expectations:
        return []
    gpus, findings = nvml_gpus(CLOCK_EVENTS, facts, next(iter(expectations.values())))
    for gpu in gpus:
        name = subject(gpu)
        mask = gpu.clock_events
        if isinstance(mask, Unknown):
            findings.append(CLOCK_EVENTS.compare(name, next(iter(expectations.values())), mask,
                                                 f"{gpu.label} clock event reasons"))
            continue
        active = active_reasons(int(mask))
        bad = [(reason, exp) for reason, exp in sorted(expectations.items())
               if not exp.evaluate("active" if reason in active else "inactive").ok]
        if not bad:
            findings.append(CLOCK_EVENTS.finding(
                name, Status.PASS, Severity.INFO,
                f"{gpu.label} clocks: {', '.join(active) or 'no event reasons active'}",
                observed=active, expected={r: e.expected for r, e in expectations.items()}))
            continue
        worst_reason, worst = max(bad, key=lambda item: _SEVERITY_RANK[item[1].severity])
        statuses = {exp.status_on_mismatch() for _, exp in bad}
        findings.append(CLOCK_EVENTS.finding(
            name, Status.FAIL if Status.FAIL in statuses else Status.WARN, worst.severity,
            f"{gpu.label} clocks held down by {', '.join(r for r, _ in bad)} (active: {', '.join(active)})",
            observed=active, expected={r: e.expected for r, e in expectations.items()}, reason=worst.reason,
            action=_ACTIONS.get(worst_reason)))
    return findings
