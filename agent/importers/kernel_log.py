"""The `kernel-log` kind: /dev/kmsg records, dmesg (-T, --time-format iso, --decode), journalctl -k.

Lines go to the snapshot's kmsg.txt as printed: agent.sources.kmsg reads every
one of these formats (its `parse_kmsg_line` is also what recognises them here,
so the importer and the audit can never disagree). `journalctl -k -o json`
(one JSON object a line) is the exception: each record becomes an ISO-stamped
line ("2025-01-02T07:20:12.123456+00:00 [  12.345678] msg") the reader parses.
Lines that are no kernel record (journalctl's "-- Boot ... --", a command echoed
at the top) are left out and counted.

The log is read line by line (`contribute_lines`: a large one is streamed, never
held whole) and only its last records are kept, as many as the snapshot may
still hold (base.MAX_KMSG_LINES, what agent.sources.kmsg reads): the newest
records are the ones an audit is about.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections import deque
from collections.abc import Iterable

from agent.importers.base import MAX_KMSG_LINES, Builder, Contribution, InputError, decode_text, text_lines
from agent.sources.kmsg import parse_kmsg_line

MAX_BYTES = 512 << 20
_JOURNAL_NOTE = re.compile(r"^-- (?:Logs begin|Journal begins|Boot [0-9a-f]+|No entries|Reboot)")


def _stamped(line: str) -> bool:
    record = parse_kmsg_line(line)
    return record is not None and (record.ts_usec is not None or record.wall is not None)


def _is_journal_json(line: str) -> bool:
    return line.startswith("{") and '"MESSAGE"' in line and '"__REALTIME_TIMESTAMP"' in line


class KernelLogImporter:
    kind = "kernel-log"

    def detect(self, head: bytes, name: str) -> bool:
        lines = [line for line in decode_text(head).splitlines()[:200] if line.strip()]
        lines = lines[:-1] if len(head) >= 4096 and lines else lines  # the cut last line may be partial
        if not lines:
            return False
        if sum(_is_journal_json(line) for line in lines) * 2 > len(lines):
            return True
        stamped = sum(_stamped(line) for line in lines)
        return stamped >= 1 and stamped * 10 >= len(lines) * 6

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not read as a kernel log", path=builder.current)
        return self.contribute_lines(text_lines(io.BytesIO(data)), builder)

    def contribute_lines(self, lines: Iterable[str], builder: Builder) -> Contribution:
        """The log's text in pieces that end at line ends (base.text_lines); only the last records are kept."""
        result = Contribution()
        room = max(MAX_KMSG_LINES - len(builder.kmsg), 0)
        kept: deque[str] = deque(maxlen=room)  # a rolling tail: memory is bounded whatever the log's size
        records = dropped = chars = 0
        for piece in lines:
            chars += len(piece)
            if chars > MAX_BYTES:
                raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not read as a kernel log", path=builder.current)
            for line in piece.splitlines():
                if not line.strip():
                    continue
                record: str | None = line
                if _is_journal_json(line):
                    record = _from_json(line)
                elif not (_stamped(line) or (line.startswith(" ") and records)):  # kmsg continuation lines stay
                    record = None
                if record is None:
                    dropped += 1
                    continue
                kept.append(record)
                records += 1
        if not records:
            raise InputError("no kernel log record in it", path=builder.current)
        older = records - len(kept)
        tail = list(kept)
        del kept
        added = builder.add_kmsg(tail, result)
        result.contributed.append(f"kmsg.txt: {added} record(s)" + (
            f" ({len(tail) - added} repeated an earlier input's)" if added < len(tail) else ""))
        if older:
            result.skipped.append(f"{older} older record(s): the snapshot keeps the last {MAX_KMSG_LINES} "
                                  "kernel log lines (the reader keeps no more)" if room == MAX_KMSG_LINES else
                                  f"{older} older record(s): earlier inputs left room for only the last {room} "
                                  f"of its kernel log lines (the snapshot keeps {MAX_KMSG_LINES})")
        if dropped:
            result.skipped.append(f"{dropped} line(s) that are no kernel log record")
        return result


def _from_json(line: str) -> str | None:
    """One `journalctl -o json` record as an ISO-stamped kernel log line; None if it is not a kernel record."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    message = record.get("MESSAGE")
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode("utf-8", "replace")  # journald's form for non-UTF-8 messages
    if not isinstance(message, str) or record.get("_TRANSPORT", "kernel") != "kernel":
        return None
    try:
        usec = int(record["__REALTIME_TIMESTAMP"])
        wall = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=usec)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    stamp = wall.isoformat(timespec="microseconds")
    mono = record.get("_SOURCE_MONOTONIC_TIMESTAMP")
    text = message.replace("\n", " ")
    if isinstance(mono, str) and mono.isdigit():
        seconds, micros = divmod(int(mono), 1_000_000)
        return f"{stamp} [{seconds:5d}.{micros:06d}] {text}"
    return f"{stamp} {text}"
