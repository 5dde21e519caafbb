"""Remediation engine: audit -> plan -> (journal -> apply -> verify) -> report; rollback.

Per action, in this order: the before-state of every path the action will
touch is appended to the run journal and fsync'ed; then the changes are
written; then each is re-read through the same parser the audit uses and the
profile's expectation is evaluated again. Only a verified action counts as
fixed. `rollback` restores the journal's before-states in reverse order, so
a run killed at any point — before the journal entry, after it, or between
two writes of one action — returns to exactly the prior state.

One remediate or rollback at a time per *target*: the live node's lock is
/run/nodewarden/remediate.lock, a snapshot's is the flock of the snapshot
folder itself (the recorded tree stays byte-identical), whatever --state-dir
each run uses. Rollback first checks every journaled path against the
paths its actuator declares (`remediations.actuator(writes=...)`) and
refuses the whole run (exit 2) if one is foreign.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import ConfigError, NodewardenError
from agent.core.facts import NodeFacts
from agent.core.model import Status
from agent.engine.audit import AuditRequest, run_audit
from agent.engine.change_kinds import NotSupportedWrite, VerifyError, kind_named, kind_of
from agent.io.fsutil import trusted_dir
from agent.policy.profiles import ProfileStore
from agent.report.model import Report
from agent.sources.node import open_node
from agent.state.journal import JournalError, JournalWriteError, RunJournal, StateDir, hold_lock, new_run_id
from checks import all_checks
from remediations import (
    Action,
    ActionClass,
    Change,
    HostTarget,
    Outcome,
    may_write,
    planners,
)
from remediations.targets import LiveTarget, SnapshotTarget

log = logging.getLogger("nodewarden.remediate")

REMEDIATION_SCHEMA = "nodewarden.remediation/v1"
CLASS_ORDER = (ActionClass.SAFE, ActionClass.DISRUPTIVE, ActionClass.REBOOT)


class RemediationError(NodewardenError):
    """The remediation could not run (bad target, journal problem)."""

    exit_code = 3


_FAILPOINT_HITS: dict[str, int] = {}


def failpoint(name: str) -> None:
    """SIGKILL this process at a named point when NODEWARDEN_FAILPOINTS asks for it.

    Used by the crash-consistency tests: "mid-action" crashes at the first
    hit, "mid-action@2" at the second; "after-journal:stop" SIGSTOPs instead
    (the lock tests hold a run mid-way). Unset in production, it costs a dict lookup.
    """
    wanted = os.environ.get("NODEWARDEN_FAILPOINTS")
    if not wanted:
        return
    _FAILPOINT_HITS[name] = hits = _FAILPOINT_HITS.get(name, 0) + 1
    for spec in wanted.split(","):
        point, _, how = spec.partition(":")
        point_name, _, nth = point.partition("@")
        if point_name == name and hits == (int(nth) if nth.isdigit() else 1):
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)


@dataclass
class RemediationRequest:
    audit: AuditRequest
    apply: bool = False
    allow: frozenset[ActionClass] = frozenset({ActionClass.SAFE})
    only: tuple[str, ...] = ()
    state_dir: Path = Path("/var/lib/nodewarden")


@dataclass
class RemediationResult:
    mode: str  # plan | apply
    target: str
    profile: str
    actions: list[Action]
    run_id: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    simulated: str | None = None  # a plan of a simulated node: --apply is refused there (name the copy to make)

    @property
    def changed(self) -> bool:
        return any(a.outcome in (Outcome.APPLIED, Outcome.FAILED) and a.error is None for a in self.actions) or (
            self.mode == "plan" and any(a.outcome is Outcome.PLANNED for a in self.actions))

    @property
    def reboot_required(self) -> bool:
        done = (Outcome.APPLIED,) if self.mode == "apply" else (Outcome.PLANNED,)
        return any(a.action_class is ActionClass.REBOOT and a.outcome in done for a in self.actions)

    @property
    def exit_code(self) -> int:
        bad = (Outcome.REFUSED, Outcome.FAILED)
        return 1 if any(a.outcome in bad for a in self.actions) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REMEDIATION_SCHEMA,
            "mode": self.mode,
            "target": self.target,
            "profile": self.profile,
            "run_id": self.run_id,
            "changed": self.changed,
            "reboot_required": self.reboot_required,
            "actions": [a.to_json() for a in self.actions],
            "findings": self.findings,
        }


class _Context:
    def __init__(self, profile: Any, target: HostTarget, facts: NodeFacts | None) -> None:
        self.profile = profile
        self.target = target
        self.facts = facts
        self.cache: dict[str, Any] = {}


def open_target(request: AuditRequest, writable: bool) -> HostTarget:
    node = open_node(request)
    if request.simulate is not None:
        if writable:
            raise ConfigError(f"simulated nodes are read-only; make a copy to practise on with "
                              f"`nodewarden snapshot capture --simulate {request.simulate} --out DIR` "
                              "and pass --snapshot DIR")
        assert node.snapshot is not None
        return SnapshotTarget(node.snapshot.path, writable=False)
    if node.snapshot is not None:
        if not node.snapshot.has("host"):
            raise ConfigError("the snapshot holds no host data (fs/) to remediate", path=str(node.snapshot.path))
        return SnapshotTarget(node.snapshot.path, writable=writable)
    return LiveTarget("/", bmc_options=request.bmc if request.bmc.url else None)


LIVE_LOCK_DIR = Path("/run/nodewarden")


def _live_lock_dir() -> Path:
    """/run/nodewarden for root; any other user (a BMC-only run) locks in its own runtime folder."""
    if os.geteuid() == 0:
        return trusted_dir(LIVE_LOCK_DIR, create=True, what="lock folder")
    import tempfile

    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "nodewarden" if runtime else Path(tempfile.gettempdir()) / f"nodewarden-{os.geteuid()}"
    return trusted_dir(folder, create=True, what="lock folder")


@contextmanager
def target_lock(target: HostTarget) -> Iterator[None]:
    """Hold the target's lock: one remediate or rollback per node, whatever --state-dir each uses."""
    if isinstance(target, SnapshotTarget):
        with hold_lock(target.path, target=target.description, directory=True):
            yield
    elif isinstance(target, LiveTarget) and target.root != "/":
        with hold_lock(Path(target.root).resolve(), target=target.description, directory=True):
            yield
    else:
        with hold_lock(_live_lock_dir() / "remediate.lock", target=target.description):
            yield


def _remediable_check_ids() -> tuple[str, ...]:
    known = planners()
    return tuple(c.id for c in all_checks() if c.remediation in known)


def _matches(action: Action, globs: tuple[str, ...]) -> bool:
    return not globs or any(fnmatch.fnmatchcase(action.id, g) or fnmatch.fnmatchcase(action.finding, g)
                            for g in globs)


def plan(request: RemediationRequest, target: HostTarget,
         store: ProfileStore | None = None) -> tuple[Report, list[Action]]:
    config = request.audit.config
    store = store or ProfileStore(config.profile_dirs, config.overrides_file)
    # Audit only what an actuator can fix: no NVML or BMC reads for a host-only plan.
    audit = dataclasses.replace(request.audit, only=_remediable_check_ids())
    report = run_audit(audit, store)
    profile = store.profile(report.profile)
    context = _Context(profile, target, report.facts)
    table = planners()
    remediation_of = {c.id: c.remediation for c in all_checks()}
    actions: list[Action] = []
    seen: set[str] = set()
    for finding in report.findings:
        if finding.waiver is not None:
            continue
        # A skipped finding reaches its actuator only when the check asks for it
        # (a profile value this node cannot take: the plan must refuse it, not ignore it).
        if finding.status not in (Status.FAIL, Status.WARN, Status.UNKNOWN) and not (
                finding.status is Status.SKIP and finding.remediation):
            continue
        # An unknown finding (e.g. a sysctl the kernel lacks) goes to its actuator
        # too, which refuses it with the reason instead of silently skipping it.
        planner = table.get(finding.remediation or remediation_of.get(finding.check) or "")
        if planner is None:
            continue
        for action in planner(finding, context):
            if action.id in seen or not _matches(action, request.only):
                continue
            seen.add(action.id)
            action.finding_subject = finding.subject
            if action.refused is not None:
                action.outcome = Outcome.REFUSED
            elif action.action_class not in request.allow:
                action.outcome = Outcome.NOT_ALLOWED
                action.error = f"class {action.action_class.value} not allowed (--allow {action.action_class.value})"
            actions.append(action)
    return report, actions


def _before_state(target: HostTarget, change: Change) -> dict[str, Any]:
    return kind_of(change).before(target, change)


def _apply_change(target: HostTarget, change: Change) -> str | None:
    """Write one change; returns a note for the operator (e.g. the BMC's job), if any."""
    return kind_of(change).apply(target, change)


def _verify(target: HostTarget, action: Action) -> tuple[bool, Any]:
    observed: Any = None
    ok = True
    values = []
    for change in action.changes:
        try:
            verified = kind_of(change).verify(target, change, action.expectation)
        except VerifyError as exc:
            return False, str(exc)
        if verified is not None:
            ok = verified[0] and ok
            values.append(verified[1])
    if len(values) == 1 and isinstance(values[0], dict):
        observed = values[0]
    elif values:
        distinct = sorted({str(v) for v in values})
        observed = distinct[0] if len(distinct) == 1 else distinct
    return ok, observed


def _journal_stopped(actions: list[Action], after: Action, why: str) -> None:
    """The journal cannot take more entries: no later action is taken (each needs its before-state)."""
    for later in actions[actions.index(after) + 1:]:
        if later.outcome is Outcome.PLANNED:
            later.outcome, later.error = Outcome.FAILED, f"not applied: {why}"


def apply(request: RemediationRequest, target: HostTarget, actions: list[Action], journal: RunJournal) -> None:
    for action in actions:
        if action.outcome is not Outcome.PLANNED:
            continue
        undeclared = [c.path for c in action.changes if not may_write(action.actuator, c.path)]
        if undeclared:  # an actuator bug: rollback would refuse this journal entry, so never write it
            action.outcome, action.error = Outcome.FAILED, (
                f"actuator {action.actuator} does not declare {', '.join(undeclared)} among the paths it writes")
            continue
        try:
            states = [_before_state(target, c) for c in action.changes]
        except (OSError, ValueError) as exc:
            action.outcome, action.error = Outcome.FAILED, f"cannot read the before-state: {exc}"
            continue
        failpoint("before-journal")
        try:
            journal.append({"phase": "before", "action": action.id, "states": states})
        except JournalWriteError as exc:
            action.outcome, action.error = Outcome.FAILED, f"not applied: {exc}"
            _journal_stopped(actions, action, str(exc))
            return
        failpoint("after-journal")
        number = 0
        try:
            for number, change in enumerate(action.changes):
                if number == 1:
                    failpoint("mid-action")
                note = _apply_change(target, change)
                if note:
                    action.notes.append(note)
        except (OSError, ValueError) as exc:
            # The first write refused as unsupported changed nothing: rollback skips it (`not_applied`).
            unchanged = isinstance(exc, NotSupportedWrite) and number == 0
            action.outcome, action.error = (Outcome.REFUSED, f"{exc}: nothing was changed") if unchanged else (
                Outcome.FAILED, f"write failed: {exc}; `nodewarden rollback {journal.run_id}` restores the prior state")
            if not _record(journal, {"phase": "not_applied" if unchanged else "failed", "action": action.id,
                                     "error": str(exc)}):
                _journal_stopped(actions, action, "the journal is full or failing")
                return
            continue
        ok, observed = _verify(target, action)
        action.verified, action.observed_after = ok, observed
        action.outcome = Outcome.APPLIED if ok else Outcome.FAILED
        if not ok:
            action.error = f"re-read shows {observed}, expected {action.after}"
        if not _record(journal, {"phase": "done", "action": action.id, "verified": ok}):
            # Its before-state is durable, so rollback still restores it; nothing more is started.
            action.notes.append("the journal could not record completion (full?); rollback still restores it")
            _journal_stopped(actions, action, "the journal is full or failing")
            return


def _record(journal: RunJournal, entry: dict[str, Any]) -> bool:
    """An entry after a step (done, failed, finished): its loss hides nothing rollback needs."""
    try:
        journal.append(entry)
    except JournalWriteError:
        return False
    return True


def remediate(request: RemediationRequest, store: ProfileStore | None = None) -> RemediationResult:
    target = open_target(request.audit, writable=request.apply)
    try:
        return _remediate(request, target, store)
    finally:
        target.close()


def _remediate(request: RemediationRequest, target: HostTarget, store: ProfileStore | None) -> RemediationResult:
    state = StateDir(request.state_dir)
    if not request.apply:
        report, actions = plan(request, target, store)
        return RemediationResult("plan", target.description, report.profile, actions,
                                 simulated=request.audit.simulate)
    state.ensure()  # a state dir others could write is refused (exit 2) before anything else
    with target_lock(target):
        # Plan under the lock: a concurrent run could otherwise change what we read.
        report, actions = plan(request, target, store)
        result = RemediationResult("apply", target.description, report.profile, actions)
        if not any(a.outcome is Outcome.PLANNED for a in actions):
            return result
        run_id = new_run_id()
        journal = state.create_run(run_id, {"target": target.description, "profile": report.profile,
                                            "actions": [a.id for a in actions if a.outcome is Outcome.PLANNED]})
        result.run_id = run_id
        apply(request, target, actions, journal)
        _record(journal, {"phase": "finished"})
        if request.audit.simulate is None and request.audit.snapshot is None:  # a live node's own history
            _remember_remediation(request.state_dir, run_id, actions)
    # A reboot-class change is staged, not fixed: its finding stays until the reboot.
    fixed = {(a.finding, a.finding_subject) for a in actions
             if a.outcome is Outcome.APPLIED and a.action_class is not ActionClass.REBOOT}
    for finding in report.findings:
        if (finding.check, finding.subject) in fixed:
            result.findings.append({**finding.to_json(), "status": Status.FIXED.value})
    return result


def _remember_remediation(state_dir: Path, run_id: str, actions: list[Action]) -> None:
    """The run's applied actions into the node's ledger (history.node counts them: node_churn)."""
    applied = [a for a in actions if a.outcome is Outcome.APPLIED]
    if not applied:
        return
    from agent.engine.history import action_incident, record_action

    unwritten = record_action(state_dir, action_incident(
        "remediation", "remediate", run_id, ", ".join(sorted({a.finding for a in applied}))[:200],
        "; ".join(f"{a.id} {a.finding_subject}" for a in applied)[:500]))
    if unwritten:
        log.warning("the ledger did not record remediation run %s: %s", run_id, unwritten)


@dataclass
class RollbackResult:
    run_id: str
    target: str
    restored: list[str]
    already: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "target": self.target, "restored": self.restored,
                "already_rolled_back": self.already, "changed": bool(self.restored), "warnings": self.warnings}


def _restore(target: HostTarget, state: dict[str, Any]) -> None:
    kind = kind_named(state.get("kind"))
    assert kind is not None  # _check_restorable refused the journal otherwise
    kind.restore(target, state)


def _remove_leftover_temps(target: HostTarget, run: RunJournal) -> None:
    """A run killed inside an atomic replace leaves its temporary file beside the target: remove it."""
    paths = [str(state["path"]) for entry in run.before_states() for state in entry["states"]
             if (kind := kind_named(state.get("kind"))) is not None and kind.on_files]
    with contextlib.suppress(OSError):
        target.remove_leftover_temps(paths)


def _check_restorable(run: RunJournal) -> None:
    """Refuse (exit 2) a journal naming anything its actuator could not have written, before restoring any."""
    for entry in run.before_states():
        action = entry.get("action")
        name = action.partition(":")[0] if isinstance(action, str) else ""
        states = entry.get("states")
        if not isinstance(states, list):
            raise JournalError(f"run {run.run_id}: entry of {action!r} has no list of states",
                               path=str(run.entries_path))
        for state in states:
            problem = _foreign(name, state)
            if problem:
                raise JournalError(f"run {run.run_id} is refused: {problem}; nothing was restored. nodewarden "
                                   "restores only paths its actuators write (was the journal edited?)",
                                   path=str(run.entries_path))


def _foreign(actuator: str, state: Any) -> str | None:
    if not isinstance(state, dict) or not isinstance(state.get("path"), str):
        return f"{actuator or 'an entry'}: a state without a path"
    path, kind = state["path"], state.get("kind")
    if not may_write(actuator, path):
        return f"{path} is not a path actuator {actuator or '(none)'} writes"
    change_kind = kind_named(kind)
    if change_kind is None:
        return f"{path}: unknown kind of state {kind!r}"
    return change_kind.foreign(state)


def rollback(audit: AuditRequest, state_dir: Path, run_id: str | None) -> RollbackResult:
    target = open_target(audit, writable=True)
    try:
        return _rollback(target, StateDir(state_dir), run_id)
    finally:
        target.close()


def _rollback(target: HostTarget, state: StateDir, run_id: str | None) -> RollbackResult:
    with target_lock(target):
        run = state.open_run(run_id) if run_id else state.last_run(target.description)
        meta = run.meta()
        if meta.get("target") != target.description:
            raise RemediationError(f"run {run.run_id} changed {meta.get('target')}, not {target.description}; "
                                   "pass the same source options as to remediate")
        if run.rolled_back() is not None:
            return RollbackResult(run.run_id, target.description, [], already=True)
        _check_restorable(run)
        # First: a temporary file a kill left inside a folder the run created would keep that
        # folder from being removed below (found by the seeded SIGKILL test).
        _remove_leftover_temps(target, run)
        restored: list[str] = []
        unchanged = {e.get("action") for e in run.entries() if e.get("phase") == "not_applied"}
        for entry in reversed([e for e in run.before_states() if e.get("action") not in unchanged]):
            for item in reversed(entry["states"]):
                try:
                    _restore(target, item)
                except (OSError, ValueError) as exc:
                    # Restoring is idempotent: fix the cause and run rollback again.
                    raise RemediationError(f"cannot restore {item['path']}: {exc}; restored so far: "
                                           f"{', '.join(restored) or 'nothing'}; run rollback again") from None
                restored.append(str(item["path"]))
        unrecorded = run.mark_rolled_back(len(restored))
    result = RollbackResult(run.run_id, target.description, restored)
    if unrecorded:
        result.warnings.append(f"restored, but the journal could not record it ({unrecorded}); "
                               "a second rollback restores the same bytes again")
    return result
