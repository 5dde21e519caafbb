"""Fleet compliance: many audit reports (or Prometheus) -> one summary.

Reading is the expensive part at 10,000 nodes (about half a gigabyte of
JSON), so each report is parsed and reduced to a `NodeSummary` in a worker
process, and only the summaries travel back. A file that is corrupt,
truncated, foreign or of another schema is skipped with a warning that the
report lists; it never stops the report. A node that reported more than once
counts once: its newest report wins and the duplicate is noted.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _read_one(path: str, keep_rows: bool) -> NodeSummary | Skipped:
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
        return summarize_report(data, path, keep_rows)
    except ValueError as exc:
        return Skipped(path, str(exc))


def _read_chunk(paths: list[str], keep_rows: bool) -> list[NodeSummary | Skipped]:
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


def read_reports(
    files: list[str],
    keep_rows: bool = False,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[NodeSummary], list[Skipped]]:
    """Parse in worker processes (JSON parsing is the bottleneck), in file order."""
    workers = workers or min(os.cpu_count() or 1, 8)
    chunk = 200
    chunks = [files[i : i + chunk] for i in range(0, len(files), chunk)]
    results: list[NodeSummary | Skipped] = []
    done = 0
    if workers <= 1 or len(chunks) <= 1:
        for part in chunks:
            results.extend(_read_chunk(part, keep_rows))
            done += len(part)
            if progress:
                progress(done, len(files))
    else:
        with futures.ProcessPoolExecutor(max_workers=workers) as pool:
            for part, out in zip(chunks, pool.map(_read_chunk, chunks, [keep_rows] * len(chunks)), strict=True):
                results.extend(out)
                done += len(part)
                if progress:
                    progress(done, len(files))
    nodes = [r for r in results if isinstance(r, NodeSummary)]
    skipped = [r for r in results if isinstance(r, Skipped)]
    return nodes, skipped


def newest_per_node(nodes: list[NodeSummary]) -> tuple[list[NodeSummary], list[dict[str, Any]]]:
    """One summary per node: the newest report wins; the others are noted."""
    by_name: dict[str, list[NodeSummary]] = defaultdict(list)
    for node in nodes:
        by_name[node.node].append(node)
    oldest = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    kept: list[NodeSummary] = []
    duplicates: list[dict[str, Any]] = []
    for name, group in sorted(by_name.items()):
        group.sort(key=lambda n: (n.started_at or oldest, n.source), reverse=True)
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


def build_fleet(
    nodes: list[NodeSummary], skipped: list[Skipped], duplicates: list[dict[str, Any]], options: FleetOptions
) -> dict[str, Any]:
    """The machine summary every output format renders."""
    total = len(nodes)
    compliant = sum(1 for n in nodes if n.compliant)
    severity: Counter[str] = Counter()
    for node in nodes:
        for row in node.failing:
            if row.status == "fail":
                severity[row.severity] += 1

    by_check: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # check -> [nodes judged, nodes failing]
    for node in nodes:
        for check, ok in node.checks.items():
            entry = by_check[check]
            entry[0] += 1
            entry[1] += 0 if ok else 1
    checks: list[dict[str, Any]] = sorted(
        (
            {"check": c, "nodes": n, "failing": f, "compliant_pct": round(100 * (n - f) / n, 1) if n else 100.0}
            for c, (n, f) in by_check.items()
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

    def impact(node: NodeSummary) -> tuple[int, int, int, str]:
        critical = sum(1 for r in node.failing if r.status == "fail" and r.severity == "critical")
        return (-critical, -node.fails, -node.counts.get("warn", 0), node.node)

    worst = [
        {
            "node": n.node,
            "profile": n.profile,
            "fail": n.fails,
            "warn": n.counts.get("warn", 0),
            "critical": sum(1 for r in n.failing if r.status == "fail" and r.severity == "critical"),
            "top": [f"{r.check} {r.subject}" for r in n.failing if r.status == "fail"][:5],
        }
        for n in sorted(nodes, key=impact)[: options.worst]
        if n.fails or n.counts.get("warn")
    ]

    firmware: dict[str, list[dict[str, Any]]] = {}
    versions_by_component: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        for component, versions in node.firmware.items():
            for version in versions:
                # Per profile: an A100 and an H100 node rightly run different VBIOS and drivers.
                versions_by_component[f"{component} [{node.profile}]"][version].append(node.node)
    for component, by_version in sorted(versions_by_component.items()):
        ordered = sorted(by_version.items(), key=lambda kv: _version_key(kv[0]))
        firmware[component] = [
            {
                "version": v,
                "nodes": len(names),
                "oldest": i == 0 and len(ordered) > 1,
                "node_names": sorted(names)[:50] if i == 0 and len(ordered) > 1 else [],
            }
            for i, (v, names) in enumerate(ordered)
        ]
    drift = {c: rows for c, rows in firmware.items() if len(rows) > 1}

    slots: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for node in nodes:
        for slot, temp in node.temperatures.items():
            slots[(node.profile, slot)].append((temp, node.node))
    outliers: list[dict[str, Any]] = []
    for (profile, slot), readings in sorted(slots.items()):
        median = statistics.median(t for t, _ in readings)
        for temp, name in readings:
            if temp - median > options.thermal_delta_c:
                outliers.append(
                    {
                        "node": name,
                        "profile": profile,
                        "slot": slot,
                        "temperature_c": temp,
                        "slot_median_c": median,
                        "above_median_c": round(temp - median, 1),
                    }
                )
    outliers.sort(key=lambda r: (-r["above_median_c"], r["node"], r["slot"]))

    xid_codes: dict[int, dict[str, int]] = defaultdict(dict)
    for node in nodes:
        for code, count in node.xids.items():
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

    waivers = []
    for node in nodes:
        for row in node.waivers:
            waiver = row.waiver or {}
            expires = _parse_time(str(waiver.get("expires"))) if waiver.get("expires") else None
            if expires is None and isinstance(waiver.get("expires"), str):
                try:
                    expires = dt.datetime.combine(dt.date.fromisoformat(waiver["expires"]), dt.time(), dt.timezone.utc)
                except ValueError:
                    expires = None
            soon = expires is not None and expires - options.now <= options.expiring_within
            waivers.append(
                {
                    "node": node.node,
                    "check": row.check,
                    "subject": row.subject,
                    "reason": waiver.get("reason"),
                    "expires": waiver.get("expires"),
                    "expiring_soon": soon,
                }
            )
    waivers.sort(key=lambda r: (not r["expiring_soon"], str(r["expires"]), r["node"], r["check"]))

    with_baseline = [n for n in nodes if n.has_baseline]
    baselines = {
        "nodes_with_baseline": len(with_baseline),
        "nodes_without_baseline": total - len(with_baseline),
        "drifting": sorted(
            (
                {"node": n.node, "subject": r.subject, "status": r.status, "severity": r.severity, "message": r.message}
                for n in with_baseline
                for r in n.failing
                if r.check == BASELINE_CHECK
            ),
            key=lambda r: (r["status"] != "fail", r["node"], r["subject"]),
        ),
    }

    not_audited = sorted(
        ({"node": n.node, "sources": n.sources_down} for n in nodes if n.sources_down),
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
            "failing_findings_by_severity": {s: severity.get(s, 0) for s in ("critical", "warning", "info")},
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
        "nodes": [
            {
                "node": n.node,
                "profile": n.profile,
                "model": n.model,
                "compliant": n.compliant,
                "fail": n.fails,
                "warn": n.counts.get("warn", 0),
                "started_at": n.started_at.isoformat() if n.started_at else None,
            }
            for n in sorted(nodes, key=impact)
        ],
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
