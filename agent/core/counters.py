"""Rates, not totals, for a GPU's monotonic counters (issue 33.3).

A total (remapped rows 12, PCIe replays 40,000) says little; how fast it grows says whether the board
is failing now. The ledger keeps one sample per counter, GPU and day (the day's last reading);
`growth` turns a series of them into the increase over a window. A counter that goes down was reset
(a driver reload, a GPU reset, an InfoROM cleared): that is a new start, counted from zero as
Prometheus' `increase()` does, never negative growth, and said (`resets`). Samples are keyed by the
board's serial (else UUID), so a board swapped into the slot starts a series of its own.

Pure: samples in, growth out. Standard library only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from agent.core.facts_nvml import GpuFacts
from agent.core.windows import window_seconds


def _nvlink(name: str) -> Callable[[GpuFacts], object]:
    def read(gpu: GpuFacts) -> object:
        errors = gpu.nvlink_errors
        return errors.get(name) if isinstance(errors, dict) else None

    return read


# What each counter is read from. Volatile ECC counts are left out on purpose: they reset at every
# driver load, and the aggregate (lifetime, InfoROM) ones say the same over time.
COUNTERS: dict[str, Callable[[GpuFacts], object]] = {
    "ecc_sbe_aggregate": lambda g: g.ecc_aggregate_corrected,
    "ecc_dbe_aggregate": lambda g: g.ecc_aggregate_uncorrected,
    "remapped_correctable": lambda g: g.remapped_correctable,
    "remapped_uncorrectable": lambda g: g.remapped_uncorrectable,
    "retired_sbe": lambda g: g.retired_sbe,
    "retired_dbe": lambda g: g.retired_dbe,
    "pcie_replays": lambda g: g.pcie_replays,
    "nvlink_recovery": _nvlink("recovery"),
    "nvlink_replay": _nvlink("replay"),
    "nvlink_crc_flit": _nvlink("crc_flit"),
}
MAX_VALUE = 1 << 62  # larger is no counter reading


class Sample(NamedTuple):
    ts: float  # Unix seconds of the reading
    key: str  # the board: serial, else UUID
    counter: str  # one of COUNTERS
    value: int
    boot_id: str = ""


def samples_of(gpus: Iterable[GpuFacts], ts: float, boot_id: str = "") -> list[Sample]:
    """Every counter NVML read on a GPU that can be named (never a value that is not a count)."""
    out = []
    for gpu in gpus:
        key = gpu.serial if isinstance(gpu.serial, str) and gpu.serial else (
            gpu.uuid if isinstance(gpu.uuid, str) and gpu.uuid else "")
        if not key or gpu.lost is not None:
            continue
        for name, read in COUNTERS.items():
            value = read(gpu)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_VALUE:
                out.append(Sample(ts, key, name, value, boot_id))
    return out


class Growth(NamedTuple):
    increase: int  # over the window, resets counted from zero
    first: Sample  # the sample the window starts from
    last: Sample
    resets: int  # times the counter went down within the window


def growth(samples: Iterable[Sample], since: float) -> Growth | None:
    """The increase of one counter of one board from its last sample at or before `since` (else its
    first after) to its newest; None with fewer than two samples (no rate from one reading)."""
    ordered = sorted(samples, key=lambda s: s.ts)
    before = [s for s in ordered if s.ts <= since]
    series = ([before[-1]] if before else []) + [s for s in ordered if s.ts > since]
    if len(series) < 2:
        return None
    increase = resets = 0
    for previous, current in itertools.pairwise(series):
        if current.value >= previous.value:
            increase += current.value - previous.value
        else:  # reset: the new count started from zero
            resets += 1
            increase += current.value
    return Growth(increase, series[0], series[-1], resets)


class CounterRule(NamedTuple):
    name: str
    counters: tuple[str, ...]  # summed (remapped rows: correctable + uncorrectable)
    window: str
    window_s: float
    max_increase: int  # fires above this
    severity: str
    action: str
    reason: str


def parse_counter_rules(section: Mapping[str, Any]) -> list[CounterRule]:
    """The profile's `expect.counters` (schema-checked already; null entries are removed rules)."""
    rules = []
    for name, body in sorted(section.items()):
        if not isinstance(body, Mapping):
            continue
        counters = tuple(str(c) for c in (body.get("counters") or [body.get("counter")]) if c in COUNTERS)
        rules.append(CounterRule(str(name), counters, str(body["window"]), window_seconds(str(body["window"])),
                                 int(body["max_increase"]), str(body["severity"]),
                                 str(body.get("action") or "review"), str(body["reason"])))
    return rules


class CounterFiring(NamedTuple):
    rule: CounterRule
    key: str
    increase: int
    since: float  # the first sample's time
    until: float
    resets: int


def evaluate_counter_rules(rules: Iterable[CounterRule], samples: Iterable[Sample], until: float
                           ) -> tuple[list[CounterFiring], dict[str, set[str]]]:
    """Each rule's firings at `until`, and per board the rules it could be judged by (two samples or
    more of every counter the rule sums): a board with one reading has no rate yet."""
    by_series: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if sample.ts <= until:
            by_series.setdefault((sample.key, sample.counter), []).append(sample)
    keys = sorted({k for k, _ in by_series})
    firings: list[CounterFiring] = []
    judged: dict[str, set[str]] = {}
    for rule in rules:
        since = until - rule.window_s
        for key in keys:
            parts = [growth(by_series.get((key, c), ()), since) for c in rule.counters]
            known = [p for p in parts if p is not None]
            if not known or len(known) < len(rule.counters):
                continue
            judged.setdefault(key, set()).add(rule.name)
            increase = sum(p.increase for p in known)
            if increase > rule.max_increase:
                firings.append(CounterFiring(rule, key, increase, min(p.first.ts for p in known),
                                             max(p.last.ts for p in known), sum(p.resets for p in known)))
    return firings, judged
