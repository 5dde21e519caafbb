"""Issue 30.12: the gate's whole decision matrix through the pure `policy.decide`, without Slurm.

Each row: what was read (verdict, the node as Slurm shows it, the mark, memory, the cluster, the
acceptance result) and the plan that must come out, with the memory it keeps. The adapter that
carries plans out is tested against a real slurmctld in tests/integration/test_scheduler_slurm.py."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from agent.apps.scheduler.answer import SUMMARY_SCHEMA, Answer, parse_summary
from agent.apps.scheduler.ownership import Mark
from agent.apps.scheduler.policy import Plan, Seen, decide, reason_for
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm_cli import NodeState
from agent.apps.scheduler.trail import Memory

NOW = 1_800_000_000.0
AT = 1_799_999_000  # when Slurm stamped our drain
PSU = ("bmc.psu", "PS1 Status")
GPU = ("gpu.lost", "gpu7")


def answer(verdict: str | None, **status: str) -> Answer:
    """A summary whose PSU and GPU results have the given status (`psu="fail"`); a bad one drains."""
    if verdict is None:
        return Answer(None, "state file", "state file stale")
    keys = {"psu": PSU, "gpu": GPU}
    results = [[*keys[k], s, "drains" if s == "fail" else ""] for k, s in status.items()]
    actions = [{"action": "drain node", "severity": "critical", "checks": ["bmc.psu"], "subjects": ["PS1 Status"], "message": "failed",
                "drains": True}] if verdict == "DRAIN" else []
    return parse_summary({"schema": SUMMARY_SCHEMA, "verdict": verdict, "actions": actions, "results": results},
                         "state file")


BAD = answer("DRAIN", psu="fail", gpu="pass")
REASON = reason_for(BAD)
MARK = Mark(REASON, "root", AT)


def node(flags: str = "IDLE", reason: str = "", partitions: tuple[str, ...] | None = ("gpu",),
         user: str = "root", at: int = AT, name: str = "n1") -> NodeState:
    return NodeState(name, frozenset(flags.split("+")), reason, partitions, user if reason else "",
                     at if reason else 0)


OURS = node("IDLE+DRAIN", REASON)
PEERS = {f"p{i}": node("IDLE", name=f"p{i}") for i in range(20)}  # a 21-node partition: limit 5 (min nodes)
FULL = {**PEERS, **{f"p{i}": node("IDLE+DRAIN", f"nodewarden: x {i}", name=f"p{i}") for i in range(5)}}
DRAINED = Memory(0, AT, (PSU,))


class Row(NamedTuple):
    why: str
    answer: Answer
    state: NodeState | None
    expect: str  # the plan's action
    expect_memory: Memory | None
    mark: Mark | None = MARK
    memory: Memory = Memory()
    view: dict[str, NodeState] = PEERS
    accepted: tuple[bool, str] = (True, "passed")
    settings: dict[str, object] = {}
    says: str = ""  # a part of the plan's why


ROWS = [
    Row("no verdict", answer(None), None, "unknown", Memory(0, AT, (PSU,)), memory=Memory(1, AT, (PSU,)),
        says="cannot decide"),
    Row("Slurm not read", BAD, None, "unknown", Memory()),
    Row("healthy, nothing of ours", answer("OK", psu="pass"), node(), "none", Memory(0, None)),
    Row("bad, idle: drain", BAD, node(), "drain", Memory(0, NOW, (PSU,))),
    Row("bad, DOWN: hands off", BAD, node("DOWN+DRAIN", "Not responding", user="slurm"), "none", Memory(),
        says="DOWN"),
    Row("bad, MAINT: hands off", BAD, node("IDLE+MAINT"), "none", Memory(), says="MAINT"),
    Row("bad, reboot asked: hands off", BAD, node("IDLE+REBOOT_REQUESTED"), "none", Memory(), says="REBOOT"),
    Row("bad, power saving: hands off", BAD, node("IDLE+POWERED_DOWN"), "none", Memory()),
    Row("admin's drain", BAD, node("IDLE+DRAIN", "maint: PSU swap", user="admin"), "none", Memory(),
        says="not nodewarden's"),
    Row("admin's look-alike drain", answer("OK", psu="pass"),
        node("IDLE+DRAIN", "nodewarden: held by admin - RMA 4711", user="admin"), "none", Memory(0, AT, (PSU,)),
        memory=DRAINED, says="not nodewarden's"),
    Row("our reason edited", answer("OK", psu="pass"), node("IDLE+DRAIN", REASON + " (admin)"), "none",
        Memory(0, AT, (PSU,)), memory=DRAINED, says="not nodewarden's"),
    Row("our reason re-set by another user", answer("OK", psu="pass"), node("IDLE+DRAIN", REASON, user="admin"),
        "none", Memory(0, AT, (PSU,)), memory=DRAINED),
    Row("our reason re-set later", answer("OK", psu="pass"), node("IDLE+DRAIN", REASON, at=AT + 60), "none",
        Memory(0, AT, (PSU,)), memory=DRAINED),
    Row("mark lost", answer("OK", psu="pass"), OURS, "none", Memory(0, AT, (PSU,)), mark=None, memory=DRAINED,
        says="not nodewarden's"),
    Row("a reason on an undrained node", BAD, node("IDLE", "maint: next week", user="admin"), "none", Memory()),
    Row("bad, already ours: kept, causes grow", answer("DRAIN", gpu="fail"), OURS, "none",
        Memory(0, AT, (PSU, GPU)), memory=DRAINED, says="already drained by nodewarden"),
    Row("bad, no partition read", BAD, node(partitions=None), "unknown", None, says="no partition"),
    Row("bad, in no partition", BAD, node(partitions=()), "unknown", None, says="no partition"),
    Row("bad, breaker open", BAD, node(), "breaker", Memory(), view=FULL, says="circuit breaker open"),
    Row("bad, breaker open in a second partition", BAD, node(partitions=("cpu", "gpu")), "breaker", Memory(),
        view=FULL),
    Row("bad, breaker of a bigger limit", BAD, node(), "drain", Memory(0, NOW, (PSU,)), view=FULL,
        settings={"breaker_min_nodes": 6}),
    Row("DEGRADED, drain_on DRAIN", answer("DEGRADED"), node(), "none", Memory(0, None)),
    Row("DEGRADED, drain_on DEGRADED", answer("DEGRADED"), node(), "drain", Memory(0, NOW, ()),
        settings={"drain_on": "DEGRADED"}),
    Row("ours, cause back, 1 of 2", answer("OK", psu="pass"), OURS, "none", Memory(1, AT, (PSU,)),
        memory=DRAINED, says="healthy 1 of 2"),
    Row("ours, cause back, 2 of 2: resume", answer("OK", psu="pass"), OURS, "resume", Memory(0, None),
        memory=Memory(1, AT, (PSU,))),
    Row("ours, cause unknown", answer("OK", psu="unknown"), OURS, "none", Memory(0, AT, (PSU,)),
        memory=Memory(1, AT, (PSU,)), says="undecided: bmc.psu PS1 Status: unknown"),
    Row("ours, cause skipped", answer("OK", psu="skip"), OURS, "none", Memory(0, AT, (PSU,)),
        memory=Memory(1, AT, (PSU,)), says="skip"),
    Row("ours, cause absent", answer("OK", gpu="pass"), OURS, "none", Memory(0, AT, (PSU,)),
        memory=Memory(1, AT, (PSU,)), says="absent"),
    Row("ours, DEGRADED is not evidence", answer("DEGRADED", psu="unknown"), OURS, "none",
        Memory(0, AT, (PSU,)), memory=Memory(1, AT, (PSU,)), says="undecided"),
    Row("ours, causes never recorded", answer("OK", psu="pass"), OURS, "none", Memory(0, AT, ()),
        memory=Memory(1, AT, ()), says="resume it by hand"),
    Row("ours, drain time lost: from now", answer("OK", psu="pass"), OURS, "none", Memory(1, NOW, (PSU,)),
        memory=Memory(0, None, (PSU,))),
    Row("ours, acceptance missing", answer("OK", psu="pass"), OURS, "none", Memory(2, AT, (PSU,)),
        memory=Memory(1, AT, (PSU,)), accepted=(False, "no acceptance run since the drain"),
        settings={"require_accept": True}, says="waits for acceptance"),
    Row("ours, acceptance passed", answer("OK", psu="pass"), OURS, "resume", Memory(0, None),
        memory=Memory(1, AT, (PSU,)), settings={"require_accept": True}),
    Row("ours, acceptance not asked", answer("OK", psu="pass"), OURS, "resume", Memory(0, None),
        memory=Memory(1, AT, (PSU,)), accepted=(False, "none")),
    Row("ours but DOWN now", answer("OK", psu="pass"), node("DOWN+DRAIN", REASON), "none", Memory(0, AT, (PSU,)),
        memory=Memory(1, AT, (PSU,)), says="DOWN"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.why for r in ROWS])
def test_the_decision_matrix(row: Row, tmp_path: Path) -> None:
    settings = HealthSettings(state_dir=tmp_path, **row.settings)  # type: ignore[arg-type]
    seen = Seen(row.answer, row.state, row.memory, row.mark, row.view, row.accepted, NOW)
    plan = decide(seen, settings)
    assert (plan.action, plan.memory) == (row.expect, row.expect_memory), plan
    assert row.says in plan.why, plan
    assert decide(seen, settings) == plan  # pure: the same reading, the same plan
    assert list(tmp_path.iterdir()) == []  # and nothing written


def test_a_drain_plan_carries_its_reason_and_what_to_keep_if_it_is_undone(tmp_path: Path) -> None:
    memory = Memory(0, None, (GPU,))
    plan = decide(Seen(BAD, node(), memory, None, PEERS, (True, ""), NOW), HealthSettings(state_dir=tmp_path))
    assert plan == Plan("drain", f"DRAIN: {REASON}", Memory(0, NOW, (GPU, PSU)), Memory(0, None, (GPU,)), REASON)
    assert plan.reason.startswith("nodewarden: bmc.psu PS1 Status") and len(plan.reason) <= 100


def test_a_resume_that_fails_keeps_the_streak(tmp_path: Path) -> None:
    plan = decide(Seen(answer("OK", psu="pass"), OURS, Memory(1, AT, (PSU,)), MARK, PEERS, (True, ""), NOW),
                  HealthSettings(state_dir=tmp_path))
    assert (plan.action, plan.otherwise) == ("resume", Memory(2, AT, (PSU,)))
