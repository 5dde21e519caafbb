"""Prometheus exposition of findings: the audit's textfile output and the daemon's /metrics.

Every finding exports one series per possible status (1 for the current one,
0 for the others), so an alert on `status="fail"` never silently loses its
series when a check stops failing or stops running. Metric names and labels
are the contract in docs/metrics.md.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _client_float

from agent import __version__
from agent.engine import Report
from agent.model import Status
from agent.sanitise import clean

STATUSES = [s.value for s in Status]
SEVERITIES = ("info", "warning", "critical")


def report_families(report: Report) -> list[Metric]:
    """Findings, sources, profile and version: what an audit knows."""
    status = GaugeMetricFamily("nodewarden_check_status", "1 for the finding's current status, 0 for the others",
                               labels=["check", "subject", "severity", "status"])
    waived = GaugeMetricFamily("nodewarden_check_waived", "1 if the finding is covered by an unexpired waiver",
                               labels=["check", "subject"])
    totals = GaugeMetricFamily("nodewarden_findings", "Findings by status and severity (waived counted as waived)",
                               labels=["status", "severity"])
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

    seen: set[tuple[str, str]] = set()
    counts: dict[tuple[str, str], int] = {}
    for finding in report.findings:
        key = (finding.check, finding.subject)
        counts_key = ("waived" if finding.waiver else finding.status.value, finding.severity.value)
        counts[counts_key] = counts.get(counts_key, 0) + 1
        if key in seen:  # a series must be unique; the first finding for a subject wins
            continue
        seen.add(key)
        for value in STATUSES:
            status.add_metric([finding.check, finding.subject, finding.severity.value, value],
                              1 if finding.status.value == value else 0)
        waived.add_metric([finding.check, finding.subject], 1 if finding.waiver else 0)
    for value in [*STATUSES, "waived"]:
        for severity in SEVERITIES:
            totals.add_metric([value, severity], counts.get((value, severity), 0))
    for name, src in sorted(report.sources.items()):
        if src.configured:
            source_up.add_metric([name], 1 if src.ok else 0)
            source_pending.add_metric([name], 1 if src.detail.get("pending") else 0)
            source_duration.add_metric([name], src.duration_s)
    profile.add_metric([report.profile], 1)
    build.add_metric([__version__], 1)
    last.add_metric([], dt.datetime.fromisoformat(report.started_at).timestamp())
    duration.add_metric([], report.duration_s)
    return [status, waived, totals, source_up, source_pending, source_duration, profile, build, last, duration]


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
    # Cleaned first (agent.sanitise): no control characters or lone surrogates reach the exposition;
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
