"""GPU operating modes: persistence, compute mode, MIG.

MIG is configuration (issue 22 item 3): base records it at `info`, naming the node's layout (which GPUs
are partitioned); only a profile that pins it (`equals`) judges it.
"""

from __future__ import annotations

from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Status
from agent.policy.profiles import Profile
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
    layout = _layout(gpus)
    for gpu in gpus:
        finding = MIG.compare(subject(gpu), expectation, gpu.mig_mode, f"{gpu.label} MIG mode")
        if layout and finding.status is Status.PASS:
            finding.message += f" (MIG layout: {layout})"
        pending = gpu.mig_pending
        if isinstance(pending, str) and pending != gpu.mig_mode:
            finding.status = Status.WARN if finding.status is not Status.FAIL else finding.status
            finding.message += f"; {pending} is pending until the GPU is reset"
            finding.action = "reset_gpu"
        findings.append(finding)
    return findings


def _layout(gpus: list[GpuFacts]) -> str:
    """"enabled on GPU 0, 1; disabled on GPU 2": the node's MIG layout in one line ("" when no GPU reports it)."""
    modes: dict[str, list[str]] = {}
    for gpu in gpus:
        if isinstance(gpu.mig_mode, str):
            modes.setdefault(gpu.mig_mode, []).append(str(gpu.index))
    return "; ".join(f"{mode} on GPU {', '.join(indexes)}" for mode, indexes in sorted(modes.items()))
