"""The circuit breaker, decided from one view of the cluster (one `sinfo --json`), pure: no Slurm calls.

Counting and then draining is a race: 20 nodes checking at the same second each count 0 drains and
all drain. So the breaker has two steps, with Slurm as the only shared state:

- before: a drain is not even tried while the partition already holds the limit's worth of drains in
  our form on other nodes (`before`);
- after: the drain is made, the partition is counted again with this node in it, and the drains in our
  form are put in one order every node computes the same way: the reason's time as Slurm stamped it,
  then the node name. A node whose own drain falls at or past the limit undoes it (`after`).

Why that holds however checks interleave: slurmctld applies updates one at a time and stamps each
with its own clock's second. A node re-counts only after that second is over (the caller waits it
out), so it sees every drain stamped before or with its own; the first `limit` in the order never
back off, and every later one sees them. Assumed: node clocks within ~0.3 s of slurmctld's (NTP).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.apps.scheduler.ownership import looks_ours
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm_cli import NodeState

SETTLE_S = 0.3  # past the end of slurmctld's second before the re-count (clock skew allowance)
MAX_SETTLE_S = 3.0  # the longest wait for that second to pass (a controller clock far ahead)


def limit(size: int, settings: HealthSettings) -> int:
    return max(math.ceil(size * settings.breaker_percent / 100), settings.breaker_min_nodes)


def _drained_by_us(state: NodeState) -> bool:
    return state.drained and looks_ours(state.reason)


def _partition(view: Mapping[str, NodeState], partition: str) -> tuple[int, list[NodeState]]:
    """The partition's size and its drains in our form. A node whose partitions Slurm answered
    unreadably counts as a drain in every partition but adds to none's size (stricter both ways)."""
    size = sum(1 for s in view.values() if s.partitions is not None and partition in s.partitions)
    drained = [s for s in view.values()
               if _drained_by_us(s) and (s.partitions is None or partition in s.partitions)]
    return size, drained


def before(view: Mapping[str, NodeState], state: NodeState, settings: HealthSettings) -> str | None:
    """Why a drain of `state` is not tried (the breaker is open already), or None."""
    for partition in state.partitions or ():
        size, drained = _partition(view, partition)
        others = [s for s in drained if s.name != state.name]
        cap = limit(size, settings)
        if len(others) >= cap:
            return (f"circuit breaker open: partition {partition} has {len(others)} of {size} nodes "
                    f"drained by nodewarden (limit {cap}); not draining")
    return None


def order(drained: list[NodeState]) -> list[NodeState]:
    """Who keeps a drain first: the earliest reason time Slurm stamped, then the node name."""
    return sorted(drained, key=lambda s: (s.reason_time, s.name))


def after(view: Mapping[str, NodeState], state: NodeState, settings: HealthSettings) -> str | None:
    """After our drain, re-counted: why it must be undone (past the limit in one of its partitions), or None."""
    for partition in state.partitions or ():
        size, drained = _partition(view, partition)
        ranked = [s.name for s in order([*(s for s in drained if s.name != state.name), state])]
        cap = limit(size, settings)
        place = ranked.index(state.name)
        if place >= cap:
            return (f"circuit breaker: partition {partition} has {len(ranked)} of {size} nodes drained by "
                    f"nodewarden at once (limit {cap}); this node is number {place + 1} in Slurm's order")
    return None


def wait_s(now: float, reason_time: int | None) -> float:
    """How long to wait before the re-count: until the second our drain was stamped in (Slurm's
    `reason_time`, else the local one) is over by SETTLE_S, at most MAX_SETTLE_S."""
    second = max(int(now), reason_time or 0)
    return min(max(second + 1 + SETTLE_S - now, 0.0), MAX_SETTLE_S)
