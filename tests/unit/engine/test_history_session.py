"""The engine's ledger session (agent.engine.history): what a daemon poll reads back and remembers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.core.history import GpuRef, Incident, digest
from agent.core.history_rules import parse_rules
from agent.core.model import Finding, Severity, Status
from agent.engine.history import HistorySession, action_incident, record_action
from agent.sources.host import absent_host_facts
from agent.state.ledger import open_ledger

NOW = 1_800_000_000.0
D = 86400.0
RULES = parse_rules({
    "burst": {"kind": "xid", "scope": "gpu", "window": "1d", "count": 2, "severity": "critical", "reason": "r"},
    "churn": {"kinds": ["drain"], "scope": "node", "window": "7d", "count": 2, "sticky": True,
              "severity": "warning", "reason": "r"},
})
LONGER = parse_rules({"month": {"kind": "xid", "scope": "node", "window": "30d", "count": 1, "severity": "info",
                                "reason": "r"}})
GPU = GpuRef(0, "GPU-a", "S1")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    return folder


def _facts() -> object:
    from agent.core.facts import NodeFacts

    return NodeFacts(host=absent_host_facts("test"), kmsg=())


def _xid(at: float, n: int) -> Incident:
    return Incident(ts=at, kind="xid", source="kmsg", code="79", gpu=GPU, severity="critical", digest=digest(n))


def _held(session: HistorySession, rules: list, at: float) -> list[Incident]:  # type: ignore[type-arg]
    facts = _facts()
    session.observe(facts, rules, now=at)  # type: ignore[arg-type]
    history = facts.history  # type: ignore[attr-defined]
    assert history is not None
    return list(history.incidents)


def test_a_recording_session_sees_what_other_writers_add_between_polls(state: Path) -> None:
    daemon = HistorySession.open(state, source="daemon", writable=True)
    daemon.record([_xid(NOW - 3600, 1)], now=NOW)
    assert [i.digest for i in _held(daemon, RULES, NOW)] == [digest(1)]
    assert record_action(state, action_incident("drain", "health-check", "DRAIN", "node1", "gpu.lost gpu7",
                                                now=NOW - 60)) is None  # another process, another handle
    held = _held(daemon, RULES, NOW)
    assert [i.kind for i in held] == ["xid", "drain"]
    daemon.close()


def test_the_kept_window_moves_on_and_keeps_sticky_memory(state: Path) -> None:
    daemon = HistorySession.open(state, source="daemon", writable=True)
    memory = Incident(ts=NOW - 20 * D, kind="rule", source="ledger", code="churn", subject="|", digest=digest("m"))
    daemon.record([_xid(NOW - 3 * D, 1), _xid(NOW - 3600, 2), memory], now=NOW)
    assert {i.digest for i in _held(daemon, RULES, NOW)} == {digest(1), digest(2), digest("m")}
    later = NOW + 6 * D  # 7 days on: the first Xid is past every window; the memory stays
    assert {i.digest for i in _held(daemon, RULES, later)} == {digest(2), digest("m")}
    # a reload's longer rule reads the ledger again rather than answer from the shorter window it kept
    assert {i.digest for i in _held(daemon, LONGER, later)} == {digest(1), digest(2), digest("m")}
    daemon.close()


def test_a_sticky_firing_is_remembered_once_and_hardware_faults_once_per_boot(state: Path) -> None:
    daemon = HistorySession.open(state, source="daemon", writable=True)
    facts = _facts()
    facts.host = dataclasses.replace(facts.host, boot_id="boot-1")  # type: ignore[attr-defined]
    sticky = Finding(check="history.node", source="ledger", subject="churn", status=Status.FAIL, severity=Severity.WARNING,
                     message="churn: drain 2 times in 7d", observed=[{"rule": "churn", "sticky": True, "memory": "|",
                                                                       "first": "2027-01-15T00:00:00Z"}])
    psu = Finding(check="bmc.psu", source="redfish", subject="PS3", status=Status.FAIL, severity=Severity.CRITICAL, message="PS3 lost")
    for at in (NOW, NOW + 60, NOW + 120):  # three polls of the same state
        daemon.remember([sticky, psu], facts, now=at)  # type: ignore[arg-type]
    with open_ledger(state, readonly=True) as ledger:
        kinds = sorted(i.kind for i in ledger.window(0))
    assert kinds == ["psu", "rule"]
    facts.host = dataclasses.replace(facts.host, boot_id="boot-2")  # type: ignore[attr-defined]
    daemon.remember([psu], facts, now=NOW + 3 * D)  # type: ignore[arg-type]
    with open_ledger(state, readonly=True) as ledger:
        assert sorted(i.boot_id for i in ledger.window(0, kinds=("psu",))) == ["boot-1", "boot-2"]
    daemon.close()


def test_a_reader_without_a_ledger_says_so_and_writes_nothing(state: Path) -> None:
    reader = HistorySession.open(state, source="audit", writable=False)
    facts = _facts()
    reader.observe(facts, RULES, now=NOW)  # type: ignore[arg-type]
    assert facts.history is None  # type: ignore[attr-defined]
    status = facts.sources["ledger"]  # type: ignore[attr-defined]
    assert not status.ok and "no ledger yet" in status.error
    assert list(state.iterdir()) == []
