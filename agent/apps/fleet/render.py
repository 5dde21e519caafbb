"""Fleet report outputs: one self-contained HTML page, Markdown, CSV (a row per finding), JSON.

The HTML has no scripts, fonts or external resources: inline CSS and SVG
charts, so it opens offline, in a ticket, or printed. Every string from the
audit files goes through `agent.core.sanitise` in every format: control characters
and lone surrogates become visible escapes, CSV formulas are neutralised,
Markdown and HTML are escaped.
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import itertools
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from agent.apps.fleet.acceptance import accept_counts, accept_rank, attention, csv_cells, describe, html_cell
from agent.apps.fleet.charts import bar_chart, stacked_bar
from agent.apps.fleet.heatmap import heatmap_svg, signatures_table
from agent.apps.fleet.records import waiver_expired
from agent.core.sanitise import clean, clean_value, csv_row, md_cell
from agent.report.html import CSS

if TYPE_CHECKING:  # the renderers take agent.apps.fleet's records
    from agent.apps.fleet.figures import NodeRows
    from agent.apps.fleet.records import NodeRecord, NodeSummary


class RowSource(Protocol):
    """What iter_csv needs of agent.apps.fleet.reading's FleetReader (which imports this module: no circle)."""

    def csv_rows(self, rec: NodeRecord) -> str: ...


TABLE_LIMIT = 200  # rows per table in HTML/Markdown; the JSON has everything


_ENCODE_STR = json.encoder.encode_basestring_ascii  # the C encoder's string escaper (ensure_ascii)


def _dumps(value: Any, level: int) -> str:
    """`value` as `json.dumps(..., indent=1)` writes it `level` deep inside the document."""
    text = json.dumps(clean_value(value), indent=1, default=lambda v: clean(str(v)))
    return text.replace("\n", "\n" + " " * level) if level else text


def _scalar(value: Any) -> str | None:
    """A flat value as json writes it, or None for anything else (then `_dumps` does it)."""
    if isinstance(value, str):
        return _ENCODE_STR(clean(value))
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return int.__repr__(value)
    return None


def _node_entry(row: dict[str, Any]) -> str:
    """One `nodes` entry at depth 2, byte for byte what `json.dumps(indent=1)` makes, without it."""
    parts = []
    for key, value in row.items():
        text = _scalar(value)
        parts.append(f"{_ENCODE_STR(key)}: {text if text is not None else _dumps(value, 3)}")
    return "{\n   " + ",\n   ".join(parts) + "\n  }"


def iter_json(fleet: dict[str, Any], batch: int = 2000) -> Iterator[str]:
    """The fleet as indented JSON, in pieces: the per-node table a batch of entries at a time."""
    yield "{"
    for index, (key, value) in enumerate(fleet.items()):
        yield ("\n " if index == 0 else ",\n ") + _ENCODE_STR(clean(key)) + ": "
        if key != "nodes" or (isinstance(value, list) and not value):
            yield _dumps(value, 1)
            continue
        rows = iter(value)
        first = True
        while True:
            chunk = [_node_entry(row) for row in itertools.islice(rows, batch)]
            if not chunk:
                break
            yield ("[\n  " if first else ",\n  ") + ",\n  ".join(chunk)
            first = False
        yield "[]" if first else "\n ]"
    yield "\n}\n" if fleet else "}\n"


def render_json(fleet: dict[str, Any]) -> str:
    return "".join(iter_json(fleet))


CSV_HEADER = "node,profile,started_at,check,subject,status,severity,waived,observed,expected,message\n"


def csv_rows(node: NodeSummary, today: dt.date | None = None) -> str:
    """One node's CSV rows (a row per finding, no header); made in the worker that read the node.

    `waived` is yes, no, or `expired` for a waiver whose day passed before `today` (the report's
    date): it no longer waives, as the table and JSON say (issue 26 item 4).
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    started = node.started_at.isoformat() if node.started_at else ""
    for row in node.rows:
        cells = [
            node.node,
            node.profile,
            started,
            row.check,
            row.subject,
            row.status,
            row.severity,
            _waived(row.waiver, today) if row.waived else "no",
            _cell(row.observed),
            _cell(row.expected),
            row.message,
        ]
        writer.writerow(csv_row(cells))
    return out.getvalue()


def _waived(waiver: dict[str, Any] | None, today: dt.date | None) -> str:
    return "expired" if today is not None and waiver and waiver_expired(waiver.get("expires"), today) else "yes"


def render_csv(nodes: list[NodeSummary], today: dt.date | None = None) -> str:
    return CSV_HEADER + "".join(csv_rows(node, today) for node in nodes)


def iter_csv(reader: RowSource, records: list[NodeRecord], rows: NodeRows | None = None) -> Iterator[str]:
    """The CSV of the nodes kept, by name, from the rows the reader spooled as they arrived; with `rows`
    (the fleet's `nodes`), each node's acceptance follows as one more row, check `acceptance`."""
    yield CSV_HEADER
    for rec in records:
        yield reader.csv_rows(rec)
        if rows is not None and rows.accepts is not None:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerow(csv_row(csv_cells(rec.node, rec.profile,
                                                                            rows.acceptance_of(rec.node))))
            yield out.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


# --- Markdown --------------------------------------------------------------------------------------


def _md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows[:TABLE_LIMIT]]
    if len(rows) > TABLE_LIMIT:
        lines.append(f"\n{len(rows) - TABLE_LIMIT} more rows in the JSON output.")
    return "\n".join(lines) + "\n"


def render_md(fleet: dict[str, Any]) -> str:
    return "".join(iter_md(fleet))


def iter_md(fleet: dict[str, Any]) -> Iterator[str]:
    """Markdown, a section at a time (every table stops at TABLE_LIMIT rows)."""
    s = fleet["summary"]
    parts = [
        f"# nodewarden fleet report\n\nGenerated {fleet['generated_at']}. **{s['nodes']} nodes**, "
        f"**{s['compliant_pct']} % compliant** ({s['compliant']}), failing findings: "
        + ", ".join(f"{k} {v}" for k, v in s["failing_findings_by_severity"].items())
        + f"; {s['stale']} stale, {s['missing']} missing, {s['not_audited']} not fully audited.\n"
    ]
    parts.append(
        "## Compliance by check\n\n"
        + _md_table(
            ["check", "nodes", "failing", "compliant %"],
            [[r["check"], r["nodes"], r["failing"], r["compliant_pct"]] for r in fleet["by_check"] if r["failing"]],
        )
    )
    parts.append(
        "## Compliance by profile\n\n"
        + _md_table(
            ["profile", "nodes", "compliant", "compliant %"],
            [[r["profile"], r["nodes"], r["compliant"], r["compliant_pct"]] for r in fleet["by_profile"]],
        )
    )
    parts.append(
        "## Worst nodes\n\n"
        + _md_table(
            ["node", "profile", "critical", "fail", "warn", "failing checks"],
            [
                [r["node"], r["profile"], r["critical"], r["fail"], r["warn"], ", ".join(r["top"])]
                for r in fleet["worst_nodes"]
            ],
        )
    )
    parts.append(
        "## Failure signatures\n\nFailing nodes grouped by the checks that fail on them.\n\n"
        + _md_table(
            ["nodes", "with critical", "failing checks", "nodes, worst first"],
            [[r["nodes"], r["critical_nodes"], ", ".join(r["checks"]), ", ".join(r["node_names"][:10])]
             for r in fleet["failure_signatures"]],
        )
    )
    rows = []
    for component in fleet["firmware_drift"]:
        for v in fleet["firmware"][component]:
            rows.append([component, v["version"], v["nodes"], ", ".join(v["node_names"][:10]) if v["oldest"] else ""])
    parts.append(
        "## Firmware drift\n\n"
        + (
            _md_table(["component", "version", "nodes", "oldest on"], rows)
            if rows
            else "One version per component across the fleet.\n"
        )
    )
    parts.append(
        "## GPU thermal outliers\n\n"
        + _md_table(
            ["node", "profile", "slot", "°C", "slot median °C", "above"],
            [
                [r["node"], r["profile"], r["slot"], r["temperature_c"], r["slot_median_c"], r["above_median_c"]]
                for r in fleet["thermal_outliers"]
            ],
        )
    )
    parts.append(
        "## Xid errors\n\n"
        + _md_table(
            ["xid", "nodes", "events", "nodes (events)"],
            [
                [r["xid"], r["nodes"], r["events"], ", ".join(f"{n} ({c})" for n, c in list(r["by_node"].items())[:10])]
                for r in fleet["xids"]
            ],
        )
    )
    if fleet.get("repeat_offenders"):
        parts.append(
            "## Repeat offenders\n\nNodes and GPUs (by serial) a history rule of the node's ledger fires for: a "
            "fault that keeps coming back, counted in the rule's window.\n\n"
            + _md_table(
                ["node", "subject", "GPU", "rule", "count", "window", "first", "last"],
                [[r["node"], r["subject"], r["gpu"] or "", r["rule"], r["count"], r["window"], r["first"] or "",
                  r["last"] or ""] for r in fleet["repeat_offenders"]],
            )
        )
    parts.append(
        "## Missing and stale reports\n\n"
        + _md_table(
            ["node", "state", "last report"],
            [[n, "missing", ""] for n in fleet["missing"]]
            + [[r["node"], f"stale ({r['age_hours']} h)", r["started_at"]] for r in fleet["stale"]],
        )
    )
    parts.append(
        "## Nodes not fully audited\n\n"
        + _md_table(
            ["node", "sources down"],
            [[r["node"], "; ".join(f"{k}: {v}" for k, v in r["sources"].items())] for r in fleet["not_audited"]],
        )
    )
    b = fleet["baselines"]
    parts.append(
        "## Baselines\n\n"
        + f"{b['nodes_with_baseline']} nodes judged against their baseline, {b['nodes_without_baseline']} without one"
        + " (`nodewarden baseline record`).\n\n"
        + _md_table(
            ["node", "subject", "status", "drift"],
            [[r["node"], r["subject"], r["status"], r["message"]] for r in b["drifting"]],
        )
    )
    if "acceptance" in fleet:
        listed = sorted(fleet["nodes"], key=lambda r: (accept_rank(r["acceptance"]), r["node"]))
        parts.append(f"## Acceptance\n\n{accept_counts(fleet['acceptance'])}\n\n" + _md_table(
            ["node", "acceptance"], [[r["node"], describe(r["acceptance"])] for r in listed]))
    expired = [r for r in fleet["waivers"] if r.get("expired")]
    parts.append(
        "## Waivers\n\n"
        + (
            f"### Expired ({len(expired)}): they no longer waive their findings, which count again\n\n"
            + _md_table(
                ["node", "check", "subject", "reason", "expired"],
                [[r["node"], r["check"], r["subject"], r["reason"], r["expires"]] for r in expired],
            )
            + "\n### In force\n\n"
            if expired
            else ""
        )
        + _md_table(
            ["node", "check", "subject", "reason", "expires", "expiring soon"],
            [
                [r["node"], r["check"], r["subject"], r["reason"], r["expires"], "yes" if r["expiring_soon"] else ""]
                for r in fleet["waivers"]
                if not r.get("expired")
            ],
        )
    )
    skipped = fleet["inputs"]["skipped"]
    parts.append(
        "## Inputs\n\n" + f"{fleet['inputs']['reports']} reports for {fleet['inputs']['nodes']} nodes; "
        f"{len(skipped)} files skipped, {len(fleet['inputs']['duplicates'])} nodes reported more than once "
        "(the newest report is used).\n\n"
        + (_md_table(["file", "why skipped"], [[r["path"], r["reason"]] for r in skipped]) if skipped else "")
    )
    for index, part in enumerate(parts):
        yield part if index == 0 else "\n" + part


# --- HTML ------------------------------------------------------------------------------------------

# the page's CSS: agent.report.html (shared with the acceptance page)


def _e(value: Any) -> str:
    return html.escape("" if value is None else clean(str(value)))


def anchor(node: str) -> str:
    return "node-" + re.sub(r"[^A-Za-z0-9_.-]", "_", node)


def _node_link(node: str) -> str:
    return f'<a href="#{anchor(node)}">{_e(node)}</a>'


def _table(
    headers: list[str], rows: list[list[str]], numeric: set[int] | None = None, row_ids: list[str] | None = None
) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for index, row in enumerate(rows[:TABLE_LIMIT] if row_ids is None else rows):
        rid = f' id="{row_ids[index]}"' if row_ids is not None else ""
        cells = "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        body.append(f"<tr{rid}>{cells}</tr>")
    more = (
        f'<p class="more">{len(rows) - TABLE_LIMIT} more rows in the JSON output.</p>'
        if row_ids is None and len(rows) > TABLE_LIMIT
        else ""
    )
    if not rows:
        return '<p class="ok">None.</p>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def render_html(fleet: dict[str, Any]) -> str:
    return "".join(iter_html(fleet))


def iter_html(fleet: dict[str, Any], batch: int = 2000) -> Iterator[str]:
    """The page in pieces: everything above the all-nodes table, then that table a batch of rows at a time."""
    s = fleet["summary"]
    sev = s["failing_findings_by_severity"]
    card_items: list[tuple[Any, str, str]] = [
        (s["nodes"], "nodes", ""),
        (f"{s['compliant_pct']} %", "compliant", "ok" if s["compliant_pct"] >= 95 else "warn"),
        (sev["critical"], "critical findings", "crit" if sev["critical"] else ""),
        (sev["warning"], "warning findings", ""),
        (s["stale"], "stale reports", "warn" if s["stale"] else ""),
        (s["missing"], "missing reports", "warn" if s["missing"] else ""),
        (s["not_audited"], "not fully audited", "warn" if s["not_audited"] else ""),
        (s["waivers_expiring_soon"], "waivers expiring soon", "warn" if s["waivers_expiring_soon"] else ""),
    ]
    if s.get("waivers_expired"):
        card_items.append((s["waivers_expired"], "waivers expired", "crit"))
    acc = fleet.get("acceptance")
    if acc is not None:
        card_items += [(acc["accepted"], "accepted", ""), (acc["failed"], "acceptance failed",
                                                           "crit" if acc["failed"] else ""),
                       (acc["none"], "no acceptance", "")]
    cards = "".join(
        f'<div class="card"><b class="{cls}">{_e(value)}</b><span>{_e(label)}</span></div>'
        for value, label, cls in card_items
    )
    failing_checks = [r for r in fleet["by_check"] if r["failing"]]
    sections = [
        f'<h1>nodewarden fleet report</h1><p class="meta">Generated {_e(fleet["generated_at"])} from '
        f"{fleet['inputs']['reports']} reports; {len(fleet['inputs']['skipped'])} files skipped.</p>",
        f'<div class="cards">{cards}</div>',
        '<h2 id="by-check">Compliance by check</h2>',
        bar_chart([(r["check"], r["failing"], "#b00020") for r in failing_checks[:20]], "Nodes failing, by check"),
        _table(
            ["check", "nodes", "failing", "compliant %"],
            [[_e(r["check"]), str(r["nodes"]), str(r["failing"]), str(r["compliant_pct"])] for r in failing_checks],
            {1, 2, 3},
        ),
        '<h2 id="by-profile">Compliance by profile</h2>',
        bar_chart(
            [(r["profile"], r["compliant_pct"], "#2e7d32") for r in fleet["by_profile"]],
            "Compliant %, by profile",
            100,
            " %",
        ),
        _table(
            ["profile", "nodes", "compliant", "compliant %"],
            [
                [_e(r["profile"]), str(r["nodes"]), str(r["compliant"]), str(r["compliant_pct"])]
                for r in fleet["by_profile"]
            ],
            {1, 2, 3},
        ),
        '<h2 id="worst">Worst nodes, by failure signature</h2>',
        signatures_table(fleet["failure_signatures"], _node_link),
        '<h2 id="firmware">Firmware drift</h2>',
    ]
    if fleet["firmware_drift"]:
        for component in fleet["firmware_drift"]:
            versions = fleet["firmware"][component]
            oldest = versions[0]
            sections.append(f"<h3>{_e(component)}</h3>{stacked_bar(component, versions)}")
            sections.append(
                _table(
                    ["version", "nodes", "nodes on it"],
                    [
                        [
                            _e(v["version"]) + (" (oldest)" if v["oldest"] else ""),
                            str(v["nodes"]),
                            ", ".join(_node_link(n) for n in v["node_names"][:20]) if v["oldest"] else "",
                        ]
                        for v in versions
                    ],
                    {1},
                )
            )
            if oldest["nodes"] <= 3:
                sections.append(
                    f'<p class="warn">Oldest {_e(component)} {_e(oldest["version"])} only on: '
                    + ", ".join(_node_link(n) for n in oldest["node_names"])
                    + "</p>"
                )
    else:
        sections.append('<p class="ok">One version per component across the fleet.</p>')
    sections += [
        '<h2 id="thermal">GPU temperature above the slot median</h2>',
        heatmap_svg(fleet["thermal_heatmap"], _node_link),
        '<h2 id="xid">Xid errors</h2>',
        bar_chart([(f"Xid {r['xid']}", r["nodes"], "#6a4c93") for r in fleet["xids"][:20]], "Nodes with each Xid"),
        _table(
            ["xid", "nodes", "events", "nodes (events)"],
            [
                [
                    str(r["xid"]),
                    str(r["nodes"]),
                    str(r["events"]),
                    ", ".join(f"{_node_link(n)} ({c})" for n, c in list(r["by_node"].items())[:20]),
                ]
                for r in fleet["xids"]
            ],
            {0, 1, 2},
        ),
        *(['<h2 id="repeat">Repeat offenders</h2>', _table(
            ["node", "subject", "GPU", "rule", "count", "window", "first", "last"],
            [[_node_link(r["node"]), _e(r["subject"]), _e(r["gpu"] or ""), _e(r["rule"]), str(r["count"]),
              _e(r["window"]), _e(r["first"] or ""), _e(r["last"] or "")] for r in fleet["repeat_offenders"]],
            {4})] if fleet.get("repeat_offenders") else []),
        '<h2 id="stale">Missing and stale reports</h2>',
        _table(
            ["node", "state", "last report"],
            [[_e(n), '<span class="warn">missing</span>', ""] for n in fleet["missing"]]
            + [[_node_link(r["node"]), f"stale ({r['age_hours']} h)", _e(r["started_at"])] for r in fleet["stale"]],
        ),
        '<h2 id="not-audited">Nodes not fully audited</h2>',
        _table(
            ["node", "sources down"],
            [
                [_node_link(r["node"]), _e("; ".join(f"{k}: {v}" for k, v in r["sources"].items()))]
                for r in fleet["not_audited"]
            ],
        ),
        '<h2 id="baselines">Baselines</h2>',
        f"<p>{fleet['baselines']['nodes_with_baseline']} nodes judged against their baseline, "
        f"{fleet['baselines']['nodes_without_baseline']} without one (<code>nodewarden baseline record</code>).</p>",
        _table(
            ["node", "subject", "status", "drift"],
            [
                [_node_link(r["node"]), _e(r["subject"]), _e(r["status"]), _e(r["message"])]
                for r in fleet["baselines"]["drifting"]
            ],
        ),
        *([f'<h2 id="acceptance">Acceptance</h2><p>{_e(accept_counts(acc))}</p>',
           _table(["node", "acceptance"], [[_node_link(r["node"]), _e(describe(r))] for r in attention(acc)])]
          if acc else []),
        '<h2 id="waivers">Waivers</h2>',
        _expired_waivers([r for r in fleet["waivers"] if r.get("expired")])
        + _table(
            ["node", "check", "subject", "reason", "expires"],
            [
                [
                    _node_link(r["node"]),
                    _e(r["check"]),
                    _e(r["subject"]),
                    _e(r["reason"]),
                    f'<span class="warn">{_e(r["expires"])} (soon)</span>' if r["expiring_soon"] else _e(r["expires"]),
                ]
                for r in fleet["waivers"]
                if not r.get("expired")
            ],
        ),
        '<h2 id="inputs">Inputs</h2>',
        f"<p>{fleet['inputs']['reports']} reports for {fleet['inputs']['nodes']} nodes. "
        f"{len(fleet['inputs']['duplicates'])} nodes reported more than once (the newest report is used).</p>",
        _table(["skipped file", "why"], [[_e(r["path"]), _e(r["reason"])] for r in fleet["inputs"]["skipped"]]),
        '<h2 id="nodes">All nodes</h2>',
    ]
    yield (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>nodewarden fleet report</title><style>{CSS}</style></head><body>"
        + "\n".join(sections)
        + "\n"
    )
    yield from _nodes_table(fleet["nodes"], batch, "acceptance" in fleet)
    yield "</body></html>\n"


def _expired_waivers(rows: list[dict[str, Any]]) -> str:
    """Waivers whose day passed before the report's: listed apart, their findings count again."""
    cells = [[_node_link(r["node"]), _e(r["check"]), _e(r["subject"]), _e(r["reason"]),
              f'<span class="crit">{_e(r["expires"])} (expired)</span>'] for r in rows]
    return (f'<h3 id="waivers-expired" class="crit">Expired ({len(rows)}): they no longer waive their findings, '
            "which count again</h3>" + _table(["node", "check", "subject", "reason", "expired"], cells)
            + "<h3>In force</h3>") if rows else ""


_NOT_COMPLIANT = '<span class="crit">no</span>'


def _nodes_table(nodes: Any, batch: int, accepted: bool = False) -> Iterator[str]:
    """Every node, worst first, a batch of rows at a time (the one HTML table without a limit); with
    `accepted` (acceptance runs among the inputs), each node's acceptance in a last column."""
    if not len(nodes):
        yield '<p class="ok">None.</p>'
        return
    head = "".join(f"<th>{_e(h)}</th>" for h in ["node", "profile", "model", "compliant", "fail", "warn", "report",
                                                 *(["acceptance"] if accepted else [])])
    yield f"<table><thead><tr>{head}</tr></thead><tbody>"
    rows = iter(nodes)
    while True:
        chunk = [
            f'<tr id="{anchor(r["node"])}"><td>{_e(r["node"])}</td><td>{_e(r["profile"])}</td>'
            f"<td>{_e(r['model'])}</td><td>{'yes' if r['compliant'] else _NOT_COMPLIANT}</td>"
            f'<td class="n">{r["fail"]}</td><td class="n">{r["warn"]}</td><td>{_e(r["started_at"])}</td>'
            f"{html_cell(r['acceptance']) if accepted else ''}</tr>"
            for r in itertools.islice(rows, batch)
        ]
        if not chunk:
            break
        yield "".join(chunk)
    yield "</tbody></table>"

