"""Helpers shared by the BMC checks."""

from __future__ import annotations

from agent.expect import Expectation
from agent.facts import BmcFacts, NodeFacts
from agent.model import Finding, Unknown, Unsupported
from checks import Check

PRESENT_STATES_SKIPPED = ("Absent", "StandbySpare", "StandbyOffline", "Standby", "Disabled")


def bmc_facts(check: Check, facts: NodeFacts, expectation: Expectation | None,
              part: str | None = None) -> tuple[BmcFacts | None, list[Finding]]:
    """The BMC's facts, or the one finding that says why there are none.

    No BMC configured: nothing (source.available says so). BMC down: one
    `unknown`. A part the BMC does not expose: `skip` with the reason.
    """
    bmc = facts.bmc
    if isinstance(bmc, Unsupported):
        return None, []
    if isinstance(bmc, Unknown):
        return None, [with_source(check.unknown("bmc", expectation, f"BMC unavailable: {bmc.reason}"), facts)]
    if part is not None:
        value = getattr(bmc, part)
        if isinstance(value, Unknown):
            return None, [with_source(check.missing("bmc", expectation, value, part.replace("_", " ")), facts)]
    return bmc, []


def with_source(finding: Finding, facts: NodeFacts) -> Finding:
    """BMC findings name the protocol the data came from."""
    bmc = facts.bmc
    finding.source = bmc.protocol if isinstance(bmc, BmcFacts) else "redfish"
    return finding
