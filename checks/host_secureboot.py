"""host.secureboot: UEFI Secure Boot state against the site's policy."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding
from agent.policy.profiles import Profile
from checks import Check, expectation_schema

SECUREBOOT = Check("host.secureboot", "UEFI Secure Boot", source="host", expect_path=("secure_boot",),
                   schema=expectation_schema("enabled | disabled | unsupported"),
                   evidence="the SecureBoot variable in efivarfs (unsupported: legacy boot)", parts=("secure_boot",))


@SECUREBOOT.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = SECUREBOOT.expectation(profile)
    if expectation is None:
        return []
    return [SECUREBOOT.compare("node", expectation, facts.host.secure_boot, "Secure Boot")]
