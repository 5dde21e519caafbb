"""host.thp.*: transparent hugepages (sysfs, not a sysctl)."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding
from agent.policy.profiles import Profile
from checks import Check, expectation_schema

THP_ENABLED = Check("host.thp.enabled", "Transparent hugepages mode", source="host", remediation="thp",
                    expect_path=("thp", "enabled"), schema=expectation_schema(),
                    evidence="the bracketed choice in /sys/kernel/mm/transparent_hugepage/enabled", parts=("thp",))
THP_DEFRAG = Check("host.thp.defrag", "Transparent hugepages defrag", source="host", remediation="thp",
                   expect_path=("thp", "defrag"), schema=expectation_schema(),
                   evidence="the bracketed choice in /sys/kernel/mm/transparent_hugepage/defrag", parts=("thp",))


@THP_ENABLED.evaluator
def evaluate_enabled(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = THP_ENABLED.expectation(profile)
    if expectation is None:
        return []
    return [THP_ENABLED.compare("node", expectation, facts.host.thp_enabled,
                                "transparent_hugepage/enabled")]


@THP_DEFRAG.evaluator
def evaluate_defrag(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = THP_DEFRAG.expectation(profile)
    if expectation is None:
        return []
    return [THP_DEFRAG.compare("node", expectation, facts.host.thp_defrag, "transparent_hugepage/defrag")]
