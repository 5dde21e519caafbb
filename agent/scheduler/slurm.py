"""The Slurm gate (NHC's conventions): drain on a bad verdict, resume our own drain after N healthy
checks, never touch what is not ours, and a circuit breaker so a wrong profile cannot empty a cluster.

Ownership: a reason starting with `nodewarden:` is ours; any other reason (an admin's "maint: PSU
swap", NHC's) is never changed or cleared, and a node in down, maint, reboot, planned or power
states is left alone. Resume (`State=RESUME`) only clears our own drain, after `resume_after`
consecutive healthy checks (the count survives between runs in the state dir), and with
`require_accept` only after a passing `nodewarden accept` since the drain. When the worst finding
changes while drained, our reason is rewritten. The checks and subjects that caused the drain (and
any that turned bad while it lasts) are kept with it; a resume needs each back as `pass`. Before
draining, the partition's nodes with our reason are counted (sinfo); at max(breaker_percent of the
partition, breaker_min_nodes) the breaker is open: no drain, a critical log line, `action=breaker`
in the trail and the metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.report.verdict import DEGRADED
from agent.scheduler.answer import Answer, short
from agent.scheduler.settings import Deadline, HealthSettings
from agent.scheduler.slurm_cli import NodeState, Slurm, SlurmError
from agent.scheduler.state import accepted_since
from agent.scheduler.trail import MAX_CAUSES, Memory, recall, remember

PREFIX = "nodewarden:"
MAX_REASON = 100  # characters of our reason, prefix included (sinfo's default column shows ~20)
# States an operator or Slurm itself owns: never drained, resumed or re-reasoned by us.
HANDS_OFF = frozenset({"DOWN", "MAINT", "PLANNED", "FUTURE", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                       "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "POWER_UP"})


@dataclass
class Decision:
    action: str  # drain, resume, none, breaker (the metrics' values); unknown, failed: nothing done
    why: str
    node: str
    verdict: str | None = None
    argv: list[str] = field(default_factory=list)  # the scontrol update run (or, dry run, that would run)


def ours(reason: str) -> bool:
    return reason.startswith(PREFIX)


def hands_off(state: NodeState) -> str | None:
    touched = sorted(f for f in state.flags if f in HANDS_OFF or f.startswith(("REBOOT", "POWER")))
    return "+".join(touched) if touched else None


def reason_for(answer: Answer) -> str:
    return short(f"{PREFIX} {answer.worst(MAX_REASON)}", MAX_REASON)


def breaker_limit(size: int, settings: HealthSettings) -> int:
    return max(math.ceil(size * settings.breaker_percent / 100), settings.breaker_min_nodes)


def _breaker(slurm: Slurm, state: NodeState, settings: HealthSettings) -> str | None:
    """Why the breaker is open for this node's partitions, or None when a drain may go ahead."""
    for partition in state.partitions:
        nodes = slurm.partition_reasons(partition)
        drained = sorted(n for n, reason in nodes.items() if ours(reason) and n != state.name)
        limit = breaker_limit(len(nodes), settings)
        if len(drained) >= limit:
            return (f"circuit breaker open: partition {partition} has {len(drained)} of {len(nodes)} nodes "
                    f"drained by nodewarden (limit {limit}); not draining")
    return None


def decide(answer: Answer, node: str, settings: HealthSettings, *, dry_run: bool,
           slurm: Slurm | None = None, deadline: Deadline | None = None) -> Decision:
    """Look at the node in Slurm and act on `answer` (dry run: say what would be run, change nothing)."""
    state_dir = settings.state_dir
    memory = recall(state_dir, node)

    def keep(new: Memory) -> None:
        if not dry_run:
            remember(state_dir, node, new)

    if answer.verdict is None:
        keep(Memory(0, memory.drained_at, memory.causes))  # an undecided check breaks the healthy streak
        return Decision("unknown", f"cannot decide ({answer.how}): {answer.why}; nothing done", node)
    try:
        slurm = slurm or Slurm(settings, deadline)
        state = slurm.node(node)
    except SlurmError as exc:
        return Decision("failed", f"cannot read the node from Slurm: {exc}; nothing done", node, answer.verdict)
    decision = _decide(answer, state, settings, slurm, memory, dry_run, keep)
    decision.verdict = answer.verdict
    return decision


def _update(slurm: Slurm, decision: Decision, dry_run: bool) -> Decision:
    if dry_run:
        return decision
    try:
        slurm.call(decision.argv)
    except SlurmError as exc:
        return Decision("failed", f"{decision.action} failed: {exc}", decision.node, argv=decision.argv)
    return decision


def _decide(answer: Answer, state: NodeState, settings: HealthSettings, slurm: Slurm, memory: Memory,
            dry_run: bool, remember_: Callable[[Memory], None]) -> Decision:
    name, verdict = state.name, str(answer.verdict)
    held = hands_off(state)
    if held:
        remember_(Memory(0, memory.drained_at, memory.causes))
        return Decision("none", f"node is {held}: left alone ({verdict})", name)
    if state.reason and not ours(state.reason):
        remember_(Memory(0, memory.drained_at, memory.causes))
        return Decision("none", f"reason {short(state.reason, 60)!r} is not nodewarden's: left alone ({verdict})",
                        name)
    if settings.bad(verdict):
        reason = reason_for(answer)
        causes = tuple(dict.fromkeys([*memory.causes, *answer.causes(settings.drain_on == DEGRADED)]))[:MAX_CAUSES]
        if state.drained and ours(state.reason):
            # drained by another run: from now on, and what is bad now must come back pass too
            remember_(Memory(0, memory.drained_at or time.time(), causes))
            if state.reason == reason:
                return Decision("none", f"already drained by nodewarden: {reason}", name)
            return _update(slurm, Decision("drain", f"worst finding changed: {reason}", name,
                                           argv=slurm.update_argv(name, "DRAIN", reason)), dry_run)
        try:
            open_ = _breaker(slurm, state, settings)
        except SlurmError as exc:
            return Decision("failed", f"cannot count the partition's drains: {exc}; not draining", name)
        if open_:
            remember_(Memory(0, memory.drained_at, memory.causes))
            return Decision("breaker", open_, name)
        decision = _update(slurm, Decision("drain", f"{verdict}: {reason}", name,
                                           argv=slurm.update_argv(name, "DRAIN", reason)), dry_run)
        if decision.action == "drain":
            remember_(Memory(0, time.time(), causes))
        return decision
    if not (state.drained and ours(state.reason)):
        remember_(Memory(0, None))
        return Decision("none", f"{verdict}: nothing to do", name)
    # No resume without positive evidence: each check and subject that caused the drain must be back as
    # `pass`. unknown, skip or absent (a BMC gone dark, a source not read) is undecided, not healthy:
    # it breaks the streak, and the trail says which. A drain whose causes were never recorded (another
    # state dir, a lost file) has nothing that could come back: an operator resumes it.
    undecided = (answer.undecided(memory.causes) if memory.causes
                 else ["the drain's causes are not recorded here (resume it by hand)"])
    if undecided:
        remember_(Memory(0, memory.drained_at or time.time(), memory.causes))
        more = f" and {len(undecided) - 4} more" if len(undecided) > 4 else ""
        return Decision("none", f"{verdict}, but undecided: {'; '.join(undecided[:4])}{more}; a resume needs "
                        "each cause of the drain back as pass", name)
    healthy = memory.healthy + 1
    # A drain of ours this state dir did not see start (another state dir, a lost file): an
    # acceptance run must still come after it, so it counts from now, never from the epoch.
    memory = Memory(memory.healthy, memory.drained_at or time.time(), memory.causes)
    if healthy < settings.resume_after:
        remember_(Memory(healthy, memory.drained_at, memory.causes))
        return Decision("none", f"{verdict}: healthy {healthy} of {settings.resume_after} checks before resume", name)
    if settings.require_accept:
        passed, why = accepted_since(settings.state_dir, memory.drained_at or time.time())
        if not passed:
            remember_(Memory(healthy, memory.drained_at, memory.causes))
            return Decision("none", f"{verdict}, but resume waits for acceptance: {why}", name)
    decision = _update(slurm, Decision("resume", f"{verdict} for {healthy} checks: resuming our drain", name,
                                       argv=slurm.update_argv(name, "RESUME")), dry_run)
    remember_(Memory(0, None) if decision.action == "resume" else Memory(healthy, memory.drained_at, memory.causes))
    return decision


