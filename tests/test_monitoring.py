"""monitoring/: the Prometheus rules, their promtool unit tests and the Grafana dashboard.

* `promtool check rules` and `promtool test rules` on the real files; mutated copies (a wrong
  expectation, a broken threshold) must make `promtool test rules` fail, which proves the unit
  tests can fail at all;
* every rule and panel expression uses only metric names from docs/metrics.md (the contract),
  the recording rules, or `up`;
* every dashboard expression (Grafana variables replaced by concrete values) is parsed by a real
  Prometheus server started for this module (`prometheus_server`): a parse error is HTTP 400
  `bad_data`. The same server loads the rules file and must evaluate every rule without error;
* neither the rules nor the dashboard name a scrape job: the daemon's job and node_exporter's
  (textfile collector) both work (tests/test_alerting.py runs both on the drifted node's metrics).

Needs `promtool` and `prometheus` (Debian package `prometheus`; `python -m tests.peers.setup` installs
it). Without them these tests fail, they do not skip.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.peers.locations import SETUP_COMMAND

MONITORING = REPO / "monitoring"
RULES = MONITORING / "nodewarden.rules.yml"
RULES_TEST = MONITORING / "tests" / "nodewarden.rules_test.yml"
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
# Series that are not nodewarden's own but may appear in expressions.
FOREIGN_METRICS = {"up"}
# Alerts about the absence of the whole job have no instance to name.
NO_INSTANCE_ALERTS = {"NodewardenMetricsAbsent"}
SEVERITIES = {"critical", "warning"}
# A templated severity must be critical|warning: a failing finding's severity (info never fails), or
# chosen from the alert's value (PSU and fan: 4 critical, 3 warning).
TEMPLATED_SEVERITIES = {"{{ $labels.severity }}", "{{ if ge $value 4.0 }}critical{{ else }}warning{{ end }}"}


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


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recording_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


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


# --- metric names -----------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                   "offset", "bool", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small tokenizer, good for these files)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', " ", expr)  # string literals
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        word = match.group(0)
        if word.lower() in PROMQL_KEYWORDS or re.match(r"\s*\(", text[match.end():]):
            continue  # keyword, or a function / aggregation
        names.add(word)
    return names


@functools.cache
def documented_metrics() -> tuple[set[str], tuple[str, ...]]:
    """Names in docs/metrics.md's table, and the prefixes of its wildcard rows (`process_*`)."""
    names: set[str] = set()
    prefixes: list[str] = []
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([A-Za-z_:][\w:]*\*?)`", line.split("|")[1]):
            if name.endswith("*"):
                prefixes.append(name[:-1])
            else:
                names.add(name)
    assert len(names) >= 20, f"could not parse the metrics table of {METRICS_DOC}: {sorted(names)}"
    return names, tuple(prefixes)


def undocumented(names: set[str]) -> set[str]:
    documented, prefixes = documented_metrics()
    allowed = documented | recording_names() | FOREIGN_METRICS
    return {name for name in names if name not in allowed and not name.startswith(prefixes)}


@pytest.mark.parametrize(("expr", "expected"), [
    ('sum by (instance) (rate(foo_total{a="b c", d=~"x|y"}[5m] offset 10m)) / on (instance) group_left (x) bar',
     {"foo_total", "bar"}),
    ("count(level:metric:op > bool 1e3) or vector(0)", {"level:metric:op"}),
    ('time() - nodewarden_x{job="up"} > 900 and on (job) up == 0 unless absent(up{job="nodewarden"})',
     {"nodewarden_x", "up"}),
    ("max_over_time(a[1h:5m]) and ignoring (le) b", {"a", "b"}),
])
def test_metric_name_tokenizer(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_undocumented_names_are_caught() -> None:
    assert undocumented({"nodewarden_gpu_up", "nodewarden:findings_failing:sum", "up",
                         "process_cpu_seconds_total"}) == set()
    assert undocumented({"nodewarden_gpu_temperature", "node_hwmon_temp_celsius"}) == {
        "nodewarden_gpu_temperature", "node_hwmon_temp_celsius"}


def test_every_metric_name_is_documented() -> None:
    used: dict[str, set[str]] = {}
    for rule in rules():
        used[f"rule {rule.get('alert') or rule.get('record')}"] = metric_names(rule["expr"])
    for where, expr in [*panel_targets(), *variable_selectors()]:
        used[f"dashboard {where}"] = metric_names(expr)
    problems = {where: sorted(undocumented(names)) for where, names in used.items() if undocumented(names)}
    assert not problems, f"metric names neither in {METRICS_DOC.name}, nor recording rules, nor up: {problems}"
    # Names also hide in annotation templates (`query`) and descriptions: scan the raw text too.
    text = RULES.read_text(encoding="utf-8") + DASHBOARD.read_text(encoding="utf-8")
    mentioned = set(re.findall(r"\bnodewarden[_:][\w:]*\w", text))
    assert not undocumented(mentioned), f"undocumented nodewarden metric names: {sorted(undocumented(mentioned))}"
    assert "nodewarden_check_status" in mentioned and "nodewarden:findings_failing:sum" in mentioned


# --- rules --------------------------------------------------------------------------------------------


def test_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_shape() -> None:
    groups = load_yaml(RULES)["groups"]
    assert [group["name"] for group in groups] == ["nodewarden"]
    assert recording_names() >= {"nodewarden:findings_failing:sum"}
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    for rule in alerts():
        name, labels, notes = rule["alert"], rule.get("labels", {}), rule.get("annotations", {})
        assert labels.get("severity") in SEVERITIES | TEMPLATED_SEVERITIES, f"{name}: severity {labels}"
        assert {"summary", "description", "runbook"} <= set(notes), f"{name}: annotations {sorted(notes)}"
        if name not in NO_INSTANCE_ALERTS:
            for key in ("summary", "description"):
                assert "$labels.instance" in notes[key], f"{name}: {key} does not name the instance"
            # The subject: a label (source), or the node's list of them from a `query` (checks, PSUs, GPUs).
            assert re.search(r"\$labels\.(?!instance\b)\w+|\$s\.Labels\.\w+", notes["description"]), (
                f"{name}: the description names no subject")
    expected = {"NodewardenNodeCritical", "NodewardenPsuFailed", "NodewardenFanFailed", "NodewardenFirmwareMismatch",
                "NodewardenTuningDrift", "NodewardenNodeWarning", "NodewardenSourceDown", "NodewardenSourceStale",
                "NodewardenDaemonDown", "NodewardenMetricsAbsent", "NodewardenXidCritical", "NodewardenXidWarning",
                "NodewardenGpuThermalMarginLow", "NodewardenIbPortFlapping", "NodewardenFirmwareDrift"}
    assert set(names) == expected
    for rule in alerts():  # alerts per node, not per finding, GPU or port: `for` on every state alert
        if rule["alert"] not in {"NodewardenXidCritical", "NodewardenXidWarning", "NodewardenIbPortFlapping"}:
            assert rule.get("for"), f"{rule['alert']}: no `for:` duration"


def test_no_rule_or_panel_names_a_job() -> None:
    """Both deployments: the daemon's job and node_exporter's (textfile collector) are not named."""
    for path in (RULES, DASHBOARD):
        text = json.dumps(load_yaml(path))  # values only: the comments may name example jobs
        literal = re.findall(r'job\s*=~?\s*\\*"(?!\$job)[^"\\]*', text)
        assert not literal, f"{path.name} names a job: {literal}"
    for where, expr in [*panel_targets(), *variable_selectors()]:
        if where != "variable job":
            assert 'job=~"$job"' in expr, f"{where} ignores $job: {expr}"


def test_every_alert_fires_and_stays_silent_in_the_unit_tests() -> None:
    cases: dict[str, list[list[dict[str, Any]]]] = {}
    recorded_exprs: list[str] = []
    for group in load_yaml(RULES_TEST)["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
        recorded_exprs += [case["expr"] for case in group.get("promql_expr_test", [])]
    for rule in alerts():
        name = rule["alert"]
        seen = cases.get(name, [])
        assert any(not expected for expected in seen), f"{name}: no case where it must stay silent"
        firing = [alert for expected in seen for alert in expected]
        assert firing, f"{name}: no case where it fires"
        for alert in firing:
            assert alert.get("exp_labels", {}).get("severity") in SEVERITIES, f"{name}: {alert}"
            assert {"summary", "description", "runbook"} <= set(alert.get("exp_annotations", {})), (
                f"{name}: a firing case does not check every annotation: {alert}")
    for record in recording_names():
        assert any(re.search(rf"(?<![\w:]){re.escape(record)}(?![\w:])", expr) for expr in recorded_exprs), (
            f"recording rule {record} has no promql_expr_test")


def first_firing_case(tests: dict[str, Any]) -> dict[str, Any]:
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                return case  # type: ignore[no-any-return]
    raise AssertionError("no alert_rule_test expects an alert")


def mutate_expected_sample(tests: dict[str, Any]) -> None:
    group = next(group for group in tests["tests"] if group.get("promql_expr_test"))
    group["promql_expr_test"][0]["exp_samples"][0]["value"] += 1


def mutate_expected_severity(tests: dict[str, Any]) -> None:
    labels = first_firing_case(tests)["exp_alerts"][0]["exp_labels"]
    labels["severity"] = "warning" if labels["severity"] == "critical" else "critical"


def mutate_expected_summary(tests: dict[str, Any]) -> None:
    first_firing_case(tests)["exp_alerts"][0]["exp_annotations"]["summary"] += " (edited)"


def mutate_expect_silence(tests: dict[str, Any]) -> None:
    first_firing_case(tests)["exp_alerts"] = []


# One expected value changed in a copy of the unit tests: promtool must report the test as failed.
EXPECTATION_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "recorded value": mutate_expected_sample,
    "alert severity": mutate_expected_severity,
    "alert summary": mutate_expected_summary,
    "alert expected silent": mutate_expect_silence,
}

# A rule broken on purpose (old text -> new text): the unchanged unit tests must fail.
RULE_MUTATIONS = {
    "thermal margin threshold 5 -> 7": ("(nodewarden_gpu_thermal_margin_celsius) < 5",
                                        "(nodewarden_gpu_thermal_margin_celsius) < 7"),
    "waivers ignored": ("nodewarden_check_status == 5\n"
                        "            unless on (job, instance, check, subject) nodewarden_check_waived == 1",
                        "nodewarden_check_status == 5"),
    "warn and unknown counted as failing": ("nodewarden_check_status == 5\n", "nodewarden_check_status >= 3\n"),
    "PSU failures drain the node": ('severity="critical", action!~"replace_psu|replace_fan"}', 'severity="critical"}'),
    "critical PSU only a warning": ('severity="critical"} * 0 + 4)', 'severity="critical"} * 0 + 3)'),
    "targets forgotten when they go down": (
        "or\n          (group by (job, instance) (up) and on (job, instance) nodewarden:target)", ""),
    "a CPU node's node_exporter counts": ("up == 0 and on (job, instance) nodewarden:target", "up == 0"),
    "nvml stale after 9000 s": ("> 900)", "> 9000)"),
    "quiet kmsg judged stale": ('source!~"host|nvml|kmsg"', 'source!~"host|nvml"'),
    "Xid 79 not critical": ('xid=~"48|61|62|63|64|74|79|', 'xid=~"48|61|62|63|64|74|'),
    "new Xid series missed": ("unless nodewarden_xid_errors_total offset 10m", "unless nodewarden_xid_errors_total"),
    "stale although never polled": (
        "and on (job, instance, source) (nodewarden_source_last_success_timestamp_seconds > 0)", ""),
    "firmware drift without majority": (
        "unless on (job, profile, component, version) nodewarden:firmware_version_majority:count", ""),
    "redundancy alert on ok": ("(nodewarden_psu_redundancy_ok == 0)", "(nodewarden_psu_redundancy_ok == 1)"),
}


@pytest.fixture(scope="module")
def mutant_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str] | str]:
    """`promtool test rules` on every mutant (run concurrently to keep the module fast), or why it could not run."""
    tool("promtool")
    base = tmp_path_factory.mktemp("mutants")
    runs: dict[str, list[str]] = {}
    results: dict[str, subprocess.CompletedProcess[str] | str] = {}
    for name, mutate in EXPECTATION_MUTATIONS.items():
        tests = load_yaml(RULES_TEST)
        original = copy.deepcopy(tests)
        mutate(tests)
        if tests == original:
            results[name] = "the mutation changed nothing"
            continue
        tests["rule_files"] = [str(RULES)]
        path = base / f"expect-{len(runs)}.yml"
        path.write_text(yaml.safe_dump(tests, sort_keys=False, allow_unicode=True), encoding="utf-8")
        runs[name] = ["test", "rules", str(path)]
    rules_text = RULES.read_text(encoding="utf-8")
    for name, (old, new) in RULE_MUTATIONS.items():
        if old not in rules_text:
            results[name] = f"{old!r} is not in {RULES.name}"
            continue
        workdir = base / f"rule-{len(runs)}"
        (workdir / "tests").mkdir(parents=True)
        (workdir / RULES.name).write_text(rules_text.replace(old, new), encoding="utf-8")
        shutil.copy(RULES_TEST, workdir / "tests" / RULES_TEST.name)
        runs[name] = ["test", "rules", str(workdir / "tests" / RULES_TEST.name)]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(promtool, *args) for name, args in runs.items()}
        results.update({name: future.result() for name, future in futures.items()})
    return results


@pytest.mark.parametrize("mutation", list(EXPECTATION_MUTATIONS))
def test_rules_unit_tests_can_fail(mutant_runs: dict[str, subprocess.CompletedProcess[str] | str],
                                   mutation: str) -> None:
    result = mutant_runs[mutation]
    assert not isinstance(result, str), f"mutation {mutation!r}: {result}"
    assert result.returncode != 0, f"promtool accepted a wrong expectation ({mutation}):\n{result.stdout}"
    assert "FAILED" in result.stdout + result.stderr


@pytest.mark.parametrize("mutation", list(RULE_MUTATIONS))
def test_rules_unit_tests_catch_broken_rules(mutant_runs: dict[str, subprocess.CompletedProcess[str] | str],
                                             mutation: str) -> None:
    result = mutant_runs[mutation]
    assert not isinstance(result, str), f"mutation {mutation!r}: {result}"
    assert result.returncode != 0, f"the unit tests did not notice the broken rule ({mutation}):\n{result.stdout}"
    assert "FAILED" in result.stdout + result.stderr, result.stdout + result.stderr


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
    from agent.metrics import HEALTH_CODES
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
        process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    assert [group["name"] for group in groups] == ["nodewarden"]
    assert set(loaded) == expected
    unhealthy = {name: (rule["health"], rule.get("lastError")) for name, rule in loaded.items() if rule["health"] != "ok"}
    assert not unhealthy, f"rules Prometheus could not evaluate: {unhealthy}\n{prometheus_server.log_tail()}"
