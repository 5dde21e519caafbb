"""The `nvidia-bug-report` kind: nvidia-bug-report.log(.gz), split into its sections.

nvidia-bug-report.sh writes sections one after another (each piped through
gzip on its own, so the .gz is many gzip members, which `inputs` reads as one
stream). Every section starts with a line of 44 underscores and a blank line,
then a header: `*** /path` and a `*** ls: ...` line for a file it copied
(append()), or the command it ran (`/usr/bin/nvidia-smi --query`,
`/sbin/lspci -nnDvvvxxxx`, `/usr/sbin/dmidecode`), or a title (`dmesg:`).
Each section's body goes to the importer of its kind (found by content, as
any input); copied /proc and /sys files (`*** /proc/...`, `*** /sys/...`) go to fs/ as
the files they name, for the host reader; every other section is listed by name as not used.

The report is read line by line (`contribute_lines`; a large one is streamed,
never held whole): a section goes whole to an importer of whole inputs
(bounded: `MAX_SECTION`), and as a stream of lines to one that reads lines
(the kernel log, almost all of a large report). Kinds are detected on each
section's first HEAD_BYTES, as for any input.
"""

from __future__ import annotations

import io
import posixpath
import re
from collections.abc import Iterable, Iterator
from typing import Any

from agent.sources.importers.base import (
    HEAD_BYTES,
    MAX_FS_FILE,
    Builder,
    Contribution,
    Importer,
    InputError,
    decode_text,
    detect_kind,
    run_importer,
    text_lines,
)

SEPARATOR = "_" * 44
MAX_BYTES = 1 << 30
MAX_SECTION = 64 << 20  # characters: a section for an importer of whole inputs (theirs are <= 64 MiB)
_FILE_RE = re.compile(r"^\*\*\* (/\S+)$")
_HOST_FILES = re.compile(r"^/(?:proc|sys)/[^/].*$")  # procfs/sysfs files copied by append(): kept as the files


def host_file(header: str) -> str | None:
    """The /proc or /sys path a `*** /path` section copies, read like the file it names; None for other sections.

    The path is normalised first ("/proc/driver/nvidia/./gpus/..."), so "/proc/../etc/x" names no host file;
    the snapshot writer (Builder.put_fs) checks the characters again.
    """
    m = _FILE_RE.match(header)
    if m is None:
        return None
    path = posixpath.normpath(m.group(1))
    return path if _HOST_FILES.match(path) else None


def split_sections(text: str) -> list[tuple[str, str]]:
    """(header, body) of every section, in order; the prologue's header is "Start of NVIDIA bug report"."""
    sections: list[tuple[str, str]] = []
    for chunk in ("\n" + text).split("\n" + SEPARATOR + "\n")[1:]:
        lines = chunk.removeprefix("\n").split("\n")
        header = lines[0].strip()
        body_lines = lines[1:]
        if _FILE_RE.match(header):
            if body_lines and body_lines[0].startswith("*** ls:"):
                body_lines = body_lines[1:]
        elif body_lines and not body_lines[0].strip():
            body_lines = body_lines[1:]
        body = "\n".join(body_lines)
        sections.append((header, body.removesuffix("\n")))
    return sections


_Item = tuple[str, bool, bool]  # a line (or a piece of a long one) without its "\n"; ended by "\n"; a separator


class SectionReader:
    """`split_sections` over a stream of lines (base.text_lines), one section at a time, in bounded memory.

    `sections()` yields each header; while it is suspended, `body()` yields that section's body
    in pieces whose "".join() is split_sections' body (what is not read is skipped when it resumes).
    """

    def __init__(self, pieces: Iterable[str]) -> None:
        self._items = iter(pieces)
        self._peeked: _Item | None = None
        self._line_start = True
        self._after_separator = False  # the line before was a separator: its "\n" is taken ("\n" SEP "\n")
        self._in_body = False

    def _next(self) -> _Item | None:
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
            return item
        piece = next(self._items, None)
        if piece is None:
            return None
        newline = piece.endswith("\n")
        text = piece[:-1].removesuffix("\r") if newline else piece  # the report's "\r\n" read as "\n"
        separator = self._line_start and newline and text == SEPARATOR and not self._after_separator
        if self._line_start:
            self._after_separator = separator
        self._line_start = newline
        return text, newline, separator

    def _skip_line(self, item: _Item) -> None:
        """The rest of a long line whose first piece was `item`."""
        while not item[1]:
            following = self._next()
            if following is None:
                return
            item = following

    def sections(self) -> Iterator[str]:
        while (item := self._next()) is not None and not item[2]:
            pass  # what comes before the first separator is no section
        if item is None:
            return
        while True:
            first = self._next()
            if first is not None and first[:2] == ("", True):
                following = self._next()
                if following is None or following[2]:
                    self._peeked = following
                else:
                    first = following  # split_sections' removeprefix("\n")
            header = ""
            if first is not None and first[2]:
                self._peeked = first  # an empty section: the next one starts here
            elif first is not None:
                header = first[0].strip()
                self._skip_line(first)
                self._drop_first_body_line(header)
            self._in_body = True
            yield header
            for _ in self.body():
                pass
            if self._peeked is None:
                return
            self._peeked = None  # the separator that starts the next section

    def _drop_first_body_line(self, header: str) -> None:
        item = self._next()
        if item is None or item[2]:
            self._peeked = item
        elif (item[0].startswith("*** ls:") if _FILE_RE.match(header) else not item[0].strip()):
            self._skip_line(item)
        else:
            self._peeked = item

    def body(self) -> Iterator[str]:
        """The current section's body in pieces; ends at the next separator (left for `sections`) or the end."""
        if not self._in_body:
            return
        owed = 0  # "\n"s not yet handed on: the body's last one or two are not part of it
        while (item := self._next()) is not None and not item[2]:
            text, newline, _ = item
            if text:
                yield "\n" * owed + text if owed else text
                owed = 0
            owed += newline
        self._in_body = False
        if item is not None:
            self._peeked = item  # the separator took the "\n" before it
            owed = max(owed - 1, 0)
        owed = max(owed - 1, 0)  # removesuffix("\n")
        while owed:
            yield "\n" * min(owed, 1 << 16)
            owed -= min(owed, 1 << 16)


class _Encoded(io.RawIOBase):
    """Text pieces as a UTF-8 byte stream (what run_importer streams to an importer of lines)."""

    def __init__(self, pieces: Iterable[str]) -> None:
        super().__init__()
        self._pieces = iter(pieces)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._left:
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            self._left = piece.encode("utf-8")
        n = min(len(view), len(self._left))
        view[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _capped(pieces: Iterable[str], what: str) -> Iterator[str]:
    total = 0
    for piece in pieces:
        total += len(piece)
        if total > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 30} GiB: not read", path=what)
        yield piece


class BugReportImporter:
    """Splits a bug report into its sections and hands each to the importer of its kind (`sections`)."""

    kind = "nvidia-bug-report"

    def __init__(self, sections: list[Importer]) -> None:
        self.sections = sections

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head[:4096])
        return text.startswith(SEPARATOR) and "NVIDIA bug report log file" in text

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 30} GiB: not read", path=builder.current)
        return self.contribute_lines(text_lines(io.BytesIO(data)), builder)

    def contribute_lines(self, lines: Iterable[str], builder: Builder) -> Contribution:
        result = Contribution()
        unused: list[str] = []
        outer = builder.current
        report = SectionReader(_capped(lines, builder.current))
        count = 0
        for header in report.sections():
            count += 1
            shown = header[:100] or "(untitled)"
            body = report.body()
            copied = host_file(header)
            want = MAX_FS_FILE + 1 if copied else HEAD_BYTES  # a host file whole (or past its cap), else a head
            head_pieces: list[str] = []
            have = 0
            whole = True
            for piece in body:
                head_pieces.append(piece)
                have += len(piece)
                if have >= want:
                    whole = False
                    break
            text = "".join(head_pieces)
            del head_pieces
            if copied and text:
                if builder.put_fs(copied, text + "\n", result):  # past MAX_FS_FILE: refused by put_fs
                    result.contributed.append(f"{copied} (section {shown!r})")
                continue
            importer = detect_kind(text.encode("utf-8")[:HEAD_BYTES], shown, self.sections) if text.strip() else None
            if importer is None or importer.kind == self.kind:
                unused.append(shown)
                continue
            name = f"{outer} section {shown!r}"
            try:
                if whole:
                    part = run_importer(importer, text.encode("utf-8"), builder, name)
                elif hasattr(importer, "contribute_lines"):
                    part = run_importer(importer, _Encoded(_chain(text, body)), builder, name)
                else:
                    part = run_importer(importer, _whole(text, body), builder, name)
            except InputError as exc:
                result.skipped.append(f"section {shown!r} ({importer.kind}): {exc.message}")
                continue
            result.contributed += [f"{item} (section {shown!r})" for item in part.contributed]
            result.skipped += [f"section {shown!r}: {item}" for item in part.skipped]
        if not count:
            raise InputError("no nvidia-bug-report section in it", path=builder.current)
        if unused:
            result.skipped.append(f"{len(unused)} section(s) not used: " + "; ".join(unused[:60])
                                  + (" ..." if len(unused) > 60 else ""))
        return result


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _whole(first: str, rest: Iterator[str]) -> bytes:
    """A section for an importer of whole inputs, up to MAX_SECTION characters."""
    pieces, have = [first], len(first)
    for piece in rest:
        have += len(piece)
        if have > MAX_SECTION:
            raise InputError(f"larger than {MAX_SECTION >> 20} MiB: not read")
        pieces.append(piece)
    return "".join(pieces).encode("utf-8")
