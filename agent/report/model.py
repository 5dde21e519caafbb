"""The finished audit: `Report`, what the engine returns and every renderer, the daemon and the CLI take.

Plain data only: it imports the finding types (`agent.core.model`) and the facts, never the engine or a
renderer, so anything may import it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent import __version__
from agent.core.facts import NodeFacts
from agent.core.model import Finding, SourceStatus, Status
from agent.report.gpu_identity import gpu_identities, gpu_of
from agent.report.verdict import verdict_json

REPORT_SCHEMA = "nodewarden.report/v1"
SUMMARY_KEYS = ("pass", "warn", "fail", "unknown", "skip", "waived", "fixed")


@dataclass
class Report:
    node: dict[str, Any]
    profile: str
    profile_chain: tuple[str, ...]
    started_at: str
    duration_s: float
    sources: dict[str, SourceStatus]
    findings: list[Finding]
    extra: dict[str, Any] = field(default_factory=dict)
    facts: NodeFacts | None = field(default=None, repr=False, compare=False)  # for planners; not serialised

    def summary(self) -> dict[str, int]:
        counts = {s: 0 for s in SUMMARY_KEYS}
        for finding in self.findings:
            counts["waived" if finding.waiver else finding.status.value] += 1
        return counts

    @property
    def exit_code(self) -> int:
        failed = any(f.status is Status.FAIL and f.waiver is None for f in self.findings)
        return 1 if failed else 0

    def to_json(self) -> dict[str, Any]:
        gpus = gpu_identities(self.facts)  # a GPU subject's UUID, bus id, serial (agent.report.gpu_identity)
        findings = []
        for finding in self.findings:
            doc = finding.to_json()
            gpu = gpu_of(finding.subject, gpus)
            if gpu is not None:
                doc["gpu"] = gpu
            findings.append(doc)
        return {
            "schema": REPORT_SCHEMA,
            "nodewarden_version": __version__,
            "node": self.node,
            "profile": self.profile,
            "profile_chain": list(self.profile_chain),
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 6),
            "sources": {name: status.to_json() for name, status in sorted(self.sources.items())},
            "findings": findings,
            "summary": self.summary(),
            **verdict_json(self.findings, gpus),
            **self.extra,
        }
