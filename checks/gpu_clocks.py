"""gpu.app_clocks: application clocks left away from the board's defaults.

A benchmark or a tuning script that pinned application clocks (`nvidia-smi -ac`)
caps every later job's clocks until someone resets them; nothing else shows it.
"""

from __future__ import annotations

from typing import Any

from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import per_gpu

APP_CLOCKS = Check("gpu.app_clocks", "Application clocks", source="nvml", remediation="gpu_app_clocks",
                   evidence="NVML application clocks vs the board's default application clocks")


def describe_app_clocks(gpu: GpuFacts) -> Any:
    """"default" when the application clocks are the board's defaults, else the pair in MHz."""
    current, default = gpu.app_clocks_mhz, gpu.default_app_clocks_mhz
    if isinstance(current, Unknown):
        return current
    if isinstance(default, Unknown):
        return Unknown(f"default application clocks: {default.reason}")
    if tuple(current) == tuple(default):
        return "default"
    return (f"graphics {current[0]} MHz, memory {current[1]} MHz "
            f"(default {default[0]}/{default[1]} MHz)")


@APP_CLOCKS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(APP_CLOCKS, facts, profile.expectation("gpu", "applications_clocks"), describe_app_clocks,
                   "application clocks")
