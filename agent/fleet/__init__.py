"""Fleet compliance: many audit reports (or Prometheus) -> one summary.

Reading is the expensive part (about 5 GB of JSON at 100,000 nodes), so each
report is parsed and reduced to a `NodeRecord` in a worker process, and only
the records travel back. The parent folds each one in as it arrives
(`FleetReader`): a compact record per node, its repeated strings and tuples
shared (`Interner`), well under 5 KiB a node (issue #16); the fleet-wide
figures are derived from the records at the end (`build_report`) and the
renderers stream their output. A file that is corrupt, truncated, foreign,
of another schema or holding values no report holds is skipped with a
warning that the report lists; it never stops the report. A node that
reported more than once counts once: its newest report wins and the
duplicate is noted.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.errors import NodewardenError
from agent.jsonfile import JsonInputError, load_json_file

REPORT_SCHEMA = "nodewarden.report/v1"
FLEET_SCHEMA = "nodewarden.fleet/v1"
BASELINE_CHECK = "baseline.drift"
FIRMWARE_CHECKS = {"bmc.firmware": None, "gpu.firmware.vbios": "gpu vbios", "host.driver.version": "nvidia driver"}
MAX_FILE_BYTES = 64 << 20  # an audit report is ~100 KB; anything this big is not one
MAX_DEPTH = 64  # a report nests ~6 deep (observed values are small objects)


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


def _parse_time(text: Any) -> dt.datetime | None:
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
        _parse_time(data.get("started_at")),
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
    )


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
        self.waivers = tuple((r.check, r.subject, (r.waiver or {}).get("reason"), (r.waiver or {}).get("expires"))
                             for r in summary.waivers)
        self.down = tuple(summary.sources_down.items())
        self.has_baseline = summary.has_baseline
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


Result = tuple[NodeRecord, str | None] | Skipped  # a node (and its CSV rows when asked) or why not


def _read_one(path: str, keep_rows: bool) -> Result:
    """One file -> its record, or why it is skipped. Nothing in a file can stop the report."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            return Skipped(path, f"{size} bytes: too big for an audit report")
        data = load_json_file(Path(path), max_bytes=MAX_FILE_BYTES, max_depth=MAX_DEPTH)
    except JsonInputError as exc:
        return Skipped(path, f"unreadable JSON: {exc.message[:160]}")
    except OSError as exc:
        return Skipped(path, f"unreadable: {exc.strerror or exc}")
    try:
        return _result(summarize_report(data, path, keep_rows), keep_rows)
    except ValueError as exc:
        return Skipped(path, str(exc)[:300])
    except (TypeError, OverflowError, ArithmeticError, RecursionError, LookupError, AttributeError) as exc:
        # Values no audit report holds (a 400-digit temperature, ...): this file is refused, the rest go on.
        return Skipped(path, f"not a usable audit report ({type(exc).__name__}: {str(exc)[:160]})")


def _result(summary: NodeSummary, keep_rows: bool) -> tuple[NodeRecord, str | None]:
    if not keep_rows:
        return NodeRecord(summary), None
    from agent.fleet.render import csv_rows

    return NodeRecord(summary), csv_rows(summary)


def _read_chunk(paths: list[str], keep_rows: bool) -> list[Result]:
    return [_read_one(p, keep_rows) for p in paths]


def input_files(inputs: Iterable[Path]) -> tuple[list[str], list[Skipped]]:
    """Files as given and every *.json under the folders given, sorted; missing inputs are skipped."""
    files: list[str] = []
    skipped: list[Skipped] = []
    for item in inputs:
        if item.is_dir():
            files.extend(sorted(str(p) for p in item.rglob("*.json") if p.is_file()))
        elif item.is_file():
            files.append(str(item))
        else:
            skipped.append(Skipped(str(item), "no such file or folder"))
    return files, skipped


_OLDEST = dt.datetime.min.replace(tzinfo=dt.timezone.utc)


class FleetReader:
    """The parent's side: each result is folded in as it arrives, one compact record per node.

    A node that reported more than once keeps only its newest report (then the greater file
    name), as `newest_per_node` decides; the others are remembered by file name only. With
    `keep_rows` (CSV), each node's rendered rows go to an unnamed temporary spool file and the
    record keeps their offset, so memory stays per node whatever the number of findings.
    """

    def __init__(self, keep_rows: bool = False) -> None:
        self.keep_rows = keep_rows
        self.intern = Interner()
        self.by_name: dict[str, NodeRecord] = {}
        self.ignored: dict[str, list[tuple[tuple[dt.datetime, str], str]]] = {}
        self.skipped: list[Skipped] = []
        self.reports = 0
        self.spool: IO[bytes] | None = tempfile.TemporaryFile() if keep_rows else None  # noqa: SIM115

    def add(self, result: Result) -> None:
        if isinstance(result, Skipped):
            self.skipped.append(result)
            return
        rec, rows = result
        if rows is not None and self.spool is not None:
            data = rows.encode("utf-8", "surrogatepass")
            offset = self.spool.seek(0, os.SEEK_END)
            self.spool.write(data)
            rec.csv = (offset, len(data))
        self.add_record(rec)

    def add_summary(self, summary: NodeSummary) -> None:
        self.add(_result(summary, self.keep_rows))

    def add_record(self, rec: NodeRecord) -> None:
        self.reports += 1
        rec = self.intern.record(rec)
        current = self.by_name.get(rec.node)
        if current is None:
            self.by_name[rec.node] = rec
            return
        key, held = (rec.started_at or _OLDEST, rec.source), (current.started_at or _OLDEST, current.source)
        loser = current if key > held else rec
        if loser is current:
            self.by_name[rec.node] = rec
        self.ignored.setdefault(rec.node, []).append(((loser.started_at or _OLDEST, loser.source), loser.source))

    def records(self) -> list[NodeRecord]:
        """One record per node, by name."""
        return [self.by_name[name] for name in sorted(self.by_name)]

    def duplicates(self) -> list[dict[str, Any]]:
        return [
            {"node": name, "used": self.by_name[name].source,
             "ignored": [source for _key, source in sorted(losers, key=lambda kv: kv[0], reverse=True)]}
            for name, losers in sorted(self.ignored.items())
        ]

    def csv_rows(self, rec: NodeRecord) -> str:
        if rec.csv is None or self.spool is None:
            return ""
        self.spool.seek(rec.csv[0])
        return self.spool.read(rec.csv[1]).decode("utf-8", "surrogatepass")

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


def read_into(
    reader: FleetReader,
    files: list[str],
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FleetReader:
    """Parse in worker processes (JSON parsing is the bottleneck); fold each chunk in as it arrives."""
    workers = workers or min(os.cpu_count() or 1, 8)
    chunk = 200
    chunks = [files[i : i + chunk] for i in range(0, len(files), chunk)]
    done = 0
    if workers <= 1 or len(chunks) <= 1:
        outputs: Iterator[list[Result]] = (_read_chunk(part, reader.keep_rows) for part in chunks)
        pool = None
    else:
        pool = futures.ProcessPoolExecutor(max_workers=workers)
        outputs = pool.map(_read_chunk, chunks, [reader.keep_rows] * len(chunks))
    try:
        for part, out in zip(chunks, outputs, strict=True):
            for result in out:
                reader.add(result)
            done += len(part)
            if progress:
                progress(done, len(files))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return reader


def read_reports(
    files: list[str],
    keep_rows: bool = False,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FleetReader:
    """Every file folded into a new `FleetReader` (the caller closes it)."""
    return read_into(FleetReader(keep_rows), files, workers, progress)


def newest_per_node(nodes: list[NodeSummary]) -> tuple[list[NodeSummary], list[dict[str, Any]]]:
    """One summary per node: the newest report wins; the others are noted."""
    by_name: dict[str, list[NodeSummary]] = defaultdict(list)
    for node in nodes:
        by_name[node.node].append(node)
    kept: list[NodeSummary] = []
    duplicates: list[dict[str, Any]] = []
    for name, group in sorted(by_name.items()):
        group.sort(key=lambda n: (n.started_at or _OLDEST, n.source), reverse=True)
        kept.append(group[0])
        if len(group) > 1:
            duplicates.append({"node": name, "used": group[0].source, "ignored": [n.source for n in group[1:]]})
    return kept, duplicates


@dataclass
class FleetOptions:
    stale_after: dt.timedelta = dt.timedelta(hours=24)
    expiring_within: dt.timedelta = dt.timedelta(days=14)
    thermal_delta_c: float = 5.0
    expected_nodes: list[str] | None = None
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    worst: int = 25


def _version_key(version: str) -> tuple[Any, ...]:
    """Sort versions by their numeric parts ("7.10.50.00" > "7.9"), text as a tie-breaker."""
    parts: list[Any] = []
    for token in version.replace("-", ".").replace("_", ".").split("."):
        parts.append((0, int(token), "") if token.isdigit() else (1, 0, token))
    return tuple(parts)


class NodeRows:
    """The `nodes` table, worst first, made one row at a time (renderers stream it; len() is free)."""

    def __init__(self, ordered: list[NodeRecord]) -> None:
        self.ordered = ordered

    def __len__(self) -> int:
        return len(self.ordered)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for n in self.ordered:
            yield {
                "node": n.node,
                "profile": n.profile,
                "model": n.model,
                "compliant": n.compliant,
                "fail": n.fail,
                "warn": n.warn,
                "started_at": n.started_at.isoformat() if n.started_at else None,
            }


def _impact(node: NodeRecord) -> tuple[int, int, int, str]:
    return (-node.critical, -node.fail, -node.warn, node.node)


def build_fleet(
    nodes: list[NodeSummary], skipped: list[Skipped], duplicates: list[dict[str, Any]], options: FleetOptions
) -> dict[str, Any]:
    """The machine summary every output format renders, from one summary per node."""
    fleet = build_report([NodeRecord(n) for n in nodes], skipped, duplicates, options)
    fleet["nodes"] = list(fleet["nodes"])
    return fleet


def build_report(
    nodes: list[NodeRecord], skipped: list[Skipped], duplicates: list[dict[str, Any]], options: FleetOptions
) -> dict[str, Any]:
    """The fleet summary from one record per node (by name); `nodes` is a `NodeRows` to stream."""
    total = len(nodes)
    compliant = sum(1 for n in nodes if n.compliant)
    severity = [sum(n.severity[i] for n in nodes) for i in range(3)]

    judged: Counter[tuple[str, ...]] = Counter(n.judged for n in nodes)  # one entry per distinct set of checks
    failed: Counter[str] = Counter(c for n in nodes for c in n.failed)
    by_check: Counter[str] = Counter()
    for names, count in judged.items():
        for check in names:
            by_check[check] += count
    checks: list[dict[str, Any]] = sorted(
        (
            {"check": c, "nodes": n, "failing": failed[c], "compliant_pct": round(100 * (n - failed[c]) / n, 1)
             if n else 100.0}
            for c, n in by_check.items()
        ),
        key=lambda r: (-r["failing"], r["check"]),
    )

    by_profile: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for node in nodes:
        by_profile[node.profile][0] += 1
        by_profile[node.profile][1] += 1 if node.compliant else 0
    profiles: list[dict[str, Any]] = sorted(
        (
            {"profile": p, "nodes": n, "compliant": c, "compliant_pct": round(100 * c / n, 1)}
            for p, (n, c) in by_profile.items()
        ),
        key=lambda r: (r["compliant_pct"], r["profile"]),
    )

    ordered = sorted(nodes, key=_impact)
    worst = [
        {"node": n.node, "profile": n.profile, "fail": n.fail, "warn": n.warn, "critical": n.critical,
         "top": list(n.top)}
        for n in ordered[: options.worst]
        if n.fail or n.warn
    ]

    firmware: dict[str, list[dict[str, Any]]] = {}
    versions_by_component: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        for component, version in node.firmware:
            # Per profile: an A100 and an H100 node rightly run different VBIOS and drivers.
            versions_by_component[f"{component} [{node.profile}]"][version].append(node.node)
    for component, by_version in sorted(versions_by_component.items()):
        ordered_versions = sorted(by_version.items(), key=lambda kv: _version_key(kv[0]))
        firmware[component] = [
            {
                "version": v,
                "nodes": len(names),
                "oldest": i == 0 and len(ordered_versions) > 1,
                "node_names": sorted(names)[:50] if i == 0 and len(ordered_versions) > 1 else [],
            }
            for i, (v, names) in enumerate(ordered_versions)
        ]
    del versions_by_component
    drift = {c: rows for c, rows in firmware.items() if len(rows) > 1}

    readings: dict[tuple[str, str], list[float]] = defaultdict(list)
    for node in nodes:
        for slot, temp in zip(node.slots, node.temps, strict=True):
            readings[(node.profile, slot)].append(temp)
    medians = {key: statistics.median(temps) for key, temps in readings.items()}
    del readings
    outliers: list[dict[str, Any]] = []
    for node in nodes:
        for slot, temp in zip(node.slots, node.temps, strict=True):
            median = medians[(node.profile, slot)]
            if temp - median > options.thermal_delta_c:
                outliers.append(
                    {
                        "node": node.node,
                        "profile": node.profile,
                        "slot": slot,
                        "temperature_c": temp,
                        "slot_median_c": median,
                        "above_median_c": round(temp - median, 1),
                    }
                )
    outliers.sort(key=lambda r: (-r["above_median_c"], r["node"], r["slot"]))

    xid_codes: dict[int, dict[str, int]] = defaultdict(dict)
    for node in nodes:
        for code, count in node.xids:
            xid_codes[code][node.node] = count
    xids: list[dict[str, Any]] = sorted(
        (
            {
                "xid": code,
                "events": sum(per.values()),
                "nodes": len(per),
                "by_node": dict(sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))[:50]),
            }
            for code, per in xid_codes.items()
        ),
        key=lambda r: (-r["nodes"], -r["events"], r["xid"]),
    )

    stale: list[dict[str, Any]] = sorted(
        (
            {
                "node": n.node,
                "started_at": n.started_at.isoformat() if n.started_at else None,
                "age_hours": round((options.now - n.started_at).total_seconds() / 3600, 1) if n.started_at else None,
            }
            for n in nodes
            if n.started_at is None or options.now - n.started_at > options.stale_after
        ),
        key=lambda r: (-(r["age_hours"] or 1e9), r["node"]),
    )
    reported = {n.node for n in nodes}
    missing = sorted(set(options.expected_nodes or []) - reported)
    del reported

    waivers = []
    for node in nodes:
        for check, subject, reason, expires_text in node.waivers:
            expires = _parse_time(str(expires_text)) if expires_text else None
            if expires is None and isinstance(expires_text, str):
                try:
                    expires = dt.datetime.combine(dt.date.fromisoformat(expires_text), dt.time(), dt.timezone.utc)
                except ValueError:
                    expires = None
            soon = expires is not None and expires - options.now <= options.expiring_within
            waivers.append(
                {
                    "node": node.node,
                    "check": check,
                    "subject": subject,
                    "reason": reason,
                    "expires": expires_text,
                    "expiring_soon": soon,
                }
            )
    waivers.sort(key=lambda r: (not r["expiring_soon"], str(r["expires"]), r["node"], r["check"]))

    with_baseline = sum(1 for n in nodes if n.has_baseline)
    baselines = {
        "nodes_with_baseline": with_baseline,
        "nodes_without_baseline": total - with_baseline,
        "drifting": sorted(
            (
                {"node": n.node, "subject": subject, "status": status, "severity": sev, "message": message}
                for n in nodes
                for subject, status, sev, message in n.drifting
            ),
            key=lambda r: (r["status"] != "fail", r["node"], r["subject"]),
        ),
    }

    not_audited = sorted(
        ({"node": n.node, "sources": dict(n.down)} for n in nodes if n.down),
        key=lambda r: (-len(r["sources"]), r["node"]),
    )

    return {
        "schema": FLEET_SCHEMA,
        "generated_at": options.now.isoformat(timespec="seconds"),
        "inputs": {
            "reports": total + sum(len(d["ignored"]) for d in duplicates),
            "nodes": total,
            "skipped": [{"path": s.path, "reason": s.reason} for s in skipped],
            "duplicates": duplicates,
        },
        "summary": {
            "nodes": total,
            "compliant": compliant,
            "compliant_pct": round(100 * compliant / total, 1) if total else 0.0,
            "failing_findings_by_severity": dict(zip(("critical", "warning", "info"), severity, strict=True)),
            "stale": len(stale),
            "missing": len(missing),
            "not_audited": len(not_audited),
            "waivers": len(waivers),
            "waivers_expiring_soon": sum(1 for w in waivers if w["expiring_soon"]),
        },
        "by_check": checks,
        "by_profile": profiles,
        "worst_nodes": worst,
        "firmware": firmware,
        "firmware_drift": sorted(drift),
        "thermal_outliers": outliers,
        "xids": xids,
        "stale": stale,
        "missing": missing,
        "waivers": waivers,
        "not_audited": not_audited,
        "baselines": baselines,
        "nodes": NodeRows(ordered),
    }


def iter_rows(nodes: list[NodeSummary]) -> Iterator[tuple[NodeSummary, FindingRow]]:
    for node in nodes:
        for row in node.rows:
            yield node, row


def progress_bar(stream: Any = sys.stderr) -> Callable[[int, int], None] | None:
    """A one-line progress bar on a terminal; None otherwise (logs and pipes stay clean)."""
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(f"\rreading reports [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show
