"""Reading many audit reports: each file parsed in a worker process and reduced to a `NodeRecord`,
folded into a `FleetReader` in the parent as it arrives (the newest report of a node wins).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import IO, Any

from agent.apps.fleet.acceptance import MAX_ACCEPT_BYTES, AcceptRecord, is_acceptance, summarize_acceptance
from agent.apps.fleet.records import Interner, NodeRecord, NodeSummary, Skipped, summarize_report
from agent.apps.fleet.render import csv_rows
from agent.io.jsonfile import JsonInputError, load_json_file

MAX_FILE_BYTES = 64 << 20  # an audit report is ~100 KB; anything this big is not one
MAX_DEPTH = 64  # a report nests ~6 deep (observed values are small objects)


# A node (and its CSV rows when asked), a node's acceptance run, or why the file is skipped.
Result = tuple[NodeRecord, str | None] | AcceptRecord | Skipped


def _read_one(path: str, keep_rows: bool, today: dt.date | None = None) -> Result:
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
        if is_acceptance(data):  # an accept report shares the audit schema; its `acceptance` block tells it apart
            if size > MAX_ACCEPT_BYTES:
                return Skipped(path, f"{size} bytes: too big for an acceptance report")
            return summarize_acceptance(data, path)
        return _result(summarize_report(data, path, keep_rows), keep_rows, today)
    except ValueError as exc:
        return Skipped(path, str(exc)[:300])
    except (TypeError, OverflowError, ArithmeticError, RecursionError, LookupError, AttributeError) as exc:
        # Values no audit report holds (a 400-digit temperature, ...): this file is refused, the rest go on.
        return Skipped(path, f"not a usable audit report ({type(exc).__name__}: {str(exc)[:160]})")


def _result(summary: NodeSummary, keep_rows: bool, today: dt.date | None) -> tuple[NodeRecord, str | None]:
    if not keep_rows:
        return NodeRecord(summary), None
    return NodeRecord(summary), csv_rows(summary, today)


def _read_chunk(paths: list[str], keep_rows: bool, today: dt.date | None = None) -> list[Result]:
    return [_read_one(p, keep_rows, today) for p in paths]


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
    record keeps their offset, so memory stays per node whatever the number of findings. `today`
    is the report's date: a waiver expired by then says `expired` in the CSV. Acceptance runs are
    kept apart in `accepts`, the newest per node.
    """

    def __init__(self, keep_rows: bool = False, today: dt.date | None = None) -> None:
        self.keep_rows = keep_rows
        self.today = today or dt.datetime.now(dt.timezone.utc).date()
        self.accepts: dict[str, AcceptRecord] = {}
        self.accept_reports = 0
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
        if isinstance(result, AcceptRecord):
            self.accept_reports += 1
            held = self.accepts.get(result.node)
            if held is None or result.key() > held.key():  # the newest acceptance run of a node wins
                self.accepts[result.node] = result
            return
        rec, rows = result
        if rows is not None and self.spool is not None:
            data = rows.encode("utf-8", "surrogatepass")
            offset = self.spool.seek(0, os.SEEK_END)
            self.spool.write(data)
            rec.csv = (offset, len(data))
        self.add_record(rec)

    def add_summary(self, summary: NodeSummary) -> None:
        self.add(_result(summary, self.keep_rows, self.today))

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
        outputs: Iterator[list[Result]] = (_read_chunk(part, reader.keep_rows, reader.today) for part in chunks)
        pool = None
    else:
        pool = futures.ProcessPoolExecutor(max_workers=workers)
        outputs = pool.map(_read_chunk, chunks, [reader.keep_rows] * len(chunks), [reader.today] * len(chunks))
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
    today: dt.date | None = None,
) -> FleetReader:
    """Every file folded into a new `FleetReader` (the caller closes it)."""
    return read_into(FleetReader(keep_rows, today), files, workers, progress)


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


def progress_bar(stream: Any = sys.stderr) -> Callable[[int, int], None] | None:
    """click's progress bar on a terminal, as the importer draws it; None otherwise (logs and pipes stay
    clean). The callback takes (files read, files in all) as the readers finish them."""
    if not getattr(stream, "isatty", lambda: False)():
        return None
    import click

    bar: Any = None
    shown = 0

    def show(done: int, total: int) -> None:
        nonlocal bar, shown
        if bar is None:
            bar = click.progressbar(length=total, label="reading reports", show_pos=True, file=stream)
            bar.__enter__()
        bar.update(done - shown)
        shown = done
        if done >= total:
            bar.__exit__(None, None, None)

    return show
