"""gpu.recovery_action: what the driver itself says the GPU needs (R550+)."""

from __future__ import annotations

from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import per_gpu

RECOVERY = Check("gpu.recovery_action", "Driver-requested recovery action", source="nvml",
                 evidence="the driver's own recovery action (R550+); unsupported is skip")

# NVML_GPU_RECOVERY_ACTION_*: what the driver asks the operator to do.
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
                    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
_OPERATOR_ACTION = {"gpu_reset": "reset_gpu", "node_reboot": "reboot", "drain_p2p": "drain",
                    "drain_and_reset": "drain", "recover_imex_domain": "restart_imex", "bus_reset": "reset_gpu",
                    "system_reboot": "reboot"}


def action_name(gpu: GpuFacts) -> object:
    value = gpu.recovery_action
    if isinstance(value, Unknown):
        return value
    return RECOVERY_ACTIONS.get(int(value), f"action {value}")


@RECOVERY.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = per_gpu(RECOVERY, facts, profile.expectation("gpu", "recovery_action"), action_name,
                       "recovery action")
    for finding in findings:
        if finding.status.value in ("fail", "warn") and isinstance(finding.observed, str):
            finding.action = _OPERATOR_ACTION.get(finding.observed, "contact_support")
    return findings
