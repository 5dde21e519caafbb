"""Kernel log: /dev/kmsg live, kmsg.txt in a snapshot, or a dmesg dump.

Lines are read by grammar (`GRAMMARS`, tried in order; `line_grammar` names the one a line
matches), never by file name: the /dev/kmsg record ("PRI,SEQ,TS_USEC,FLAGS;msg"), pstore's
ramoops/ERST record ("<6>[  12.345678] msg", under a "Panic#1 Part1" header), `dmesg`
("[  12.345678] msg"), `dmesg -H`/`--reltime` ("[Feb13 04:56] msg", then "[  +2.141017] msg"),
`dmesg -T` ("[Thu Jul 18 16:03:50 2024] msg"), `dmesg --time-format=iso`, each optionally
`--decode`d, `journalctl -k` in the `short-iso`, `short-precise`, `short` and `short-monotonic`
outputs (the "HOST kernel: " prefix is dropped), syslog files where kernel and user-space lines
mix (a user-space line, "HOST sshd[12]: ...", is recognised and is no kernel record), and bare
message text (`dmesg -t`, node-problem-detector's replay): support engineers receive all of them.

One kind of user-space line is a record: a network manager's carrier change ("syslog-link": systemd-networkd's
"ib6: Lost carrier" / "Gained carrier", NetworkManager's "device (ib0): carrier: link disconnected" and its
"state change: activated -> unavailable (reason 'carrier-changed')"). The kernel prints an IPoIB port's
carrier changes at debug level only, so these lines are what a syslog shows of an IB port flapping. Only a
whole line of that exact grammar qualifies, and its record keeps the program's tag ("systemd-networkd[5398]:
ib6: Lost carrier"), which no kernel message starts with: the Xid, SXid and catalogue rules written for
kernel text never read it; `net.link_flap`'s patterns anchored on the tag do.

Time: /dev/kmsg, pstore and plain dmesg carry seconds since boot (`ts_usec`): a log of
one boot. When that clock goes back (a log that concatenates boots), the
records before the last restart belong to earlier boots (`boot_start`). The
other formats carry a wall-clock stamp (`wall`, kept as printed) that
`wall_time` reads, and `predates_boot` compares with the boot time, which is the
observation time (now, or a snapshot's captured_at) minus /proc/uptime. `dmesg -H` prints a
minute-precision stamp and then offsets: `parse_kmsg_text` adds them up into stamps. A log whose
records carry neither (`timeless`: `dmesg -t`, a console paste) is what dmesg holds, the current
boot, unless a boot banner inside it says a later boot began (`boot_start`).
pstore's records under their "Panic#1 Part1" header are an earlier boot's (their since-boot clock
says nothing about this one): their `wall` is EARLIER_BOOT, which `predates_boot` always is.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import select
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from agent.core.facts import KmsgRecord
from agent.core.lazyre import lazy_compile
from agent.core.model import Unknown
from agent.core.numbers import MAX_UPTIME_S, finite, sane_time
from agent.sources.fsroot import read_tail_fd

KMSG_DEVICE = "/dev/kmsg"
MAX_RECORDS = 200_000  # the kernel ring buffer holds far fewer; bound memory anyway
KMSG_TAIL_BYTES = 16 << 20  # a recorded log is read from its last 16 MiB (the largest common ring buffer)
_RECORD_BYTES = 8192  # /dev/kmsg returns one record per read; EINVAL if the buffer is smaller

# Digits bounded: a 4,000-digit sequence number or stamp is no record header (int() of one is slow,
# past 4,300 digits an error, and its seconds overflow a float), so such a line stays plain text.
_KMSG_RE = lazy_compile(r"^(\d{1,10}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
_DMESG_RE = lazy_compile(r"^\[\s*(\d{1,12})\.(\d{1,9})\]\s?(.*)$")
# dmesg --time-format=iso "2024-11-15T05:39:15,491363+00:00 msg"; journalctl -o short-iso "2025-01-02T15:20:12+0800 "
_ISO_RE = lazy_compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[,.]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s(.*)$")
_ISO_PARTS_RE = lazy_compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[,.](\d+))?"
                             r"(Z|([+-])(\d{2}):?(\d{2}))?$")
# dmesg -T / --ctime "[Thu Jul 18 16:03:50 2024] msg" (local time, no zone)
_CTIME_RE = lazy_compile(r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]"
                         r"\s?(.*)$")
# journalctl -o short-precise / short, syslog: "Jan 02 15:20:12.123456 HOST kernel: msg" (local time, no year)
_SYSLOG_RE = lazy_compile(r"^([A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?) (\S+ kernel: .*)$")
_SYSLOG_STAMP_RE = lazy_compile(r"^([A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?) (.*)$")
_MONTH_DAY_RE = lazy_compile(r"^(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
                             r"(?: (\d{4}))?$")
_JOURNAL_HOST_RE = lazy_compile(r"^\S+ kernel: (.*)$")
# A syslog line of a user-space program: "HOST TAG[PID]: msg" (rsyslog, journalctl without -k)
_USER_RE = lazy_compile(r"^\S+ (?!kernel:)[A-Za-z_][\w.@/()-]{0,63}(?:\[\d{1,10}\])?: ")
# A network manager's carrier line after the stamp: "HOST systemd-networkd[PID]: PORT: Lost carrier", NetworkManager's
# "HOST NetworkManager[PID]: <info>  [1692234567.1234] device (PORT): carrier: link disconnected" (older releases:
# "<info> (PORT): link disconnected (deferring action for 4 seconds)") and its state change to unavailable
# for a carrier change. The whole line, bounded, or no match: nothing else a program writes rides along.
_LINK_USER_RE = lazy_compile(
    r"^\S{1,255} (?P<line>systemd-networkd\[\d{1,10}\]: [^\s:/()]{1,15}: (?:[Ll]ost|[Gg]ained) carrier"
    r"|NetworkManager\[\d{1,10}\]: (?:<[a-z]{4,5}> +)?(?:\[\d{1,12}\.\d{1,9}\] +)?(?:device )?\([^\s:/()]{1,15}\): "
    r"(?:(?:carrier: )?link (?:dis)?connected(?: \((?:deferring action for \d{1,10} (?:milli)?seconds"
    r"|calling deferred action|canceling deferred action)\))?"
    r"|(?:device )?state change: [a-z-]{1,20} -> unavailable \(reason 'carrier-changed'"
    r"(?:, [a-z-]{1,20}: '[a-z-]{0,20}'){0,3}\)(?: \[\d{1,4} \d{1,4} \d{1,4}\])?))$")
# pstore (ramoops, ERST): "<6>[   12.345678] msg" records under "Panic#1 Part1" headers
_PRIO_RE = lazy_compile(r"^<(\d{1,3})>(\[.*)$")
_PSTORE_HEADER_RE = lazy_compile(r"^(?:Panic|Oops|Emergency|Shutdown|Halt|Poweroff|Restart|Unknown)#\d{1,10} "
                                 r"Part\d{1,10}$")
# dmesg -H / --reltime: "[Feb13 04:56] msg" (local time, minutes, no year), then "[  +2.141017] msg"
_RELTIME_RE = lazy_compile(r"^\[([A-Z][a-z]{2}) ?(\d{1,2}) (\d{2}):(\d{2})(?::(\d{2}))?\]\s?(.*)$")
_RELDELTA_RE = lazy_compile(r"^\[\s*\+\s*(\d{1,12})\.(\d{1,9})\]\s?(.*)$")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}
# `dmesg --decode`: "kern  :warn  : <rest>"
_DECODED_RE = lazy_compile(r"^([a-z]+)\s*:([a-z]+)\s*: (.*)$")
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
EARLIER_BOOT = "(an earlier boot, saved by pstore)"  # the `wall` of a pstore record: predates this boot
BOOT_RESET_USEC = 1_000_000  # the since-boot clock going back by more than this: a later boot's records
CLOCK_SLACK = dt.timedelta(minutes=10)  # clock steps after boot (NTP) and the capture's own duration
TZ_SLACK = dt.timedelta(hours=14)  # stamps without a zone are node-local: no zone is more than 14 h from UTC


# The line grammars, in the order they are tried (the first that matches names the line).
GRAMMARS = ("kmsg", "pstore-header", "pstore", "decoded", "dmesg", "reltime", "ctime", "iso", "syslog",
            "syslog-link", "syslog-user")
# Grammars whose lines are no kernel record: recognised, then left out.
NOT_RECORDS = frozenset({"pstore-header", "syslog-user"})
# The user-space lines that are records (a network manager's carrier change, tagged with its program).
USER_RECORDS = frozenset({"syslog-link"})


def line_grammar(line: str, journal: bool = False) -> str | None:
    """The grammar a line matches; "bare" for message text without a stamp; None for blank/continuation lines.

    `journal`: the file is a journal or syslog file (`is_journal`), so an ISO-stamped "HOST prog[pid]: ..."
    line is a user-space line, not `dmesg --time-format=iso` text.
    """
    if not line.strip() or line.startswith(" "):
        return None
    if _KMSG_RE().match(line):
        return "kmsg"
    if _PSTORE_HEADER_RE().match(line):
        return "pstore-header"
    if _PRIO_RE().match(line):
        return "pstore"
    if (decoded := _DECODED_RE().match(line)) and decoded.group(2) in _LEVELS:
        return "decoded"
    if _DMESG_RE().match(line):
        return "dmesg"
    if _RELTIME_RE().match(line) or _RELDELTA_RE().match(line):
        return "reltime"
    if _CTIME_RE().match(line):
        return "ctime"
    if iso := _ISO_RE().match(line):
        rest = iso.group(2)
        if _LINK_USER_RE().match(rest):
            return "syslog-link"
        # In a journal, "HOST prog[pid]: ..." is a program's line; dmesg's own ISO lines (a kmsg.txt fed by
        # both) hold no such host and tag ("pci 0000:19:00.0: ...", "NVRM: Xid ...") and stay records.
        user = journal and not _JOURNAL_HOST_RE().match(rest) and _USER_RE().match(rest)
        return "syslog-user" if user else "iso"
    if _SYSLOG_RE().match(line):
        return "syslog"
    if (stamp := _SYSLOG_STAMP_RE().match(line)) and _USER_RE().match(stamp.group(2)):
        return "syslog-link" if _LINK_USER_RE().match(stamp.group(2)) else "syslog-user"
    return "bare"


def is_journal(lines: Iterable[str]) -> bool:
    """Whether ISO-stamped lines carry "HOST kernel: " (journalctl short-iso, rsyslog): a journal, not dmesg."""
    return any((iso := _ISO_RE().match(line)) is not None and _JOURNAL_HOST_RE().match(iso.group(2)) is not None
               for line in lines)


def timeless(record: KmsgRecord) -> bool:
    """A record that carries no time at all (dmesg -t, bare text): whether it is of this boot cannot be told."""
    return record.ts_usec is None and record.wall is None


def parse_kmsg_line(line: str, journal: bool = False) -> KmsgRecord | None:
    """One line of any supported format; None for continuation, blank and user-space lines (but a network
    manager's carrier line) and pstore headers.

    A `dmesg -H` offset line ("[  +2.141017] msg") has no time of its own here; `parse_kmsg_text` dates it.
    """
    grammar = line_grammar(line, journal)
    if grammar is None or grammar in NOT_RECORDS:
        return None
    if grammar == "syslog-link":
        stamped = _ISO_RE().match(line) or _SYSLOG_STAMP_RE().match(line)
        link = _LINK_USER_RE().match(stamped.group(2)) if stamped else None
        if stamped and link:  # the program's line without the host: its tag says it is user space's
            return KmsgRecord(message=link.group("line"), wall=stamped.group(1))
    if grammar == "pstore":
        prio = _PRIO_RE().match(line)
        inner = parse_kmsg_line(prio.group(2)) if prio else None
        if prio and inner is not None:
            return inner._replace(priority=int(prio.group(1)) & 7)
    if grammar == "reltime":
        if header := _RELTIME_RE().match(line):
            month, day, hour, minute, second, message = header.groups()
            return KmsgRecord(message=message, wall=f"{month} {int(day):2d} {hour}:{minute}:{second or '00'}")
        if delta := _RELDELTA_RE().match(line):
            return KmsgRecord(message=delta.group(3))
    match = _KMSG_RE().match(line)
    if match:
        prefix = int(match.group(1))
        return KmsgRecord(
            message=match.group(4),
            priority=prefix & 7,  # the low 3 bits are the level; the rest is the facility
            seq=int(match.group(2)),
            ts_usec=int(match.group(3)),
        )
    decoded = _DECODED_RE().match(line)
    if decoded and decoded.group(2) in _LEVELS:
        inner = parse_kmsg_line(decoded.group(3))
        if inner is not None:
            level = _LEVELS[decoded.group(2)]
            return KmsgRecord(message=inner.message, priority=level, ts_usec=inner.ts_usec, wall=inner.wall)
    match = _DMESG_RE().match(line)
    if match:
        rest = match.group(3)
        host = _JOURNAL_HOST_RE().match(rest)  # journalctl -o short-monotonic: "[  12.3] HOST kernel: msg"
        return KmsgRecord(message=host.group(1) if host else rest, ts_usec=_usec(match))
    match = _CTIME_RE().match(line)
    if match:
        return KmsgRecord(message=match.group(2), wall=match.group(1))
    match = _ISO_RE().match(line) or _SYSLOG_RE().match(line)
    if match:
        return _stamped(match.group(1), match.group(2))
    return KmsgRecord(message=line)


def _usec(match: re.Match[str]) -> int:
    return int(match.group(1)) * 1_000_000 + int(match.group(2).ljust(6, "0")[:6])


def _stamped(stamp: str, rest: str) -> KmsgRecord:
    """A record with a wall-clock stamp; journalctl's "HOST kernel: " and a printk time after it are read too."""
    if host := _JOURNAL_HOST_RE().match(rest):
        rest = host.group(1)
    if mono := _DMESG_RE().match(rest):
        return KmsgRecord(message=mono.group(3), ts_usec=_usec(mono), wall=stamp)
    return KmsgRecord(message=rest, wall=stamp)


def wall_time(stamp: str | None, reference: dt.datetime | None = None) -> dt.datetime | None:
    """A record's wall-clock stamp as a datetime: aware where the stamp names its zone, else naive local time.

    Stamps without a year (journalctl short-precise, syslog) take the year of `reference` (the
    observation time), or the year before when that would put them more than a day after it;
    without a reference they are None. None also for a stamp that is not a date.
    """
    if not stamp:
        return None
    if iso := _ISO_PARTS_RE().match(stamp):
        year, month, day, hour, minute, second, fraction, zone, sign, zh, zm = iso.groups()
        tz: dt.tzinfo | None = None
        if zone == "Z":
            tz = dt.timezone.utc
        elif zone:
            if int(zh) > 14 or int(zm) > 59:
                return None  # +99:99 is no zone (and dt.timezone refuses 24 h or more)
            offset = dt.timedelta(hours=int(zh), minutes=int(zm))
            tz = dt.timezone(-offset if sign == "-" else offset)
        try:
            return sane_time(dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                                         int((fraction or "0").ljust(6, "0")[:6]), tzinfo=tz))
        except ValueError:
            return None
    parts = _MONTH_DAY_RE().match(stamp)
    if not parts or parts.group(1) not in _MONTHS:
        return None
    month_name, day, hour, minute, second, fraction, year = parts.groups()
    if year is None and reference is None:
        return None
    reference = sane_time(reference)  # the year is taken from it, and a day added: never year 1 or 9999
    if year is None and reference is None:
        return None
    local_ref = reference.replace(tzinfo=None) if reference is not None else None
    try:
        when = dt.datetime(int(year) if year else 2000, _MONTHS[month_name], int(day), int(hour), int(minute),
                           int(second), int((fraction or "0").ljust(6, "0")[:6]))
        if year is None and local_ref is not None:
            when = when.replace(year=local_ref.year)
            if when > local_ref + dt.timedelta(days=1):
                when = when.replace(year=local_ref.year - 1)
    except ValueError:  # 29 Feb in a year without one
        return None
    return sane_time(when)


def boot_time(observed_at: dt.datetime | None, uptime_s: float | None) -> dt.datetime | None:
    """When the node booted (aware UTC): the observation time minus /proc/uptime."""
    if observed_at is None or uptime_s is None:
        return None
    observed = sane_time(observed_at if observed_at.tzinfo else observed_at.replace(tzinfo=dt.timezone.utc))
    if observed is None or finite(uptime_s, low=0, high=MAX_UPTIME_S) is None:
        return None  # year 1 minus an uptime, or an uptime of 1e308 s, is no boot time
    return observed.astimezone(dt.timezone.utc) - dt.timedelta(seconds=uptime_s)


def predates_boot(stamp: str | None, boot: dt.datetime | None, reference: dt.datetime | None = None) -> bool:
    """Whether a record's wall-clock stamp is older than the boot (with slack for clock steps and zones).

    A stamp without a zone is node-local time: it predates the boot only when it is older in every
    time zone. Records without a stamp, or an unknown boot time, never predate it.
    """
    if stamp == EARLIER_BOOT:
        return True
    when = wall_time(stamp, reference)
    if when is None or boot is None:
        return False
    if when.tzinfo is not None:
        return when < boot - CLOCK_SLACK
    return when < boot.astimezone(dt.timezone.utc).replace(tzinfo=None) - TZ_SLACK - CLOCK_SLACK


BOOT_BANNER_RE = lazy_compile(r"^Linux version \d+\.\d+")  # init/version.c: the first line of every boot
# journalctl's boot separator (`journalctl -k -b -N..`, and what `snapshot import` writes for `-o json`
# records' _BOOT_ID): the records after it are that boot's.
JOURNAL_BOOT_RE = lazy_compile(r"^-- Boot ([0-9a-f]{32}) --$")


def boot_start(records: Sequence[KmsgRecord]) -> int:
    """Index of the first record of the last boot in `records`: where the since-boot clock last went back.

    Records without a since-boot time (wall-clock formats) neither start nor end a boot here. A log with no
    time at all (`dmesg -t`, a console paste, journal MESSAGEs) is a dmesg of the current boot unless a boot
    banner ("Linux version ...") inside it says a boot began: then the last banner starts the current boot
    (issue 31.4).
    """
    if records and all(timeless(r) for r in records):
        banners = [i for i, r in enumerate(records) if BOOT_BANNER_RE().match(r.message)]
        return banners[-1] if banners else 0
    start, high = 0, -1
    for index, record in enumerate(records):
        ts = record.ts_usec
        if ts is None:
            continue
        if ts + BOOT_RESET_USEC < high:
            start = index
            high = ts
        else:
            high = max(high, ts)
    return start


def parse_kmsg_text(lines: Iterable[str]) -> tuple[KmsgRecord, ...]:
    """The records of a log's lines; `dmesg -H` offsets are added to the last stamp into stamps of their own."""
    text = lines if isinstance(lines, (list, tuple)) else list(lines)
    journal = is_journal(text)
    records: list[KmsgRecord] = []
    clock: dt.datetime | None = None  # dmesg -H: the time of the previous record (the year is a placeholder)
    pstore = False  # under a "Panic#1 Part1" header: an earlier boot's records
    boot: str | None = None  # after a journal boot separator: the boot the records are of
    for raw in text:
        line = raw.rstrip("\n")
        if (separator := JOURNAL_BOOT_RE().match(line)) is not None:
            boot = separator.group(1)
            continue
        record = parse_kmsg_line(line, journal)
        if record is None:
            pstore = pstore or _PSTORE_HEADER_RE().match(line) is not None
            continue
        if pstore and _PRIO_RE().match(line):
            # Saved by the crashed boot: its since-boot clock is not this boot's. `dmesg -r` prints the same
            # "<6>[  12.3]" lines without a header, and those keep their time.
            record = record._replace(ts_usec=None, seq=None, wall=EARLIER_BOOT)
        if (delta := _RELDELTA_RE().match(line)) and record.wall is None and clock is not None:
            try:
                clock += dt.timedelta(microseconds=_usec(delta))
            except OverflowError:  # an offset of 10^12 s runs past year 9999: the rest stays timeless
                clock = None
            else:
                record = record._replace(wall=f"{clock:%b} {clock.day:2d} {clock:%H:%M:%S.%f}")
        elif _RELTIME_RE().match(line):
            clock = _reltime_clock(record.wall)
        records.append(record if boot is None else record._replace(boot=boot))
        if len(records) >= MAX_RECORDS:
            break
    return tuple(records)


def _reltime_clock(stamp: str | None) -> dt.datetime | None:
    """A `dmesg -H` stamp ("Feb 13 04:56:00") as a datetime to add offsets to (in a leap year: 29 Feb exists)."""
    parts = _MONTH_DAY_RE().match(stamp or "")
    if not parts or parts.group(1) not in _MONTHS:
        return None
    try:
        return dt.datetime(2000, _MONTHS[parts.group(1)], int(parts.group(2)), int(parts.group(3)),
                           int(parts.group(4)), int(parts.group(5)))
    except ValueError:
        return None


def open_recorded_log(path: str | Path) -> int:
    """A descriptor of a recorded kernel log: a regular file, never through a symlink (a snapshot is untrusted).

    The type is checked before the open, so a FIFO or device planted as kmsg.txt is never opened.
    """
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"refused: {kind}, not a regular file (not opened)", str(path))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "refused: not a regular file (not opened)", str(path))
    return fd


def read_recorded_kmsg(path: Path) -> tuple[KmsgRecord, ...] | Unknown:
    """The records of a recorded log's last KMSG_TAIL_BYTES (a log of any size costs bounded memory)."""
    try:
        fd = open_recorded_log(path)
        try:
            data, _size, _read = read_tail_fd(fd, KMSG_TAIL_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        return Unknown(f"{path}: {exc.strerror}")
    text = data.decode("utf-8", "backslashreplace")
    del data
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
        batch = list(parse_kmsg_text(lines))  # the same grammars as a whole file (journal, dmesg -H, pstore)
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
            fd = open_recorded_log(self.path)
            try:
                size = os.fstat(fd).st_size
                if size < offset:  # replaced or truncated: start over (the counters keep what they saw)
                    offset, partial = 0, b""
                    with self._lock:
                        self.records.clear()
                skip = size - offset > KMSG_TAIL_BYTES  # more than a tail to catch up on: only the tail
                if skip:
                    offset, partial = size - KMSG_TAIL_BYTES, b""
                data = os.pread(fd, size - offset, offset) if size > offset else b""
            finally:
                os.close(fd)
            if data:
                offset += len(data)
                if skip:  # begin at the first full line
                    cut = data.find(b"\n")
                    data = data[cut + 1:] if cut >= 0 else b""
                data, partial = partial + data, b""
                if not data.endswith(b"\n"):
                    data, _, partial = data.rpartition(b"\n")
                self._deliver(data.decode("utf-8", "backslashreplace").splitlines())
            self._alive()
            self._stop.wait(self.poll_s)
