"""Human table: grouped by area, fails first, one summary line at the end."""

from __future__ import annotations

import shutil

import click

from agent.engine import Report
from agent.model import Finding, Status
from agent.sanitise import clean

_ORDER = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2, Status.FIXED: 3, Status.SKIP: 4, Status.PASS: 5}
_COLORS = {Status.FAIL: "red", Status.UNKNOWN: "magenta", Status.WARN: "yellow", Status.FIXED: "cyan",
           Status.SKIP: "bright_black", Status.PASS: "green"}


def _label(finding: Finding, color: bool) -> str:
    text = "waived" if finding.waiver else finding.status.value
    padded = f"{text:<7}"
    if not color:
        return padded
    return click.style(padded, fg="blue" if finding.waiver else _COLORS[finding.status], bold=True)


def _rank(finding: Finding) -> tuple[int, int]:
    return (_ORDER[finding.status] + (10 if finding.waiver else 0), 0)


def render_table(report: Report, *, verbose: bool = False, color: bool = False) -> str:
    width = shutil.get_terminal_size((120, 20)).columns
    lines: list[str] = []
    node = report.node
    model = clean(str(node.get("model") or "unknown model"))
    lines.append(f"nodewarden audit of {clean(str(node.get('hostname') or '?'))} ({model}) "
                 f"with profile {clean(report.profile)} [{node.get('mode')}]")
    shown = [f for f in report.findings if verbose or f.status is not Status.PASS or f.waiver]
    areas: dict[str, list[Finding]] = {}
    for finding in shown:
        areas.setdefault(finding.check.split(".", 1)[0], []).append(finding)
    # Areas with the worst finding first; inside an area, fails first.
    for area in sorted(areas, key=lambda a: (min(_rank(f) for f in areas[a]), a)):
        lines.append("")
        title = clean(area.upper())
        lines.append(click.style(title, bold=True) if color else title)
        for finding in sorted(areas[area], key=lambda f: (_rank(f), f.check, f.subject)):
            head = f"  {_label(finding, color)} {clean(finding.check):<22} {clean(finding.subject):<16} "
            message = clean(finding.message)
            room = max(40, width - len(head) - 1)
            if len(message) > room and not verbose:
                message = message[: room - 3] + "..."
            lines.append(head + message)
            if verbose and finding.reason and finding.status is not Status.PASS:
                lines.append(f"  {'':<7} {'':<22} {'':<16} why: {clean(finding.reason)}")
            if finding.waiver:
                lines.append(f"  {'':<7} {'':<22} {'':<16} waived until {clean(str(finding.waiver.expires))}: "
                             f"{clean(finding.waiver.reason)}")
    summary = report.summary()
    hidden = "" if verbose else f" ({summary['pass']} passes hidden; -v shows them)"
    lines.append("")
    lines.append(
        f"{summary['fail']} fail, {summary['warn']} warn, {summary['unknown']} unknown, "
        f"{summary['pass']} pass, {summary['skip']} skip, {summary['waived']} waived"
        f" in {report.duration_s:.2f} s{hidden}"
    )
    return "\n".join(lines) + "\n"
