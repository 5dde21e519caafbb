"""Every dashboard panel and rule that compares a coded value, checked against docs/metrics.md's code table.

`nodewarden_check_status` (5 fail, 4 unknown, ...) and `nodewarden_psu_health` / `nodewarden_fan_health`
(4 critical, 1 absent, ...) carry a code in their value. A comparison such as `nodewarden_psu_health == 1`
silently changes meaning when the codes are renumbered (issue 26.1: the PSU panel showed the absent
slots and hid the critical PS3). So:

* the code table is parsed from docs/metrics.md (a renumbering there changes what the test expects);
* every comparison of a coded metric with a number, in the rules (expressions and annotation queries)
  and in the dashboard, is found and must be declared in INTENT with the code names it means to
  select; the constant must select exactly those names under the documented codes;
* the alerts that turn PSU and fan health into a severity use the documented critical and warning codes;
* the dashboard's value mappings name the documented codes;
* `promtool test rules` runs every dashboard query on PSU and fan health on a node with a critical
  (4) PSU and fan: each panel must show them (the panel that lists every PSU and fan shows all codes).

Needs promtool (see tests/integration/test_monitoring.py); without it these tests fail, they do not skip.
"""

from __future__ import annotations

import functools
import operator
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_monitoring import (
    METRICS_DOC,
    all_panels,
    dashboard,
    promtool,
    rules,
    substitute,
)

STATUS = "nodewarden_check_status"
PSU = "nodewarden_psu_health"
FAN = "nodewarden_fan_health"

# What each comparison means to select, by the code's documented name: (where, metric) -> names.
# `where` is "rule NAME" or "panel TITLE". A new comparison of a coded metric must be added here.
INTENT: dict[tuple[str, str], frozenset[str]] = {
    ("rule nodewarden:check_failing:count", STATUS): frozenset({"fail"}),
    ("rule NodewardenPsuFailed", PSU): frozenset({"warning", "critical"}),
    ("rule NodewardenPsuFailed", STATUS): frozenset({"fail"}),
    ("rule NodewardenFanFailed", FAN): frozenset({"warning", "critical"}),
    ("rule NodewardenFanFailed", STATUS): frozenset({"fail"}),
    ("rule NodewardenFirmwareMismatch", STATUS): frozenset({"fail"}),
    ("panel Critical findings (not waived)", STATUS): frozenset({"fail"}),
    ("panel Power and cooling problems", PSU): frozenset({"warning", "critical"}),
    ("panel Power and cooling problems", FAN): frozenset({"warning", "critical"}),
    ("panel Power and cooling problems", STATUS): frozenset({"fail"}),
}
# Whatever else a comparison selects, it must select the worst code and never the good ones.
MUST_SELECT = {STATUS: "fail", PSU: "critical", FAN: "critical"}
NEVER_SELECT = {STATUS: {"pass", "skip"}, PSU: {"ok"}, FAN: {"ok"}}

_METRIC = r"nodewarden_(?:check_status|psu_health|fan_health)"
_OP = r"==|!=|>=|<=|>|<"
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_MATCHERS = r"(?:\s*\{[^{}]*\})?"
# METRIC{..} OP N, max|min [by (..)] (METRIC{..}) OP N, and N OP METRIC{..}
_COMPARISONS = [
    re.compile(rf"(?P<metric>{_METRIC}){_MATCHERS}\s*(?P<op>{_OP})\s*(?:bool\s+)?(?P<value>{_NUMBER})"),
    re.compile(rf"\b(?:max|min)\s*(?:(?:by|without)\s*\([^()]*\)\s*)?\(\s*(?P<metric>{_METRIC}){_MATCHERS}\s*\)"
               rf"\s*(?P<op>{_OP})\s*(?:bool\s+)?(?P<value>{_NUMBER})"),
    re.compile(rf"(?<![\w.])(?P<value>{_NUMBER})\s*(?P<op>{_OP})\s*(?:bool\s+)?(?P<metric>{_METRIC})"),
]
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "==", "!=": "!="}


@functools.cache
def code_tables() -> dict[str, dict[str, int]]:
    """docs/metrics.md's code table: metric -> {name: code}, read from the doc itself."""
    lines = METRICS_DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Code |"))
    header = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
    columns: list[tuple[int, int, list[str]]] = []  # (code column, name column, metrics)
    for index, cell in enumerate(header):
        if cell == "Code":
            columns.append((index, index + 1, re.findall(r"`(nodewarden_\w+)`", header[index + 1])))
    tables: dict[str, dict[str, int]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        for code_col, name_col, metrics in columns:
            if code_col < len(cells) and cells[code_col].isdigit() and cells[name_col]:
                for metric in metrics:
                    tables.setdefault(metric, {})[cells[name_col].split()[0]] = int(cells[code_col])
    return tables


def selected(metric: str, op: str, value: float) -> frozenset[str]:
    """The documented names a comparison `metric OP value` keeps."""
    test = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
            ">": operator.gt, "<": operator.lt}[op]
    return frozenset(name for name, code in code_tables()[metric].items() if test(float(code), value))


def comparisons(text: str) -> list[tuple[str, str, float]]:
    """(metric, op as if the metric were on the left, constant) for each comparison of a coded metric."""
    found: list[tuple[str, str, float]] = []
    seen: set[tuple[int, int]] = set()
    for index, pattern in enumerate(_COMPARISONS):
        for match in pattern.finditer(text):
            span = match.span("metric")
            if span in seen:
                continue
            seen.add(span)
            op = match.group("op") if index < 2 else _FLIPPED[match.group("op")]
            found.append((match.group("metric"), op, float(match.group("value"))))
    return found


def rule_texts() -> list[tuple[str, str]]:
    """(where, text) of every rule's expression and annotations (their `query` calls hold PromQL too)."""
    found: list[tuple[str, str]] = []
    for rule in rules():
        where = f"rule {rule.get('alert') or rule.get('record')}"
        found.append((where, rule["expr"]))
        found += [(where, str(text)) for text in rule.get("annotations", {}).values()]
    return found


def panel_texts() -> list[tuple[str, str]]:
    return [(f"panel {panel['title']}", target["expr"])
            for panel in all_panels(dashboard()["panels"]) for target in panel.get("targets", [])]


def all_comparisons() -> list[tuple[str, str, str, float]]:
    return [(where, metric, op, value) for where, text in [*rule_texts(), *panel_texts()]
            for metric, op, value in comparisons(text)]


# --- the doc's table and the extractor --------------------------------------------------------------------


def test_the_code_table_is_read_from_the_doc() -> None:
    tables = code_tables()
    assert set(tables) == {STATUS, PSU, FAN}
    assert tables[STATUS] == {"pass": 0, "skip": 1, "fixed": 2, "warn": 3, "unknown": 4, "fail": 5}
    assert tables[PSU] == tables[FAN] == {"ok": 0, "absent": 1, "unknown": 2, "warning": 3, "critical": 4}


def test_the_doc_table_is_the_exporters() -> None:
    from agent.report.metrics import HEALTH_CODES
    from agent.report.prom import STATUS_CODES

    assert code_tables()[STATUS] == {status.value: code for status, code in STATUS_CODES.items()}
    assert code_tables()[PSU] == dict(HEALTH_CODES)


@pytest.mark.parametrize(("text", "expected"), [
    ('nodewarden_psu_health{job=~"$job", instance=~"$instance"} == 1', [(PSU, "==", 1.0)]),
    ("nodewarden_fan_health >= 3", [(FAN, ">=", 3.0)]),
    ("max by (instance) (nodewarden_check_status{x=\"y\"}) >= bool 5", [(STATUS, ">=", 5.0)]),
    ("4 <= nodewarden_psu_health", [(PSU, ">=", 4.0)]),
    ('count(nodewarden_check_status == 5) > 0 and nodewarden_check_waived == 1', [(STATUS, "==", 5.0)]),
    ("nodewarden_psu_health", []),
    ('printf `nodewarden_check_status{job=%q, instance=%q, action="replace_psu"} == 5`', [(STATUS, "==", 5.0)]),
])
def test_comparison_extractor(text: str, expected: list[tuple[str, str, float]]) -> None:
    assert comparisons(text) == expected


def test_a_renumbering_changes_what_a_comparison_selects() -> None:
    assert selected(PSU, "==", 4) == {"critical"} and selected(PSU, ">=", 3) == {"warning", "critical"}
    assert selected(PSU, "==", 1) == {"absent"}  # the old PSU panel: it showed empty slots only
    assert selected(STATUS, "==", 5) == {"fail"} and selected(STATUS, ">=", 3) == {"warn", "unknown", "fail"}


# --- every comparison in the rules and the dashboard ------------------------------------------------------


def test_every_coded_comparison_selects_what_it_means() -> None:
    found = all_comparisons()
    assert len(found) >= 12, f"the extractor found too few comparisons: {found}"
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for where, metric, op, value in found:
        names = selected(metric, op, value)
        show = f"{where}: {metric} {op} {value:g} selects {sorted(names)}"
        if MUST_SELECT[metric] not in names:
            problems.append(f"{show}, which hides {MUST_SELECT[metric]} (code {code_tables()[metric][MUST_SELECT[metric]]})")
        if names & NEVER_SELECT[metric]:
            problems.append(f"{show}, which includes {sorted(names & NEVER_SELECT[metric])}")
        intent = INTENT.get((where, metric))
        if intent is None:
            problems.append(f"{show}: not declared in INTENT (say which codes it means)")
        elif names != intent:
            problems.append(f"{show}, meant {sorted(intent)}")
        used.add((where, metric))
    assert not problems, "comparisons against docs/metrics.md's codes:\n" + "\n".join(problems)
    assert not set(INTENT) - used, f"INTENT lists comparisons that are gone: {sorted(set(INTENT) - used)}"


def test_health_alerts_turn_codes_into_severities_by_the_doc() -> None:
    """PsuFailed/FanFailed: their value is a health code; >= critical's code is critical, else warning."""
    health = code_tables()[PSU]
    for name in ("NodewardenPsuFailed", "NodewardenFanFailed"):
        rule = next(r for r in rules() if r.get("alert") == name)
        (threshold,) = re.findall(r"ge \$value ([0-9.]+)", rule["labels"]["severity"])
        assert float(threshold) == health["critical"], f"{name}: severity threshold {threshold}"
        expr = rule["expr"]
        critical = re.findall(r'severity="critical"[^{}]*\}\s*\*\s*0\s*\+\s*(\d+)', expr)
        warning = re.findall(r'severity!="critical"[^{}]*\}\s*\*\s*0\s*\+\s*(\d+)', expr)
        redundancy = re.findall(r"nodewarden_psu_redundancy_ok == 0\)\s*\+\s*(\d+)", expr)
        assert critical and warning, f"{name}: no finding -> code terms in {expr}"
        assert {int(v) for v in critical + redundancy} == {health["critical"]}, f"{name}: {expr}"
        assert {int(v) for v in warning} == {health["warning"]}, f"{name}: {expr}"


def test_value_mappings_name_the_documented_codes() -> None:
    mapped: dict[str, dict[int, str]] = {}
    for panel in all_panels(dashboard()["panels"]):
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "mappings":
                    (mapping,) = prop["value"]
                    mapped[override["matcher"]["options"]] = {int(k): v["text"] for k, v in mapping["options"].items()}
    by_code = {metric: {code: name for name, code in table.items()} for metric, table in code_tables().items()}
    assert mapped["PSU health"] == by_code[PSU] and mapped["fan health"] == by_code[FAN]
    assert mapped["status"] == {code: name for code, name in by_code[STATUS].items() if name not in ("pass", "skip")}


# --- the dashboard's PSU and fan queries on a node with a critical PSU and fan (promtool) ------------------

NODE = {"job": "nodewarden", "instance": "gpu-node-1:9847"}
# One PSU and one fan per documented code; the drifted node's PSU is "PS3 Status" (critical).
PSUS = {"ok": "PS1 Status", "absent": "PS2 Slot", "unknown": "PS4 Status", "warning": "PS5 Status",
        "critical": "PS3 Status"}
FANS = {"ok": "FAN1", "absent": "FAN6", "unknown": "FAN4", "warning": "FAN5", "critical": "FAN2"}


def _labels(metric: str, label: str, value: str) -> str:
    return f'{metric}{{instance="{NODE["instance"]}", job="{NODE["job"]}", {label}="{value}"}}'


def health_targets() -> list[tuple[str, str, str]]:
    """(where, metric, expr) of every dashboard query on PSU or fan health."""
    found = []
    for where, expr in panel_texts():
        for metric in (PSU, FAN):
            if re.search(rf"\b{metric}\b", expr):
                found.append((where, metric, expr))
    return found


def test_dashboard_health_queries_show_a_critical_psu_and_fan(tmp_path: Path) -> None:
    health = code_tables()[PSU]
    series = [{"series": _labels(PSU, "psu", psu), "values": f"{health[name]}x10"} for name, psu in PSUS.items()]
    series += [{"series": _labels(FAN, "fan", fan), "values": f"{health[name]}x10"} for name, fan in FANS.items()]
    targets = health_targets()
    assert {where for where, _, _ in targets} >= {"panel PSU and fan health", "panel Power and cooling problems"}
    cases: list[dict[str, Any]] = []
    for where, metric, expr in targets:
        label, subjects = ("psu", PSUS) if metric == PSU else ("fan", FANS)
        compared = [(op, value) for m, op, value in comparisons(expr) if m == metric]
        names = set(health) if not compared else set(selected(metric, *compared[0]))
        assert "critical" in names, f"{where}: {expr} hides the critical {label}"
        cases.append({"expr": substitute(expr), "eval_time": "5m", "exp_samples": [
            {"labels": _labels(metric, label, subjects[name]), "value": health[name]} for name in sorted(names)]})
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"name": "dashboard PSU and fan health", "interval": "1m", "input_series": series,
                       "promql_expr_test": cases}]}
    path = tmp_path / "dashboard_health_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "SUCCESS" in result.stdout

