"""NVLink links and errors, and NVSwitch fabric registration (Hopper and later)."""

from __future__ import annotations

from agent.expect import counter_total, saturated
from agent.facts import GpuFacts, NodeFacts
from agent.model import Finding, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._gpu import NVLINK_BITS, per_gpu

LINKS = Check("gpu.nvlink.links", "Active NVLinks", source="nvml", action="reset_gpu")
ERRORS = Check("gpu.nvlink.errors", "NVLink error counters", source="nvml", action="contact_support")
FABRIC = Check("gpu.fabric", "NVLink fabric registration", source="nvml", action="check_fabric_manager")


def active_links(gpu: GpuFacts) -> object:
    states = gpu.nvlink_states
    if isinstance(states, Unknown):
        return states
    return sum(1 for s in states if s == 1)


def link_errors(gpu: GpuFacts) -> object:
    errors = gpu.nvlink_errors
    if isinstance(errors, Unknown):
        return errors
    return counter_total([saturated(errors.get(k, 0), NVLINK_BITS, f"the NVLink {k} counter")
                          for k in ("replay", "recovery", "crc_flit", "crc_data")])


@LINKS.evaluator
def evaluate_links(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = per_gpu(LINKS, facts, profile.expectation("gpu", "nvlink", "active_links"), active_links,
                       "active NVLinks")
    for finding, gpu in _with_gpus(facts, findings):
        states = gpu.nvlink_states
        if finding.status.value == "fail" and not isinstance(states, Unknown):
            down = [str(i) for i, s in enumerate(states) if s != 1]
            finding.message += f" (links down: {', '.join(down) or 'none reported'})"
    return findings


@ERRORS.evaluator
def evaluate_errors(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = per_gpu(ERRORS, facts, profile.expectation("gpu", "nvlink", "errors"), link_errors,
                       "NVLink replay+recovery+CRC errors")
    for finding, gpu in _with_gpus(facts, findings):
        if not isinstance(gpu.nvlink_errors, Unknown) and finding.status.value != "pass":
            finding.observed = dict(gpu.nvlink_errors)
    return findings


@FABRIC.evaluator
def evaluate_fabric(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = per_gpu(FABRIC, facts, profile.expectation("gpu", "fabric"), lambda g: g.fabric_state,
                       "fabric state")
    for finding, gpu in _with_gpus(facts, findings):
        if isinstance(gpu.fabric_status, str) and gpu.fabric_status != "success":
            finding.status = Status.FAIL
            finding.message += f"; fabric status: {gpu.fabric_status}"
    return findings


def _with_gpus(facts: NodeFacts, findings: list[Finding]) -> list[tuple[Finding, GpuFacts]]:
    if isinstance(facts.nvml, Unknown):
        return []
    by_subject = {f"gpu{g.index}": g for g in facts.nvml.gpus}
    return [(f, by_subject[f.subject]) for f in findings if f.subject in by_subject]
