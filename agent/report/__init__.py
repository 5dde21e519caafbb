"""Report renderers: json, table, junit, prom. Each takes a finished Report.

Every string from outside goes through `agent.core.sanitise` on its way out, in every format.
"""

from __future__ import annotations

from pathlib import Path

from agent.report.model import Report

FORMATS = ("table", "json", "junit", "prom")


def render(report: Report, fmt: str, *, verbose: bool = False, color: bool = False) -> str:
    if fmt == "json":
        from agent.report.json_text import report_text  # json.dumps(clean_value(...), indent=2), faster

        return report_text(report.to_json()) + "\n"
    if fmt == "table":
        from agent.report.table import render_table

        return render_table(report, verbose=verbose, color=color)
    if fmt == "junit":
        from agent.report.junit import render_junit

        return render_junit(report)
    if fmt == "prom":
        from agent.report.prom import render_prom

        return render_prom(report)
    raise ValueError(f"unknown format {fmt}")


def write_atomic(path: Path, text: str) -> None:
    """Write a report to a path the user named: `agent.io.fsutil.write_output` (the one writer).

    A regular file is replaced atomically, so node_exporter's textfile
    collector sees the old file or the new one, never half of one; a device
    or FIFO is written in place; a missing folder is an error (exit 2).
    """
    from agent.io.fsutil import write_output

    write_output(path, text)
