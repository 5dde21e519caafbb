"""The daemon's polls, with their default interval and timeout: policy (the config's `daemon.intervals`
and `daemon.timeouts` are keyed by them), so it lives below the sources that are polled. Each `Source`
names its polls from here (`agent.sources.local_sources`, `agent.sources.bmc_source`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Poll:
    """One daemon poller of a source; `name` is its key in the config's `daemon.intervals`/`timeouts`."""

    name: str
    interval_s: float
    timeout_s: float
    what: str  # for the config reference
    sensors_only: bool = False  # the BMC's frequent poll walks the chassis only


HOST = Poll("host", 60.0, 20.0, "host files (sysctls, sysfs, procfs)")
NVML = Poll("nvml", 15.0, 10.0, "the GPUs over NVML")
# The BMC is walked from the chassis for sensors, and whole (firmware, BIOS, logs) rarely: BMCs are small and slow.
BMC_INVENTORY = Poll("bmc_inventory", 3600.0, 120.0, "the BMC's whole tree (firmware, BIOS, logs)")
BMC_SENSORS = Poll("bmc_sensors", 120.0, 60.0, "the BMC's sensors (walked from /Chassis)", sensors_only=True)
POLLS = (HOST, NVML, BMC_INVENTORY, BMC_SENSORS)  # in the order of the sources (agent.sources.registry)


def polls() -> tuple[Poll, ...]:
    """Every daemon poll of every source, in order."""
    return POLLS
