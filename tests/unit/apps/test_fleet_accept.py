"""Issue 25 item 4: the fleet report shows each node's acceptance; the CSV says when a waiver expired;
`nodewarden accept --format table` says it was an acceptance run.

The accept reports are made as `nodewarden accept` makes them: checks.accept and checks.accept_drift
judge hand-built recordings (tests/accept/test_accept_judgement.py), the audit's `Report` renders the
JSON, with the `acceptance` block agent.apps.accept.run adds. Everything goes through the real click CLI.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.series import Recording
from agent.policy.profiles import ProfileStore
from agent.report import render
from agent.report.model import Report
from checks.accept import judge
from checks.accept_drift import judge_drift
from tests.accept import mocknode
from tests.accept.test_accept_judgement import gpu, recording
from tests.conftest import RunCli
from tests.unit.apps.test_fleet import finding, report

PROFILE = ProfileStore().profile("hgx-h100-sxm")
NOW = "2026-12-03T12:00:00+00:00"
BASELINE_RUN = "20260601T100000Z-42"


def accept_report(host: str, started: str, run: str, *, hot_gpu: int | None = None, baseline: bool = True,
                  load: str = "command: gpu_burn 600") -> dict[str, Any]:
    """An acceptance run's JSON report: judged against the baseline run (all GPUs at 60 degC) when `baseline`."""
    then = recording()
    then.run_id = BASELINE_RUN
    gpus = [gpu(i, temp=68.0 if i == hot_gpu else 60.0) for i in range(8)]
    now: Recording = recording(*gpus)
    now.run_id = run
    findings = judge(now, PROFILE) + judge_drift(now, then if baseline else None, PROFILE)
    result = Report(node={"hostname": host, "model": "XE9680", "mode": "live"}, profile=PROFILE.name,
                    profile_chain=PROFILE.chain, started_at=started, duration_s=700.0, sources={},
                    findings=findings)
    passed = result.exit_code == 0
    result.extra["acceptance"] = {
        "run": run, "passed": passed, "baseline": BASELINE_RUN if baseline else (run if passed else None),
        "became_baseline": passed and not baseline,
        "load": {"kind": "command", "argv": ["gpu_burn", "600"], "described": load, "outcome": "ok"},
        "phases": {"idle": [0, 30], "ramp": [30, 40], "steady": [40, 640], "cooldown": [640, 700]},
        "xid_source": "nvml events", "notes": []}
    doc: dict[str, Any] = json.loads(render(result, "json"))
    return doc


def three_nodes(folder: Path) -> Path:
    """good: accepted against its baseline, no drift; hot: its newest acceptance failed with GPU3 drifting
    (an older passing one is on record too); bare: audited, never accepted."""
    folder.mkdir()
    audits = [report("good", [finding("gpu.ecc.mode", "gpu0", "pass")], started="2026-12-03T10:00:00+00:00"),
              report("hot", [finding("gpu.ecc.mode", "gpu0", "pass")], started="2026-12-03T10:00:00+00:00"),
              report("bare", [finding("gpu.ecc.mode", "gpu0", "fail", "critical")],
                     started="2026-12-03T10:00:00+00:00")]
    for doc in audits:
        (folder / f"{doc['node']['hostname']}.json").write_text(json.dumps(doc))
    docs = {"good-accept.json": accept_report("good", "2026-12-03T11:00:00+00:00", "20261203T110000Z-1"),
            "hot-accept-old.json": accept_report("hot", "2026-11-01T09:00:00+00:00", "20261101T090000Z-7"),
            "hot-accept.json": accept_report("hot", "2026-12-02T09:00:00+00:00", "20261202T090000Z-9", hot_gpu=3)}
    for name, doc in docs.items():
        (folder / name).write_text(json.dumps(doc))
    return folder


def test_fleet_json_pairs_each_node_with_its_newest_acceptance(run_cli: RunCli, tmp_path: Path) -> None:
    folder = three_nodes(tmp_path / "reports")
    result = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW)
    assert result.code == 0, result.stderr
    fleet = result.json()
    # The accept reports share the audit schema but are not audits: three nodes, three audit reports.
    assert (fleet["inputs"]["reports"], fleet["inputs"]["nodes"], fleet["inputs"]["skipped"]) == (3, 3, [])
    nodes = {n["node"]: n for n in fleet["nodes"]}
    assert (nodes["good"]["fail"], nodes["hot"]["fail"], nodes["bare"]["fail"]) == (0, 0, 1)
    good, hot, bare = (nodes[n]["acceptance"] for n in ("good", "hot", "bare"))
    assert good == {**good, "state": "accepted", "finished_at": "2026-12-03T11:11:40+00:00",
                    "baseline": BASELINE_RUN, "baseline_date": "2026-06-01", "compared_with_baseline": True,
                    "drift_findings": 0, "worst_drift": None, "stale": False,
                    "load": "command: gpu_burn 600, steady 600 s"}
    assert hot == {**hot, "state": "failed", "run": "20261202T090000Z-9", "drift_findings": 1,
                   "worst_drift": "GPU3 thermal resistance +13.3 %", "compared_with_baseline": True}
    assert bare["state"] == "none" and bare["finished_at"] is None
    block = fleet["acceptance"]
    assert (block["accepted"], block["failed"], block["none"], block["stale"], block["reports"]) == (1, 1, 1, 0, 3)
    assert [r["node"] for r in block["failed_nodes"]] == ["hot"] and block["without_audit"] == []


def test_fleet_csv_md_and_html_show_the_acceptance(run_cli: RunCli, tmp_path: Path) -> None:
    folder = three_nodes(tmp_path / "reports")
    out = {fmt: tmp_path / f"fleet.{fmt}" for fmt in ("csv", "md", "html")}
    for fmt, path in out.items():
        result = run_cli("fleet", "report", str(folder), "--format", fmt, "--output", str(path), "--now", NOW)
        assert result.code == 0, result.stderr
    rows = [r for r in csv.DictReader(io.StringIO(out["csv"].read_text())) if r["check"] == "acceptance"]
    by_node = {r["node"]: r for r in rows}
    assert {n: r["status"] for n, r in by_node.items()} == {"good": "accepted", "hot": "failed", "bare": "none"}
    assert json.loads(by_node["hot"]["observed"])["worst_drift"] == "GPU3 thermal resistance +13.3 %"
    assert by_node["hot"]["started_at"] == "2026-12-02T09:11:40+00:00"
    assert "none on record" in by_node["bare"]["message"] and by_node["bare"]["observed"] == ""
    assert sum(1 for r in csv.DictReader(io.StringIO(out["csv"].read_text())) if r["node"] == "hot") == 2

    md = out["md"].read_text()
    part = md.split("## Acceptance\n")[1].split("\n## ")[0]
    assert "1 nodes accepted, 1 failed, 1 none on record" in part
    lines = [line for line in part.splitlines() if line.startswith("| ") and "node" not in line]
    assert [line.split(" | ")[0] for line in lines] == ["| hot", "| bare", "| good"]  # failed first
    assert "drift: 1, worst GPU3 thermal resistance +13.3 %" in part
    assert f"baseline {BASELINE_RUN} of 2026-06-01 (compared); no drift; load command: gpu\\_burn 600" in part

    page = out["html"].read_text()
    assert '<h2 id="acceptance">Acceptance</h2>' in page and "<th>acceptance</th>" in page
    assert '<td class="crit">failed 2026-12-02T09:11:40+00:00' in page
    assert "<td>none on record</td>" in page and "<b class=\"crit\">1</b><span>acceptance failed</span>" in page
    assert "<script" not in page and "src=" not in page and "<link" not in page  # still self-contained


def test_an_old_acceptance_is_stale_by_the_configured_age(run_cli: RunCli, tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "old.json").write_text(json.dumps(report("old", [], started="2026-12-03T10:00:00+00:00")))
    (folder / "old-accept.json").write_text(json.dumps(accept_report("old", "2026-03-01T10:00:00+00:00", "r1")))
    (folder / "lone-accept.json").write_text(json.dumps(accept_report("lone", "2026-12-01T10:00:00+00:00", "r2")))
    fleet = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW).json()
    acc = fleet["nodes"][0]["acceptance"]
    assert (acc["state"], acc["stale"], acc["age_days"]) == ("accepted", True, 277.1)  # 2026-03-01T10:11:40 to 12-03T12:00
    assert fleet["acceptance"]["stale"] == 1 and [r["node"] for r in fleet["acceptance"]["stale_nodes"]] == ["old"]
    assert fleet["acceptance"]["without_audit"] == ["lone"]  # an acceptance without an audit is named, not a node
    longer = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW,
                     "--acceptance-stale-after", "365d").json()
    assert longer["nodes"][0]["acceptance"]["stale"] is False and longer["acceptance"]["stale_after_days"] == 365


def test_csv_says_expired_for_a_waiver_past_its_day(run_cli: RunCli, tmp_path: Path) -> None:
    """The table and JSON say a waiver expired by the report's date no longer waives (issue 26.4); so does the CSV."""
    folder = tmp_path / "reports"
    folder.mkdir()
    doc = report("a", [finding("gpu.ecc.mode", "gpu0", "fail", "critical",
                               waiver={"reason": "RMA open", "expires": "2026-12-02"}),
                       finding("bmc.firmware", "bmc", "fail", waiver={"reason": "booked", "expires": "2026-12-03"}),
                       finding("gpu.ecc.mode", "gpu1", "pass")], started="2026-12-01T10:00:00+00:00")
    (folder / "a.json").write_text(json.dumps(doc))
    result = run_cli("fleet", "report", str(folder), "--format", "csv", "--now", NOW)
    assert result.code == 0, result.stderr
    waived = {(r["check"], r["subject"]): r["waived"] for r in csv.DictReader(io.StringIO(result.stdout))}
    assert waived == {("gpu.ecc.mode", "gpu0"): "expired", ("bmc.firmware", "bmc"): "yes",
                      ("gpu.ecc.mode", "gpu1"): "no"}  # no accept report among the inputs: no acceptance row


def test_accept_table_header_says_accept_with_load_and_duration(run_cli: RunCli, empty_config: Path) -> None:
    doc = accept_report("n1", "2026-12-03T11:00:00+00:00", "r1", load="command: gpu_burn 600")
    result = Report(node={"hostname": "n1", "model": "XE9680", "mode": "live"}, profile="hgx-h100-sxm",
                    profile_chain=("hgx-h100-sxm",), started_at=doc["started_at"], duration_s=700.0, sources={},
                    findings=[], extra={"acceptance": doc["acceptance"]})
    header = render(result, "table").splitlines()[0]
    assert header.startswith("nodewarden accept (load command: gpu_burn 600, 700 s) of n1 (XE9680) with profile")
    audit = run_cli("--color", "never", "audit", "--config", str(empty_config), "--simulate", "hgx-h100-healthy",
                    "--format", "table")
    assert audit.stdout.startswith("nodewarden audit of ")  # audit's header as it was


@pytest.mark.nvml_mock
def test_real_accept_runs_in_a_fleet_report(run_cli: RunCli, tmp_path: Path) -> None:
    """Two real `nodewarden accept` runs on the mock NVML node (the baseline, then GPU3 8 degC hotter at the
    same power), beside an audit of that node: the fleet report shows the newest, failed, with its drift."""
    state, folder = tmp_path / "state", tmp_path / "reports"
    folder.mkdir()
    code, first = mocknode.run_accept(tmp_path, mocknode.write(tmp_path / "m1.yaml", mocknode.base_config()),
                                      state=state)
    assert code == 0, mocknode.failed(first)
    doc = mocknode.base_config()
    mocknode.device(doc, 3)["dynamic_metrics"] = mocknode.busy(temp_c=68)
    code, second = mocknode.run_accept(tmp_path, mocknode.write(tmp_path / "m2.yaml", doc), state=state)
    assert code == 1
    host = first["node"]["hostname"]
    for name, item in (("first.json", first), ("second.json", second),
                       ("audit.json", report(host, [finding("gpu.ecc.mode", "gpu0", "pass")],
                                             started=second["started_at"]))):
        (folder / name).write_text(json.dumps(item))
    fleet = run_cli("fleet", "report", str(folder), "--format", "json", "--now", second["started_at"]).json()
    assert fleet["inputs"]["reports"] == 1
    acc = fleet["nodes"][0]["acceptance"]
    assert acc == {**acc, "state": "failed", "run": second["acceptance"]["run"],
                   "baseline": first["acceptance"]["run"], "compared_with_baseline": True, "drift_findings": 1}
    assert acc["worst_drift"].startswith("GPU3 thermal resistance +") and acc["load"].startswith("none (observing")


def test_a_report_that_names_its_end_and_its_judge_is_read_by_them(run_cli: RunCli, tmp_path: Path) -> None:
    # A re-acceptance with --new-baseline: judged by the June baseline, then it became the baseline. Its report
    # says so (`compared_with`) and says when it ended (`finished_at`; a run can outlast its audit's duration).
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "n1.json").write_text(json.dumps(report("n1", [], started="2026-12-03T10:00:00+00:00")))
    doc = accept_report("n1", "2026-12-03T11:00:00+00:00", "20261203T110000Z-3")
    doc["acceptance"].update({"baseline": "20261203T110000Z-3", "became_baseline": True,
                              "compared_with": BASELINE_RUN, "finished_at": "2026-12-03T11:30:00+00:00"})
    (folder / "n1-accept.json").write_text(json.dumps(doc))
    fleet = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW).json()
    acc = fleet["nodes"][0]["acceptance"]
    assert (acc["finished_at"], acc["compared_with"], acc["compared_with_baseline"]) == (
        "2026-12-03T11:30:00+00:00", BASELINE_RUN, True)
    md = run_cli("fleet", "report", str(folder), "--format", "md", "--now", NOW).stdout
    assert f"compared with baseline {BASELINE_RUN}, then became the baseline 20261203T110000Z-3" in md
    doc["acceptance"]["compared_with"] = ["not", "text"]  # hostile: a per-file error, the rest goes on
    (folder / "n1-accept.json").write_text(json.dumps(doc))
    result = run_cli("fleet", "report", str(folder), "--format", "json", "--now", NOW)
    assert result.code in (0, 1), result.stderr
    fleet = result.json()
    assert "acceptance" not in fleet["nodes"][0] and fleet["inputs"]["nodes"] == 1
    assert "compared_with" in json.dumps(fleet["inputs"]["skipped"])
