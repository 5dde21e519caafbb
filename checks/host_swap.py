"""host.swap: swap on a GPU node (a tuning finding: paging stalls pinned-memory jobs and hides OOM)."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding
from agent.policy.profiles import Profile
from checks import Check, expectation_schema

SWAP = Check("host.swap", "Swap", source="host", action="disable_swap", expect_path=("swap", "total_kb"),
             schema=expectation_schema("KiB of active swap (the Size column of /proc/swaps summed); "
                                       "max: 0 asks for swap off."),
             evidence="the Size of every active swap area in /proc/swaps, summed (header only: swap off)",
             parts=("swap",))


@SWAP.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = SWAP.expectation(profile)
    if expectation is None:
        return []
    return [SWAP.compare("node", expectation, facts.host.swap_total_kb, "active swap (KiB)")]
