"""profile.match: which profile judged this node, and why.

Unknown hardware never passes silently: falling back to the generic profile
is a warning that names the hardware that matched nothing.
"""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.matching import board_fit
from agent.policy.profiles import Profile
from checks import Check

PROFILE_MATCH = Check("profile.match", "Profile selection", source="host",
                      evidence=("the DMI/BMC/PCI facts that selected the profile; a fallback to the generic profile "
                                "warns"), parts=("pci", "dmi", "nvml"))


@PROFILE_MATCH.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    match = facts.profile_match
    if match is None:
        return []
    findings = _selection(facts, profile)
    conflicts = match.id_conflicts
    if conflicts:  # the GPU's own word beat a stale or placeholder PCI id (issue 31.6): said as a state
        findings.append(PROFILE_MATCH.finding(
            "gpu identity", Status.WARN, Severity.WARNING, "; ".join(conflicts[:2]),
            observed=list(conflicts), expected="the PCI id and the GPU's own report name one model",
            reason="A PCI id that contradicts the GPU's name and architecture is a placeholder (a mock, an "
                   "engineering sample) or a misread: the profile follows what the GPU reports"))
    return findings


def _selection(facts: NodeFacts, profile: Profile) -> list[Finding]:
    match = facts.profile_match
    assert match is not None
    if match.how == "no_gpu":
        return [PROFILE_MATCH.finding(
            "node", Status.SKIP, Severity.INFO,
            "no NVIDIA GPU: GPU checks do not apply (none on PCI, no NVIDIA driver); "
            f"profile {match.profile} judges only what applies",
            observed=match.identity, expected="an NVIDIA GPU node",
        )]
    if match.how == "fallback":
        why = f"; {match.problems[0]}" if match.problems else ""
        return [PROFILE_MATCH.finding(
            "node", Status.WARN, Severity.WARNING,
            f"no profile matches {match.identity}{why}; judged by the generic profile {match.profile}",
            observed=match.identity, expected="a model profile",
            reason="Model-specific expectations (GPU count, fabric, firmware) "
                   "are not checked on unknown hardware",
            action="add_profile",
        )]
    fit = board_fit(profile, facts)
    partial = "" if fit.full else f"; judged as {fit.why}, so the board's GPU and NVSwitch counts are not judged"
    if match.how == "forced" and match.misfit:
        return [PROFILE_MATCH.finding(
            "node", Status.WARN, Severity.WARNING,
            f"profile {match.profile} chosen for hardware it does not match ({match.misfit}){partial}",
            observed=match.identity, expected=f"hardware profile {match.profile} matches",
            reason="A profile's expectations (firmware, clocks, fabric) are for the hardware its match rule "
                   "names; on other hardware its findings mislead")]
    if match.how == "forced":
        return [PROFILE_MATCH.finding("node", Status.PASS, Severity.INFO,
                                      f"profile {match.profile} chosen with --profile for {match.identity}{partial}",
                                      observed=match.profile, expected=match.profile)]
    message = f"profile {match.profile} matches {match.identity} on {', '.join(match.matched_on)}{partial}"
    if match.also_matched:
        message += f" (equally specific: {', '.join(match.also_matched)}; first by name wins)"
        return [PROFILE_MATCH.finding("node", Status.WARN, Severity.WARNING, message,
                                      observed=match.profile, expected="exactly one matching profile",
                                      reason="Two profiles with equally specific match rules overlap")]
    return [PROFILE_MATCH.finding("node", Status.PASS, Severity.INFO, message,
                                  observed=match.profile, expected=match.profile)]
