"""Human table: the node's verdict, then the findings by area, worst first, one summary line at the end.

Columns: status, severity, check, subject, message. Identical results on several GPUs or ports are
one row (`agent.report.collapse`); a subject is never cut (a long one puts its message on the next
line), a message only without -v; -v adds each finding's why and, for an imported snapshot, the inputs it
came from ("from: FILE (SECTION)"). Every line fits the terminal's width (`agent.report.fit`: names wrap,
messages are cut, or wrap with -v). Every string from outside goes through `agent.core.sanitise.clean`.
"""

from __future__ import annotations

import shutil

import click

from agent.core.model import Finding, Severity, Status
from agent.core.sanitise import clean
from agent.report.collapse import Row, collapse, display_subjects, rank
from agent.report.fit import clamp, continuation, cut, row, wrap
from agent.report.model import Report
from agent.report.verdict import render_verdict

_COLORS = {Status.FAIL: "red", Status.UNKNOWN: "magenta", Status.WARN: "yellow", Status.FIXED: "cyan",
           Status.SKIP: "bright_black", Status.PASS: "green"}
SUBJECT_MAX = 24  # wider subjects are printed whole, their message on the next line


def _label(finding: Finding, color: bool) -> str:
    text = "waived" if finding.waiver else finding.status.value
    padded = f"{text:<7}"
    if not color:
        return padded
    return click.style(padded, fg="blue" if finding.waiver else _COLORS[finding.status], bold=True)


def _severity(finding: Finding, color: bool) -> str:
    padded = f"{finding.severity.value:<8}"
    return click.style(padded, bold=True) if color and finding.severity is Severity.CRITICAL else padded


def evidence_text(finding: Finding, most: int = 5) -> str:
    """The inputs of an imported snapshot a finding came from, cleaned: "lspci.txt, report.log (dmesg)"."""
    refs = finding.evidence or ()
    text = ", ".join(clean(ref.describe()) for ref in refs[:most])
    return text + (f" and {len(refs) - most} more" if len(refs) > most else "")


def _ran(report: Report) -> str:
    """What ran: `audit`, or `accept` with its load and length (`nodewarden accept` adds an `acceptance` block)."""
    block = report.extra.get("acceptance")
    if not isinstance(block, dict):
        return "audit"
    load = block.get("load")
    what = (load.get("described") or load.get("kind")) if isinstance(load, dict) else None
    return f"accept (load {clean(str(what or '?'))}, {report.duration_s:.0f} s)"


def render_table(report: Report, *, verbose: bool = False, color: bool = False, width: int | None = None) -> str:
    width = clamp(width or shutil.get_terminal_size((120, 20)).columns)
    lines: list[str] = []
    node = report.node
    model = clean(str(node.get("model") or "unknown model"))
    lines += wrap(f"nodewarden {_ran(report)} of {clean(str(node.get('hostname') or 'unknown host'))} ({model}) "
                  f"with profile {clean(report.profile)} [{clean(str(node.get('mode')))}]", width, "  ")
    subjects = display_subjects(report.findings)
    lines.append("")
    lines.extend(render_verdict(report.findings, subjects, width=width, verbose=verbose, color=color))
    shown = [f for f in report.findings if verbose or f.status is not Status.PASS or f.waiver]
    areas: dict[str, list[Row]] = {}
    for collapsed in collapse(shown, subjects):
        areas.setdefault(collapsed.first.check.split(".", 1)[0], []).append(collapsed)
    check_width = max((len(clean(r.first.check)) for rows in areas.values() for r in rows), default=0)
    subject_width = min(SUBJECT_MAX, max((len(clean(r.subject)) for rows in areas.values() for r in rows),
                                         default=0))
    indent = continuation(" " * (2 + 8 + 9 + check_width + 1 + subject_width + 1), width)
    # Areas with the worst finding first; inside an area, worst first (rows come sorted).
    for area in sorted(areas, key=lambda a: (min(rank(r.first) for r in areas[a]), a)):
        lines.append("")
        title = clean(area.upper())
        lines.append(click.style(title, bold=True) if color else title)
        for shown_row in areas[area]:
            finding = shown_row.first
            subject = clean(shown_row.subject)
            head = f"  {_label(finding, False)} {_severity(finding, False)} {clean(finding.check):<{check_width}} "
            message = clean(shown_row.message)
            if len(subject) > subject_width:  # a long subject on the head's line, its message below it
                fitted = wrap(head + subject, width, indent)
                fitted += (wrap(message, width, indent, indent) if verbose
                           else [indent + cut(message, width - len(indent))])
            else:
                fitted = row(head + f"{subject:<{subject_width}} ", message, width, indent, verbose)
            if color:  # styled after fitting: escape codes take no room
                first = fitted[0]
                fitted[0] = f"  {_label(finding, True)} {_severity(finding, True)}{first[2 + 7 + 1 + 8:]}"
            lines += fitted
            if verbose and finding.reason and finding.status is not Status.PASS:
                lines += wrap(f"why: {clean(finding.reason)}", width, indent, indent)
            if verbose and finding.evidence:
                lines += wrap(f"from: {evidence_text(finding)}", width, indent, indent)
            if finding.waiver:
                lines += wrap(f"waived until {clean(str(finding.waiver.expires))}: {clean(finding.waiver.reason)}",
                              width, indent, indent)
    summary = report.summary()
    passes = f"{summary['pass']} pass" + ("" if summary["pass"] == 1 else "es")
    hidden = "" if verbose else f" ({passes} hidden; -v shows them)"
    lines.append("")
    lines += wrap(
        f"{summary['fail']} fail, {summary['warn']} warn, {summary['unknown']} unknown, "
        f"{summary['pass']} pass, {summary['skip']} skip, {summary['waived']} waived"
        f" in {report.duration_s:.2f} s{hidden}", width, "  ")
    return "\n".join(lines) + "\n"
