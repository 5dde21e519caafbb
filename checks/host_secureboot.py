"""host.secureboot: UEFI Secure Boot state against the site's policy."""

from __future__ import annotations

from agent.facts import NodeFacts
from agent.model import Finding
from agent.profiles import Profile
from checks import Check

SECUREBOOT = Check("host.secureboot", "UEFI Secure Boot", source="host")


@SECUREBOOT.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("secure_boot")
    if expectation is None:
        return []
    return [SECUREBOOT.compare("node", expectation, facts.host.secure_boot, "Secure Boot")]
