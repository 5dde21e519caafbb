"""`nodewarden health-check`: the scheduler's gate. One entry point, `run_health_check`.

The verdict (agent.report.verdict's one rule) comes from the daemon's state file when one exists and
is fresh (well under a second), else from a one-shot audit in a child process killed at the
deadline (agent.apps.scheduler.oneshot). One deadline (health_check.deadline_s, below slurmd's 60 s kill)
covers the whole run: the audit gets what is left less one Slurm call's worth, each scontrol/sinfo
call what is left after it (agent.apps.scheduler.slurm_cli). No verdict (stale state file, deadline hit)
means nothing is done: not drained, not resumed, exit Unknown. Then one of: print it (plain), act through scontrol
(`--slurm`, agent.apps.scheduler.slurm), or answer node-problem-detector (`--npd`, agent.apps.scheduler.npd).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from dataclasses import dataclass, field

from agent.apps.scheduler.answer import Answer, reading
from agent.apps.scheduler.npd import npd_line
from agent.apps.scheduler.settings import Deadline, HealthSettings
from agent.apps.scheduler.state import foreign_state, read_state, write_decision
from agent.engine.audit import AuditRequest
from agent.sources.snapshot import simulated_path

__all__ = ["EXIT_BAD", "EXIT_OK", "EXIT_UNKNOWN", "HealthRequest", "Outcome", "answer_for", "run_health_check",
           "valid_node_name"]

EXIT_OK, EXIT_BAD, EXIT_UNKNOWN = 0, 1, 3  # plain and --slurm; --npd has its own (0, 1, 2)
RECORDING = "one-shot audit of the recording, not the daemon's state file"
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # never "-x": it reaches scontrol's argv


def valid_node_name(name: str) -> bool:
    return NODE_NAME.fullmatch(name) is not None


@dataclass
class HealthRequest:
    audit: AuditRequest  # what the one-shot audit reads (live, --snapshot, --simulate)
    settings: HealthSettings
    node: str
    mode: str = "plain"  # plain, slurm, npd
    dry_run: bool = False
    event: bool = False  # the event-driven gate (agent.apps.scheduler.trigger): the daemon's word only, drains only


@dataclass
class Outcome:
    exit_code: int
    lines: list[str] = field(default_factory=list)
    answer: Answer | None = None


def audit_budget(request: HealthRequest, deadline: Deadline) -> float:
    """What the one-shot audit may take of the run's one deadline: all that is left, less (with
    --slurm) one Slurm call's worth for scontrol and sinfo, which share the rest."""
    left = deadline.left()
    return left - min(request.settings.slurm_timeout_s, left / 2) if request.mode == "slurm" else left


def answer_for(request: HealthRequest, deadline: Deadline | None = None) -> Answer:
    """The verdict from the daemon's fresh state file, or from a bounded one-shot audit."""
    deadline = deadline or Deadline(request.settings.deadline_s)
    audit = request.audit
    judged = (reading("simulated", simulated_path(audit.simulate)) if audit.simulate
              else reading("snapshot", audit.snapshot) if audit.snapshot else "live")
    if request.event and not request.settings.daemon_state:
        return Answer(None, RECORDING, "a recording has no daemon: the event gate acts on the daemon's word only")
    if not request.settings.daemon_state:  # a recording: audited once (agent.apps.scheduler.settings)
        from agent.apps.scheduler.oneshot import audit_once

        return dataclasses.replace(audit_once(request.audit, audit_budget(request, deadline)), how=RECORDING)
    answer = read_state(request.settings.state_dir, request.settings.max_age_s, judged=judged)
    if answer is not None:
        return answer
    if request.event:  # started by the daemon's verdict change: without its state file there is nothing to act on
        return Answer(None, "state file", "no daemon state file: the event gate acts on the daemon's word only")
    from agent.apps.scheduler.oneshot import audit_once  # only without a daemon: the engine loads here

    answer = audit_once(request.audit, audit_budget(request, deadline))
    other = foreign_state(request.settings.state_dir, judged)
    if other is not None:  # a daemon's file of another reading: ignored, and said (never silently)
        answer = dataclasses.replace(answer, how=f"{answer.how}; the state file in {request.settings.state_dir} "
                                     f"judged {other}, not this node: ignored")
    return answer


def _said(answer: Answer) -> str:
    if answer.verdict is None:
        return f"UNKNOWN ({answer.how}): {answer.why}"
    age = f", {answer.age_s:.0f} s old" if answer.age_s is not None else ""
    worst = f": {answer.worst()}" if answer.actions else ""
    return f"{answer.verdict} ({answer.how}{age}){worst}"


def run_health_check(request: HealthRequest) -> Outcome:
    deadline = Deadline(request.settings.deadline_s)  # one for the whole run: audit and every Slurm call
    answer = answer_for(request, deadline)
    settings = request.settings
    if request.mode == "npd":
        line, code = npd_line(answer, settings)
        return Outcome(code, [line], answer)
    code = EXIT_UNKNOWN if answer.verdict is None else EXIT_BAD if settings.bad(answer.verdict) else EXIT_OK
    if request.mode != "slurm":
        return Outcome(code, [_said(answer)], answer)
    from agent.apps.scheduler.slurm import act
    from agent.apps.scheduler.trail import record

    decision = act(answer, request.node, settings, dry_run=request.dry_run, deadline=deadline,
                   drain_only=request.event)
    lines = [_said(answer)]
    if request.dry_run:
        lines.append(f"dry run: would run: {shlex.join(decision.argv)}" if decision.argv
                     else f"dry run: {decision.action}: {decision.why}")
        return Outcome(EXIT_UNKNOWN if decision.action in ("unknown", "failed") else code, lines, answer)
    lines.append(f"slurm {request.node}: {decision.action}: {decision.why}")
    now = time.time()
    entry = {"at": round(now, 3), "node": request.node, "action": decision.action, "verdict": answer.verdict,
             "trigger": "event" if request.event else "periodic",
             "how": answer.how, "why": decision.why, **({"argv": decision.argv} if decision.argv else {}),
             **({"gpus": answer.drained_gpus()} if answer.drained_gpus() and decision.action == "drain" else {})}
    unwritten = record(settings.state_dir, entry)  # the ledger: history.node counts the drains (node_churn)
    if unwritten:
        lines.append(f"warning: the ledger did not keep this decision: {unwritten}")
    try:
        write_decision(settings.state_dir, {"at": now, "node": request.node, "verdict": answer.verdict,
                                            "action": decision.action if decision.action in
                                            ("drain", "resume", "none", "breaker") else "none",
                                            "why": decision.why})
    except Exception as exc:  # noqa: BLE001 - the decision is made; only its metric is lost
        lines.append(f"warning: could not record the decision: {exc}")
    if decision.action in ("unknown", "failed"):
        return Outcome(EXIT_UNKNOWN, lines, answer)
    return Outcome(code, lines, answer)
