"""`nodewarden ledger show|export|clear`: the node's ledger (agent.state.ledger) for a person, a ticket
or the fleet, and the operator's way to end a sticky history rule (issue 33.4).

`show` and `export` open the ledger read-only (nothing is created where there is none). `clear` is an
action: a dry run unless `--apply`, and what it does is itself an incident (kind `clear`), so the
ledger says who cleared what and when; it never deletes a row.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from agent.apps.cli.options import FILE_PATH, PATH, load_cli_config
from agent.apps.cli.support import say
from agent.core.history import KINDS

_KIND_CHOICES = KINDS


def _since(text: str) -> float:
    from agent.core.windows import window_seconds

    if text == "all":
        return 0.0
    try:
        return time.time() - window_seconds(text)
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (or `all`)", param_hint="--since") from None


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def incident_doc(incident: Any) -> dict[str, Any]:
    """One incident as JSON (the export's line and show's list item)."""
    gpu = incident.gpu
    return {"time": _when(incident.ts), "ts": incident.ts, "kind": incident.kind, "source": incident.source,
            "code": incident.code, "subcode": incident.subcode or None,
            "gpu": ({"index": gpu.index, "uuid": gpu.uuid or None, "serial": gpu.serial or None}
                    if (gpu.index is not None or gpu.uuid or gpu.serial) else None),
            "subject": incident.subject or None, "severity": incident.severity or None,
            "boot_id": incident.boot_id or None, "detail": incident.detail, "digest": incident.digest}


def _open(state_dir: Path | None, snapshot: Path | None, config_path: Path | None, *, readonly: bool) -> Any:
    """The ledger asked for, or None (with a line saying why) where there is none yet."""
    from agent.state.layout import LEDGER_FILE
    from agent.state.ledger import Ledger, LedgerError, open_ledger

    try:
        if snapshot is not None:
            return Ledger.open(snapshot / LEDGER_FILE, readonly=True)
        folder = state_dir if state_dir is not None else load_cli_config(config_path).state_dir
        return open_ledger(folder, readonly=readonly)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"the ledger cannot be read: {exc}") from None


def _select(ledger: Any, since: float, kinds: tuple[str, ...], gpu: str | None) -> list[Any]:
    found = ledger.window(since, kinds=kinds) if ledger is not None else ()
    return [i for i in found if gpu is None or i.gpu.matches(gpu)]


def _gpu_text(incident: Any) -> str:
    gpu = incident.gpu
    if gpu.index is None and not gpu.serial and not gpu.uuid:
        return "-"
    return f"{'?' if gpu.index is None else gpu.index} {gpu.serial or gpu.uuid or ''}".rstrip()


def _readable(detail: str) -> str:
    """A health-check decision's detail is its whole JSON line (export has it): a person reads its `why`."""
    if detail.startswith("{"):
        try:
            doc = json.loads(detail)
        except ValueError:
            return detail
        if isinstance(doc, dict) and isinstance(doc.get("why"), str):
            return str(doc["why"])
    return detail


def render_table(incidents: list[Any], width: int | None = None) -> str:
    """Oldest first, one line each; the detail is cut to the terminal (the JSON has it whole)."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    if not incidents:
        return "no incidents in this window\n"
    header = ("time (UTC)", "boot", "kind", "code", "GPU", "subject", "severity", "detail")
    rows = [header] + [(_when(i.ts), (i.boot_id or "-")[:8], i.kind, i.code or "-", _gpu_text(i),
                        i.subject or "-", i.severity or "-", " ".join(_readable(i.detail).split())) for i in incidents]
    widths = [min(32, max(len(r[n]) for r in rows)) for n in range(len(header) - 1)]
    lines = []
    for row in rows:
        fixed = "  ".join(cell[:w].ljust(w) for cell, w in zip(row[:-1], widths, strict=True))
        room = max(10, width - len(fixed) - 2)
        detail = row[-1] if len(row[-1]) <= room else row[-1][:room - 1] + "…"
        lines.append(f"{fixed}  {detail}".rstrip())
    return "\n".join(lines) + f"\n{len(incidents)} incidents\n"


@click.group()
def ledger() -> None:
    """The node's ledger: incidents kept across restarts and reboots (history.* checks judge it)."""


def _where_options(func: Any) -> Any:
    for option in reversed([
        click.option("--state-dir", type=PATH, metavar="DIR", help="State folder (default: the config's state_dir)."),
        click.option("--snapshot", type=PATH, metavar="DIR", help="Read a snapshot's copy of a ledger (read-only)."),
        click.option("--config", "config_path", type=PATH, metavar="FILE",
                     help="Config file (default /etc/nodewarden/config.yaml if present)."),
    ]):
        func = option(func)
    return func


def _filter_options(func: Any) -> Any:
    for option in reversed([
        click.option("--since", default="7d", show_default=True, metavar="WINDOW|all",
                     help="How far back: N followed by s, m, h, d or w (e.g. 24h, 30d), or all."),
        click.option("--gpu", metavar="SERIAL|UUID|INDEX",
                     help="Only this GPU's incidents (a serial follows the board)."),
        click.option("--kind", "kinds", multiple=True, type=click.Choice(_KIND_CHOICES),
                     help="Only these kinds (repeatable)."),
    ]):
        func = option(func)
    return func


@ledger.command("show")
@_where_options
@_filter_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]),
              help="Output format (default: table on a terminal, json otherwise).")
def show(state_dir: Path | None, snapshot: Path | None, config_path: Path | None, since: str, gpu: str | None,
         kinds: tuple[str, ...], fmt: str | None) -> None:
    """What the ledger holds, oldest first. Exit 0; 3 when the ledger cannot be used."""
    from agent.apps.cli.support import stdout_is_tty

    start = _since(since)
    book = _open(state_dir, snapshot, config_path, readonly=True)
    try:
        incidents = _select(book, start, kinds, gpu)
        note = book.note if book is not None else "no ledger yet (nothing has been recorded)"
    finally:
        if book is not None:
            book.close()
    fmt = fmt or ("table" if stdout_is_tty() else "json")
    if fmt == "json":
        click.echo(json.dumps({"since": _when(start), "note": note or None,
                               "incidents": [incident_doc(i) for i in incidents]}, indent=2))
        return
    if note:
        click.echo(f"note: {note}")
    click.echo(render_table(incidents), nl=False)


@ledger.command("export")
@_where_options
@_filter_options
@click.option("--output", type=FILE_PATH, metavar="FILE", help="Write to FILE (atomically) instead of stdout.")
def export(state_dir: Path | None, snapshot: Path | None, config_path: Path | None, since: str, gpu: str | None,
           kinds: tuple[str, ...], output: Path | None) -> None:
    """The incidents as JSON lines (one object each, oldest first), for a ticket or the fleet."""
    start = _since(since)
    book = _open(state_dir, snapshot, config_path, readonly=True)
    try:
        text = "".join(json.dumps(incident_doc(i), sort_keys=True) + "\n" for i in _select(book, start, kinds, gpu))
    finally:
        if book is not None:
            book.close()
    if output is not None:
        from agent.io.fsutil import write_output

        write_output(output, text)
    else:
        click.echo(text, nl=False)


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@ledger.command("clear")
@click.option("--rule", "rule", required=True, metavar="NAME", help="The history rule to clear (e.g. node_churn).")
@click.option("--gpu", metavar="SERIAL|UUID|INDEX", help="Only this GPU's firing of a per-GPU rule.")
@click.option("--apply", "apply", is_flag=True,
              help="Record the clear (without it: a dry run saying what it would do).")
@click.option("--state-dir", type=PATH, metavar="DIR", help="State folder (default: the config's state_dir).")
@click.option("--config", "config_path", type=PATH, metavar="FILE",
              help="Config file (default /etc/nodewarden/config.yaml if present).")
def clear(rule: str, gpu: str | None, apply: bool, state_dir: Path | None, config_path: Path | None) -> None:
    """End a history rule's firing (a sticky one stays until this): recorded as an incident, never a deletion.

    The rule counts again from the clear. Exit 0; 2 for a name that is not a rule's; 3 when the
    ledger cannot be used.
    """
    import re

    from agent.core.history import Incident, digest
    from agent.core.history_rules import RULE_NAME

    if not re.fullmatch(RULE_NAME, rule):
        raise click.BadParameter(f"{rule!r} is not a rule name ({RULE_NAME})", param_hint="--rule")
    book = _open(state_dir, None, config_path, readonly=not apply)
    try:
        known = _select(book, 0.0, (), None) if book is not None else []
        subject = "*"
        if gpu is not None:  # the key the rule counts by: the board's serial, else its UUID
            boards = {i.gpu.key for i in known if i.gpu.matches(gpu) and i.gpu.key}
            if len(boards) > 1:
                raise click.BadParameter(f"{gpu!r} names {len(boards)} boards in the ledger "
                                         f"({', '.join(sorted(boards))}): give a serial or UUID", param_hint="--gpu")
            subject = boards.pop() if boards else gpu
        memories = [i for i in known if i.kind == "rule" and i.code == rule
                    and (subject == "*" or i.subject.partition("|")[0] == subject)]
        what = f"rule {rule}" + ("" if subject == "*" else f" for GPU {subject}")
        if not apply:
            say("info", f"dry run: would clear {what} ({len(memories)} sticky firings held); run again with --apply")
            return
        if book is None:
            say("info", "nothing to clear: no ledger yet")
            return
        now = time.time()
        operator = _operator()
        book.record([Incident(ts=now, kind="clear", source="cli", code=rule, subject=subject, severity="info",
                              detail=f"cleared by {operator} (nodewarden ledger clear)",
                              digest=digest("clear", rule, subject, now))], now=now)
        say("info", f"cleared {what}: {len(memories)} sticky firings ended; it counts again from now",
            operator=operator)
    finally:
        if book is not None:
            book.close()
    sys.stdout.flush()
