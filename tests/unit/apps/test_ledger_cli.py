"""`nodewarden ledger show|export|clear` through the real click CLI (issue 33.4)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.core.history import GpuRef, Incident, digest
from agent.state.ledger import open_ledger

NOW = time.time()
A = GpuRef(3, "GPU-aaaa", "1650924000001")
B = GpuRef(3, "GPU-bbbb", "1650924000002")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    with open_ledger(folder) as ledger:
        ledger.record([
            Incident(ts=NOW - 3 * 86400, kind="xid", source="kmsg", code="79", gpu=A, subject="0000:19:00.0",
                     severity="critical", boot_id="b1", detail="NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off",
                     digest=digest(1)),
            Incident(ts=NOW - 3600, kind="xid", source="kmsg", code="31", gpu=B, subject="0000:19:00.0",
                     severity="warning", boot_id="b2", detail="NVRM: Xid 31", digest=digest(2)),
            Incident(ts=NOW - 40 * 86400, kind="rule", source="ledger", code="node_churn", subject="|",
                     severity="warning", digest=digest(3)),
            Incident(ts=NOW - 60, kind="drain", source="health-check", code="DRAIN", subject="node1",
                     detail="gpu.lost gpu7", digest=digest(4)),
        ], now=NOW)
    return folder


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_show_filters_by_window_kind_and_gpu(state: Path) -> None:
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--format", "json")
    assert code == 0
    assert [i["kind"] for i in json.loads(out)["incidents"]] == ["xid", "xid", "drain"]  # 7 days by default
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--since", "all", "--kind", "rule",
                        "--format", "json")
    assert [i["code"] for i in json.loads(out)["incidents"]] == ["node_churn"]
    for wanted in (A.serial, A.uuid, "aaaa"):  # by serial, by UUID, by UUID without its GPU- prefix
        code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--gpu", wanted, "--format", "json")
        assert [i["code"] for i in json.loads(out)["incidents"]] == ["79"], wanted
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--gpu", "3", "--format", "json")
    assert len(json.loads(out)["incidents"]) == 2  # the slot: both boards that sat in it


def test_show_as_a_table_and_export_as_json_lines(state: Path, tmp_path: Path) -> None:
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--format", "table")
    assert code == 0 and "3 incidents" in out and "1650924000001" in out and "GPU has fallen off" in out
    code, out, _ = _run("ledger", "export", "--state-dir", str(state), "--since", "all")
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 4 and lines[0]["kind"] == "rule" and lines[-1]["kind"] == "drain"
    assert lines[1]["gpu"] == {"index": 3, "uuid": "GPU-aaaa", "serial": "1650924000001"}
    target = tmp_path / "out.jsonl"
    assert _run("ledger", "export", "--state-dir", str(state), "--output", str(target))[0] == 0
    assert len(target.read_text().splitlines()) == 3


def test_a_reader_creates_nothing_where_there_is_no_ledger(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    code, out, _ = _run("ledger", "show", "--state-dir", str(empty), "--format", "json")
    assert code == 0 and json.loads(out)["incidents"] == [] and "no ledger yet" in json.loads(out)["note"]
    assert _run("ledger", "export", "--state-dir", str(empty)) == (0, "", "")
    assert _run("ledger", "clear", "--rule", "node_churn", "--state-dir", str(empty))[0] == 0  # a dry run
    assert list(empty.iterdir()) == []


def test_clear_is_a_dry_run_unless_applied_and_is_itself_recorded(state: Path) -> None:
    before = (state / "ledger.db").read_bytes()
    code, _, err = _run("ledger", "clear", "--rule", "node_churn", "--state-dir", str(state))
    assert code == 0 and "dry run: would clear rule node_churn (1 sticky firings held)" in err
    assert (state / "ledger.db").read_bytes() == before
    code, _, err = _run("ledger", "clear", "--rule", "node_churn", "--state-dir", str(state), "--apply")
    assert code == 0 and "cleared rule node_churn" in err
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--kind", "clear", "--format", "json")
    [clear] = json.loads(out)["incidents"]
    assert clear["code"] == "node_churn" and clear["subject"] == "*" and clear["detail"].startswith("cleared by ")
    code, out, _ = _run("ledger", "show", "--state-dir", str(state), "--since", "all", "--format", "json")
    assert len(json.loads(out)["incidents"]) == 5  # nothing deleted


def test_clear_for_one_gpu_names_its_board(state: Path) -> None:
    code, _, err = _run("ledger", "clear", "--rule", "fatal_xid_burst", "--gpu", "3", "--state-dir", str(state))
    assert code == 2 and "names 2 boards" in err  # the slot held two boards: which one is the operator's to say
    code, _, _ = _run("ledger", "clear", "--rule", "fatal_xid_burst", "--gpu", "GPU-aaaa", "--state-dir", str(state),
                      "--apply")
    assert code == 0
    _, out, _ = _run("ledger", "show", "--state-dir", str(state), "--kind", "clear", "--format", "json")
    assert json.loads(out)["incidents"][0]["subject"] == A.serial  # what the rule counts by


@pytest.mark.parametrize("args", [("--since", "7 days"), ("--since", "-1d"), ("--kind", "nope")])
def test_bad_arguments_are_usage_errors(state: Path, args: tuple[str, ...]) -> None:
    assert _run("ledger", "show", "--state-dir", str(state), *args)[0] == 2


@pytest.mark.parametrize("rule", ["Node_Churn", "a;b", "../x", "x" * 80])
def test_clear_validates_the_rule_name(state: Path, rule: str) -> None:
    assert _run("ledger", "clear", "--rule", rule, "--state-dir", str(state), "--apply")[0] == 2


def test_a_snapshot_ledger_is_read_in_place(state: Path, tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "ledger.db").write_bytes((state / "ledger.db").read_bytes())
    code, out, _ = _run("ledger", "show", "--snapshot", str(snap), "--since", "all", "--format", "json")
    assert code == 0 and len(json.loads(out)["incidents"]) == 4
    (snap / "ledger.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 4000)
    code, _, err = _run("ledger", "show", "--snapshot", str(snap))
    assert code == 3 and "ledger" in err


def test_health_check_decisions_are_kept_whole_and_shown_by_their_why(tmp_path: Path) -> None:
    from agent.apps.scheduler.trail import record

    folder = tmp_path / "hc"
    folder.mkdir(mode=0o700)
    for n, (action, why) in enumerate([("none", "healthy 1 of 2 since our drain"), ("drain", "gpu.lost gpu7"),
                                       ("breaker", "9 of 10 nodes drained: held back")]):
        assert record(folder, {"at": NOW - 60 + n, "node": "gpu17", "action": action, "why": why,
                               "argv": ["scontrol", "update"]}) is None
    code, out, _ = _run("ledger", "export", "--state-dir", str(folder))
    assert code == 0
    kept = [json.loads(line) for line in out.splitlines()]
    assert [(k["kind"], k["code"], k["severity"]) for k in kept] == [
        ("decision", "none", "info"), ("drain", "drain", "warning"), ("decision", "breaker", "critical")]
    assert json.loads(kept[1]["detail"]) == {"at": NOW - 59, "node": "gpu17", "action": "drain",
                                             "why": "gpu.lost gpu7", "argv": ["scontrol", "update"]}
    code, out, _ = _run("ledger", "show", "--state-dir", str(folder), "--format", "table")
    assert code == 0 and "healthy 1 of 2 since our drain" in out and '{"at"' not in out
    assert not (folder / "scheduler" / "decisions.jsonl").exists()  # the ledger replaced it
