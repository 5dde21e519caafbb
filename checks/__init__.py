"""Check registry. A check is a pure function of (facts, profile) -> findings.

Each module in this package defines one area's checks with `Check(...)` and
`@CHECK.evaluator`; modules are discovered automatically, so adding a check
touches one file (plus its test). Check ids are stable: they appear in
reports, metrics, waivers and `--only/--skip` globs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.expect import AtLeast, Expectation, saturated
from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.core.series import AcceptanceRun
from agent.policy.profiles import Profile

Evaluator = Callable[[NodeFacts, Profile], list[Finding]]
SeriesEvaluator = Callable[[AcceptanceRun, Profile], list[Finding]]
INPUTS = ("facts", "series")  # a node's facts (an audit, the daemon), an acceptance run's series (accept)

_REGISTRY: dict[str, Check] = {}


@dataclass
class Check:
    id: str
    title: str
    source: str  # host | nvml | redfish | ipmi | kmsg | crosscheck
    remediation: str | None = None
    action: str | None = None  # default recommended operator action on failure
    reads: tuple[str, ...] = ()  # sources it needs read besides its own (e.g. "nvml", "bmc")
    # Sources it uses when another selected check has them read, but never reads for itself alone
    # (baseline.drift's GPU half: `--skip 'gpu.*'` must not touch NVML).
    optional_reads: tuple[str, ...] = ()
    # What the check reads from the profile: its JSON-Schema fragment, placed under
    # `expect.<expect_path>` in the generated profiles/schema.json (agent.apps.cli.schema_gen).
    expect_path: tuple[str, ...] = ()
    schema: Mapping[str, Any] | None = field(default=None, repr=False)
    evidence: str = ""  # what counts as evidence, one line for the README's check reference
    evaluate: Evaluator | None = field(default=None, repr=False)
    # The fact areas its findings come from, which an imported snapshot ties to its input files (a
    # finding's `evidence`): host parts by name (agent.sources.host_parts.HOST_PARTS: "sysctl", "pci", ...),
    # "host" (all of them), "nvml", "kmsg", "redfish", "ipmi" or "ipmi.<part>" (sensors, sel, fru,
    # device_id, power), "subject" (the finding's subject names the source). Empty: what the
    # check's source implies (SOURCE_AREAS).
    parts: tuple[str, ...] = ()
    # What its evaluator judges (issue 32.3): "facts" (`evaluator`, run by audits and the daemon) or
    # "series" (`series_evaluator`, an acceptance run: run by `nodewarden accept`, never by an audit).
    input: str = "facts"
    evaluate_series: SeriesEvaluator | None = field(default=None, repr=False)

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def fact_areas(self) -> tuple[str, ...]:
        return self.parts or SOURCE_AREAS.get(self.source, ())

    def evaluator(self, func: Evaluator) -> Evaluator:
        if self.id in _REGISTRY and _REGISTRY[self.id] is not self:
            raise RuntimeError(f"duplicate check id {self.id}")
        self.evaluate = func
        _REGISTRY[self.id] = self
        return func

    def expectation(self, profile: Profile) -> Expectation | None:
        """The profile's expectation at the path this check declared (`expect_path`): said once, here."""
        if not self.expect_path:
            raise RuntimeError(f"check {self.id} declares no expect_path")
        return profile.expectation(*self.expect_path)

    def series_evaluator(self, fn: SeriesEvaluator) -> SeriesEvaluator:
        """Register what judges an acceptance run's series; the check's input is then "series"."""
        if self.id in _REGISTRY and _REGISTRY[self.id] is not self:
            raise RuntimeError(f"duplicate check id {self.id}")
        self.input, self.evaluate_series = "series", fn
        _REGISTRY[self.id] = self
        return fn

    def run(self, facts: NodeFacts, profile: Profile) -> list[Finding]:
        if self.input != "facts":
            raise RuntimeError(f"check {self.id} judges an acceptance run's series (run_series), not a node's facts")
        if self.evaluate is None:
            raise RuntimeError(f"check {self.id} has no evaluator")
        return self.evaluate(facts, profile)

    def run_series(self, run: AcceptanceRun, profile: Profile) -> list[Finding]:
        if self.evaluate_series is None:
            raise RuntimeError(f"check {self.id} judges a node's facts (run), not an acceptance run's series")
        return self.evaluate_series(run, profile)

    def finding(self, subject: str, status: Status, severity: Severity, message: str, *,
                observed: Any = None, expected: Any = None, reason: str | None = None,
                remediation: str | None = None, action: str | None = None, label: str | None = None) -> Finding:
        return Finding(
            check=self.id, subject=subject, status=status, severity=severity, message=message,
            source=self.source, observed=observed, expected=expected, reason=reason, label=label,
            remediation=remediation if remediation is not None else (
                self.remediation if status in (Status.FAIL, Status.WARN) else None),
            action=action if action is not None else (
                self.action if status in (Status.FAIL, Status.WARN) else None),
        )

    def compare(self, subject: str, expectation: Expectation, observed: Any, what: str,
                refs: Mapping[str, Any] | None = None, bits: int | None = None) -> Finding:
        """The common case: one observed value against one expectation.

        `refs` resolves relative expectations such as `max: "@slowdown_c - 10"`
        against what the device itself reports. `bits`: the observed value is a
        counter of that width; at its maximum it is only a lower bound (`AtLeast`),
        which fails a limit below it and is `unknown` against a limit at or above it.
        """
        observed = saturated(observed, bits, "the counter")
        if isinstance(observed, Unknown):
            return self.missing(subject, expectation, observed, what)
        for name in expectation.references():
            ref = (refs or {}).get(name)
            if isinstance(ref, Unsupported):  # e.g. a threshold this GPU or recording lacks
                return self.missing(subject, expectation, ref, f"{what} is {observed}, but {name}")
        resolved = expectation.resolve(refs or {})
        if isinstance(resolved, str):
            return self.unknown(subject, expectation, f"{what} is {observed}, but {resolved}")
        expectation = resolved
        if isinstance(observed, AtLeast):
            return self._compare_at_least(subject, expectation, observed, what)
        verdict = expectation.evaluate(observed)
        if not verdict.comparable:
            return self.finding(subject, Status.UNKNOWN, expectation.severity, f"{what}: {verdict.detail}",
                                observed=observed, expected=expectation.expected, reason=expectation.reason)
        if verdict.ok:
            return self.finding(subject, Status.PASS, expectation.severity,
                                f"{what} is {observed}", observed=observed,
                                expected=expectation.expected, reason=expectation.reason)
        return self.finding(subject, expectation.status_on_mismatch(), expectation.severity,
                            f"{what} is {observed}, expected {expectation.describe()}",
                            observed=observed, expected=expectation.expected, reason=expectation.reason)

    def _compare_at_least(self, subject: str, expectation: Expectation, observed: AtLeast, what: str) -> Finding:
        verdict = expectation.evaluate_at_least(observed)
        if not verdict.comparable:
            return self.finding(subject, Status.UNKNOWN, expectation.severity, f"{what}: {verdict.detail}",
                                observed=observed.value, expected=expectation.expected, reason=expectation.reason)
        status = Status.PASS if verdict.ok else expectation.status_on_mismatch()
        tail = "" if verdict.ok else f", expected {expectation.describe()}"
        return self.finding(subject, status, expectation.severity,
                            f"{what} is at least {observed.value} ({observed.why}){tail}",
                            observed=observed.value, expected=expectation.expected, reason=expectation.reason)

    def missing(self, subject: str, expectation: Expectation | None, value: Unknown, what: str) -> Finding:
        """A fact that could not be judged: `skip` if not supported/recorded, else `unknown`."""
        if isinstance(value, Unsupported):
            return self.finding(subject, Status.SKIP, expectation.severity if expectation else Severity.INFO,
                                f"{what}: {value.reason}",
                                expected=expectation.expected if expectation else None,
                                reason=expectation.reason if expectation else None)
        return self.unknown(subject, expectation, f"{what}: {value.reason}")

    def unknown(self, subject: str, expectation: Expectation | None, message: str) -> Finding:
        return self.finding(subject, Status.UNKNOWN,
                            expectation.severity if expectation else Severity.WARNING, message,
                            expected=expectation.expected if expectation else None,
                            reason=expectation.reason if expectation else None)


# What a check of each source reads when it declares no `parts`.
SOURCE_AREAS: dict[str, tuple[str, ...]] = {
    "host": ("host",), "nvml": ("nvml",), "kmsg": ("kmsg",), "bmc": ("redfish", "ipmi"),
    "redfish": ("redfish",), "ipmi": ("ipmi",), "crosscheck": ("nvml", "redfish", "ipmi"),
}


def expectation_schema(description: str | None = None) -> dict[str, Any]:
    """The schema fragment of one plain expectation (comparators, severity, reason; null drops it)."""
    fragment: dict[str, Any] = {"$ref": "#/$defs/expectation_or_drop"}
    if description is not None:
        fragment["description"] = description
    return fragment


def keyed_schema(description: str, key_pattern: str) -> dict[str, Any]:
    """The fragment of a section whose keys are names (sysctl keys, modules) -> expectation."""
    return {"type": ["object", "null"], "description": description,
            "propertyNames": {"pattern": key_pattern},
            "additionalProperties": {"$ref": "#/$defs/expectation_or_drop"}}


def _module_names(folders: Iterable[str]) -> list[str]:
    """The modules and packages in `folders`, as `pkgutil.iter_modules` names them, in its order
    (without importing pkgutil and importlib.util: ~1 ms of a one-shot audit)."""
    names: dict[str, None] = {}
    for folder in folders:
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            name = inspect.getmodulename(entry)
            if name is None and "." not in entry and os.path.isdir(os.path.join(folder, entry)):
                with contextlib.suppress(OSError):
                    if any(inspect.getmodulename(f) == "__init__" for f in os.listdir(os.path.join(folder, entry))):
                        name = entry  # a package
            if name and name != "__init__" and "." not in name:
                names.setdefault(name)
    return list(names)


@functools.cache
def _discover() -> None:
    for name in _module_names(__path__):
        if not name.startswith("_"):
            importlib.import_module(f"{__name__}.{name}")


def all_checks() -> list[Check]:
    # Always discover (once), not "if the registry is empty": importing one
    # check module (a remediation reusing a helper) must not hide the others.
    _discover()
    return sorted(_REGISTRY.values(), key=lambda c: c.id)


def run_checks(checks: Iterable[Check], facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings: list[Finding] = []
    for check in checks:
        findings.extend(check.run(facts, profile))
    return findings
