"""The rules, dashboard and Alertmanager example on the drifted node's real metrics, both deployments.

* the exposition of `nodewarden audit --simulate hgx-h100-drifted --format prom` (what node_exporter's
  textfile collector serves, job "node") and the daemon's /metrics for the same node (job
  "nodewarden") become promtool input series: the alerts that fire are counted (at most 8 per node)
  and named;
* a real Prometheus scrapes both and the dashboard's panels show the node for each job;
* monitoring/alertmanager.yml passes `amtool check-config`, routes by severity, and a real
  Alertmanager inhibits what its comments say.

Needs promtool, prometheus and amtool/alertmanager (Debian packages prometheus and
prometheus-alertmanager); without them these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.daemon_peer import running_daemon
from tests.integration.test_monitoring import (
    INSTALL_HINT,
    RULES,
    PromServer,
    free_tcp_port,
    panel_targets,
    promtool,
    substitute,
    tool,
)
from tests.peers import processes

ALERTMANAGER_CONFIG = REPO / "monitoring" / "alertmanager.yml"
TEXTFILE = {"job": "node", "instance": "drifted:9100"}  # node_exporter's textfile collector
DAEMON = {"job": "nodewarden", "instance": "drifted:9847"}
MAX_ALERTS_PER_NODE = 8
# What fires for the drifted node once every `for:` has passed: one alert per action.
DRIFTED_ALERTS = {
    ("NodewardenNodeCritical", "critical"),  # gpu.lost, gpu.xid, gpu.nvlink.links, fabric.manager, bmc.events
    ("NodewardenPsuFailed", "critical"),  # PS3 and the lost redundancy
    ("NodewardenFirmwareMismatch", "warning"),  # the BMC, the driver downgrade, CUDA
    ("NodewardenTuningDrift", "warning"),  # sysctls, THP, governor, persistence, power limit, MTU, ACS, BIOS
    ("NodewardenNodeWarning", "warning"),  # the rails, thermal imbalance, the BMC's health rollup
}


def _text(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode in (0, 1), proc.stderr  # 1: the drifted node fails checks
    return proc.stdout


@pytest.fixture(scope="module")
def drifted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The drifted node's exposition, as the textfile collector and as the daemon serve it."""
    audit = _text(subprocess.run([sys.executable, "-m", "agent", "audit", "--simulate", "hgx-h100-drifted",
                                  "--format", "prom"], cwd=REPO, capture_output=True, text=True, timeout=120,
                                 check=False))
    tmp = tmp_path_factory.mktemp("daemon")
    with running_daemon(tmp, "--simulate", "hgx-h100-drifted") as daemon:
        body = daemon.wait_for(lambda: next((b for s, b in [daemon.scrape()] if s == 200 and 'nodewarden_source_pending'
                                             '{source="redfish"} 0.0' in b), None), what="every source read")
    return {"textfile": audit, "daemon": body}


def _series(text: str, target: dict[str, str]) -> list[dict[str, str]]:
    """promtool input series: every sample held for 3 hours, timestamps advancing with time()."""
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            labels = {**sample.labels, **target}
            selector = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            fresh = sample.name.endswith("_timestamp_seconds") and sample.value > 0
            values = "0+60x180" if fresh else f"{sample.value:g}x180"
            found.append({"series": f"{sample.name}{{{selector}}}", "values": values})
    return found


def test_the_drifted_node_raises_a_handful_of_alerts(drifted: dict[str, str], tmp_path: Path) -> None:
    series = [*_series(drifted["textfile"], TEXTFILE), *_series(drifted["daemon"], DAEMON)]
    for target in (TEXTFILE, DAEMON):
        series.append({"series": f'up{{job="{target["job"]}", instance="{target["instance"]}"}}', "values": "1x180"})
    assert len(series) > 500
    per_node = f'count by (instance) (ALERTS{{alertstate="firing"}}) <= bool {MAX_ALERTS_PER_NODE}'
    checks: list[dict[str, Any]] = [
        {"expr": per_node, "eval_time": at, "exp_samples": [
            {"labels": f'{{instance="{t["instance"]}"}}', "value": 1} for t in (TEXTFILE, DAEMON)]}
        for at in ("6m", "20m", "40m", "70m", "2h", "3h")]
    checks.append({"expr": 'count by (instance, alertname, severity) (ALERTS{alertstate="firing"})', "eval_time": "2h",
                   "exp_samples": [{"labels": f'{{instance="{t["instance"]}", alertname="{name}", severity="{sev}"}}',
                                    "value": 1} for t in (TEXTFILE, DAEMON) for name, sev in sorted(DRIFTED_ALERTS)]})
    # The daemon counted the boot's Xid 79 at start: new to Prometheus for ten minutes.
    checks.append({"expr": 'ALERTS{alertname="NodewardenXidCritical", alertstate="firing"}', "eval_time": "6m",
                   "exp_samples": [{"labels": 'ALERTS{alertname="NodewardenXidCritical", alertstate="firing", '
                                              f'severity="critical", job="nodewarden", instance="{DAEMON["instance"]}"}}',
                                    "value": 1}]})
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"name": "drifted node", "interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    path = tmp_path / "drifted_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert "SUCCESS" in result.stdout


# --- both deployments on a real Prometheus --------------------------------------------------------------


@pytest.fixture(scope="module")
def scraped(drifted: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """A Prometheus scraping the drifted node as job "node" (textfile) and job "nodewarden" (daemon)."""
    bodies = {"/textfile": drifted["textfile"].encode(), "/daemon": drifted["daemon"].encode()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path.split("?", 1)[0])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exporter.server_address[1]}"
    workdir = tmp_path_factory.mktemp("prometheus-scrape")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": job, "metrics_path": path, "static_configs": [{"targets": [target]}]}
                           for job, path in (("node", "/textfile"), ("nodewarden", "/daemon"))]}))
    port = free_tcp_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = processes.spawn([tool("prometheus"), f"--config.file={config}",
                                   f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=out, stderr=subprocess.STDOUT)
    server = PromServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 30
        while not _results(server, "count by (job) (nodewarden:check_failing:count)", 2):
            assert process.poll() is None, server.log_tail()
            assert time.monotonic() < deadline, f"no recorded findings for both jobs:\n{server.log_tail()}"
            time.sleep(0.25)
        yield server
    finally:
        exporter.shutdown()
        processes.stop(process, timeout_s=10)


def _results(server: PromServer, expr: str, at_least: int = 1) -> list[dict[str, Any]]:
    try:
        status, body = server.query(expr)
    except OSError:
        return []
    assert status == 200, (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result if len(result) >= at_least else []


# Panels that show the drifted node from the audit's textfile alone (the others need the daemon's
# GPU, BMC and timestamp series, or events: Xids, drift between nodes, a target or source down; a
# stat at its `or vector(0)` does not count as showing the node).
TEXTFILE_PANELS = {"Failing nodes", "Critical findings", "GPUs lost", "Nodes reporting",
                   "Critical findings (not waived)", "Power and cooling problems", "Failing findings per node",
                   "nodewarden versions and profiles", "Failing checks across the fleet", "Findings", "Sources",
                   "Checks", "Firmware", "Audit age and duration"}
DAEMON_PANELS = TEXTFILE_PANELS | {"Firmware versions", "Hottest GPUs", "Lowest thermal margin", "GPU temperature",
                                   "GPU thermal margin", "GPU power and enforced limit", "GPU up", "ECC errors (volatile)",
                                   "Row remaps", "NVLink active links", "PCIe link width", "PSU and fan health",
                                   "BMC temperatures"}


@pytest.mark.parametrize(("job", "expected"), [("node", TEXTFILE_PANELS), ("nodewarden", DAEMON_PANELS)])
def test_the_dashboard_shows_the_node_for_either_job(scraped: PromServer, job: str, expected: set[str]) -> None:
    showing: set[str] = set()
    for where, expr in panel_targets():
        concrete = substitute(expr).replace('job=~"nodewarden"', f'job=~"{job}"')
        concrete = concrete.replace('instance=~"(gpu-node-1:9847|gpu-node-2:9100)"', 'instance=~".+"')
        concrete = concrete.replace('gpu=~"0"', 'gpu=~".+"')
        if any(float(sample["value"][1]) != 0 or "vector(0)" not in expr for sample in _results(scraped, concrete)):
            showing.add(where.split("'")[1])
    assert showing >= expected, f"job {job}: panels without data: {sorted(expected - showing)}"
    assert _results(scraped, f'nodewarden_build_info{{job=~"{job}"}}')  # the $instance variable lists the node
    (lost,) = _results(scraped, f'sum(nodewarden_checks{{job=~"{job}", check="gpu.lost", status="fail"}})')
    assert float(lost["value"][1]) == 1  # GPU 7 fell off the bus, whichever way it was scraped


# --- Alertmanager --------------------------------------------------------------------------------------


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("amtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def test_alertmanager_example_is_valid_and_routes_by_severity() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    for labels, receiver in ((["alertname=NodewardenNodeCritical", "severity=critical", "instance=n1"], "gpu-oncall"),
                             (["alertname=NodewardenTuningDrift", "severity=warning", "instance=n1"], "gpu-tickets"),
                             (["alertname=SomethingElse", "severity=critical"], "default")):
        result = amtool("config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
                        f"--verify.receivers={receiver}", *labels)
        assert result.returncode == 0, (labels, result.stdout + result.stderr)
    route = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["route"]["routes"][0]
    assert route["group_by"] == ["instance", "severity"]  # one notification per node and severity


def _alertmanager_binary() -> str:
    found = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
    if found is None:
        pytest.fail(f"alertmanager not found on PATH: {INSTALL_HINT.replace('prometheus', 'prometheus-alertmanager')}",
                    pytrace=False)
    return found


def test_alertmanager_inhibits_a_down_nodes_alerts_and_warnings_under_criticals(tmp_path: Path) -> None:
    port = free_tcp_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    process = processes.spawn([_alertmanager_binary(), f"--config.file={ALERTMANAGER_CONFIG}",
                               f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                               "--cluster.listen-address="], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/api/v2"
    sent = {
        "down": {"alertname": "NodewardenDaemonDown", "severity": "warning", "job": "nodewarden", "instance": "n1"},
        "n1 critical": {"alertname": "NodewardenNodeCritical", "severity": "critical", "job": "nodewarden",
                        "instance": "n1"},
        "n2 critical": {"alertname": "NodewardenNodeCritical", "severity": "critical", "job": "nodewarden",
                        "instance": "n2"},
        "n2 firmware critical": {"alertname": "NodewardenFirmwareMismatch", "severity": "critical", "job": "nodewarden",
                                 "instance": "n2"},
        "n2 firmware warning": {"alertname": "NodewardenFirmwareMismatch", "severity": "warning", "job": "nodewarden",
                                "instance": "n2"},
        "n2 tuning": {"alertname": "NodewardenTuningDrift", "severity": "warning", "job": "nodewarden", "instance": "n2"},
    }
    expected = {"down": "active", "n1 critical": "suppressed", "n2 critical": "active",
                "n2 firmware critical": "active", "n2 firmware warning": "suppressed", "n2 tuning": "active"}
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
                    f"{base}/alerts", data=json.dumps([{"labels": labels, "annotations": {"summary": name}}
                                                       for name, labels in sent.items()]).encode(),
                    headers={"Content-Type": "application/json"}, method="POST")
                with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - 127.0.0.1 only
                    assert response.status == 200
                with urllib.request.urlopen(f"{base}/alerts", timeout=5) as response:  # noqa: S310
                    states = {a["annotations"]["summary"]: a["status"]["state"] for a in json.loads(response.read())}
            except (urllib.error.URLError, OSError):
                states = {}
            if states == expected or time.monotonic() > deadline:
                break
            assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()[-3000:]
            time.sleep(0.25)
        assert states == expected
    finally:
        processes.stop(process, timeout_s=10)
        log.close()
