"""node_exporter textfile output, built with prometheus-client.

Every finding exports one series per possible status (1 for the current one,
0 for the others), so an alert on `status="fail"` never silently loses its
series when a check stops failing or stops running.
"""

from __future__ import annotations

import datetime as dt

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from agent import __version__
from agent.engine import Report
from agent.model import Status

STATUSES = [s.value for s in Status]


def render_prom(report: Report) -> str:
    registry = CollectorRegistry()
    status = Gauge("nodewarden_check_status", "1 for the finding's current status, 0 for the others",
                   ["check", "subject", "severity", "status"], registry=registry)
    waived = Gauge("nodewarden_check_waived", "1 if the finding is covered by an unexpired waiver",
                   ["check", "subject"], registry=registry)
    totals = Gauge("nodewarden_findings", "Findings by status and severity (waived counted as waived)",
                   ["status", "severity"], registry=registry)
    source_up = Gauge("nodewarden_source_up", "1 if the source answered, 0 if it did not",
                      ["source"], registry=registry)
    source_duration = Gauge("nodewarden_source_duration_seconds", "Time spent reading the source",
                            ["source"], registry=registry)
    profile = Gauge("nodewarden_profile_info", "The profile the node was judged by", ["profile"],
                    registry=registry)
    build = Gauge("nodewarden_build_info", "nodewarden version", ["version"], registry=registry)
    last = Gauge("nodewarden_audit_timestamp_seconds", "When the audit ran (Unix time)", registry=registry)
    duration = Gauge("nodewarden_audit_duration_seconds", "How long the audit took", registry=registry)

    for finding in report.findings:
        for value in STATUSES:
            status.labels(finding.check, finding.subject, finding.severity.value, value).set(
                1 if finding.status.value == value else 0)
        waived.labels(finding.check, finding.subject).set(1 if finding.waiver else 0)
    counts: dict[tuple[str, str], int] = {}
    for finding in report.findings:
        key = ("waived" if finding.waiver else finding.status.value, finding.severity.value)
        counts[key] = counts.get(key, 0) + 1
    for value in [*STATUSES, "waived"]:
        for severity in ("info", "warning", "critical"):
            totals.labels(value, severity).set(counts.get((value, severity), 0))
    for name, src in report.sources.items():
        if src.configured:
            source_up.labels(name).set(1 if src.ok else 0)
            source_duration.labels(name).set(src.duration_s)
    profile.labels(report.profile).set(1)
    build.labels(__version__).set(1)
    last.set(dt.datetime.fromisoformat(report.started_at).timestamp())
    duration.set(report.duration_s)
    return generate_latest(registry).decode("utf-8")
