"""Every source nodewarden reads, in reading order: the one list engine, daemon, capture and importers use.

Adding a source: implement `agent.sources.source.Source` in its own module and add it here; the
audit reads it through `read`, `snapshot capture` records it through `record`, the daemon polls it
per `polls` (config keys `daemon.intervals.<poll>` / `daemon.timeouts.<poll>`, generated docs) and
reports its statuses (`nodewarden_source_up{source=...}`).
"""

from __future__ import annotations

from agent.policy.polls import Poll
from agent.sources.bmc_source import BmcSource
from agent.sources.local_sources import HostSource, KmsgSource, NvmlSource
from agent.sources.source import Source

HOST = HostSource()
KMSG = KmsgSource()
NVML = NvmlSource()
BMC = BmcSource()
# Reading and recording order: the host first (it names the hardware), the BMC last (slowest).
SOURCES: tuple[Source, ...] = (HOST, KMSG, NVML, BMC)


def source(name: str) -> Source:
    """The source called `name` (KeyError for another name)."""
    for candidate in SOURCES:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def polls() -> tuple[Poll, ...]:
    """Every daemon poll of every source, in order."""
    return tuple(poll for src in SOURCES for poll in src.polls)


def status_names() -> tuple[str, ...]:
    """Every status name a source reports (`host`, `kmsg`, `nvml`, `redfish`, `ipmi`)."""
    return tuple(name for src in SOURCES for name in src.statuses)
