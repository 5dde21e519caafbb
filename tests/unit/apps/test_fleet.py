"""`nodewarden fleet report`: arithmetic, bad input, every output format, the HTML in a real browser."""

from __future__ import annotations

import copy
import csv
import datetime as dt
import importlib.util
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.apps.fleet import FleetOptions, build_fleet, newest_per_node, summarize_report
from agent.apps.fleet.prometheus import read_prometheus
from agent.apps.fleet.render import render_html, render_md
from tests.conftest import REPO, RunCli
from tests.daemon_peer import running_daemon
from tests.integration.test_daemon import prometheus

__all__ = ["prometheus"]
NOW = "2026-11-29T12:00:00+00:00"


def finding(check: str, subject: str, status: str, severity: str = "warning", observed: Any = None,
            waiver: dict[str, str] | None = None) -> dict[str, Any]:
    return {"check": check, "subject": subject, "status": status, "severity": severity, "observed": observed,
            "expected": None, "message": f"{check} {subject} {status}", "waiver": waiver}


def report(host: str, findings: list[dict[str, Any]], started: str = "2026-11-29T11:00:00+00:00",
           profile: str = "hgx-h100-sxm", sources: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": "nodewarden.report/v1", "node": {"hostname": host, "model": "XE9680"}, "profile": profile,
            "started_at": started, "sources": sources or {"host": {"ok": True, "configured": True}},
            "findings": findings, "summary": {}}


def fleet_of(reports: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    nodes = [summarize_report(r, f"{r['node']['hostname']}-{i}.json") for i, r in enumerate(reports)]
    kept, duplicates = newest_per_node(nodes)
    return build_fleet(kept, [], duplicates, FleetOptions(now=dt.datetime.fromisoformat(NOW), **options))


# ---- arithmetic ----

def test_skipped_and_waived_findings_never_count_as_failures() -> None:
    waiver = {"reason": "RMA open", "expires": "2026-12-05"}
    fleet = fleet_of([
        report("a", [finding("gpu.ecc.mode", "gpu0", "pass"), finding("host.thp.enabled", "node", "skip")]),
        report("b", [finding("gpu.ecc.mode", "gpu0", "fail", "critical", waiver=waiver)]),
        report("c", [finding("gpu.ecc.mode", "gpu0", "fail", "critical"), finding("gpu.ecc.mode", "gpu1", "pass")]),
    ])
    assert fleet["summary"]["nodes"] == 3 and fleet["summary"]["compliant"] == 2
    assert fleet["summary"]["compliant_pct"] == pytest.approx(66.7)
    assert fleet["summary"]["failing_findings_by_severity"] == {"critical": 1, "warning": 0, "info": 0}
    ecc = next(r for r in fleet["by_check"] if r["check"] == "gpu.ecc.mode")
    assert (ecc["nodes"], ecc["failing"]) == (3, 1)
    (waived,) = fleet["waivers"]
    assert (waived["node"], waived["expiring_soon"]) == ("b", True)  # 6 days out, within 14
    assert [r["node"] for r in fleet["worst_nodes"]] == ["c"]


def test_a_waiver_expired_by_the_reports_date_no_longer_waives(run_cli: RunCli, tmp_path: Path) -> None:
    """Issue 26.4: node reports waived on 2026-12-01, the fleet report made on 2026-12-03."""
    expired = {"reason": "RMA open", "expires": "2026-12-02"}
    last_day = {"reason": "BIOS update booked", "expires": "2026-12-03"}  # still valid through its day
    reports = [
        report("a", [finding("gpu.ecc.mode", "gpu0", "fail", "critical", waiver=expired),
                     finding("host.sysctl", "vm.swappiness", "warn", waiver=expired)],
               started="2026-12-01T10:00:00+00:00"),
        report("b", [finding("bmc.firmware", "bmc", "fail", waiver=last_day)], started="2026-12-01T10:00:00+00:00"),
    ]
    now = "2026-12-03T09:00:00+00:00"
    folder = tmp_path / "reports"
    folder.mkdir()
    for item in reports:
        (folder / f"{item['node']['hostname']}.json").write_text(json.dumps(item))
    result = run_cli("fleet", "report", str(folder), "--format", "json", "--now", now)  # workers, as operators run it
    assert result.code == 0, result.stderr
    nodes = [summarize_report(r, f"{r['node']['hostname']}.json") for r in reports]
    direct = build_fleet(nodes, [], [], FleetOptions(now=dt.datetime.fromisoformat(now)))
    for fleet in (result.json(), direct):
        by_check = {(w["node"], w["check"]): w for w in fleet["waivers"]}
        gone = by_check[("a", "gpu.ecc.mode")]
        assert (gone["expired"], gone["expiring_soon"]) == (True, False)
        assert (by_check[("b", "bmc.firmware")]["expired"], by_check[("b", "bmc.firmware")]["expiring_soon"]) == (
            False, True)
        assert [w["expired"] for w in fleet["waivers"]] == [True, True, False]  # expired listed first
        summary = fleet["summary"]
        assert (summary["waivers_expired"], summary["waivers_expiring_soon"]) == (2, 1)
        # The expired waiver's findings count again: a fails its critical check, b stays waived.
        assert summary["compliant"] == 1 and summary["failing_findings_by_severity"]["critical"] == 1
        nodes_by_name = {n["node"]: n for n in fleet["nodes"]}
        assert (nodes_by_name["a"]["compliant"], nodes_by_name["a"]["fail"], nodes_by_name["a"]["warn"]) == (False, 1, 1)
        assert nodes_by_name["b"]["compliant"] is True
        ecc = next(r for r in fleet["by_check"] if r["check"] == "gpu.ecc.mode")
        assert ecc["failing"] == 1
        assert [(w["node"], w["top"]) for w in fleet["worst_nodes"]] == [("a", ["gpu.ecc.mode gpu0"])]
    page = render_html(direct)
    assert "2026-12-02 (soon)" not in page and "2026-12-02 (expired)" in page and "Expired (2)" in page
    assert "2026-12-03 (soon)" in page
    md = render_md(direct)
    assert "### Expired (2)" in md
    expired_part, in_force = md.split("### Expired (2)")[1].split("### In force")
    assert "2026-12-02" in expired_part and "2026-12-02" not in in_force and "2026-12-03" in in_force


def test_each_node_counts_once_and_the_newest_report_wins() -> None:
    old = report("a", [finding("host.sysctl", "vm.swappiness", "fail")], started="2026-11-28T08:00:00+00:00")
    new = report("a", [finding("host.sysctl", "vm.swappiness", "pass")], started="2026-11-29T10:00:00+00:00")
    fleet = fleet_of([new, old, report("b", [finding("host.sysctl", "vm.swappiness", "pass")])])
    assert fleet["summary"]["nodes"] == 2 and fleet["summary"]["compliant"] == 2  # the old failure is superseded
    (duplicate,) = fleet["inputs"]["duplicates"]
    assert duplicate["node"] == "a" and duplicate["used"] == "a-0.json" and duplicate["ignored"] == ["a-1.json"]
    assert fleet["inputs"]["reports"] == 3


def test_firmware_drift_names_the_nodes_on_the_oldest_version() -> None:
    reports = [report(f"n{i}", [finding("bmc.firmware", "bmc", "pass", observed="7.10.50.00")]) for i in range(6)]
    reports.append(report("old-one", [finding("bmc.firmware", "bmc", "fail", observed="5.00.00.00")]))
    reports.append(report("a100", [finding("bmc.firmware", "bmc", "pass", observed="4.0")], profile="dgx-a100"))
    fleet = fleet_of(reports)
    assert fleet["firmware_drift"] == ["bmc bmc [hgx-h100-sxm]"]  # an A100 on other firmware is not drift
    versions = fleet["firmware"]["bmc bmc [hgx-h100-sxm]"]
    assert [(v["version"], v["nodes"], v["oldest"]) for v in versions] == [("5.00.00.00", 1, True),
                                                                          ("7.10.50.00", 6, False)]
    assert versions[0]["node_names"] == ["old-one"]


def test_thermal_outliers_are_judged_per_slot_and_profile() -> None:
    reports = [report(f"n{i}", [finding("gpu.temperature", "gpu5", "pass", observed=40 + (i % 2)),
                                finding("gpu.temperature", "gpu0", "pass", observed=35)]) for i in range(9)]
    reports.append(report("hot", [finding("gpu.temperature", "gpu5", "pass", observed=49),
                                  finding("gpu.temperature", "gpu0", "pass", observed=36)]))
    reports.append(report("a100", [finding("gpu.temperature", "gpu5", "pass", observed=60)], profile="dgx-a100"))
    fleet = fleet_of(reports)
    assert [(r["node"], r["slot"], r["above_median_c"]) for r in fleet["thermal_outliers"]] == [("hot", "gpu5", 8.5)]  # median 40.5


def test_xids_stale_missing_and_sources_down() -> None:
    fleet = fleet_of([
        report("a", [finding("gpu.xid", "gpu7", "fail", "critical", observed={"79": 1})]),
        report("b", [finding("gpu.xid", "gpu1", "fail", "critical", observed={"79": 2, "48": 1})],
               started="2026-11-27T12:00:00+00:00"),
        report("c", [finding("gpu.xid", "gpu0", "pass", observed={})],
               sources={"redfish": {"ok": False, "configured": True, "error": "timed out"},
                        "ipmi": {"ok": False, "configured": False, "error": "not configured"}}),
    ], expected_nodes=["a", "b", "c", "d"])
    assert [(r["xid"], r["nodes"], r["events"]) for r in fleet["xids"]] == [(79, 2, 3), (48, 1, 1)]
    assert [(r["node"], r["age_hours"]) for r in fleet["stale"]] == [("b", 48.0)]
    assert fleet["missing"] == ["d"]
    assert fleet["not_audited"] == [{"node": "c", "sources": {"redfish": "timed out"}}]


def test_a_foreign_or_broken_report_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="not a nodewarden audit report"):
        summarize_report({"schema": "something/v2"}, "x.json")
    with pytest.raises(ValueError, match="lacks `node` or `findings`"):
        summarize_report({"schema": "nodewarden.report/v1"}, "x.json")
    with pytest.raises(ValueError, match="not an object with a `check`"):
        summarize_report(report("a", [42]), "x.json")  # type: ignore[list-item]


# ---- the command over files ----

def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("fleet_generator", REPO / "benchmarks" / "fleet_generator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def synthetic_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "reports"
    _generator().generate(out, nodes=60, seed=7)
    return out


def test_broken_files_are_listed_and_the_report_goes_on(run_cli: RunCli, synthetic_fleet: Path) -> None:
    result = run_cli("fleet", "report", str(synthetic_fleet), "--format", "json", "--now", NOW)
    assert result.code == 0, result.stderr
    fleet = result.json()
    assert fleet["summary"]["nodes"] == 60 and len(fleet["inputs"]["duplicates"]) == 2
    assert sorted(Path(s["path"]).name for s in fleet["inputs"]["skipped"]) == [
        "broken-0.json", "broken-1.json", "broken-2.json"]
    assert result.stderr.count("warning: skipped") == 3


def test_empty_or_unusable_input_exits_2(run_cli: RunCli, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("fleet", "report", str(empty), "--format", "json")
    assert result.code == 2 and "no usable audit report among 0 file(s)" in result.stderr
    (empty / "x.json").write_text("{")
    result = run_cli("fleet", "report", str(empty), "--format", "json")
    assert result.code == 2 and "(1 skipped)" in result.stderr
    assert run_cli("fleet", "report", "--format", "json").code == 2


def test_csv_has_a_row_per_finding_and_round_trips(run_cli: RunCli, synthetic_fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.csv"
    assert run_cli("fleet", "report", str(synthetic_fleet), "--format", "csv", "--output", str(out)).code == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    expected = 0
    for path in synthetic_fleet.glob("gpu-*.json"):
        if not path.name.endswith(".old.json"):
            expected += len(json.loads(path.read_text())["findings"])
    assert len(rows) == expected
    xid = next(r for r in rows if r["check"] == "gpu.xid" and r["status"] == "fail")
    assert json.loads(xid["observed"])  # JSON cells read back as the values they were
    assert {r["node"] for r in rows} == {f"gpu-{i:05d}" for i in range(60)}


def test_json_and_markdown_outputs(run_cli: RunCli, synthetic_fleet: Path, tmp_path: Path) -> None:
    result = run_cli("fleet", "report", str(synthetic_fleet), "--format", "json", "--now", NOW)
    fleet = result.json()
    assert json.loads(json.dumps(fleet)) == fleet and fleet["schema"] == "nodewarden.fleet/v1"
    assert fleet["summary"]["nodes"] == len(fleet["nodes"])
    md = run_cli("fleet", "report", str(synthetic_fleet), "--format", "md", "--now", NOW).stdout
    assert md.startswith("# nodewarden fleet report") and "## Firmware drift" in md
    assert f"**{fleet['summary']['compliant_pct']} % compliant**" in md


# ---- the HTML page, opened in headless Chromium ----

def test_html_is_self_contained_and_renders_in_chromium(run_cli: RunCli, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is missing: run `.venv/bin/python -m tests.peers.setup` (Debian package chromium)"
    reports = tmp_path / "reports"
    _generator().generate(reports, nodes=30, seed=3)
    page = tmp_path / "fleet.html"
    assert run_cli("fleet", "report", str(reports), "--format", "html", "--output", str(page), "--now", NOW).code == 0
    text = page.read_text()
    assert not re.search(r"<script|<link|@import|url\(|src=", text)  # nothing loaded from anywhere
    assert set(re.findall(r"https?://[^\"' )]+", text)) <= {"http://www.w3.org/2000/svg"}
    shot = tmp_path / "fleet.png"
    profile = tmp_path / "chromium-profile"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    proc = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False).stdout
    assert dom.count("<svg") >= 3  # compliance, firmware and Xid charts at least
    assert 'id="node-gpu-00000"' in dom and re.search(r'href="#node-gpu-\d{5}"', dom)  # per-node anchors


# ---- the same findings from Prometheus ----

def test_fleet_report_from_prometheus(run_cli: RunCli, tmp_path: Path, prometheus: Any) -> None:
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted") as daemon:
        prometheus.start(daemon.url.removeprefix("http://"))
        prometheus.wait('nodewarden_xid_errors_total{gpu="7"}')
        prometheus.wait("nodewarden_audit_timestamp_seconds")
        prometheus.wait('nodewarden_source_pending{source="redfish"} == 0')
        prometheus.wait('nodewarden_checks{check="bmc.psu"}')
        result = run_cli("fleet", "report", "--prometheus", prometheus.url, "--format", "json")
        (from_prometheus,) = read_prometheus(prometheus.url, keep_rows=True)
    assert result.code == 0, result.stderr
    # The same node as its audit file says it, from one series per problem and per-check counts.
    from_file = summarize_report(json.loads(run_cli("audit", "--simulate", "hgx-h100-drifted",
                                                    "--format", "json").stdout), "drifted.json")
    assert from_prometheus.counts == from_file.counts and from_prometheus.checks == from_file.checks
    # Prometheus names a firmware group as the table does (issue 26.9), the report by its grouping key
    named = {"psu.slot.#|power supply.slot.#": "Power Supply.Slot.1\u20136"}
    assert {(r.check, r.subject, r.status) for r in from_prometheus.failing} == {
        (r.check, named.get(r.subject, r.subject), r.status) for r in from_file.failing}
    assert {r.status for r in from_prometheus.rows} == {"fail", "warn"}  # passing findings have no series
    fleet = result.json()
    (node,) = fleet["nodes"]
    assert node["node"] == "127.0.0.1" and node["profile"] == "hgx-h100-sxm" and node["compliant"] is False
    assert any(r["check"] == "gpu.xid" and r["failing"] == 1 for r in fleet["by_check"])
    assert fleet["xids"][0]["xid"] == 79
    assert "nvidia driver [hgx-h100-sxm]" in fleet["firmware"]


def test_report_files_and_prometheus_agree_on_a_node(run_cli: RunCli, tmp_path: Path) -> None:
    drifted = json.loads(run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "json").stdout)
    node = summarize_report(copy.deepcopy(drifted), "x.json")
    assert node.fails == drifted["summary"]["fail"]
    assert set(node.xids) == {79} and node.temperatures["gpu0"] > 0
    assert not node.compliant


def test_baselines_are_summarised() -> None:
    fleet = fleet_of([
        report("a", [finding("baseline.drift", "gpu5:temperature", "fail", observed=9.0)]),
        report("b", [finding("baseline.drift", "gpu0:temperature", "pass", observed=1.0)]),
        report("c", [finding("gpu.temperature", "gpu0", "pass", observed=35)]),
    ])
    baselines = fleet["baselines"]
    assert (baselines["nodes_with_baseline"], baselines["nodes_without_baseline"]) == (2, 1)
    assert [(r["node"], r["subject"], r["status"]) for r in baselines["drifting"]] == [("a", "gpu5:temperature", "fail")]


def test_progress_bar_only_on_a_terminal() -> None:
    from agent.apps.fleet import progress_bar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress_bar(io.StringIO()) is None  # a pipe or log file stays clean
    stream = Tty()
    show = progress_bar(stream)
    assert show is not None
    show(5, 10)
    show(10, 10)
    out = stream.getvalue()  # click's bar (issue 32.6: the importer's, not one drawn by hand)
    assert "reading reports" in out and "5/10" in out and "10/10" in out and out.endswith("\n")
