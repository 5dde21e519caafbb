"""The gate's decision, pure (issue 30.12, NHC/NVSentinel style): what to do with a node, given what
was read before it; no Slurm call, no file, no clock. agent.apps.scheduler.slurm reads, calls `decide`,
and carries the plan out (the only code that runs scontrol/sinfo); a table test walks the matrix.

The rules, in order:
- no verdict: nothing (an undecided check breaks the healthy streak);
- a node in an operator's or Slurm's own state (down, maint, reboot, power): left alone;
- a reason or drain this gate cannot prove it made (ownership.proven): someone else's, left alone;
- a bad verdict: already drained by us, kept (never re-reasoned: its time orders the breaker); in no
  readable partition, not drained (the breaker cannot be counted); the breaker open, not drained;
  else drain (the adapter then re-counts: breaker.after);
- a good verdict on our drain: resume only when each cause of the drain is back as `pass`, after
  `resume_after` healthy checks in a row, and with `require_accept` after a passing acceptance run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.apps.scheduler import breaker
from agent.apps.scheduler.answer import Answer, short
from agent.apps.scheduler.ownership import PREFIX, Mark, proven
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm_cli import NodeState
from agent.apps.scheduler.trail import MAX_CAUSES, Memory
from agent.report.verdict import DEGRADED

MAX_REASON = 100  # characters of our reason, prefix included (sinfo's default column shows ~20)
# States an operator or Slurm itself owns: never drained, resumed or re-reasoned by us.
HANDS_OFF = frozenset({"DOWN", "MAINT", "PLANNED", "FUTURE", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                       "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "POWER_UP"})
ACTS = ("drain", "resume")  # the plans that change Slurm


@dataclass(frozen=True)
class Seen:
    """Everything one decision rests on, read before it."""

    answer: Answer
    state: NodeState | None  # None: Slurm was not asked (no verdict) or could not be read
    memory: Memory
    mark: Mark | None  # what this gate marked after its last drain (ownership.py)
    view: Mapping[str, NodeState]  # the cluster as the same sinfo call showed it (the breaker's count)
    accepted: tuple[bool, str]  # a passing acceptance run since the drain, and why not
    now: float  # Unix time of the reading


@dataclass(frozen=True)
class Plan:
    """What to do, why, and the memory to keep: `memory` once the action is done (or when there is
    nothing to do), `otherwise` when it fails or the breaker undoes it (None: keep nothing new)."""

    action: str  # drain, resume, none, breaker, unknown
    why: str
    memory: Memory | None
    otherwise: Memory | None = None
    reason: str = ""  # a drain's reason


def hands_off(state: NodeState) -> str | None:
    touched = sorted(f for f in state.flags if f in HANDS_OFF or f.startswith(("REBOOT", "POWER")))
    return "+".join(touched) if touched else None


def reason_for(answer: Answer) -> str:
    return short(f"{PREFIX} {answer.worst(MAX_REASON)}", MAX_REASON)


def decide(seen: Seen, settings: HealthSettings) -> Plan:
    """The plan for `seen.state` (pure: the same input always gives the same plan)."""
    answer, state, memory = seen.answer, seen.state, seen.memory
    broken = Memory(0, memory.drained_at, memory.causes)  # the healthy streak broken, the drain remembered
    if answer.verdict is None or state is None:
        return Plan("unknown", f"cannot decide ({answer.how}): {answer.why}; nothing done", broken)
    verdict = answer.verdict
    held = hands_off(state)
    if held:
        return Plan("none", f"node is {held}: left alone ({verdict})", broken)
    owned = proven(state, seen.mark)
    if (state.reason or state.drained) and not owned:
        return Plan("none", f"reason {short(state.reason, 60)!r} is not nodewarden's: left alone ({verdict})",
                    broken)
    if settings.bad(verdict):
        return _bad(seen, settings, owned, broken)
    if not (state.drained and owned):
        return Plan("none", f"{verdict}: nothing to do", Memory(0, None))
    return _good(seen, settings)


def _bad(seen: Seen, settings: HealthSettings, owned: bool, broken: Memory) -> Plan:
    answer, state, memory = seen.answer, seen.state, seen.memory
    assert state is not None and answer.verdict is not None
    reason = reason_for(answer)
    causes = tuple(dict.fromkeys([*memory.causes, *answer.causes(settings.drain_on == DEGRADED)]))[:MAX_CAUSES]
    if state.drained and owned:
        # Drained by another run: from now on, what is bad now must come back pass too. Never
        # rewritten: the reason's time, as Slurm stamped our drain, orders the breaker.
        now = "" if state.reason == reason else f"; the worst finding is now {reason!r} (our reason kept)"
        return Plan("none", f"already drained by nodewarden: {state.reason}{now}",
                    Memory(0, memory.drained_at or seen.now, causes))
    if not state.partitions:
        return Plan("unknown", "cannot decide: the node is in no partition Slurm names readably, so the "
                    "breaker cannot be counted; not draining", None)
    open_ = breaker.before(seen.view, state, settings)
    if open_:
        return Plan("breaker", open_, broken)
    return Plan("drain", f"{answer.verdict}: {reason}", Memory(0, seen.now, causes), broken, reason)


def _good(seen: Seen, settings: HealthSettings) -> Plan:
    """A good verdict on our drain. No resume without positive evidence: each check and subject that
    caused the drain must be back as `pass`; unknown, skip or absent (a BMC gone dark, a source not
    read) is undecided, not healthy: it breaks the streak. A drain whose causes were never recorded
    (another state dir, a lost file) has nothing that could come back: an operator resumes it."""
    answer, memory = seen.answer, seen.memory
    verdict = answer.verdict
    # A drain of ours this state dir did not see start: an acceptance run must still come after it,
    # so it counts from now, never from the epoch.
    drained_at = memory.drained_at or seen.now
    undecided = (answer.undecided(memory.causes) if memory.causes
                 else ["the drain's causes are not recorded here (resume it by hand)"])
    if undecided:
        more = f" and {len(undecided) - 4} more" if len(undecided) > 4 else ""
        return Plan("none", f"{verdict}, but undecided: {'; '.join(undecided[:4])}{more}; a resume needs "
                    "each cause of the drain back as pass", Memory(0, drained_at, memory.causes))
    healthy = memory.healthy + 1
    streak = Memory(healthy, drained_at, memory.causes)
    if healthy < settings.resume_after:
        return Plan("none", f"{verdict}: healthy {healthy} of {settings.resume_after} checks before resume", streak)
    if settings.require_accept:
        passed, why = seen.accepted
        if not passed:
            return Plan("none", f"{verdict}, but resume waits for acceptance: {why}", streak)
    return Plan("resume", f"{verdict} for {healthy} checks: resuming our drain", Memory(0, None), streak)
