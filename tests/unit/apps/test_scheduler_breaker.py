"""The breaker, ownership and sinfo --json parsing as pure pieces (issue 30.1, 30.2, 30.4), without Slurm.

The real-Slurm tests (tests/integration/test_scheduler_slurm.py) show the gate holding on a live slurmctld; here
the breaker's two-step protocol runs through thousands of random interleavings against a model of
slurmctld (updates applied one at a time, each stamped with the controller's second).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from agent.apps.scheduler import breaker
from agent.apps.scheduler.ownership import Mark, proven
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm_cli import NodeState, SlurmError, parse_view

SETTINGS = HealthSettings(state_dir=Path("/nonexistent"), breaker_percent=25, breaker_min_nodes=1)
REASON = "nodewarden: gpu.lost gpu7: GPU 7 has fallen off the bus"


def idle(name: str, partitions: tuple[str, ...] | None = ("p",)) -> NodeState:
    return NodeState(name, frozenset({"IDLE"}), "", partitions)


def drained(name: str, at: int, partitions: tuple[str, ...] | None = ("p",), reason: str = REASON) -> NodeState:
    return NodeState(name, frozenset({"IDLE", "DRAIN"}), reason, partitions, "root", at)


def simulate(seed: int, nodes: int, partitions: dict[str, tuple[str, ...]] | None = None) -> dict[str, NodeState]:
    """Every node runs the gate's drain at once: view, before(), drain, wait out the stamped second,
    view, after(), maybe undo. Each step is atomic at slurmctld; the order and the clock are random."""
    rng = random.Random(seed)  # noqa: S311 - a seeded, repeatable schedule, no secret
    names = [f"n{i:02d}" for i in range(nodes)]
    cluster = {n: idle(n, (partitions or {}).get(n, ("p",))) for n in names}
    clock = 1000.0 + rng.random()
    phase = dict.fromkeys(names, 0)
    stamp: dict[str, int] = {}
    while any(p < 3 for p in phase.values()):
        ready = [n for n in names if phase[n] < 3 and not (phase[n] == 2 and clock < stamp[n] + 1 + breaker.SETTLE_S)]
        if not ready:
            clock += rng.random() * 0.5
            continue
        node = rng.choice(ready)
        if phase[node] == 0:  # the view before, then the drain in one later step
            if breaker.before(cluster, cluster[node], SETTINGS):
                phase[node] = 3
            else:
                phase[node] = 1
        elif phase[node] == 1:
            stamp[node] = int(clock)
            cluster[node] = replace(cluster[node], flags=frozenset({"IDLE", "DRAIN"}), reason=REASON,
                                    reason_user="root", reason_time=stamp[node])
            phase[node] = 2
        else:
            if breaker.after(cluster, cluster[node], SETTINGS):
                cluster[node] = idle(node, cluster[node].partitions)
            phase[node] = 3
        clock += rng.random() * 0.4
    return cluster


@pytest.mark.parametrize("nodes", [3, 5, 6, 20, 40])
def test_exactly_the_limit_stays_drained_however_checks_interleave(nodes: int) -> None:
    cap = breaker.limit(nodes, SETTINGS)
    for seed in range(300):
        final = simulate(seed, nodes)
        assert sum(s.drained for s in final.values()) == min(cap, nodes), seed


def test_no_partition_ever_holds_more_than_its_limit_when_nodes_share_partitions() -> None:
    names = [f"n{i:02d}" for i in range(24)]
    layout: dict[str, tuple[str, ...]] = {n: ("a",) if i < 8 else ("a", "b") if i < 16 else ("b",) for i, n in enumerate(names)}
    for seed in range(300):
        final = simulate(seed, 24, layout)
        for partition in ("a", "b"):
            size = sum(partition in p for p in layout.values())
            held = sum(s.drained for s in final.values() if partition in (s.partitions or ()))
            assert 0 < held <= breaker.limit(size, SETTINGS), (seed, partition, held)


def test_the_order_is_slurms_reason_time_then_the_node_name() -> None:
    view = {s.name: s for s in [drained("b", 10), drained("a", 10), drained("c", 9), idle("d"), idle("e")]}
    cap = breaker.limit(5, SETTINGS)  # 2
    assert [s.name for s in breaker.order(list(view.values())[:3])] == ["c", "a", "b"]
    assert breaker.after(view, view["a"], SETTINGS) is None
    why = breaker.after(view, view["b"], SETTINGS)
    assert why is not None and f"limit {cap}" in why and "number 3" in why


def test_a_drain_in_our_form_with_unreadable_partitions_counts_everywhere() -> None:
    view = {s.name: s for s in [drained("x", 5, None), idle("a"), idle("b"), idle("c")]}
    assert breaker.before(view, view["a"], SETTINGS) is not None  # 3 nodes in p: limit 1, taken by x


def test_partitions_of_any_name_are_read_from_sinfo_json() -> None:
    names = ["gpu+h100", "gpu:h100", "gpu@h100", "gpu/h100", "gpu#1", "gpu%1", "H100(A)", "gpu~1"]
    view = parse_view(json.dumps({"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"],
                                             "partitions": names, "reason": "a|b\nc",
                                             "reason_set_by_user": "root", "reason_changed_at": 7}]}))
    assert view["n1"] == NodeState("n1", frozenset({"IDLE", "DRAIN"}), "a|b\nc", tuple(names), "root", 7)


@pytest.mark.parametrize("partitions", [None, "gpu", [1], ["ok", ""], ["x\n"], [f"p{i}" for i in range(65)]])
def test_partitions_that_cannot_be_read_are_none(partitions: object) -> None:
    view = parse_view(json.dumps({"nodes": [{"name": "n1", "partitions": partitions}]}))
    assert view["n1"].partitions is None


@pytest.mark.parametrize("text", ["not json", "[]", '{"nodes": {}}', '{"nodes": [{"name": 7}]}',
                                  '{"nodes": [{"name": "a b"}]}', '{"nodes": [{"name": "n"}, {"name": "n"}]}'])
def test_a_view_that_could_miss_a_node_is_refused(text: str) -> None:
    with pytest.raises(SlurmError):
        parse_view(text)


@pytest.mark.parametrize(("state", "ours"), [
    (drained("n", 100), True),
    (drained("n", 101), False),  # the same text set again, a second later
    (replace(drained("n", 100), reason_user="admin"), False),
    (drained("n", 100, reason=REASON + " "), False),  # edited
    (drained("n", 100, reason="nodewarden: held by admin - RMA 4711"), False),
    (drained("n", 100, reason=REASON + "\nsecond line"), False),
    (replace(drained("n", 100), reason_time=0), False),
])
def test_ours_only_when_slurm_shows_what_we_marked(state: NodeState, ours: bool) -> None:
    assert proven(state, Mark(REASON, "root", 100)) is ours
    assert proven(state, None) is False
