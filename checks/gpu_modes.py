"""GPU operating modes: persistence, compute mode, MIG."""

from __future__ import annotations

from agent.facts import NodeFacts
from agent.model import Finding, Status
from agent.profiles import Profile
from checks import Check
from checks._gpu import nvml_gpus, per_gpu, subject

PERSISTENCE = Check("gpu.persistence_mode", "Persistence mode", source="nvml", remediation="gpu_persistence",
                    evidence="NVML persistence mode against the profile")
COMPUTE = Check("gpu.compute_mode", "Compute mode", source="nvml", remediation="gpu_compute_mode",
                evidence="NVML compute mode against the profile")
MIG = Check("gpu.mig_mode", "MIG mode", source="nvml", action="reset_gpu",
            evidence="NVML current and pending MIG mode against the profile")


@PERSISTENCE.evaluator
def evaluate_persistence(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(PERSISTENCE, facts, profile.expectation("gpu", "persistence_mode"),
                   lambda g: g.persistence_mode, "persistence mode")


@COMPUTE.evaluator
def evaluate_compute(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(COMPUTE, facts, profile.expectation("gpu", "compute_mode"), lambda g: g.compute_mode,
                   "compute mode")


@MIG.evaluator
def evaluate_mig(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "mig_mode")
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(MIG, facts, expectation)
    for gpu in gpus:
        finding = MIG.compare(subject(gpu), expectation, gpu.mig_mode, f"{gpu.label} MIG mode")
        pending = gpu.mig_pending
        if isinstance(pending, str) and pending != gpu.mig_mode:
            finding.status = Status.WARN if finding.status is not Status.FAIL else finding.status
            finding.message += f"; {pending} is pending until the GPU is reset"
            finding.action = "reset_gpu"
        findings.append(finding)
    return findings
