"""monitoring/nodewarden.rules.yml: the Prometheus rules, their promtool unit tests and the metric-name contract.

* `promtool check rules` and `promtool test rules` on the real files; mutated copies (a wrong
  expectation, a broken threshold) must make `promtool test rules` fail, which proves the unit
  tests can fail at all;
* the shape of the rules (severities, annotations, `for:`), and every alert has a unit test where it
  fires and one where it stays silent;
* every rule and panel expression uses only metric names from docs/metrics.md (the contract),
  the recording rules, or `up`;
* neither the rules nor the dashboard name a scrape job: the daemon's job and node_exporter's
  (textfile collector) both work (tests/integration/test_alerting.py runs both on the drifted node's metrics).

The dashboard and a real Prometheus: tests/integration/test_monitoring.py (which holds the shared helpers).
Needs `promtool` (Debian package `prometheus`; `python -m tests.peers.setup` installs it). Without it
these tests fail, they do not skip.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from tests.integration.test_monitoring import (
    DASHBOARD,
    METRICS_DOC,
    MONITORING,
    RULES,
    load_yaml,
    panel_targets,
    promtool,
    rules,
    tool,
    variable_selectors,
)

RULES_TEST = MONITORING / "tests" / "nodewarden.rules_test.yml"
ALERTS_DOC = MONITORING.parent / "docs" / "alerts.md"  # every runbook_url points at a section of it
# Series that are not nodewarden's own but may appear in expressions.
FOREIGN_METRICS = {"up"}
# Alerts about the whole job (none at all; mixed firmware of a job and profile) have no instance to name.
NO_INSTANCE_ALERTS = {"NodewardenMetricsAbsent", "NodewardenFirmwareMixed"}
SEVERITIES = {"critical", "warning"}
# A templated severity must be critical|warning: a failing finding's severity (info never fails), or
# chosen from the alert's value (PSU and fan: 4 critical, 3 warning).
TEMPLATED_SEVERITIES = {"{{ $labels.severity }}", "{{ if ge $value 4.0 }}critical{{ else }}warning{{ end }}"}


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recording_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


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
    group_names = [group["name"] for group in groups]
    # "nodewarden" first; a separate group (e.g. the daemon's reload failures) may follow it.
    assert group_names[0] == "nodewarden" and len(group_names) == len(set(group_names)), group_names
    assert recording_names() >= {"nodewarden:findings_failing:sum"}
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    for rule in alerts():
        name, labels, notes = rule["alert"], rule.get("labels", {}), rule.get("annotations", {})
        assert labels.get("severity") in SEVERITIES | TEMPLATED_SEVERITIES, f"{name}: severity {labels}"
        assert {"summary", "description", "runbook", "runbook_url"} <= set(notes), f"{name}: annotations {sorted(notes)}"
        assert notes["runbook_url"] == f"docs/alerts.md#{name.lower()}", f"{name}: runbook_url {notes['runbook_url']}"
        assert f"\n## {name}\n" in ALERTS_DOC.read_text(encoding="utf-8"), f"{name}: no section in docs/alerts.md"
        if name not in NO_INSTANCE_ALERTS:
            for key in ("summary", "description"):
                assert "$labels.instance" in notes[key], f"{name}: {key} does not name the instance"
            # The subject: a label (source), or the node's list of them from a `query` (checks, PSUs, GPUs).
            assert re.search(r"\$labels\.(?!instance\b)\w+|\$s\.Labels\.\w+", notes["description"]), (
                f"{name}: the description names no subject")
    expected = {"NodewardenNodeCritical", "NodewardenPsuFailed", "NodewardenFanFailed", "NodewardenFirmwareMismatch",
                "NodewardenTuningDrift", "NodewardenNodeWarning", "NodewardenSourceDown", "NodewardenSourceStale",
                "NodewardenDaemonDown", "NodewardenMetricsAbsent", "NodewardenXidCritical", "NodewardenXidWarning",
                "NodewardenGpuThermalMarginLow", "NodewardenIbPortFlapping", "NodewardenFirmwareDrift",
                "NodewardenFirmwareMixed", "NodewardenConfigReloadFailed", "NodewardenAuditStale",
                "NodewardenHealthCheckBreakerOpen"}
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
            assert {"summary", "description", "runbook", "runbook_url"} <= set(alert.get("exp_annotations", {})), (
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
    "every node drifts when there is no majority": (
        "and on (job, profile, component) nodewarden:firmware_version_majority:count\n", "\n"),
    "half the nodes counted as a majority": (
        "> on (job, profile, component) group_left ()\n          (sum by",
        ">= on (job, profile, component) group_left ()\n          (sum by"),
    "fan critical (4) only a warning": ('action="replace_fan", severity="critical"} * 0 + 4)',
                                        'action="replace_fan", severity="critical"} * 0 + 3)'),
    "critical fan health ignored": ("(nodewarden_fan_health >= 3)", "(nodewarden_fan_health == 3)"),
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
