"""The Slurm gate (NHC's conventions): drain on a bad verdict, resume our own drain after N healthy
checks, never touch what is not ours, and a circuit breaker so a wrong profile cannot empty a cluster.

Ownership (ownership.py): ours only while Slurm shows the reason, user and time this gate recorded
after its drain; anything else (an admin's "maint: PSU swap" or "nodewarden: held by admin", an
edited reason, NHC's) is never changed or cleared, and a node in down, maint, reboot, planned or power
states is left alone. Resume (`State=RESUME`) only clears our own drain, after `resume_after`
consecutive healthy checks (the count survives between runs in the state dir), and with
`require_accept` only after a passing `nodewarden accept` since the drain. Our reason is never
rewritten while drained: its time, as Slurm stamped it, orders the breaker. The checks and
subjects that caused the drain (and any that turned bad while it lasts) are kept with it; a
resume needs each back as `pass`. The breaker (breaker.py) counts before the drain and again
after it, and undoes our own drain past the limit: no more than max(breaker_percent of the
partition, breaker_min_nodes) stay drained however checks interleave; a critical log line,
`action=breaker` in the trail and the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.report.verdict import DEGRADED
from agent.scheduler import breaker
from agent.scheduler.answer import Answer, short
from agent.scheduler.ownership import PREFIX, mark_of, proven, recall_mark, remember_mark
from agent.scheduler.settings import MIN_UPDATE_S, Deadline, HealthSettings
from agent.scheduler.slurm_cli import NodeState, Slurm, SlurmError
from agent.scheduler.state import accepted_since
from agent.scheduler.trail import MAX_CAUSES, Memory, recall, remember

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


def hands_off(state: NodeState) -> str | None:
    touched = sorted(f for f in state.flags if f in HANDS_OFF or f.startswith(("REBOOT", "POWER")))
    return "+".join(touched) if touched else None


def reason_for(answer: Answer) -> str:
    return short(f"{PREFIX} {answer.worst(MAX_REASON)}", MAX_REASON)


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


def _time_short(slurm: Slurm) -> str | None:
    """Why the deadline leaves too little for a drain's whole sequence (drain, wait, re-count, and a
    possible undo), or None: a drain must never be left past the breaker for want of time."""
    if slurm.deadline is None:
        return None
    update = max(MIN_UPDATE_S, 1.5 * slurm.slowest_s)
    need = 2 * update + breaker.MAX_SETTLE_S + max(1.0, 1.5 * slurm.slowest_s)
    left = slurm.deadline.left()
    return f"{max(left, 0):.1f} s left of the deadline, {need:.1f} s needed" if left < need else None


def _settle(slurm: Slurm, settings: HealthSettings, decision: Decision, reason: str) -> Decision:
    """After our drain: mark what Slurm shows we wrote (ownership), re-count the partitions with this
    node in them (breaker.after) and, past the limit, undo our drain. The node was undrained with no
    reason of anyone else's (nothing else is drained), so RESUME puts back its state and reason."""
    name = decision.node
    try:
        time.sleep(breaker.wait_s(time.time(), None))
        mine = slurm.node(name)
        wait = breaker.wait_s(time.time(), mine.reason_time)  # slurmctld's clock ahead of ours
        if wait > 0:
            time.sleep(wait)
            mine = slurm.node(name)
    except SlurmError as exc:
        return Decision("failed", f"drained, but cannot re-count the partition: {exc}; the drain stays, "
                        "unmarked (an operator's to resume)", name, argv=decision.argv)
    if not (mine.drained and mine.reason == reason and mine.reason_time > 0):
        return Decision("none", f"drained, but Slurm now shows {short(mine.reason, 60)!r}: someone else's, "
                        "left alone", name, argv=decision.argv)
    remember_mark(settings.state_dir, name, mark_of(mine))
    why = breaker.after(slurm.seen, mine, settings)
    if why is None:
        return decision
    undo = slurm.update_argv(name, "RESUME")
    try:
        slurm.call(undo)
    except SlurmError as exc:
        return Decision("failed", f"{why}; undoing our drain failed: {exc}", name, argv=undo)
    return Decision("breaker", f"{why}: our drain undone, the node is back as it was", name, argv=undo)


def _decide(answer: Answer, state: NodeState, settings: HealthSettings, slurm: Slurm, memory: Memory,
            dry_run: bool, remember_: Callable[[Memory], None]) -> Decision:
    name, verdict = state.name, str(answer.verdict)
    held = hands_off(state)
    if held:
        remember_(Memory(0, memory.drained_at, memory.causes))
        return Decision("none", f"node is {held}: left alone ({verdict})", name)
    # Ours only when Slurm shows byte-for-byte the reason, user and time this gate marked (ownership.py)
    owned = proven(state, recall_mark(settings.state_dir, name))
    if (state.reason or state.drained) and not owned:
        remember_(Memory(0, memory.drained_at, memory.causes))
        return Decision("none", f"reason {short(state.reason, 60)!r} is not nodewarden's: left alone ({verdict})",
                        name)
    if settings.bad(verdict):
        reason = reason_for(answer)
        causes = tuple(dict.fromkeys([*memory.causes, *answer.causes(settings.drain_on == DEGRADED)]))[:MAX_CAUSES]
        if state.drained and owned:
            # drained by another run: from now on, and what is bad now must come back pass too
            remember_(Memory(0, memory.drained_at or time.time(), causes))
            # Never rewritten: the reason's time, as Slurm stamped our drain, orders the breaker.
            now = "" if state.reason == reason else f"; the worst finding is now {reason!r} (our reason kept)"
            return Decision("none", f"already drained by nodewarden: {state.reason}{now}", name)
        if not state.partitions:
            return Decision("unknown", "cannot decide: the node is in no partition Slurm names readably, so "
                            "the breaker cannot be counted; not draining", name)
        open_ = breaker.before(slurm.seen, state, settings)
        if open_:
            remember_(Memory(0, memory.drained_at, memory.causes))
            return Decision("breaker", open_, name)
        short_of = _time_short(slurm)
        if short_of and not dry_run:
            return Decision("failed", f"not draining: {short_of}", name)
        decision = _update(slurm, Decision("drain", f"{verdict}: {reason}", name,
                                           argv=slurm.update_argv(name, "DRAIN", reason)), dry_run)
        if decision.action == "drain" and not dry_run:
            decision = _settle(slurm, settings, decision, reason)
        if decision.action == "drain":
            remember_(Memory(0, time.time(), causes))
        elif decision.action == "breaker":
            remember_(Memory(0, memory.drained_at, memory.causes))
        return decision
    if not (state.drained and owned):
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


