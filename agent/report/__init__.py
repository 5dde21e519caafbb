"""Report renderers: json, table, junit, prom. Each takes a finished Report."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from agent.engine import Report

FORMATS = ("table", "json", "junit", "prom")


def render(report: Report, fmt: str, *, verbose: bool = False, color: bool = False) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=2, sort_keys=False) + "\n"
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
    """Write via a temporary file in the same folder and rename it into place.

    node_exporter's textfile collector (and any reader) then sees either the
    old file or the new one, never a half-written file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
