"""The fleet-wide figures (`build_report`), derived at the end from one `NodeRecord` per node."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.apps.fleet.acceptance import AcceptRecord, accept_section, node_acceptance
from agent.apps.fleet.records import NodeRecord, NodeSummary, Skipped, waiver_expiry
from agent.core.names import natural_key

FLEET_SCHEMA = "nodewarden.fleet/v1"


@dataclass
class FleetOptions:
    stale_after: dt.timedelta = dt.timedelta(hours=24)
    expiring_within: dt.timedelta = dt.timedelta(days=14)
    thermal_delta_c: float = 5.0
    expected_nodes: list[str] | None = None
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    worst: int = 25
    heatmap_nodes: int = 1000  # rows of the thermal heat map (hottest first); every outlier stays in the JSON
    acceptance_stale_after: dt.timedelta = dt.timedelta(days=180)  # then an SRE re-accepts the node


def _version_key(version: str) -> tuple[Any, ...]:
    """Sort versions by their numeric parts ("7.10.50.00" > "7.9"), text as a tie-breaker."""
    parts: list[Any] = []
    for token in version.replace("-", ".").replace("_", ".").split("."):
        parts.append((0, int(token), "") if token.isdigit() else (1, 0, token))
    return tuple(parts)


class NodeRows:
    """The `nodes` table, worst first, made one row at a time (renderers stream it; len() is free)."""

    def __init__(self, ordered: list[NodeRecord], accepts: dict[str, AcceptRecord] | None = None,
                 options: FleetOptions | None = None) -> None:
        self.ordered = ordered
        self.accepts = accepts  # None: no acceptance run among the inputs, rows without `acceptance`
        self.options = options or FleetOptions()

    def __len__(self) -> int:
        return len(self.ordered)

    def acceptance_of(self, node: str) -> dict[str, Any]:
        rec = self.accepts.get(node) if self.accepts is not None else None
        return node_acceptance(rec, self.options.now, self.options.acceptance_stale_after)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for n in self.ordered:
            row = {
                "node": n.node,
                "profile": n.profile,
                "model": n.model,
                "compliant": n.compliant,
                "fail": n.fail,
                "warn": n.warn,
                "started_at": n.started_at.isoformat() if n.started_at else None,
            }
            if self.accepts is not None:
                row["acceptance"] = self.acceptance_of(n.node)
            yield row


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
    nodes: list[NodeRecord], skipped: list[Skipped], duplicates: list[dict[str, Any]], options: FleetOptions,
    accepts: dict[str, AcceptRecord] | None = None, accept_reports: int = 0,
) -> dict[str, Any]:
    """The fleet summary from one record per node (by name); `nodes` is a `NodeRows` to stream.

    `accepts` holds each node's newest acceptance run (agent.apps.fleet.acceptance), paired by node name;
    with no acceptance run among the inputs the report has no `acceptance` (audit-only fleets unchanged).
    """
    today = options.now.date()
    nodes = [n.as_of(today) for n in nodes]  # waivers expired by the report's date no longer waive
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
    heatmap = thermal_heatmap(nodes, medians, options.heatmap_nodes, options.thermal_delta_c)

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
        for check, subject, reason, expires_text, _status, _severity in node.waivers:
            day = waiver_expiry(expires_text)
            expired = day is not None and day < today
            # Soon: its last day falls within `expiring_within` of the report's time.
            last = dt.datetime.combine(day, dt.time(), dt.timezone.utc) if day else None
            soon = not expired and last is not None and last - options.now <= options.expiring_within
            waivers.append(
                {
                    "node": node.node,
                    "check": check,
                    "subject": subject,
                    "reason": reason,
                    "expires": expires_text,
                    "expiring_soon": soon,
                    "expired": expired,
                }
            )
    waivers.sort(key=lambda r: (not r["expired"], not r["expiring_soon"], str(r["expires"]), r["node"], r["check"]))

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

    # Nodes and boards the history rules call repeat offenders: the pattern, with its count and window.
    met = sorted(((n.node, *repeat) for n in nodes for repeat in n.repeats),
                 key=lambda r: (-r[4], r[0], r[1], r[2]))[:MAX_REPEAT_ROWS]
    repeat_offenders: list[dict[str, Any]] = [
        {"node": node, "subject": subject, "gpu": key or None, "rule": rule, "count": count, "window": window,
         "first": first or None, "last": last or None}
        for node, rule, subject, key, count, window, first, last in met]

    not_audited = sorted(
        ({"node": n.node, "sources": dict(n.down)} for n in nodes if n.down),
        key=lambda r: (-len(r["sources"]), r["node"]),
    )

    fleet: dict[str, Any] = {
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
            "waivers_expired": sum(1 for w in waivers if w["expired"]),
        },
        "by_check": checks,
        "by_profile": profiles,
        "worst_nodes": worst,
        "failure_signatures": failure_signatures(ordered),
        "firmware": firmware,
        "firmware_drift": sorted(drift),
        "thermal_outliers": outliers,
        "thermal_heatmap": heatmap,
        "xids": xids,
        "stale": stale,
        "missing": missing,
        "waivers": waivers,
        "not_audited": not_audited,
        "baselines": baselines,
    }
    if repeat_offenders:  # as acceptance: a fleet without any ledger history reports as before
        fleet["summary"]["repeat_offender_nodes"] = sum(1 for n in nodes if n.repeats)
        fleet["repeat_offenders"] = repeat_offenders
    if accepts or accept_reports:
        fleet["acceptance"] = accept_section([n.node for n in nodes], accepts or {}, accept_reports, options.now,
                                             options.acceptance_stale_after)
    fleet["nodes"] = NodeRows(ordered, (accepts or {}) if "acceptance" in fleet else None, options)
    return fleet


MAX_REPEAT_ROWS = 500  # repeat offenders listed, worst first; the summary counts every node
MAX_SIGNATURE_NODES = 20  # nodes named per failure signature; the rest are counted


def failure_signatures(ordered: list[NodeRecord]) -> list[dict[str, Any]]:
    """Failing nodes grouped by the set of checks that fail on them, biggest group first.

    Three hundred nodes failing the same two checks are one line with a count: one cause, usually
    one fix. `ordered` is worst first, so each group names its worst nodes first.
    """
    groups: dict[tuple[str, ...], list[NodeRecord]] = defaultdict(list)
    for node in ordered:
        if node.failed:
            groups[tuple(sorted(node.failed))].append(node)
    ordered_groups = sorted(groups.items(), key=lambda g: (-len(g[1]), -sum(1 for n in g[1] if n.critical), g[0]))
    return [
        {
            "checks": list(checks),
            "nodes": len(members),
            "critical_nodes": sum(1 for n in members if n.critical),
            "node_names": [n.node for n in members[:MAX_SIGNATURE_NODES]],
        }
        for checks, members in ordered_groups
    ]


def thermal_heatmap(nodes: list[NodeRecord], medians: dict[tuple[str, str], float], limit: int,
                    delta_c: float) -> dict[str, Any]:
    """Each node's GPUs in °C above the fleet median of the same slot and profile (None: no reading).

    Rows are the `limit` nodes with the largest excess, hottest first; `slots` the columns, in order.
    """
    slots = sorted({slot for node in nodes for slot in node.slots}, key=natural_key)
    column = {slot: i for i, slot in enumerate(slots)}
    rows: list[dict[str, Any]] = []
    for node in nodes:
        if not node.slots:
            continue
        above: list[float | None] = [None] * len(slots)
        for slot, temp in zip(node.slots, node.temps, strict=True):
            above[column[slot]] = round(temp - medians[(node.profile, slot)], 1)
        rows.append({"node": node.node, "profile": node.profile, "above_median_c": above})
    rows.sort(key=lambda r: (-max((v for v in r["above_median_c"] if v is not None), default=0.0), r["node"]))
    return {"slots": slots, "rows": rows[:limit], "nodes": len(rows), "delta_c": delta_c}
