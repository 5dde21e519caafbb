"""Issue 30.3: no resume without positive evidence. A drain keeps the checks and subjects that caused
it (agent.apps.scheduler.trail.Memory); a resume needs each back as `pass` in the summary's results, and an
unknown, skip or absent one is undecided. The real-Slurm case is in tests/integration/test_scheduler_slurm.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import pytest

from agent.apps.scheduler.answer import SUMMARY_SCHEMA, Answer, SummaryError, parse_summary
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm import act
from agent.apps.scheduler.slurm_cli import NodeState, Slurm
from agent.apps.scheduler.trail import Memory, recall, remember

PSU = ("bmc.psu", "PS1 Status")


def summary(verdict: str, *results: list[str]) -> Answer:
    return parse_summary({"schema": SUMMARY_SCHEMA, "verdict": verdict, "actions": [], "results": list(results)},
                         "state file")


class FakeSlurm:
    """The node as Slurm shows it, and the updates asked for (the adapter itself is tested on a real slurmctld)."""

    def __init__(self, state_dir: Path, reason: str) -> None:
        # Our drain, as Slurm shows it and as the gate marked it (issue 30.4's proof of ownership, where
        # NodeState carries who set the reason and when; a gate that goes by the prefix ignores both).
        proof: dict[str, Any] = {"reason_user": "root", "reason_time": 1700000000}
        known = {f.name for f in dataclasses.fields(NodeState)}
        self.state = NodeState("n1", frozenset({"IDLE", "DRAIN"}), reason, ("gpu",),
                               **{k: v for k, v in proof.items() if k in known})
        (state_dir / "scheduler").mkdir(mode=0o700, exist_ok=True)
        (state_dir / "scheduler" / "drain-n1.json").write_text(json.dumps(
            {"reason": reason, "user": proof["reason_user"], "at": proof["reason_time"]}))
        self.updates: list[list[str]] = []
        self.seen: dict[str, NodeState] = {"n1": self.state}

    def node(self, name: str) -> NodeState:
        return self.state

    def call(self, argv: list[str]) -> str:
        self.updates.append(argv)
        return ""

    def update_argv(self, name: str, state: str, reason: str | None = None) -> list[str]:
        return ["scontrol", "update", f"NodeName={name}", f"State={state}"]

    def partition_reasons(self, partition: str) -> dict[str, str]:
        return {"n1": ""}


def test_the_summary_carries_each_result_and_a_pass_never_hides_a_failure() -> None:
    answer = summary("DRAIN", ["bmc.psu", "PS1 Status", "pass", ""], ["bmc.psu", "PS1 Status", "fail", "drains"],
                     ["gpu.lost", "gpu0", "pass", ""])
    assert answer.results[PSU] == ("fail", "drains")
    assert answer.causes(degraded_drains=False) == (PSU,)
    assert answer.undecided((PSU, ("gpu.lost", "gpu0"), ("bmc.fans", "bmc"))) == [
        "bmc.psu PS1 Status: fail", "bmc.fans bmc: absent"]
    assert summary("OK").results == {}  # a summary from before results: nothing can come back as pass
    with pytest.raises(SummaryError, match="a result is not"):
        summary("OK", ["bmc.psu", "PS1 Status", "pass"])


def test_degraded_causes_count_only_where_degraded_drains() -> None:
    answer = summary("DEGRADED", ["sysctl", "vm.zone_reclaim_mode", "fail", "degrades"])
    assert answer.causes(degraded_drains=False) == ()
    assert answer.causes(degraded_drains=True) == (("sysctl", "vm.zone_reclaim_mode"),)


def test_a_drains_causes_survive_between_runs_and_hostile_ones_are_dropped(tmp_path: Path) -> None:
    remember(tmp_path, "n1", Memory(1, 1700000000.0, (PSU,)))
    assert recall(tmp_path, "n1") == Memory(1, 1700000000.0, (PSU,))
    path = tmp_path / "scheduler" / "slurm-n1.json"
    for causes in ("bmc.psu", [["bmc.psu"]], [[1, 2]], [["bmc.psu", "x" * 201]], [PSU] * 65):
        path.write_text(json.dumps({"healthy": 1, "drained_at": 1.0, "causes": causes}))
        assert recall(tmp_path, "n1").causes == (), causes  # no causes: never resumed on its own


@pytest.mark.parametrize(("status", "resumed"), [("pass", True), ("unknown", False), ("skip", False),
                                                 (None, False)])
def test_resume_needs_each_cause_back_as_pass(tmp_path: Path, status: str | None, resumed: bool) -> None:
    settings = HealthSettings(state_dir=tmp_path, resume_after=1)
    remember(tmp_path, "n1", Memory(0, 1700000000.0, (PSU,)))
    slurm = FakeSlurm(tmp_path, "nodewarden: bmc.psu PS1 Status: failed")
    results: list[Any] = [["gpu.lost", "gpu0", "pass", ""]] + ([[*PSU, status, ""]] if status else [])
    decision = act(summary("OK", *results), "n1", settings, dry_run=False, slurm=cast(Slurm, slurm))
    assert (decision.action == "resume") is resumed, decision
    assert bool(slurm.updates) is resumed
    if not resumed:
        assert f"undecided: bmc.psu PS1 Status: {status or 'absent'}" in decision.why
        assert recall(tmp_path, "n1") == Memory(0, 1700000000.0, (PSU,))  # the streak broken, the causes kept
    else:
        assert recall(tmp_path, "n1") == Memory()


def test_a_drain_with_no_recorded_cause_is_left_for_an_operator(tmp_path: Path) -> None:
    slurm = FakeSlurm(tmp_path, "nodewarden: gpu.lost gpu7: a drain whose memory was lost")
    decision = act(summary("OK", ["gpu.lost", "gpu7", "pass", ""]), "n1",
                   HealthSettings(state_dir=tmp_path, resume_after=1), dry_run=False, slurm=cast(Slurm, slurm))
    assert decision.action == "none" and "causes are not recorded" in decision.why
    assert slurm.updates == []
