"""An imported snapshot's per-input index: `inputs.jsonl`, one JSON row per input or archive member.

Until issue 31 the index was meta.yaml's `inputs` list, and meta.yaml may hold 1 MiB: a real iDRAC9
tree (3,061 resources) or a big sysfs tree imported fine and then could not be audited. A limit must
bound hostile input, not our own output, so the index has its own file and its bounds follow from
what the writer itself produces:

* each row is cut by the writer to at most `LINE_MAX_BYTES` (`row_bytes`: fields cut, lists shortened),
* at most `MAX_ENTRIES` rows are written (an import accepts 100,000 members; the rest are counted in
  the header, never silently lost), so the file is at most `index_max_bytes()`.

The reader (`read_index`) refuses a file past that size, a row past its line bound, a missing or
foreign header, and reads only the first `READ_ENTRIES` rows (what the report shows), line by line:
memory is bounded by READ_ENTRIES x LINE_MAX_BYTES whatever the file holds.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agent.core.errors import SnapshotError

INDEX_FILE = "inputs.jsonl"
FORMAT = "nodewarden.inputs/v1"
LINE_MAX_BYTES = 32 << 10  # one row; a real one is ~300 bytes
MAX_ENTRIES = 200_000  # rows written: twice what an import accepts (agent.sources.importers.input_streams.MAX_MEMBERS)
READ_ENTRIES = 1000  # rows read back: what the report's node.snapshot.inputs shows
_NAME_MAX = 4096  # PATH_MAX: a member's name as written (the report shows 300)
_TEXT_MAX = 2000  # an error or link target as written
_ITEM_MAX = 300  # one contributed / skipped text
_ITEMS_MAX = 50  # contributed / skipped texts per row
_COMPACT = 300  # every text in a row that is still too long (worst case 15 texts x 300 chars x 6 bytes < 32 KiB)


def index_max_bytes() -> int:
    """The largest inputs.jsonl the writer can produce: the header and MAX_ENTRIES rows, each a line."""
    return (MAX_ENTRIES + 1) * (LINE_MAX_BYTES + 1)


def _cut_row(row: dict[str, Any], text: int, items: int, item: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, str):
            out[key] = value[:min(text, _NAME_MAX if key == "name" else _TEXT_MAX)]
        elif isinstance(value, list):
            out[key] = [str(v)[:item] for v in value[:items]]
            if len(value) > items:
                out[f"{key}_left_out"] = len(value) - items
        else:
            out[key] = value if isinstance(value, (int, float, bool)) or value is None else str(value)[:text]
    return out


def row_bytes(row: dict[str, Any]) -> bytes:
    """One row as a line, within LINE_MAX_BYTES (cut harder when the plain cut is still too long)."""
    line = json.dumps(_cut_row(row, _NAME_MAX, _ITEMS_MAX, _ITEM_MAX), ensure_ascii=False).encode()
    if len(line) >= LINE_MAX_BYTES:
        line = json.dumps(_cut_row(row, _COMPACT, 5, _COMPACT), ensure_ascii=False).encode()
    return line + b"\n"


def index_lines(rows: list[dict[str, Any]]) -> Iterator[bytes]:
    """inputs.jsonl as the importer writes it: the header, then at most MAX_ENTRIES rows."""
    header = {"format": FORMAT, "entries": len(rows), "left_out": max(0, len(rows) - MAX_ENTRIES)}
    yield json.dumps(header).encode() + b"\n"
    for row in rows[:MAX_ENTRIES]:
        yield row_bytes(row)


def _lines(fd: int, what: str) -> Iterable[tuple[int, bytes]]:
    """The file's lines (at most READ_ENTRIES + 1), each refused past LINE_MAX_BYTES."""
    with os.fdopen(fd, "rb", closefd=False) as handle:
        for number in range(1, READ_ENTRIES + 2):
            line = handle.readline(LINE_MAX_BYTES + 2)
            if not line:
                return
            if len(line.rstrip(b"\n")) > LINE_MAX_BYTES:
                raise SnapshotError(f"line {number} is longer than the {LINE_MAX_BYTES} bytes a row may hold: "
                                    "not an index nodewarden wrote; refused", path=what)
            yield number, line


def read_index(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The first READ_ENTRIES rows of inputs.jsonl and the count its header gives; SnapshotError if hostile."""
    from agent.io.jsonfile import JsonInputError, load_json_bytes

    what = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symlink: refused (a snapshot is read only inside its folder)" if exc.errno == errno.ELOOP else (
            f"unreadable: {exc.strerror}")
        raise SnapshotError(why, path=what) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SnapshotError("not a regular file: refused", path=what)
        if info.st_size > index_max_bytes():
            raise SnapshotError(f"{info.st_size} bytes: larger than the {index_max_bytes()} bytes an index of "
                                f"{MAX_ENTRIES} inputs may hold", path=what)
        rows: list[dict[str, Any]] = []
        total = 0
        for number, line in _lines(fd, what):
            try:
                doc = load_json_bytes(line, what=what, max_bytes=LINE_MAX_BYTES + 1, max_depth=4)
            except JsonInputError as exc:
                raise SnapshotError(f"line {number}: {exc.message}", path=what) from None
            if not isinstance(doc, dict):
                raise SnapshotError(f"line {number}: a row must be a JSON object", path=what)
            if number == 1:
                entries = doc.get("entries")
                if doc.get("format") != FORMAT or not isinstance(entries, int) or isinstance(entries, bool):
                    raise SnapshotError(f"line 1 must be the header {{\"format\": \"{FORMAT}\", \"entries\": N}}",
                                        path=what)
                total = max(0, entries)
            elif len(rows) < READ_ENTRIES:
                rows.append(doc)
        if total == 0 and not rows and info.st_size == 0:
            raise SnapshotError("empty: the header is missing", path=what)
        return rows, total
    finally:
        os.close(fd)
