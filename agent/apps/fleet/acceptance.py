"""Acceptance runs in the fleet report: a node's `nodewarden accept` JSON report -> `AcceptRecord`, paired
with the node's audit by node name (issue 25 item 4): accepted / failed / none on record, when, with
which baseline, drifted how, under which load, and `stale` once older than `acceptance_stale_after`.

An accept report is an audit-schema report (`nodewarden.report/v1`) with an `acceptance` block; it is
hostile input like every fleet file: bounded, typed, unknown fields ignored, and a broken one is a
per-file error (ValueError -> the file is skipped with the reason), never a crash.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.apps.fleet.records import REPORT_SCHEMA, parse_time
from agent.core.sanitise import clean

DRIFT_CHECK = "accept.drift"
MAX_ACCEPT_BYTES = 4 << 20  # 8 GPUs x ~15 checks is ~100 KB; a bigger "acceptance" is not one
MAX_FINDINGS = 5000
MAX_TEXT = 256  # node names, run ids, load descriptions
MAX_RUN_S = 30 * 86400.0
_SEVERITY = {"critical": 0, "warning": 1, "info": 2}
# accept.drift's three measures (checks/accept_drift.py messages) as a person reads them, with their sign.
_MEASURES = (("degC/W against the baseline", "thermal resistance", "+"),
             ("power drop at the same utilization", "power", "-"),
             ("SM clock drop at the same power", "SM clock", "-"))


def is_acceptance(data: Any) -> bool:
    """An accept report: the audit schema plus an `acceptance` key (whatever it holds: checked later)."""
    return isinstance(data, dict) and data.get("schema") == REPORT_SCHEMA and "acceptance" in data


@dataclass(slots=True)
class AcceptRecord:
    node: str
    source: str
    finished_at: dt.datetime  # the run's end: started_at + duration_s
    passed: bool
    run: str
    baseline: str | None
    became_baseline: bool
    compared: bool  # judged against a stored baseline (`compared_with`, or accept.drift findings present)
    compared_with: str | None  # that baseline's run id, where the report names it
    drift: int  # unwaived failing or warning drift findings
    worst: str | None  # the worst of them, e.g. "GPU3 thermal resistance +18.0 %"
    load: str | None

    def key(self) -> tuple[dt.datetime, str]:
        return self.finished_at, self.source


def _text(value: Any, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ValueError(f"acceptance `{what}` is not a short string")
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def summarize_acceptance(data: dict[str, Any], source: str) -> AcceptRecord:
    """One accept report -> its record; ValueError says why the file is not a usable one."""
    block, node, findings = data.get("acceptance"), data.get("node"), data.get("findings")
    if not isinstance(block, dict):
        raise ValueError("the `acceptance` block is not an object")
    if not isinstance(node, dict) or not isinstance(findings, list):
        raise ValueError("the accept report lacks `node` or `findings`")
    if len(findings) > MAX_FINDINGS:
        raise ValueError(f"{len(findings)} findings: too many for an acceptance run")
    name = _text(node.get("hostname") or Path(source).stem, "node.hostname")
    started, duration = parse_time(data.get("started_at")), _number(data.get("duration_s"))
    if started is None or duration is None or not 0 <= duration <= MAX_RUN_S:
        raise ValueError("the accept report has no usable `started_at` and `duration_s`")
    passed, became = block.get("passed"), block.get("became_baseline", False)
    if not isinstance(passed, bool) or not isinstance(became, bool):
        raise ValueError("acceptance `passed` / `became_baseline` are not true or false")
    # Newer accept reports state their end and the baseline that judged them; older ones are read by
    # started_at + duration_s and by the presence of drift findings.
    ended = parse_time(block["finished_at"]) if isinstance(block.get("finished_at"), str) else None
    compared_with = _text(block.get("compared_with"), "compared_with", optional=True)
    compared, drifts = compared_with is not None, []
    for item in findings:
        if not isinstance(item, dict):
            raise ValueError("a finding is not an object")
        if item.get("check") != DRIFT_CHECK:
            continue
        compared = True
        if item.get("status") in ("fail", "warn") and item.get("waiver") is None:
            drifts.append(item)
    return AcceptRecord(
        node=str(name), source=source, finished_at=ended or started + dt.timedelta(seconds=duration), passed=passed,
        run=str(_text(block.get("run"), "run")), baseline=_text(block.get("baseline"), "baseline", optional=True),
        became_baseline=became, compared=compared, compared_with=compared_with, drift=len(drifts), worst=_worst(drifts),
        load=_load(block.get("load"), block.get("phases")))


def _worst(drifts: list[dict[str, Any]]) -> str | None:
    def rank(item: dict[str, Any]) -> tuple[int, int, float]:
        level = item.get("severity")
        severity = _SEVERITY.get(level, 3) if isinstance(level, str) else 3
        return severity, 0 if item.get("status") == "fail" else 1, -abs(_number(item.get("observed")) or 0.0)

    if not drifts:
        return None
    item = min(drifts, key=rank)
    subject, message = item.get("subject"), item.get("message")
    subject = subject if isinstance(subject, str) else "?"
    message = message if isinstance(message, str) else ""
    change = _number(item.get("observed"))
    for marker, what, sign in _MEASURES:
        if marker in message and change is not None:
            shown = change if sign == "+" else -change
            return f"{subject[:32].upper()} {what} {shown:+.1f} %"
    return f"{subject[:32]}: {message[:160]}"


def _load(load: Any, phases: Any) -> str | None:
    """The load as run said it (`described`, else its kind), with the steady phase's length."""
    if not isinstance(load, dict):
        return None
    text = load.get("described") if isinstance(load.get("described"), str) else load.get("kind")
    if not isinstance(text, str):
        return None
    steady = phases.get("steady") if isinstance(phases, dict) else None
    if isinstance(steady, list) and len(steady) == 2:
        start, end = _number(steady[0]), _number(steady[1])
        if start is not None and end is not None and 0 <= end - start <= MAX_RUN_S:
            return f"{text[:MAX_TEXT]}, steady {end - start:.0f} s"
    return text[:MAX_TEXT]


def baseline_date(run_id: str | None) -> str | None:
    """A baseline's date from its run id (`YYYYMMDDTHHMMSSZ-PID`, agent.apps.accept.run), or None."""
    if not run_id:
        return None
    try:
        return dt.datetime.strptime(run_id.split("-", 1)[0], "%Y%m%dT%H%M%SZ").date().isoformat()
    except ValueError:
        return None


NONE_ON_RECORD = "none on record"


def node_acceptance(rec: AcceptRecord | None, now: dt.datetime, stale_after: dt.timedelta) -> dict[str, Any]:
    """A node's acceptance as every output shows it (the JSON `acceptance` of a node)."""
    if rec is None:
        return {"state": "none", "finished_at": None, "run": None, "baseline": None, "baseline_date": None,
                "compared_with_baseline": False, "compared_with": None, "became_baseline": False, "drift_findings": 0,
                "worst_drift": None, "load": None, "stale": False, "age_days": None, "source": None}
    age = now - rec.finished_at
    return {"state": "accepted" if rec.passed else "failed",
            "finished_at": rec.finished_at.isoformat(timespec="seconds"), "run": rec.run, "baseline": rec.baseline,
            "baseline_date": baseline_date(rec.baseline), "compared_with_baseline": rec.compared,
            "compared_with": rec.compared_with,
            "became_baseline": rec.became_baseline, "drift_findings": rec.drift, "worst_drift": rec.worst,
            "load": rec.load, "stale": age > stale_after, "age_days": round(age.total_seconds() / 86400, 1),
            "source": rec.source}


def describe(acc: dict[str, Any]) -> str:
    """One line a person reads: "accepted 2026-12-03T22:02:54+00:00, baseline ... (compared), no drift"."""
    if acc["state"] == "none":
        return NONE_ON_RECORD
    parts = [f"{acc['state']} {acc['finished_at']}" + (f" (stale: {acc['age_days']} days old)" if acc["stale"]
                                                      else "")]
    if acc["baseline"] is None:
        parts.append("no baseline")
    elif acc["became_baseline"]:  # the id is this run's own: say whether an older baseline judged it first
        judged_by = f"baseline {acc['compared_with']}" if acc.get("compared_with") else "the previous baseline"
        parts.append((f"compared with {judged_by}, then " if acc["compared_with_baseline"] else "")
                     + f"became the baseline {acc['baseline']}")
    else:
        how = "compared" if acc["compared_with_baseline"] else "not compared"
        parts.append(f"baseline {acc['baseline']} of {acc['baseline_date'] or '?'} ({how})")
    if acc["compared_with_baseline"]:
        parts.append(f"drift: {acc['drift_findings']}, worst {acc['worst_drift']}" if acc["drift_findings"]
                     else "no drift")
    if acc["load"]:
        parts.append(f"load {acc['load']}")
    return "; ".join(parts)


def accept_section(names: list[str], by_name: dict[str, AcceptRecord], reports: int, now: dt.datetime,
            stale_after: dt.timedelta) -> dict[str, Any]:
    """The fleet-level block: counts over the audited nodes, the failed and stale ones in full."""
    counts = {"accepted": 0, "failed": 0, "none": 0}
    failed: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    for name in sorted(names):  # an entry is made only for the nodes listed in full (memory at 100k nodes)
        rec = by_name.get(name)
        if rec is None:
            counts["none"] += 1
            continue
        counts["accepted" if rec.passed else "failed"] += 1
        if not rec.passed or now - rec.finished_at > stale_after:
            full = {"node": name, **node_acceptance(rec, now, stale_after)}
            if not rec.passed:
                failed.append(full)
            if full["stale"]:
                stale.append(full)
    audited = set(names)
    return {
        "stale_after_days": round(stale_after.total_seconds() / 86400, 1),
        "reports": reports,
        **counts,
        "stale": len(stale),
        "failed_nodes": failed,
        "stale_nodes": stale,
        "without_audit": sorted(n for n in by_name if n not in audited),
    }


def accept_rank(acc: dict[str, Any]) -> int:
    """Listing order: failed, stale, none on record, accepted."""
    return 0 if acc["state"] == "failed" else 1 if acc["stale"] else 2 if acc["state"] == "none" else 3


def attention(acc: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes the fleet block lists in full: failed, then stale (a node once)."""
    failed: list[dict[str, Any]] = acc["failed_nodes"]
    return failed + [r for r in acc["stale_nodes"] if r["state"] != "failed"]


def accept_counts(acc: dict[str, Any]) -> str:
    """The fleet-level line of the `acceptance` block."""
    return (f"{acc['accepted']} nodes accepted, {acc['failed']} failed, {acc['none']} {NONE_ON_RECORD}; "
            f"{acc['stale']} accepted more than {acc['stale_after_days']:g} days ago (stale: re-accept).")


def html_cell(acc: dict[str, Any]) -> str:
    """The all-nodes table's acceptance cell: failed in red, stale in amber."""
    cls = "crit" if acc["state"] == "failed" else "warn" if acc["stale"] else ""
    text = html.escape(clean(describe(acc)))
    return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"


_CSV_KEYS = ("run", "baseline", "baseline_date", "compared_with_baseline", "became_baseline", "drift_findings",
             "worst_drift", "load", "stale", "age_days")


def csv_cells(node: str, profile: str, acc: dict[str, Any]) -> list[str]:
    """A node's acceptance as one fleet CSV row (check `acceptance`; `observed` holds the details as JSON)."""
    observed = json.dumps({k: acc[k] for k in _CSV_KEYS}, sort_keys=True) if acc["state"] != "none" else ""
    return [node, profile, acc["finished_at"] or "", "acceptance", "node", acc["state"], "", "no", observed, "",
            describe(acc)]
