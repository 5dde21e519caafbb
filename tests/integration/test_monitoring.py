"""monitoring/: the Grafana dashboard, on a real Prometheus, and the tools the monitoring tests share.

* the dashboard's structure (variables, rows, panel grid, drill-down queries) and its value mappings,
  which must be the codes agent/ writes (docs/metrics.md);
* every dashboard expression (Grafana variables replaced by concrete values) is parsed by a real
  Prometheus server started for this module (`prometheus_server`): a parse error is HTTP 400
  `bad_data`. The same server loads the rules file and must evaluate every rule without error.

The rules, their promtool unit tests and the metric-name contract: tests/integration/test_monitoring_rules.py;
tests/integration/test_alerting.py runs the rules on the drifted node's metrics. Both use the helpers here (`tool`,
`promtool`, `PromServer`, `substitute`, ...).

Needs `promtool` and `prometheus` (Debian package `prometheus`; `python -m tests.peers.setup` installs
it). Without them these tests fail, they do not skip.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.peers import processes
from tests.peers.locations import SETUP_COMMAND

MONITORING = REPO / "monitoring"
RULES = MONITORING / "nodewarden.rules.yml"
DASHBOARD = MONITORING / "grafana" / "nodewarden-dashboard.json"
METRICS_DOC = REPO / "docs" / "metrics.md"
INSTALL_HINT = f"run `{SETUP_COMMAND}` (as root: apt-get install prometheus) to install it"
START_TIMEOUT_S = 15.0

# What the Grafana variables become before an expression goes to Prometheus.
GRAFANA_VALUES = {
    "job": "nodewarden",
    "instance": "(gpu-node-1:9847|gpu-node-2:9100)",  # a multi-value selection, as Grafana writes it for =~
    "gpu": "0",
    "__rate_interval": "2m",
    "__interval": "1m",
    "__range": "6h",
}


# --- tools ------------------------------------------------------------------------------------------


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL_HINT}", pytrace=False)
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          check=False)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@functools.cache
def rules() -> list[dict[str, Any]]:
    groups = load_yaml(RULES)["groups"]
    return [rule for group in groups for rule in group["rules"]]


@functools.cache
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, with the panels of collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def panel_targets() -> list[tuple[str, str]]:
    """(where, expr) for every panel target of the dashboard."""
    found: list[tuple[str, str]] = []
    for panel in all_panels(dashboard()["panels"]):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['id']} {panel['title']!r} target {target.get('refId')}", target["expr"]))
    return found


def variable_selectors() -> list[tuple[str, str]]:
    """(where, selector) of every `label_values(SELECTOR, label)` template variable query."""
    found: list[tuple[str, str]] = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
        assert match, f"variable {var['name']}: expected label_values(SELECTOR, label), got {query!r}"
        found.append((f"variable {var['name']}", match.group(1)))
    return found


def substitute(expr: str) -> str:
    """Replace Grafana's $var, ${var} and [[var]] by concrete values; unknown ones stay as they are."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return GRAFANA_VALUES.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


# --- dashboard ------------------------------------------------------------------------------------------


def test_dashboard_structure() -> None:
    dash = dashboard()
    assert dash["uid"] == "nodewarden-fleet" and dash["title"]
    assert dash["schemaVersion"] == 39
    variables = {var["name"]: var for var in dash["templating"]["list"]}
    assert set(variables) >= {"datasource", "job", "instance", "gpu"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance", "gpu"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
        assert var["query"]["query"].startswith("label_values(") and var["definition"] == var["query"]["query"]
    # nodewarden's targets, whatever their job: the daemon's or node_exporter's (textfile collector)
    assert variables["job"]["query"]["query"] == "label_values(nodewarden_build_info, job)"
    assert variables["instance"]["query"]["query"] == 'label_values(nodewarden_build_info{job=~"$job"}, instance)'
    assert variables["instance"]["multi"] is True and variables["instance"]["includeAll"] is True
    assert variables["job"]["includeAll"] is True and variables["job"]["allValue"] == ".+"
    assert {"$job", "$instance"} <= set(re.findall(r"\$\w+", variables["gpu"]["query"]["query"]))

    panels = list(all_panels(dash["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    rows = [panel for panel in panels if panel["type"] == "row"]
    assert [row["title"] for row in rows] == ["Fleet overview", "Node: $instance"]
    boxes: list[tuple[str, int, int, int, int]] = []
    in_node_row = False
    for panel in dash["panels"]:
        where = f"panel {panel['id']} {panel.get('title')!r}"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, where
        for other, x, y, w, h in boxes:
            overlap = grid["x"] < x + w and x < grid["x"] + grid["w"] and grid["y"] < y + h and y < grid["y"] + grid["h"]
            assert not overlap, f"{where} overlaps {other}"
        boxes.append((where, grid["x"], grid["y"], grid["w"], grid["h"]))
        if panel["type"] == "row":
            in_node_row = panel["title"].startswith("Node")
            continue
        assert panel["title"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        targets = panel["targets"]
        assert targets, f"{where} has no targets"
        assert len({target["refId"] for target in targets}) == len(targets), f"{where}: duplicate refIds"
        for target in targets:
            assert target["expr"].strip(), f"{where}: empty expr"
            assert target["datasource"]["uid"] == "${datasource}", where
            if in_node_row:
                assert "$instance" in target["expr"], f"{where}: a drill-down query ignores $instance"
    titles = {panel["title"] for panel in panels}
    assert titles >= {"Failing nodes", "Critical findings (not waived)", "Sources down", "Firmware versions",
                      "Targets down", "Failing checks across the fleet", "Checks",
                      "Xid events", "Hottest GPUs", "GPU temperature", "GPU thermal margin",
                      "GPU power and enforced limit", "ECC errors (volatile)", "Row remaps", "NVLink active links",
                      "PSU and fan health", "Findings"}


def test_value_mappings_are_the_exporters_codes() -> None:
    """The Findings and PSU/fan tables show the names of the codes agent/ writes (docs/metrics.md)."""
    from agent.report.metrics import HEALTH_CODES
    from agent.report.prom import PASSING, STATUS_CODES

    mapped: dict[str, dict[str, str]] = {}
    for panel in all_panels(dashboard()["panels"]):
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "mappings":
                    (mapping,) = prop["value"]
                    mapped[override["matcher"]["options"]] = {k: v["text"] for k, v in mapping["options"].items()}
    statuses = {str(code): status.value for status, code in STATUS_CODES.items() if status not in PASSING}
    health = {str(code): name for name, code in HEALTH_CODES.items()}
    assert mapped == {"status": statuses, "PSU health": health, "fan health": health}
    doc = METRICS_DOC.read_text(encoding="utf-8")
    assert ", ".join(f"{code} {name}" for code, name in sorted((c, s.value) for s, c in STATUS_CODES.items())) in doc
    assert ", ".join(f"{code} {name}" for name, code in sorted(HEALTH_CODES.items(), key=lambda kv: kv[1])) in doc


# --- a real Prometheus --------------------------------------------------------------------------------


@dataclass
class PromServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - http://127.0.0.1 only
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def query(self, expr: str) -> tuple[int, dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """A Prometheus server on 127.0.0.1 (no scrape targets) that loads monitoring/nodewarden.rules.yml."""
    binary = tool("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "1s"}, "rule_files": [str(RULES)]}))
    port = free_tcp_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = processes.spawn([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
    server = PromServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with {process.returncode}:\n{server.log_tail()}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response:  # noqa: S310
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after {START_TIMEOUT_S} s:\n{server.log_tail()}", pytrace=False)
            time.sleep(0.05)
        yield server
    finally:
        processes.stop(process, timeout_s=10)


def test_prometheus_rejects_a_bad_expression(prometheus_server: PromServer) -> None:
    """The oracle works: a parse error is 400 bad_data, a good expression 200 success."""
    status, body = prometheus_server.query("sum by (instance) nodewarden_gpu_up")
    assert (status, body["status"], body["errorType"]) == (400, "error", "bad_data"), body
    status, body = prometheus_server.query('nodewarden_gpu_up{gpu=~"$gpu"}[$__rate_interval]')
    assert status == 400, body
    status, body = prometheus_server.query(substitute('nodewarden_gpu_up{gpu=~"$gpu"}[$__rate_interval]'))
    assert (status, body["status"]) == (200, "success"), body


def test_substitute() -> None:
    assert substitute('x{job=~"$job", instance=~"$instance", gpu="${gpu}"}[$__rate_interval] [[gpu]] $unknown') == (
        'x{job=~"nodewarden", instance=~"(gpu-node-1:9847|gpu-node-2:9100)", gpu="0"}[2m] 0 $unknown')


def test_dashboard_expressions_parse(prometheus_server: PromServer) -> None:
    exprs = [*panel_targets(), *variable_selectors()]
    assert len(exprs) >= 30
    problems: list[str] = []
    for where, expr in exprs:
        concrete = substitute(expr)
        if "$" in concrete:
            problems.append(f"{where}: unknown Grafana variable in {expr!r}")
            continue
        status, body = prometheus_server.query(concrete)
        if status != 200 or body.get("status") != "success":
            problems.append(f"{where}: HTTP {status} {body.get('errorType')}: {body.get('error')}\n    {concrete}")
    assert not problems, "Prometheus rejects dashboard expressions:\n" + "\n".join(problems)


def test_prometheus_loads_and_evaluates_the_rules(prometheus_server: PromServer) -> None:
    expected = {rule.get("alert") or rule["record"] for rule in rules()}
    deadline = time.monotonic() + 10
    while True:
        status, body = prometheus_server.get("/api/v1/rules")
        assert status == 200, body
        groups = body["data"]["groups"]
        loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
        if all(rule["health"] != "unknown" for rule in loaded.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert groups[0]["name"] == "nodewarden"  # other groups may follow it
    assert set(loaded) == expected
    unhealthy = {name: (rule["health"], rule.get("lastError")) for name, rule in loaded.items() if rule["health"] != "ok"}
    assert not unhealthy, f"rules Prometheus could not evaluate: {unhealthy}\n{prometheus_server.log_tail()}"
