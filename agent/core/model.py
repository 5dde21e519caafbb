"""Plain value types shared by sources, checks and reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class Status(str, enum.Enum):
    PASS = "pass"  # noqa: S105 - a status, not a password
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"
    SKIP = "skip"
    FIXED = "fixed"

    def __str__(self) -> str:
        return self.value


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Unknown:
    """A fact that could not be read, with the reason an operator can act on."""

    reason: str


@dataclass(frozen=True)
class Unsupported(Unknown):
    """A fact this device or driver does not provide (NVML NotSupported): checks skip it."""


def is_known(value: object) -> bool:
    return not isinstance(value, Unknown)


class Waiver(NamedTuple):
    check: str
    subject: str
    reason: str
    expires: str  # ISO date, inclusive
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, str]:
        return {"reason": self.reason, "expires": self.expires}


class Evidence(NamedTuple):
    """One input a finding's facts came from (an imported snapshot's meta.yaml `evidence`).

    `file`: the input's name as given to `snapshot import` (an archive member: "bundle.tar.gz:path/in/it");
    `kind`: the importer kind that read it; `section`: the bug report section or sos report file, if any.
    """

    file: str
    kind: str
    section: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"file": self.file, "kind": self.kind}
        if self.section is not None:
            out["section"] = self.section
        return out

    def describe(self) -> str:
        """"file (section)": what the table, JUnit and Markdown show (not cleaned: the renderer cleans)."""
        return f"{self.file} ({self.section})" if self.section is not None else self.file


@dataclass
class Finding:
    """One evaluated expectation: what, where, expected, observed and why."""

    check: str
    subject: str
    status: Status
    severity: Severity
    message: str
    source: str
    observed: Any = None
    expected: Any = None
    reason: str | None = None
    remediation: str | None = None
    action: str | None = None
    waiver: Waiver | None = None
    # A name for people where the subject is an internal key (a firmware group's "psu.slot.#|..."):
    # the table shows it; JSON, metrics and waivers keep the subject.
    label: str | None = field(default=None, compare=False)
    # The inputs of an imported snapshot its facts came from; None for live audits and captures.
    evidence: tuple[Evidence, ...] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "subject": self.subject,
            "status": self.status.value,
            "severity": self.severity.value,
            "observed": self.observed,
            "expected": self.expected,
            "message": self.message,
            "reason": self.reason,
            "remediation": self.remediation,
            "action": self.action,
            "source": self.source,
            "waiver": self.waiver.to_json() if self.waiver else None,
        }
        if self.evidence:
            out["evidence"] = [e.to_json() for e in self.evidence]
        return out


@dataclass
class SourceStatus:
    """How reading one source went. `configured` False means not asked for."""

    name: str
    ok: bool
    error: str | None = None
    duration_s: float = 0.0
    configured: bool = True
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
            "configured": self.configured,
        }
        out.update(self.detail)
        return out
