"""NVLink links and errors, and NVSwitch fabric registration (Hopper and later).

On a partial view of the profile's board (issue 13 rule 11, `checks._gpu.partial_view`: one SXM GPU
in a VM, a one-GPU dump) the board's NVLinks and fabric registration are not in view: a GPU with
no active link, or a fabric state short of `completed`, is `skip` with the reason. What the GPU
itself reports stays a finding: some links up and another down, or a failed registration status.
"""

from __future__ import annotations

from agent.core.expect import counter_total, saturated
from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import NVLINK_BITS, not_judged_on_partial_view, nvml_gpus, partial_view, per_gpu, subject

LINKS = Check("gpu.nvlink.links", "Active NVLinks", source="nvml", action="reset_gpu",
              evidence=("NVML NVLink link states per GPU against the board's count; a GPU with no active link on a "
                        "partial view is skip"))
ERRORS = Check("gpu.nvlink.errors", "NVLink error counters", source="nvml", action="contact_support",
               evidence="NVML NVLink error counters (replay, recovery, CRC) per link against the profile's limits")
FABRIC = Check("gpu.fabric", "NVLink fabric registration", source="nvml", action="check_fabric_manager",
               evidence=("NVML GPU fabric registration state and status (Hopper and later); a state short of "
                         "completed on a partial view is skip"))


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


def _against_own_links(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """Without a board count in the profile (the generic one): each GPU judged by its own recorded links.

    Some links active and another not is a link that failed on that GPU; no link active on a GPU of a
    node with several is a GPU cut off its NVLink fabric (not on a partial view, where that is the
    layout). A GPU whose link states are not recorded (an `nvidia-smi -q` dump has none) says nothing.
    """
    gpus, findings = nvml_gpus(LINKS, facts, None)
    if findings:
        return []
    partial = partial_view(profile, facts)
    recorded = [g for g in gpus if isinstance(g.nvlink_states, tuple) and g.nvlink_states]
    out: list[Finding] = []
    for gpu in recorded:
        states = gpu.nvlink_states
        assert isinstance(states, tuple)
        active = sum(1 for s in states if s == 1)
        down = [str(i) for i, s in enumerate(states) if s != 1]
        what = f"{gpu.label} active NVLinks is {active} of {len(states)} reported"
        if _link_down_in_view(states):
            out.append(LINKS.finding(subject(gpu), Status.FAIL, Severity.CRITICAL,
                                     f"{what} (links down: {', '.join(down)}; no board count in profile "
                                     f"{profile.name}: judged against the GPU's own links)",
                                     observed=active, expected=len(states)))
        elif active == 0 and len(gpus) > 1 and partial is None:
            out.append(LINKS.finding(subject(gpu), Status.FAIL, Severity.CRITICAL,
                                     f"{what}: no NVLink of this GPU is active while the node has {len(gpus)} "
                                     "GPUs (cut off the NVLink fabric)", observed=0, expected=len(states)))
        else:
            out.append(LINKS.finding(subject(gpu), Status.PASS, Severity.CRITICAL, what, observed=active))
    return out


@LINKS.evaluator
def evaluate_links(facts: NodeFacts, profile: Profile) -> list[Finding]:
    if profile.expectation("gpu", "nvlink", "active_links") is None:
        return _against_own_links(facts, profile)
    findings = per_gpu(LINKS, facts, profile.expectation("gpu", "nvlink", "active_links"), active_links,
                       "active NVLinks")
    partial = partial_view(profile, facts)
    out = []
    for finding in findings:
        gpu = _gpu_of(facts, finding)
        states = gpu.nvlink_states if gpu is not None else None
        if finding.status.value == "fail" and isinstance(states, tuple):
            down = [str(i) for i, s in enumerate(states) if s != 1]
            finding.message += f" (links down: {', '.join(down) or 'none reported'})"
        if partial is not None and gpu is not None and isinstance(states, tuple) and \
                finding.status in (Status.FAIL, Status.WARN) and not _link_down_in_view(states):
            # No link of this GPU trained: its NVLinks are not in this view (a one-GPU partition, a VM),
            # which is the board's layout, not this GPU's fault.
            active = sum(1 for s in states if s == 1)
            out.append(not_judged_on_partial_view(
                LINKS, finding, partial, f"{gpu.label} has {active} active NVLink(s) of {len(states)} reported"))
            continue
        out.append(finding)
    return out


def _link_down_in_view(states: tuple[int, ...]) -> bool:
    """Positive evidence, on the GPU itself, of a down link: some of its NVLinks trained and another did not.

    On a partial view a GPU with no active link is not wired to the fabric in this view; one with links up
    and one down is in a partition whose link failed, a finding on that GPU whatever the view.
    """
    return any(s == 1 for s in states) and any(s != 1 for s in states)


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
    partial = partial_view(profile, facts)
    out = []
    for finding in findings:
        gpu = _gpu_of(facts, finding)
        if gpu is None:
            out.append(finding)
            continue
        failed = isinstance(gpu.fabric_status, str) and gpu.fabric_status != "success"
        if failed:
            finding.status = Status.FAIL
            finding.message += f"; fabric status: {gpu.fabric_status}"
        if partial is not None and not failed and isinstance(gpu.fabric_state, str) and \
                finding.status in (Status.FAIL, Status.WARN):
            # Registration is Fabric Manager's work, and on a partial view that runs outside it (the
            # hypervisor's, or none for a one-GPU partition). A GPU that says its registration failed
            # (a status other than success) is still a finding on that GPU.
            out.append(not_judged_on_partial_view(FABRIC, finding, partial,
                                                  f"{gpu.label} fabric state is {gpu.fabric_state}"))
            continue
        out.append(finding)
    return out


def _gpu_of(facts: NodeFacts, finding: Finding) -> GpuFacts | None:
    if isinstance(facts.nvml, Unknown):
        return None
    return next((g for g in facts.nvml.gpus if f"gpu{g.index}" == finding.subject), None)


def _with_gpus(facts: NodeFacts, findings: list[Finding]) -> list[tuple[Finding, GpuFacts]]:
    if isinstance(facts.nvml, Unknown):
        return []
    by_subject = {f"gpu{g.index}": g for g in facts.nvml.gpus}
    return [(f, by_subject[f.subject]) for f in findings if f.subject in by_subject]
