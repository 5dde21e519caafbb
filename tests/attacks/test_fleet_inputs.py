"""Hostile files among a fleet report's inputs: an accept report with wrong types, 10 MB of it, nesting
deeper than any report, markup in its text. Each broken file is a per-file error (skipped, with the
reason), never a crash, and never stands in for the node's audit or its good acceptance run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import RunCli
from tests.unit.apps.test_fleet import finding, report
from tests.unit.apps.test_fleet_accept import NOW, accept_report


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def hostile(good: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Accept reports for node `n1`, each broken one way (all newer than the good one)."""
    def variant(**acceptance: Any) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(json.dumps(good))
        doc["started_at"] = "2026-12-03T11:30:00+00:00"
        doc["acceptance"].update(acceptance)
        return doc

    not_object = variant()
    not_object["acceptance"] = "yes"
    bad_host = variant()
    bad_host["node"]["hostname"] = ["n1"]
    long_run = variant()
    long_run["duration_s"] = 1e300
    stray = variant()
    stray["findings"].append("not a finding")
    huge = variant()
    huge["findings"].append({**good["findings"][0], "message": "A" * (10 << 20)})
    deep = variant()
    deep["acceptance"]["load"] = _nested(200)
    return {"not-object.json": not_object, "passed-text.json": variant(passed="true"), "run-number.json":
            variant(run=123), "bad-host.json": bad_host, "long-run.json": long_run, "stray.json": stray,
            "huge.json": huge, "deep.json": deep}


def test_broken_accept_reports_are_per_file_errors(run_cli: RunCli, tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "n1.json").write_text(json.dumps(report("n1", [finding("gpu.ecc.mode", "gpu0", "pass")],
                                                      started="2026-12-03T10:00:00+00:00")))
    good = accept_report("n1", "2026-12-03T11:00:00+00:00", "20261203T110000Z-1")
    (folder / "n1-accept.json").write_text(json.dumps(good))
    broken = hostile(good)
    for name, doc in broken.items():
        (folder / name).write_text(json.dumps(doc))
    assert (folder / "huge.json").stat().st_size > 10 << 20
    result = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW)
    assert result.code == 0, result.stderr
    fleet = result.json()
    reasons = {Path(s["path"]).name: s["reason"] for s in fleet["inputs"]["skipped"]}
    assert set(reasons) == set(broken)
    assert "not an object" in reasons["not-object.json"]
    assert "`passed`" in reasons["passed-text.json"] and "`run`" in reasons["run-number.json"]
    assert "hostname" in reasons["bad-host.json"] and "duration_s" in reasons["long-run.json"]
    assert "not an object" in reasons["stray.json"]
    assert "too big for an acceptance report" in reasons["huge.json"]
    assert "unreadable JSON" in reasons["deep.json"]
    (node,) = fleet["nodes"]
    assert (node["node"], node["fail"], node["started_at"]) == ("n1", 0, "2026-12-03T10:00:00+00:00")  # its audit
    assert node["acceptance"]["run"] == "20261203T110000Z-1" and node["acceptance"]["state"] == "accepted"
    assert fleet["acceptance"]["reports"] == 1


def test_markup_in_an_accept_report_stays_text(run_cli: RunCli, tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "n1.json").write_text(json.dumps(report("n1", [], started="2026-12-03T10:00:00+00:00")))
    doc = accept_report("n1", "2026-12-03T11:00:00+00:00", "r1", load="<script>alert(1)</script>\x1b[31m")
    (folder / "n1-accept.json").write_text(json.dumps(doc))
    page = run_cli("fleet", "report", str(folder), "--format", "html", "--now", NOW).stdout
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in page and "\x1b" not in page
    rows = run_cli("fleet", "report", str(folder), "--format", "csv", "--now", NOW).stdout
    assert "\x1b" not in rows and "load <script>" in rows
