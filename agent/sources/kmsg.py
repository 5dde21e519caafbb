"""Kernel log: /dev/kmsg live, kmsg.txt in a snapshot, or a dmesg dump.

The parser accepts the /dev/kmsg record format ("PRI,SEQ,TS_USEC,FLAGS;msg"),
`dmesg` output ("[  12.345678] msg") and `dmesg --time-format=iso`, because
support engineers receive all three.
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.facts import KmsgRecord
from agent.model import Unknown

KMSG_DEVICE = "/dev/kmsg"
MAX_RECORDS = 200_000  # the kernel ring buffer holds far fewer; bound memory anyway
_RECORD_BYTES = 8192  # /dev/kmsg returns one record per read; EINVAL if the buffer is smaller

_KMSG_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG_RE = re.compile(r"^\[\s*(\d+)\.(\d+)\]\s?(.*)$")
_ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[,.]\d+[+-]\d{2}:?\d{2}\s(.*)$")
# `dmesg --decode`: "kern  :warn  : <rest>"
_DECODED_RE = re.compile(r"^([a-z]+)\s*:([a-z]+)\s*: (.*)$")
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}


def parse_kmsg_line(line: str) -> KmsgRecord | None:
    """One line of any supported format; None for continuation or blank lines."""
    if not line.strip() or line.startswith(" "):
        return None  # /dev/kmsg dictionary continuation lines start with a space
    match = _KMSG_RE.match(line)
    if match:
        prefix = int(match.group(1))
        return KmsgRecord(
            message=match.group(4),
            priority=prefix & 7,  # the low 3 bits are the level; the rest is the facility
            seq=int(match.group(2)),
            ts_usec=int(match.group(3)),
        )
    decoded = _DECODED_RE.match(line)
    if decoded and decoded.group(2) in _LEVELS:
        inner = parse_kmsg_line(decoded.group(3))
        if inner is not None:
            level = _LEVELS[decoded.group(2)]
            return KmsgRecord(message=inner.message, priority=level, ts_usec=inner.ts_usec)
    match = _DMESG_RE.match(line)
    if match:
        usec = int(match.group(1)) * 1_000_000 + int(match.group(2).ljust(6, "0")[:6])
        return KmsgRecord(message=match.group(3), ts_usec=usec)
    match = _ISO_RE.match(line)
    if match:
        return KmsgRecord(message=match.group(1))
    return KmsgRecord(message=line)


def parse_kmsg_text(lines: Iterable[str]) -> tuple[KmsgRecord, ...]:
    records: list[KmsgRecord] = []
    for line in lines:
        record = parse_kmsg_line(line.rstrip("\n"))
        if record is not None:
            records.append(record)
            if len(records) >= MAX_RECORDS:
                break
    return tuple(records)


def read_recorded_kmsg(path: Path) -> tuple[KmsgRecord, ...] | Unknown:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return Unknown(f"{path}: {exc.strerror}")
    text = data.decode("utf-8", "backslashreplace")
    return parse_kmsg_text(text.splitlines())


def read_live_kmsg(device: str = KMSG_DEVICE) -> tuple[tuple[KmsgRecord, ...] | Unknown, list[str]]:
    """Drain the ring buffer without blocking. Returns records and the raw lines."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return Unknown(f"{device} is not readable (needs root or CAP_SYSLOG)"), []
        return Unknown(f"{device}: {exc.strerror}"), []
    raw: list[str] = []
    try:
        while len(raw) < MAX_RECORDS:
            try:
                chunk = os.read(fd, _RECORD_BYTES)
            except BlockingIOError:
                break  # EAGAIN: read everything there is
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while we read; go on
                return Unknown(f"{device}: {exc.strerror}"), raw
            if not chunk:
                break
            # /dev/kmsg returns one record per read, followed by " KEY=value"
            # dictionary lines; a regular file (a saved log) returns many records.
            for line in chunk.decode("utf-8", "backslashreplace").split("\n"):
                if line and not line.startswith(" "):
                    raw.append(line)
    finally:
        os.close(fd)
    return parse_kmsg_text(raw), raw


class KmsgFollower:
    """Follows the kernel log: /dev/kmsg live (blocking reads), or a recorded file as it grows.

    The records seen so far (bounded) are kept for the checks; `on_new` gets
    each batch of new records as soon as it arrives, so an Xid is counted
    within a poll interval of `poll_s` (a recording) or at once (live).
    """

    def __init__(self, path: str | Path, live: bool, on_new: Callable[[list[KmsgRecord]], None],
                 poll_s: float = 0.5) -> None:
        self.path = str(path)
        self.live = live
        self.on_new = on_new
        self.poll_s = poll_s
        self.records: deque[KmsgRecord] = deque(maxlen=MAX_RECORDS)
        self.error: str | None = None
        self.last_read_s = 0.0  # time.time() of the last successful read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple[KmsgRecord, ...] | Unknown:
        with self._lock:
            if self.error is not None and not self.records:
                return Unknown(self.error)
            return tuple(self.records)

    def _deliver(self, lines: list[str]) -> None:
        batch = [r for r in (parse_kmsg_line(line) for line in lines) if r is not None]
        with self._lock:
            self.records.extend(batch)
            self.error = None
            self.last_read_s = time.time()
        if batch:
            self.on_new(batch)

    def _alive(self) -> None:
        """The log was read (nothing new is news too): a quiet kernel is not a stale source."""
        with self._lock:
            self.error = None
            self.last_read_s = time.time()

    def _fail(self, reason: str) -> None:
        with self._lock:
            self.error = reason

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow_device() if self.live else self._follow_file()
            except OSError as exc:
                self._fail(f"{self.path}: {exc.strerror or exc}")
            self._stop.wait(5.0)  # reopen after an error, gently

    def _follow_device(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError:
            self._fail(f"{self.path} is not readable (needs root or CAP_SYSLOG)")
            return
        try:
            self._deliver([])
            while not self._stop.is_set():
                lines: list[str] = []
                while len(lines) < 1000:
                    try:
                        chunk = os.read(fd, _RECORD_BYTES)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno == errno.EPIPE:
                            continue  # overwritten while we read: go on with the next record
                        raise
                    if not chunk:
                        break
                    lines.extend(x for x in chunk.decode("utf-8", "backslashreplace").split("\n")
                                 if x and not x.startswith(" "))
                if lines:
                    self._deliver(lines)
                    continue
                self._alive()
                select.select([fd], [], [], self.poll_s)  # wake on the next record, or to check for stop
        finally:
            os.close(fd)

    def _follow_file(self) -> None:
        offset, partial = 0, b""
        self._deliver([])
        while not self._stop.is_set():
            size = os.stat(self.path).st_size
            if size < offset:  # replaced or truncated: start over (the counters keep what they saw)
                offset, partial = 0, b""
                with self._lock:
                    self.records.clear()
            if size > offset:
                with open(self.path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(size - offset)
                offset += len(data)
                data, partial = partial + data, b""
                if not data.endswith(b"\n"):
                    data, _, partial = data.rpartition(b"\n")
                self._deliver(data.decode("utf-8", "backslashreplace").splitlines())
            self._alive()
            self._stop.wait(self.poll_s)
