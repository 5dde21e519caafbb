"""GPU power limits and clock event (throttle) reasons.

The four limits stay apart: *requested* (what this host asked NVML for, `power.limit`), *enforced*
(what the GPU obeys: the lowest of every cap on it), *default* and *max*. A requested limit below the
default is someone's setting on this host (the remediation puts it back); an enforced limit below the
requested one means something else clamps the GPU, and the finding says what is known about who.
"""

from __future__ import annotations

from typing import Any

from agent.core.expect import Expectation
from agent.core.facts import CLOCK_EVENT_BITS, GpuFacts, NodeFacts, gpu_activity
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import gpu_refs, nvml_gpus, subject

POWER_LIMIT = Check("gpu.power.limit", "Power limit", source="nvml", remediation="gpu_power_limit",
                    evidence=("NVML requested, enforced, default and max power limits kept apart; an enforced limit "
                              "below requested names who clamps it where known"))
CLOCK_EVENTS = Check("gpu.clocks.events", "Clock event (throttle) reasons", source="nvml",
                     evidence=("NVML clock event reasons that are active now (HW slowdown, power brake, thermal); "
                               "idle and user-set reasons are not faults"))

_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_ACTIONS = {"hw_power_brake": "check_power_delivery", "hw_slowdown": "check_cooling_and_power",
            "hw_thermal": "check_cooling", "sw_thermal": "check_cooling", "sw_power_cap": None}


_BRAKE, _SW_CAP = CLOCK_EVENT_BITS["hw_power_brake"], CLOCK_EVENT_BITS["sw_power_cap"]
_PLATFORM_BRAKE = ("the platform asserts the power brake (the baseboard's power-brake input, driven by the BMC "
                   "or the power-delivery logic when the PSUs or power shelf cannot deliver)")


def _watts(value: Any) -> str:
    return f"{value:g} W" if isinstance(value, float) else "unknown"


def _events(gpu: GpuFacts) -> int:
    return int(gpu.clock_events) if isinstance(gpu.clock_events, int) else 0


def power_limits(gpu: GpuFacts) -> dict[str, float | None]:
    """The limits kept apart, as a finding's `observed`."""
    limits = {"requested_w": gpu.power_limit_w, "enforced_w": gpu.enforced_limit_w,
              "default_w": gpu.default_limit_w, "max_w": gpu.max_limit_w,
              "module_w": gpu.module_limit_w, "module_requested_w": gpu.module_requested_limit_w}
    return {k: v if isinstance(v, float) else None for k, v in limits.items()
            if isinstance(v, float) or not k.startswith("module")}


def _bmc_power_clues(facts: NodeFacts) -> list[str]:
    """PSUs the BMC reports unhealthy (only when the BMC was read anyway)."""
    psus = getattr(facts.bmc, "psus", None)
    if not isinstance(psus, tuple):
        return []
    bad = [f"{p.name} {p.health}" for p in psus if p.health not in (None, "OK") and p.state != "Absent"]
    return [f"the BMC reports {', '.join(bad)}"] if bad else []


def clamp_cause(facts: NodeFacts, gpu: GpuFacts) -> tuple[str, str, list[str]]:
    """(who most likely clamps the enforced limit, the operator action, corroborating clues)."""
    events, module, asked = _events(gpu), gpu.module_limit_w, gpu.module_requested_limit_w
    clues = []
    if isinstance(module, float) and isinstance(asked, float) and module < asked:
        who = (f"the platform or BMC: the Grace Hopper module limit is held at {module:g} W, below its requested "
               f"{asked:g} W")
        action = "check_platform_power_cap"
    elif isinstance(module, float):
        who = (f"the module power limit ({module:g} W for CPU, GPU and memory together on Grace Hopper): the "
               "module budget binds, not this GPU's setting")
        action = "check_module_power_limit"
    elif events & _BRAKE:
        who = _PLATFORM_BRAKE
        action = "check_power_delivery"
    else:
        who = ("something outside this host's NVML setting: most likely a platform or BMC power cap "
               "(out-of-band power management) or a data-centre power manager")
        action = "check_platform_power_cap"
    if events & _BRAKE and not who.startswith("the platform asserts"):
        clues.append("HW power brake is asserted as well")
    if events & _SW_CAP:
        clues.append("SW power cap is active: the driver is holding clocks at the enforced limit now")
    return who, action, clues + _bmc_power_clues(facts)


def _judge_enforced(facts: NodeFacts, gpu: GpuFacts, expectation: Expectation) -> Finding:
    """The enforced limit against the requested one (the default when the requested is unreadable)."""
    refs = gpu_refs(gpu)
    if not isinstance(gpu.power_limit_w, float):
        refs["power_limit_w"] = gpu.default_limit_w
    finding = POWER_LIMIT.compare(subject(gpu), expectation, gpu.enforced_limit_w,
                                  f"{gpu.label} enforced power limit (W)", refs=refs)
    if finding.status not in (Status.FAIL, Status.WARN):
        return finding
    who, action, clues = clamp_cause(facts, gpu)
    finding.message = (f"{gpu.label} is held at {_watts(gpu.enforced_limit_w)}: below its requested "
                       f"{_watts(gpu.power_limit_w)} (default {_watts(gpu.default_limit_w)}, max "
                       f"{_watts(gpu.max_limit_w)}), so something else clamps it; likely {who}"
                       + "".join(f"; {clue}" for clue in clues))
    finding.observed = power_limits(gpu)
    finding.action = action
    finding.remediation = None  # setting the requested limit again changes nothing: it is not this host's cap
    return finding


@POWER_LIMIT.evaluator
def evaluate_power_limit(facts: NodeFacts, profile: Profile) -> list[Finding]:
    requested = profile.expectation("gpu", "power", "limit")
    enforced = profile.expectation("gpu", "power", "enforced")
    if requested is None and enforced is None:
        return []
    gpus, findings = nvml_gpus(POWER_LIMIT, facts, requested or enforced)
    return findings + [_judge_limits(facts, gpu, requested, enforced) for gpu in gpus]


def _judge_limits(facts: NodeFacts, gpu: GpuFacts, requested_exp: Expectation | None,
                  enforced_exp: Expectation | None) -> Finding:
    """One finding per GPU: the requested limit first (this host's setting), then the enforced one."""
    enforced = _judge_enforced(facts, gpu, enforced_exp) if enforced_exp is not None else None
    if requested_exp is None:
        assert enforced is not None
        return enforced
    finding = POWER_LIMIT.compare(subject(gpu), requested_exp, gpu.power_limit_w,
                                  f"{gpu.label} requested power limit (W)", refs=gpu_refs(gpu))
    if finding.status in (Status.FAIL, Status.WARN):
        if isinstance(gpu.default_limit_w, float):
            finding.message += f" (default {gpu.default_limit_w:g} W: the GPU is capped)"
        return finding
    if enforced is not None and enforced.status in (Status.FAIL, Status.WARN):
        return enforced
    if enforced is not None:
        finding.message += (f", enforced {_watts(gpu.enforced_limit_w)}" if enforced.status is Status.PASS
                            else f"; {enforced.message}")
    if finding.status is Status.PASS and _events(gpu) & _BRAKE:
        finding.message += "; the limits do not hold it back, the platform's HW power brake does (gpu.clocks.events)"
    return finding


def active_reasons(mask: int) -> list[str]:
    return [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]


@CLOCK_EVENTS.evaluator
def evaluate_clock_events(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectations = profile.expectations_under("gpu", "clocks", "events")
    if not expectations:
        return []
    gpus, findings = nvml_gpus(CLOCK_EVENTS, facts, next(iter(expectations.values())))
    braked = [g for g in gpus if _events(g) & _BRAKE]
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
        why = _brake_context(gpu, len(braked), len(gpus)) if "hw_power_brake" in dict(bad) else ""
        findings.append(CLOCK_EVENTS.finding(
            name, Status.FAIL if Status.FAIL in statuses else Status.WARN, worst.severity,
            f"{gpu.label} clocks held down by {', '.join(r for r, _ in bad)} (active: {', '.join(active)}){why}",
            observed=active, expected={r: e.expected for r, e in expectations.items()}, reason=worst.reason,
            action=_ACTIONS.get(worst_reason)))
    return findings


def _brake_context(gpu: GpuFacts, braked: int, readable: int) -> str:
    """Who clamps a GPU under HW power brake: the platform; with the evidence that it is not the GPU's load."""
    parts = [f"likely clamp: {_PLATFORM_BRAKE}, not the GPU"]
    if braked == readable > 1:
        parts.append(f"on all {readable} GPUs at once: a node power-delivery fault (PSUs, power shelf, baseboard); "
                     "check the BMC's PSU state and event log")
    elif braked > 1:
        parts.append(f"on {braked} of {readable} GPUs")
    if gpu_activity(gpu) is None:
        parts.append(f"while idle ({gpu.utilization_gpu_pct} % utilization, {_watts(gpu.power_w)} of "
                     f"{_watts(gpu.enforced_limit_w)}): no load explains it")
    return "; " + "; ".join(parts)
