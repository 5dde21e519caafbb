"""One audit report reduced to what the fleet report needs: `NodeSummary` (in the worker), then the
compact `NodeRecord` the parent keeps per node, its repeated values shared by an `Interner`.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import NodewardenError

REPORT_SCHEMA = "nodewarden.report/v1"
BASELINE_CHECK = "baseline.drift"
FIRMWARE_CHECKS = {"bmc.firmware": None, "gpu.firmware.vbios": "gpu vbios", "host.driver.version": "nvidia driver"}


class FleetInputError(NodewardenError):
    """No usable input at all."""

    exit_code = 2


@dataclass
class FindingRow:
    check: str
    subject: str
    status: str
    severity: str
    waived: bool
    message: str
    observed: Any = None
    expected: Any = None
    waiver: dict[str, Any] | None = None


@dataclass
class NodeSummary:
    node: str
    source: str  # the file (or "prometheus")
    profile: str
    model: str | None
    started_at: dt.datetime | None
    counts: dict[str, int]  # status -> count, waived counted as waived
    failing: list[FindingRow]  # fail and warn, unwaived, with messages
    checks: dict[str, bool]  # check -> True if the node passes it (no unwaived fail)
    firmware: dict[str, set[str]]  # component -> versions seen on this node
    temperatures: dict[str, float]  # GPU slot -> °C
    xids: dict[int, int]  # xid -> events
    waivers: list[FindingRow]
    sources_down: dict[str, str]  # source -> error
    rows: list[FindingRow] = field(default_factory=list)  # every finding (only kept for CSV)
    has_baseline: bool = False  # the node was judged against its recorded baseline
    # history rules met (checks/history*.py): (rule, subject, GPU key, count, window, first, last)
    repeats: list[tuple[str, str, str, int, str, str, str]] = field(default_factory=list)

    @property
    def compliant(self) -> bool:
        return all(self.checks.values())

    @property
    def fails(self) -> int:
        return self.counts.get("fail", 0)


@dataclass
class Skipped:
    path: str
    reason: str


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)


def summarize_report(data: Any, source: str, keep_rows: bool = False) -> NodeSummary:
    """One audit report -> what the fleet report needs; ValueError says why it is not usable."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema") != REPORT_SCHEMA:
        raise ValueError(f"not a nodewarden audit report (schema {data.get('schema')!r}, expected {REPORT_SCHEMA})")
    node_info, findings = data.get("node"), data.get("findings")
    if not isinstance(node_info, dict) or not isinstance(findings, list):
        raise ValueError("the report lacks `node` or `findings`")
    name = node_info.get("hostname") or Path(source).stem
    counts: Counter[str] = Counter()
    failing: list[FindingRow] = []
    checks: dict[str, bool] = {}
    firmware: dict[str, set[str]] = defaultdict(set)
    temperatures: dict[str, float] = {}
    xids: Counter[int] = Counter()
    waivers: list[FindingRow] = []
    rows: list[FindingRow] = []
    repeats: list[tuple[str, str, str, int, str, str, str]] = []
    has_baseline = False
    for item in findings:
        if not isinstance(item, dict) or not isinstance(item.get("check"), str):
            raise ValueError("a finding is not an object with a `check`")
        check, subject, status = item["check"], str(item.get("subject", "")), str(item.get("status", ""))
        has_baseline = has_baseline or check == BASELINE_CHECK
        waiver = item.get("waiver") if isinstance(item.get("waiver"), dict) else None
        counts["waived" if waiver else status] += 1
        # A skipped or waived finding never counts against compliance.
        checks[check] = checks.get(check, True) and not (status == "fail" and waiver is None)
        row = None
        if (status in ("fail", "warn") and waiver is None) or waiver is not None or keep_rows:
            row = FindingRow(
                check,
                subject,
                status,
                str(item.get("severity", "")),
                waiver is not None,
                str(item.get("message", "")),
                item.get("observed"),
                item.get("expected"),
                waiver,
            )
        if row is not None and status in ("fail", "warn") and waiver is None:
            failing.append(row)
        if row is not None and waiver is not None:
            waivers.append(row)
        if keep_rows and row is not None:
            rows.append(row)
        observed = item.get("observed")
        if check in FIRMWARE_CHECKS and isinstance(observed, str) and observed:
            firmware[FIRMWARE_CHECKS[check] or f"bmc {subject}"].add(observed)
        elif check == "gpu.temperature" and isinstance(observed, (int, float)) and not isinstance(observed, bool):
            temperatures[subject] = float(observed)
        elif check.startswith("history.") and status in ("fail", "warn") and waiver is None:
            repeats.extend(_repeats(subject, observed))
        elif check == "gpu.xid" and isinstance(observed, dict):
            for code, count in observed.items():
                if str(code).isdigit() and isinstance(count, int):
                    xids[int(code)] += count
    sources: dict[str, Any] = data["sources"] if isinstance(data.get("sources"), dict) else {}
    down = {
        name_: str(s.get("error") or "down")
        for name_, s in sources.items()
        if isinstance(s, dict) and s.get("configured", True) and not s.get("ok", False)
    }
    return NodeSummary(
        str(name),
        source,
        str(data.get("profile") or "?"),
        node_info.get("model"),
        parse_time(data.get("started_at")),
        dict(counts),
        failing,
        checks,
        dict(firmware),
        temperatures,
        dict(xids),
        waivers,
        down,
        rows,
        has_baseline,
        repeats[:MAX_REPEATS],
    )


MAX_REPEATS = 32  # history firings kept per node: more is a node to look at by hand anyway


def _repeats(subject: str, observed: Any) -> list[tuple[str, str, str, int, str, str, str]]:
    """The rules a history finding met, from its `observed` (hostile: only well-formed items, cut)."""
    out = []
    for item in observed if isinstance(observed, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("rule"), str):
            continue
        count = item.get("count", item.get("increase"))
        if not isinstance(count, int) or isinstance(count, bool):
            continue
        out.append((item["rule"][:64], subject[:64], str(item.get("key") or "")[:64], count,
                    str(item.get("window") or "")[:16], str(item.get("first") or "")[:32],
                    str(item.get("last") or "")[:32]))
    return out


class NodeRecord:
    """What the parent keeps of one node while the reports stream in (well under 1 KiB, issue #16).

    Built in the worker from a `NodeSummary`; `Interner` then makes the parent share every
    repeated string and tuple (check ids, subjects, the set of checks a profile runs, firmware
    mixes, report times) between nodes. Only failing, waived, baseline-drift and down-source
    details are kept per node; every fleet-wide figure is derived from these fields.
    """

    __slots__ = (
        "csv",
        "down",
        "drifting",
        "fail",
        "failed",
        "firmware",
        "has_baseline",
        "judged",
        "model",
        "node",
        "profile",
        "repeats",
        "severity",
        "slots",
        "source",
        "started_at",
        "temps",
        "top",
        "waivers",
        "warn",
        "xids",
    )

    def __init__(self, summary: NodeSummary) -> None:
        self.node = summary.node
        self.source = summary.source
        self.profile = summary.profile
        self.model: Any = summary.model
        self.started_at = summary.started_at
        self.fail = summary.fails
        self.warn = summary.counts.get("warn", 0)
        fails = [r for r in summary.failing if r.status == "fail"]
        # (critical, warning, info): the unwaived failing findings by severity.
        self.severity = tuple(sum(1 for r in fails if r.severity == s) for s in ("critical", "warning", "info"))
        self.judged = tuple(summary.checks)
        self.failed = tuple(c for c, ok in summary.checks.items() if not ok)
        self.top = tuple(f"{r.check} {r.subject}" for r in fails[:5])
        self.firmware = tuple((c, v) for c, versions in summary.firmware.items() for v in versions)
        self.slots = tuple(summary.temperatures)
        self.temps = tuple(summary.temperatures.values())
        self.xids = tuple(summary.xids.items())
        # With the finding's status and severity: a waiver that has expired by the fleet report's date
        # stops waiving, and `as_of` counts the finding again.
        self.waivers = tuple((r.check, r.subject, (r.waiver or {}).get("reason"), (r.waiver or {}).get("expires"),
                              r.status, r.severity) for r in summary.waivers)
        self.down = tuple(summary.sources_down.items())
        self.has_baseline = summary.has_baseline
        self.repeats = tuple(summary.repeats)
        self.drifting = (tuple((r.subject, r.status, r.severity, r.message) for r in summary.failing
                               if r.check == BASELINE_CHECK) if summary.has_baseline else ())
        self.csv: tuple[int, int] | None = None  # (offset, length) of its CSV rows in the spool

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)

    @property
    def compliant(self) -> bool:
        return not self.failed

    @property
    def critical(self) -> int:
        return int(self.severity[0])

    def as_of(self, today: dt.date) -> NodeRecord:
        """This node as the fleet report judges it on `today`: a waiver expired by then no longer waives.

        The node's audit attached the waiver while it was valid; a report made later must not keep
        it silenced (agent.policy.waivers: valid through its `expires` day). Returns self when nothing
        expired, else a copy that counts those findings as failing or warning again.
        """
        expired = [w for w in self.waivers if waiver_expired(w[3], today)]
        if not expired:
            return self
        node = copy.copy(self)
        severity = list(node.severity)
        failed, top = list(node.failed), list(node.top)
        for check, subject, _reason, _expires, status, sev in expired:
            if status == "fail":
                node.fail += 1
                if sev in _SEVERITIES:
                    severity[_SEVERITIES.index(sev)] += 1
                if check not in failed:
                    failed.append(check)
                if len(top) < 5:
                    top.append(f"{check} {subject}")
            elif status == "warn":
                node.warn += 1
        node.severity, node.failed, node.top = tuple(severity), tuple(failed), tuple(top)
        return node


_SEVERITIES = ("critical", "warning", "info")


def waiver_expiry(expires: Any) -> dt.date | None:
    """The last day a waiver covers: its `expires` date (YYYY-MM-DD, or the date of an ISO time)."""
    if not isinstance(expires, str) or len(expires) > 64:
        return None
    try:
        return dt.date.fromisoformat(expires)
    except ValueError:
        stamp = parse_time(expires)
        return stamp.date() if stamp else None


def waiver_expired(expires: Any, today: dt.date) -> bool:
    """Expired once its day has passed (the audit's rule, agent.policy.waivers.apply_waivers); unreadable: not."""
    day = waiver_expiry(expires)
    return day is not None and day < today


class Interner:
    """One shared object per distinct string, number, timestamp or tuple of them (the parent's memory).

    Numbers and times are keyed with their type (1, 1.0 and True stay distinct; so do equal
    instants in other time zones); a tuple is shared only when it holds nothing but text (check
    ids, subjects, firmware pairs), else only its items are. A hostile report's dict or list is
    kept as it is, never hashed.
    """

    def __init__(self) -> None:
        self._seen: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        return self._canon(value)[0]

    def _canon(self, value: Any) -> tuple[Any, bool]:
        """(the shared object, whether it is text: a str or a tuple of text, which keys itself)."""
        kind = type(value)
        if kind is str:
            return self._seen.setdefault(value, value), True
        if kind in (int, float, bool):
            return self._seen.setdefault((kind, value), value), False
        if kind is dt.datetime:
            return self._seen.setdefault((kind, value.isoformat()), value), False
        if kind is tuple:
            items = [self._canon(v) for v in value]
            shared = tuple(v for v, _ in items)
            if all(text for _, text in items):
                return self._seen.setdefault(shared, shared), True  # text equals text only: no false match
            return shared, False  # numbers inside (temperatures, counts): the items are shared, not the tuple
        return value, False

    def record(self, rec: NodeRecord) -> NodeRecord:
        for name in NodeRecord.__slots__:
            if name not in ("csv", "has_baseline"):
                setattr(rec, name, self(getattr(rec, name)))
        return rec


def iter_rows(nodes: list[NodeSummary]) -> Iterator[tuple[NodeSummary, FindingRow]]:
    for node in nodes:
        for row in node.rows:
            yield node, row
