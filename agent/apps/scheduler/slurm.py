"""The Slurm gate's adapter: the only code that calls scontrol/sinfo for a decision (issue 30.12).

It reads what a decision rests on (the node and the cluster from Slurm, the node's memory and drain
mark and the acceptance result from the state dir), asks agent.apps.scheduler.policy's pure `decide`,
and carries the plan out: `scontrol update`, then for a drain the breaker's re-count (breaker.after)
and, past the limit, the undo; then it keeps the memory the plan names. NHC's conventions:
ownership (ownership.py) is proven from what Slurm shows, never guessed; the breaker (breaker.py)
holds however checks interleave; a dry run says what would run and writes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent.apps.scheduler import breaker
from agent.apps.scheduler.answer import Answer, short
from agent.apps.scheduler.ownership import mark_of, recall_mark, remember_mark
from agent.apps.scheduler.policy import Plan, Seen, decide, hands_off, reason_for
from agent.apps.scheduler.settings import MIN_UPDATE_S, Deadline, HealthSettings
from agent.apps.scheduler.slurm_cli import Slurm, SlurmError
from agent.apps.scheduler.trail import Memory, recall, remember
from agent.core.errors import NodewardenError
from agent.io.fsutil import open_lock_file
from agent.state.acceptance import accepted_since
from agent.state.layout import scheduler_folder

__all__ = ["Decision", "act", "hands_off", "reason_for"]

LOCK_POLL_S = 0.05
NO_LOCK_S = 30.0  # without a deadline (tests, a caller of its own), the longest wait for the node's lock


@dataclass
class Decision:
    action: str  # drain, resume, none, breaker (the metrics' values); unknown, failed: nothing done
    why: str
    node: str
    verdict: str | None = None
    argv: list[str] = field(default_factory=list)  # the scontrol update run (or, dry run, that would run)


def act(answer: Answer, node: str, settings: HealthSettings, *, dry_run: bool,
        slurm: Slurm | None = None, deadline: Deadline | None = None, drain_only: bool = False) -> Decision:
    """Look at the node in Slurm and act on `answer` (dry run: say what would be run, change nothing).

    One gate run per node at a time (the periodic HealthCheckProgram and the event-driven gate may
    start together): the node's lock is held from the first read to the last write, waited for
    within the deadline. `drain_only` (the event gate): a plan other than a drain is not carried
    out and keeps no memory, so resuming stays the periodic check's, counted by its own runs."""
    if dry_run:  # changes nothing, so it needs no lock (and creates no lock file)
        return _act(answer, node, settings, dry_run, slurm, deadline, drain_only)
    try:
        with _node_lock(settings, node, deadline):
            return _act(answer, node, settings, dry_run, slurm, deadline, drain_only)
    except TimeoutError as exc:
        return Decision("failed", f"{exc}; nothing done", node, answer.verdict)
    except (OSError, NodewardenError) as exc:
        return Decision("failed", f"cannot lock the node's gate: {exc}; nothing done", node, answer.verdict)


@contextlib.contextmanager
def _node_lock(settings: HealthSettings, node: str, deadline: Deadline | None) -> Iterator[None]:
    fd = open_lock_file(scheduler_folder(settings.state_dir, create=True) / f"gate-{node}.lock")  # names are validated
    try:
        until = time.monotonic() + (max(deadline.left() - MIN_UPDATE_S, 0.0) if deadline else NO_LOCK_S)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise TimeoutError("another gate run holds this node's lock past the deadline") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _act(answer: Answer, node: str, settings: HealthSettings, dry_run: bool, slurm: Slurm | None,
         deadline: Deadline | None, drain_only: bool) -> Decision:
    state_dir = settings.state_dir
    memory, now = recall(state_dir, node), time.time()
    accepted = (accepted_since(state_dir, memory.drained_at or now) if settings.require_accept
                else (True, "acceptance not required"))
    seen = Seen(answer, None, memory, None, {}, accepted, now)
    if answer.verdict is not None:
        try:
            slurm = slurm or Slurm(settings, deadline)
            seen = Seen(answer, slurm.node(node), memory, recall_mark(state_dir, node), slurm.seen, accepted, now)
        except SlurmError as exc:
            return Decision("failed", f"cannot read the node from Slurm: {exc}; nothing done", node, answer.verdict)
    plan = decide(seen, settings)
    if drain_only and plan.action not in ("drain", "breaker", "unknown"):
        return Decision("none", f"event gate: {plan.why} (not carried out: the event gate only drains; resuming "
                        "and counting healthy checks are the periodic health-check's)", node, answer.verdict)
    decision, kept = _carry_out(plan, node, settings, slurm, dry_run)
    if kept is not None and not dry_run:
        remember(state_dir, node, kept)
    decision.verdict = answer.verdict
    return decision


def _carry_out(plan: Plan, node: str, settings: HealthSettings, slurm: Slurm | None,
               dry_run: bool) -> tuple[Decision, Memory | None]:
    """Run the plan's update (none in a dry run): the decision made and the memory to keep."""
    if plan.action not in ("drain", "resume") or slurm is None:
        return Decision(plan.action, plan.why, node), plan.memory
    argv = slurm.update_argv(node, "DRAIN", plan.reason) if plan.action == "drain" else slurm.update_argv(
        node, "RESUME")
    decision = Decision(plan.action, plan.why, node, argv=argv)
    if dry_run:
        return decision, None
    if plan.action == "drain":
        short_of = _time_short(slurm)
        if short_of:
            return Decision("failed", f"not draining: {short_of}", node), None
    try:
        slurm.call(argv)
    except SlurmError as exc:
        return Decision("failed", f"{plan.action} failed: {exc}", node, argv=argv), plan.otherwise
    if plan.action == "resume":
        return decision, plan.memory
    decision = _settle(slurm, settings, decision, plan.reason)
    return decision, (plan.memory if decision.action == "drain"
                      else plan.otherwise if decision.action == "breaker" else None)


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
