"""GPU PCIe link width and replay rate.

A lower link *generation* on an idle GPU is normal power saving (the link
trains up under load) and is not flagged; a narrower *width* is a fault.
Replay counters are judged as a rate, since healthy GPUs show a few replays.
"""

from __future__ import annotations

from agent.core.expect import AtLeast, saturated
from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Unknown, Unsupported
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import PCIE_REPLAY_BITS, per_gpu

LINK = Check("gpu.pcie.link", "GPU PCIe link width", source="nvml", action="reseat_or_contact_support",
             evidence=("NVML current vs max PCIe width (a lower generation on an idle GPU is power saving, not "
                       "evidence)"))
REPLAY = Check("gpu.pcie.replay", "GPU PCIe replay rate", source="nvml", action="contact_support",
               evidence="NVML PCIe replay counter as a rate over the observation, not a raw count")


@LINK.evaluator
def evaluate_link(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(LINK, facts, profile.expectation("gpu", "pcie", "width"), lambda g: g.pcie_width,
                   "PCIe link width")


@REPLAY.evaluator
def evaluate_replay(facts: NodeFacts, profile: Profile) -> list[Finding]:
    uptime = facts.host.uptime_s

    def per_hour(gpu: GpuFacts) -> object:
        if isinstance(gpu.pcie_replays, Unknown):
            return gpu.pcie_replays
        if isinstance(uptime, Unknown):
            kind = Unsupported if isinstance(uptime, Unsupported) else Unknown
            return kind(f"{gpu.pcie_replays} replays, but no uptime to turn them into a rate ({uptime.reason})")
        replays = saturated(gpu.pcie_replays, PCIE_REPLAY_BITS, "the replay counter")
        count = replays.value if isinstance(replays, AtLeast) else replays
        rate = round(count / max(uptime / 3600.0, 1.0), 2)
        return AtLeast(rate, replays.why) if isinstance(replays, AtLeast) else rate  # a saturated count: a floor

    return per_gpu(REPLAY, facts, profile.expectation("gpu", "pcie", "replay_rate"), per_hour,
                   "PCIe replays per hour since boot")
