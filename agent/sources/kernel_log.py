"""The kernel log's records parsed into facts before any check runs (issue 32.4, DESIGN's data flow):
Xids, NVSwitch errors (SXid) and the catalogued fault events, each from the same records the kmsg
reader holds. A log that could not be read stays what it was (Unknown/Unsupported) in every field."""

from __future__ import annotations

import dataclasses

from agent.core.facts import NodeFacts
from agent.core.model import Unknown
from agent.sources.fabric import parse_sxids
from agent.sources.kernel_events import parse_kernel_events
from agent.sources.xid import parse_xids


def parse_kernel_log(facts: NodeFacts, *, xids: bool = True) -> NodeFacts:
    """`facts` with `sxids` and `kernel_events` (and `xids`, unless `xids=False`) parsed from its `kmsg`."""
    kmsg = facts.kmsg
    if isinstance(kmsg, Unknown):
        return dataclasses.replace(facts, sxids=kmsg, kernel_events=kmsg, xids=kmsg if xids else facts.xids)
    return dataclasses.replace(facts, sxids=parse_sxids(kmsg), kernel_events=parse_kernel_events(kmsg),
                               xids=parse_xids(kmsg) if xids else facts.xids)
