"""bmc.power_cap: a power cap the BMC enforces, judged by its numbers (issue 31.5).

A cap is a choice a site makes, so a cap alone passes. Two are worth a warning with the numbers: a
cap whose LimitException is `HardPowerOff` (the BMC cuts the node's power when it is exceeded: a GPU
job that ramps past it takes the node down with no OS in the loop), and a cap far below the platform's
rating (under CAP_FRACTION of PowerCapacityWatts / SettingRangeMax: the node is throttled to a fraction
of what it can draw, GPUs included). No cap, or no power control read: a pass, or nothing.
"""

from __future__ import annotations

from agent.core.facts import BmcFacts, BmcPowerLimit, NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import with_source

POWER_CAP = Check("bmc.power_cap", "BMC power cap", source="bmc",
                  evidence="Power.PowerControl[].PowerLimit (LimitInWatts, LimitException) and Control resources "
                           "of type Power, against the platform's PowerCapacityWatts / SettingRangeMax")
CAP_FRACTION = 0.5


def _watts(value: float | None) -> str:
    return f"{value:g} W" if value is not None else "?"


def _judge(limit: BmcPowerLimit) -> tuple[Status, str]:
    draw = f"; drawing {_watts(limit.consumed_w)} now" if limit.consumed_w is not None else ""
    rated = f" on a platform rated {_watts(limit.capacity_w)}" if limit.capacity_w else ""
    if limit.limit_w is None or limit.limit_w <= 0:
        return Status.PASS, f"{limit.name}: no power cap set{draw}"
    if (limit.exception or "").lower() == "hardpoweroff":
        return Status.WARN, (f"{limit.name}: power cap {_watts(limit.limit_w)}{rated} with LimitException "
                             f"HardPowerOff: the BMC powers the node off when it draws more{draw}")
    if limit.capacity_w and limit.limit_w < CAP_FRACTION * limit.capacity_w:
        share = 100 * limit.limit_w / limit.capacity_w
        return Status.WARN, (f"{limit.name}: power cap {_watts(limit.limit_w)} is {share:.0f}% of the platform's "
                             f"{_watts(limit.capacity_w)} rating: the node runs throttled{draw}")
    exception = limit.exception or "no exception"
    return Status.PASS, f"{limit.name}: power cap {_watts(limit.limit_w)}{rated} ({exception}){draw}"


@POWER_CAP.evaluator
def evaluate_power_cap(facts: NodeFacts, profile: Profile) -> list[Finding]:
    bmc = facts.bmc
    if not isinstance(bmc, BmcFacts) or not isinstance(bmc.power_limits, tuple):
        return []  # no BMC, or it is down (bmc.reachable says so), or no power control read
    findings = []
    for limit in bmc.power_limits:
        status, message = _judge(limit)
        findings.append(with_source(POWER_CAP.finding(
            limit.name, status, Severity.WARNING, message, expected="no hard power-off cap, none far below rating",
            observed={"limit_w": limit.limit_w, "exception": limit.exception, "capacity_w": limit.capacity_w},
            action="check_bmc" if status is Status.WARN else None), facts))
    return findings
