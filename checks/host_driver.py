"""host.driver.version: the loaded NVIDIA kernel module against the profile."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding
from agent.policy.profiles import Profile
from checks import Check, expectation_schema
from checks._gpu import driver_within_branch

DRIVER = Check("host.driver.version", "NVIDIA driver version", source="host", action="upgrade_driver",
               expect_path=("driver", "version"),
               schema=expectation_schema("NVIDIA kernel module version from /proc/driver/nvidia/version; "
                                         "version_min plus an optional one_of pin."),
               evidence="the loaded NVIDIA kernel module, /proc/driver/nvidia/version", parts=("driver",))


@DRIVER.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = DRIVER.expectation(profile)
    if expectation is None:
        return []
    return [driver_within_branch(DRIVER, DRIVER.compare("node", expectation, facts.host.nvidia_driver, "NVIDIA driver"),
                                 facts, expectation)]
