"""The `kernel-log` kind: /dev/kmsg records, pstore, dmesg (-t, -H, -T, --time-format iso, --decode),
journalctl -k, syslog files, and bare kernel message text.

A file is read by grammar, never by its name: each line's grammar is agent.sources.kmsg's
`line_grammar` (the reader's own, so the importer and the audit can never disagree), and the file's
kind is what most of its first lines are. A stamped log keeps its kernel records (and kmsg
continuation lines); a syslog file's user-space lines and pstore's "Panic#1 Part1" headers are
recognised and left out, counted. A log without any stamp (`dmesg -t`, node-problem-detector's
replay of bare message text) is kept whole when its lines look like kernel messages: its records
carry no time, and the checks judge them as the current boot's from its last boot banner on
(agent.sources.kmsg.boot_start: what dmesg holds is the current boot).
Lines go to the snapshot's kmsg.txt as printed. `journalctl -k -o json`
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
from typing import Any

from agent.sources.importers.base import MAX_KMSG_LINES, Builder, Contribution, InputError, decode_text, text_lines
from agent.sources.kmsg import JOURNAL_BOOT_RE, NOT_RECORDS, USER_RECORDS, is_journal, line_grammar

MAX_BYTES = 512 << 20
HEAD_LINES = 200  # the file's kind is what most of its first lines are
_LOOK = 512  # characters of a line the bare-text test looks at
_JOURNAL_NOTE = re.compile(r"^-- (?:Logs begin|Journal begins|Boot [0-9a-f]+|No entries|Reboot)")
# a network manager's carrier line (kmsg.USER_RECORDS) is a stamped record too
_STAMPED = frozenset({"kmsg", "pstore", "decoded", "dmesg", "reltime", "ctime", "iso", "syslog"}) | USER_RECORDS
# Bare text: a kernel message starts with its subsystem ("NVRM: ", "pci 0000:19:00.0: ", "nvme nvme0: ",
# "EXT4-fs (sda1): "); a log of them holds at least one line only the kernel prints.
_KERNELISH = re.compile(r"^(?:[A-Za-z][\w.+/-]*(?: [\w.:+/-]+){0,2}|[A-Za-z][\w-]* \([\w.:-]+\)|\[[\w ]+\]"
                        r"[\w .-]*): ")
_KERNEL_ONLY = re.compile(r"NVRM: |^Linux version \d|^Command line: |^BIOS-e820|^pci \d{4}:|^ACPI: |^Call Trace:"
                          r"|^Kernel panic|^BUG: |^Oops: |^EDAC |^mce: |^nvidia-nvswitch\d|^Out of memory: "
                          r"|^Memory cgroup out of memory|^INFO: task |^EXT4-fs |^XFS \(|^nvme nvme\d|^mlx5_core "
                          r"|^nvidia-peermem |^nvidia-modeset: |^nvidia-uvm: |^NVRM|^nvidia \d{4}:")
_MESSAGE_LIKE = re.compile(r"^[A-Za-z<\[][^\t|]*$")  # one line of text: no tab-indented fields, no table


def _kinds(lines: list[str]) -> tuple[dict[str, int], bool]:
    """How many of `lines` match each grammar, and whether the file is a journal (kmsg.is_journal)."""
    journal = is_journal(lines)
    counts: dict[str, int] = {}
    for line in lines:
        grammar = line_grammar(line, journal)
        if grammar is not None:
            counts[grammar] = counts.get(grammar, 0) + 1
    return counts, journal


def _mode(lines: list[str]) -> tuple[str | None, bool]:
    """"stamped", "bare" (message text without stamps) or None (no kernel log), by the majority of `lines`."""
    lines = [line for line in lines if line.strip() and not _JOURNAL_NOTE.match(line)]
    if not lines:
        return None, False
    counts, journal = _kinds(lines)
    stamped = sum(n for grammar, n in counts.items() if grammar in _STAMPED)
    recognised = stamped + sum(n for grammar, n in counts.items() if grammar in NOT_RECORDS)
    if stamped >= 1 and recognised * 10 >= len(lines) * 6:
        return "stamped", journal
    # Message text, 60 % of it; at least one line only the kernel prints; 30 % shaped like kernel messages.
    heads = [line[:_LOOK] for line in lines]  # a line's start says what it is; a 1 MiB line is not scanned whole
    message_like = sum(1 for line in heads if _MESSAGE_LIKE.match(line))
    marked = sum(1 for line in heads if _KERNEL_ONLY.search(line))
    kernelish = sum(1 for line in heads if _KERNELISH.match(line) or _KERNEL_ONLY.search(line))
    if marked and message_like * 10 >= len(lines) * 6 and kernelish * 10 >= len(lines) * 3:
        return "bare", journal
    return None, journal


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
        return _mode(lines)[0] is not None

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not read as a kernel log", path=builder.current)
        return self.contribute_lines(text_lines(io.BytesIO(data)), builder)

    def contribute_lines(self, lines: Iterable[str], builder: Builder) -> Contribution:
        """The log's text in pieces that end at line ends (base.text_lines); only the last records are kept."""
        result = Contribution()
        room = max(MAX_KMSG_LINES - len(builder.kmsg), 0)
        kept: deque[str] = deque(maxlen=room)  # a rolling tail: memory is bounded whatever the log's size
        records = appended = dropped = recognised = chars = 0
        head: list[str] = []  # the first lines, held until the file's kind is known
        mode: str | None = None
        journal = decided = False

        boot: list[str | None] = [None]  # the boot of the last record kept (journal separators)

        def take(line: str) -> None:
            nonlocal records, appended, dropped, recognised
            record: str | None = line
            if JOURNAL_BOOT_RE().match(line):  # journalctl's own separator: the records after it are that boot's
                kept.append(line)
                boot[0] = line[8:-3]
                appended += 1
                return
            if _is_journal_json(line):
                record, of_boot = _from_json(line)
                if record is not None and of_boot is not None and of_boot != boot[0]:
                    kept.append(f"-- Boot {of_boot} --")  # what journalctl prints between boots
                    boot[0] = of_boot
                    appended += 1
            elif mode == "bare":
                record = None if _JOURNAL_NOTE.match(line) else line
            else:
                grammar = line_grammar(line, journal)
                if grammar in NOT_RECORDS:
                    recognised += 1
                    if grammar == "pstore-header":
                        kept.append(line)  # the reader needs it: the records below it are an earlier boot's
                        appended += 1
                    return
                if not (grammar in _STAMPED or (line.startswith(" ") and records)):  # kmsg continuation lines stay
                    record = None
            if record is None:
                dropped += 1
                return
            kept.append(record)
            records += 1
            appended += 1

        for piece in lines:
            chars += len(piece)
            if chars > MAX_BYTES:
                raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not read as a kernel log", path=builder.current)
            for line in piece.splitlines():
                if not line.strip():
                    continue
                if not decided and len(head) < HEAD_LINES:
                    head.append(line)
                    continue
                if not decided:
                    decided = True
                    mode, journal = _mode(head)
                    for early in head:
                        take(early)
                take(line)
        if not decided:  # a short file: its kind is known only now
            mode, journal = _mode(head)
            for early in head:
                take(early)
        if not records:
            raise InputError("no kernel log record in it", path=builder.current)
        older = appended - len(kept)
        tail = list(kept)
        kept.clear()  # the tail is copied: free the deque's lines
        added = builder.add_kmsg(tail, result)
        result.contributed.append(f"kmsg.txt: {added} record(s)" + (
            f" ({len(tail) - added} repeated an earlier input's)" if added < len(tail) else ""))
        if older:
            result.skipped.append(f"{older} older record(s): the snapshot keeps the last {MAX_KMSG_LINES} "
                                  "kernel log lines (the reader keeps no more)" if room == MAX_KMSG_LINES else
                                  f"{older} older record(s): earlier inputs left room for only the last {room} "
                                  f"of its kernel log lines (the snapshot keeps {MAX_KMSG_LINES})")
        if recognised:
            result.skipped.append(f"{recognised} user-space syslog line(s) or pstore header(s): recognised, "
                                  "not kernel records")
        if dropped:
            result.skipped.append(f"{dropped} line(s) that are no kernel log record")
        if mode == "bare":
            result.contributed.append("the log carries no time stamps: what dmesg holds, judged as the current "
                                      "boot from its last boot banner ('Linux version ...') on")
        return result


_BOOT_ID_RE = re.compile(r"[0-9a-f]{32}")


def _from_json(line: str) -> tuple[str | None, str | None]:
    """One `journalctl -o json` record as an ISO-stamped kernel log line (None if it is not a kernel
    record) and its `_BOOT_ID` (None when absent or not 32 hex digits)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(record, dict):
        return None, None
    boot = record.get("_BOOT_ID")
    return _json_line(record), boot if isinstance(boot, str) and _BOOT_ID_RE.fullmatch(boot) else None


def _json_line(record: dict[str, Any]) -> str | None:
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
