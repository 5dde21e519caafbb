"""host.sysctl: kernel tunables under /proc/sys, one finding per profile key."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check, keyed_schema

SYSCTL = Check("host.sysctl", "Kernel sysctl values", source="host", remediation="sysctl",
               expect_path=("sysctl",), evidence="/proc/sys values against expect.sysctl, one finding per key",
               schema=keyed_schema("Sysctl key (dotted, as sysctl(8) prints it) -> expectation. "
                                   "THP is NOT a sysctl: use thp.", r"^[a-z0-9_]+(\.[A-Za-z0-9_:@/-]+)+$"),
               parts=("sysctl",))


@SYSCTL.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = []
    for key, expectation in sorted(profile.expectations_under("sysctl").items()):
        observed = facts.host.sysctl.get(key, Unknown(f"sysctl {key} was not read"))
        findings.append(SYSCTL.compare(key, expectation, observed, f"sysctl {key}"))
    return findings
