"""Rates of GPU counters (agent.core.counters, checks/history_counters.py, the ledger's samples)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agent.core.counters import Sample, evaluate_counter_rules, growth, parse_counter_rules, samples_of
from agent.core.facts import NodeFacts
from agent.core.facts_nvml import GpuFacts, NvmlFacts
from agent.core.history import History
from agent.core.model import Severity, Status
from agent.policy.profiles import ProfileStore
from agent.sources.host import absent_host_facts
from agent.state.ledger import open_ledger
from checks.history_counters import counter_rules_of, evaluate_counters

NOW = 1_800_000_000.0
D = 86400.0
SERIAL = "1650124656070"


def _series(counter: str, values: list[int], key: str = SERIAL, step: float = D) -> list[Sample]:
    start = NOW - step * (len(values) - 1)
    return [Sample(start + n * step, key, counter, v) for n, v in enumerate(values)]


def test_growth_over_a_window_and_a_reset_counted_from_zero() -> None:
    assert growth(_series("pcie_replays", [10, 10, 15, 40]), NOW - 2 * D) == growth(
        _series("pcie_replays", [10, 10, 15, 40]), NOW - 2 * D)
    steady = growth(_series("pcie_replays", [10, 10, 15, 40]), NOW - 2 * D)
    assert steady is not None and steady.increase == 30 and steady.resets == 0  # from the sample at the start: 10
    reset = growth(_series("pcie_replays", [100, 120, 3, 7]), NOW - 10 * D)
    assert reset is not None and reset.increase == 20 + 3 + 4 and reset.resets == 1  # never -113
    assert growth(_series("pcie_replays", [5]), NOW - D) is None  # one reading is no rate


def _profile() -> Any:
    return ProfileStore().profile("hgx-h100-sxm")


def _facts(samples: list[Sample], *gpus: GpuFacts) -> NodeFacts:
    nvml = NvmlFacts(driver_version="570.124.06", cuda_driver_version="12.8", nvml_version="12.570.124.06",
                     device_count=len(gpus), gpus=tuple(gpus))
    facts = NodeFacts(host=absent_host_facts("test"), kmsg=(), nvml=nvml)
    facts.history = History((), NOW - 30 * D, NOW, "b1", samples=tuple(samples))
    return facts


GPU0 = GpuFacts(index=0, uuid="GPU-d6ad", serial=SERIAL, pci_bus_id="0000:19:00.0")
SWAPPED = GpuFacts(index=0, uuid="GPU-new", serial="1650124999999", pci_bus_id="0000:19:00.0")


def test_rows_remapped_again_within_a_week_is_a_warning() -> None:
    profile = _profile()
    grew = [*_series("remapped_correctable", [2, 2, 2, 3]), *_series("remapped_uncorrectable", [0, 0, 0, 0])]
    [finding] = evaluate_counters(_facts(grew, GPU0), profile)
    assert finding.status is Status.FAIL and finding.severity is Severity.WARNING
    assert finding.action == "field_diagnostics" and "up 1 in 7d (at most 0)" in finding.message
    flat = [*_series("remapped_correctable", [2, 2, 2, 2]), *_series("remapped_uncorrectable", [0, 0, 0, 0])]
    [finding] = evaluate_counters(_facts(flat, GPU0), profile)
    assert finding.status is Status.PASS
    old = [*_series("remapped_correctable", [1, 2, 2, 2, 2, 2, 2, 2, 2, 2]),
           *_series("remapped_uncorrectable", [0] * 10)]
    [finding] = evaluate_counters(_facts(old, GPU0), profile)
    assert finding.status is Status.PASS  # grew 9 days ago: outside the week


def test_a_reset_is_not_negative_growth_and_a_swap_starts_a_new_series() -> None:
    profile = _profile()
    reset = [*_series("remapped_correctable", [5, 5, 0, 0]), *_series("remapped_uncorrectable", [1, 1, 0, 0])]
    [finding] = evaluate_counters(_facts(reset, GPU0), profile)
    assert finding.status is Status.PASS
    old_board = [*_series("remapped_correctable", [2, 3, 4, 5]), *_series("remapped_uncorrectable", [0, 0, 0, 0])]
    [finding] = evaluate_counters(_facts(old_board, SWAPPED), profile)
    assert finding.status is Status.SKIP and "no rate yet" in finding.message  # the old board's growth is not its


def test_one_sample_is_no_rate_and_no_ledger_is_no_finding() -> None:
    profile = _profile()
    one = [Sample(NOW, SERIAL, "remapped_correctable", 9), Sample(NOW, SERIAL, "remapped_uncorrectable", 0)]
    [finding] = evaluate_counters(_facts(one, GPU0), profile)
    assert finding.status is Status.SKIP
    facts = _facts(one, GPU0)
    facts.history = None
    assert evaluate_counters(facts, profile) == []
    assert [r.name for r in counter_rules_of(profile)] == ["remapped_rows_growth"]


def test_samples_are_what_nvml_read_of_a_named_board() -> None:
    gpu = GpuFacts(index=0, uuid="GPU-a", serial=SERIAL, remapped_correctable=3, pcie_replays=10,
                   nvlink_errors={"recovery": 2, "replay": 0, "crc_flit": 7})
    names = {s.counter: s.value for s in samples_of([gpu], NOW, "b1")}
    assert names == {"remapped_correctable": 3, "pcie_replays": 10, "nvlink_recovery": 2, "nvlink_replay": 0,
                     "nvlink_crc_flit": 7}
    assert samples_of([GpuFacts(index=1, remapped_correctable=3)], NOW) == []  # no serial, no UUID
    assert samples_of([GpuFacts(index=1, serial="S", lost="fallen off the bus", remapped_correctable=3)], NOW) == []
    assert samples_of([GpuFacts(index=1, serial="S", pcie_replays=-1)], NOW) == []


def test_the_ledger_keeps_the_last_sample_of_each_day(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    with open_ledger(folder) as ledger:
        day = NOW - NOW % D
        ledger.record_samples([Sample(day + 3600, SERIAL, "pcie_replays", 5),
                               Sample(day + 7200, SERIAL, "pcie_replays", 9),
                               Sample(day + 1800, SERIAL, "pcie_replays", 1),  # older than kept: ignored
                               Sample(day - 3600, SERIAL, "pcie_replays", 2)])
        got = ledger.samples(day - 5 * D)
    assert [(s.ts - day, s.value) for s in got] == [(-3600.0, 2), (7200.0, 9)]
    with sqlite3.connect(folder / "ledger.db") as conn:
        conn.execute("INSERT INTO counters VALUES (?, ?, ?, ?, ?, ?)", (SERIAL, "nope", "x", NOW, 1, ""))
        conn.execute("INSERT INTO counters VALUES (?, ?, ?, ?, ?, ?)", (SERIAL, "pcie_replays", "y", NOW, b"9", ""))
        conn.execute("INSERT INTO counters VALUES (?, ?, ?, ?, ?, ?)", (SERIAL, "retired_sbe", "z", NOW, -4, ""))
    with open_ledger(folder, readonly=True) as ledger:
        assert len(ledger.samples(day - 5 * D)) == 2  # hostile rows skipped


@pytest.mark.parametrize("body", [{"counter": "nope", "window": "7d", "max_increase": 0, "severity": "warning",
                                   "reason": "r"}])
def test_unknown_counters_are_dropped_by_the_parser(body: dict[str, Any]) -> None:
    [rule] = parse_counter_rules({"x": body, "gone": None})
    assert rule.counters == ()
    firings, judged = evaluate_counter_rules([rule], _series("pcie_replays", [1, 2]), NOW)
    assert firings == [] and judged == {}
