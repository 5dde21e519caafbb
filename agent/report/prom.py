"""Prometheus exposition of findings: the audit's textfile output and the daemon's /metrics.

Sized for a Prometheus that holds 10,000 nodes: a finding that passes (or is skipped) is
counted in `nodewarden_checks{check,status}` and has no series of its own; every other
finding (warn, unknown, fail, fixed) has one `nodewarden_check_status{check,subject,...}`
series whose value is its status, coded by badness (STATUS_CODES) so `max()` is the worst.
A status change is a new value, not a new series. Metric names and labels are the contract
in docs/metrics.md.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString as _client_float

from agent import __version__
from agent.core.model import Status
from agent.core.sanitise import clean
from agent.report.collapse import display_subjects
from agent.report.model import Report
from agent.report.verdict import VERDICTS, judge

# Status codes, ordered by badness: `max by (instance) (nodewarden_check_status)` is the worst.
STATUS_CODES = {Status.PASS: 0, Status.SKIP: 1, Status.FIXED: 2, Status.WARN: 3, Status.UNKNOWN: 4, Status.FAIL: 5}
PASSING = (Status.PASS, Status.SKIP)  # counted only; every other status has a series per finding
SEVERITIES = ("info", "warning", "critical")
ALWAYS_COUNTED = ("warn", "fail", "unknown")  # nodewarden_findings: present (0) for every severity


def report_families(report: Report, timing: bool = True) -> list[Metric]:
    """Findings, sources, profile and version: what an audit knows.

    `timing` False leaves out `nodewarden_audit_timestamp_seconds`: the daemon serves it per scrape
    (when the facts were last confirmed), so an exposition of unchanged facts stays byte-identical.
    """
    status = GaugeMetricFamily(
        "nodewarden_check_status",
        "Status of a finding that is not pass or skip: 2 fixed, 3 warn, 4 unknown, 5 fail (0 pass and 1 skip "
        "are counted in nodewarden_checks only)",
        labels=["check", "subject", "severity", "action", "remediation"])
    waived = GaugeMetricFamily("nodewarden_check_waived", "1 if an unexpired waiver covers the finding (only then)",
                               labels=["check", "subject"])
    checks = GaugeMetricFamily("nodewarden_checks", "Findings per check and status (waived counted as waived; "
                               "only non-zero counts)", labels=["check", "status"])
    totals = GaugeMetricFamily("nodewarden_findings", "Findings by status and severity (waived counted as waived; "
                               "warn, fail and unknown always present)", labels=["status", "severity"])
    source_up = GaugeMetricFamily("nodewarden_source_up", "1 if the source answered its last read, 0 if not",
                                  labels=["source"])
    source_pending = GaugeMetricFamily("nodewarden_source_pending",
                                       "1 while the source's first read has not returned (its checks are unknown)",
                                       labels=["source"])
    source_duration = GaugeMetricFamily("nodewarden_source_duration_seconds", "Time spent on the source's last read",
                                        labels=["source"])
    profile = GaugeMetricFamily("nodewarden_profile_info", "The profile the node is judged by", labels=["profile"])
    build = GaugeMetricFamily("nodewarden_build_info", "nodewarden version", labels=["version"])
    last = GaugeMetricFamily("nodewarden_audit_timestamp_seconds", "When the checks last ran (Unix time)")
    duration = GaugeMetricFamily("nodewarden_audit_duration_seconds", "How long the last audit took")
    verdict = GaugeMetricFamily("nodewarden_verdict", "The node's verdict: 1 for the current one of OK, DEGRADED, "
                                "DRAIN (agent/report/verdict.py), 0 for the others", labels=["verdict"])

    seen: set[tuple[str, str]] = set()
    # The subject people read (a firmware group's "Power Supply.Slot.1-6", not its grouping key
    # "psu.slot.#|power supply.slot.#"); status and waived use the same one, so they still join.
    subjects = display_subjects(report.findings)
    totals_count: dict[tuple[str, str], int] = {}
    checks_count: dict[tuple[str, str], int] = {}
    for finding in report.findings:
        counted = "waived" if finding.waiver else finding.status.value
        totals_key = (counted, finding.severity.value)
        totals_count[totals_key] = totals_count.get(totals_key, 0) + 1
        checks_count[(finding.check, counted)] = checks_count.get((finding.check, counted), 0) + 1
        subject = subjects[id(finding)]
        key = (finding.check, subject)
        if finding.status in PASSING or key in seen:  # a series must be unique; the first finding wins
            continue
        seen.add(key)
        add_sparse(status, {"check": finding.check, "subject": subject, "severity": finding.severity.value,
                            "action": finding.action, "remediation": finding.remediation},
                   STATUS_CODES[finding.status])
        if finding.waiver:
            waived.add_metric([finding.check, subject], 1)
    for (check, counted), count in sorted(checks_count.items()):
        checks.add_metric([check, counted], count)
    for (counted, severity), count in sorted(totals_count.items()):
        if counted not in ALWAYS_COUNTED:
            totals.add_metric([counted, severity], count)
    for counted in ALWAYS_COUNTED:
        for severity in SEVERITIES:
            totals.add_metric([counted, severity], totals_count.get((counted, severity), 0))
    for name, src in sorted(report.sources.items()):
        if src.configured:
            source_up.add_metric([name], 1 if src.ok else 0)
            source_pending.add_metric([name], 1 if src.detail.get("pending") else 0)
            source_duration.add_metric([name], src.duration_s)
    state = judge(report.findings).state
    for name in VERDICTS:
        verdict.add_metric([name], 1 if name == state else 0)
    profile.add_metric([report.profile], 1)
    build.add_metric([__version__], 1)
    last.add_metric([], dt.datetime.fromisoformat(report.started_at).timestamp())
    duration.add_metric([], report.duration_s)
    return [status, waived, checks, totals, source_up, source_pending, source_duration, profile, build,
            *([last] if timing else []), duration, verdict]


def add_sparse(family: Metric, labels: dict[str, str | None], value: float) -> None:
    """A sample without the labels that have no value (`action`, `remediation` a check does not give).

    PromQL reads an absent label as "" (`remediation=""` still selects these), but the exposition
    shows no `action=""` a person would take for a value (docs/metrics.md).
    """
    family.samples.append(Sample(family.name, {k: v for k, v in labels.items() if v}, value, None))


class FixedCollector(Collector):
    """Yields metric families built elsewhere (never reads anything at collection time)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _go_float(value: float) -> str:
    return str(_client_float(value))  # type: ignore[no-untyped-call]


@functools.lru_cache(maxsize=1 << 16)  # the daemon renders the same few thousand values every scrape
def _label_value(value: str) -> str:
    # Cleaned first (agent.core.sanitise): no control characters or lone surrogates reach the exposition;
    # a newline is kept, since the format escapes it (as prometheus-client does).
    return clean(value, newlines=True).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_families(families: Iterable[Metric]) -> bytes:
    """The text exposition format (0.0.4), as `generate_latest` writes it.

    Our metric and label names are fixed and valid, so the per-name validation and escaping
    prometheus-client does on every sample (most of the daemon's CPU at 2,000 series) is skipped;
    label values are escaped as the format requires. A test compares the output with
    prometheus-client's own.
    """
    lines: list[str] = []
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_label_value(str(value))}"' for key, value in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {_go_float(sample.value)}\n" if labels
                         else f"{sample.name} {_go_float(sample.value)}\n")
    return "".join(lines).encode("utf-8")


def render_with_client(families: Iterable[Metric]) -> bytes:
    """prometheus-client's own rendering of the same families (the reference for the test)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FixedCollector(families))
    return generate_latest(registry)


def render_prom(report: Report) -> str:
    return render_families(report_families(report)).decode("utf-8")
