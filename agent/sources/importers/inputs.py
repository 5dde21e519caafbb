"""Read `snapshot import` inputs (files, folders, archives) safely into memory, one entry at a time.

Every input is untrusted (a customer's support bundle). Nothing here writes to
disk: an archive member is read into memory by streaming and handed on under
its name, which is only ever a label, so no member can be placed anywhere,
inside `--out` or out of it. Refused by name, never followed or opened: members
with an absolute name or `..` in it, hard links, devices, FIFOs, sockets; in
folders, anything that is not a regular file, folder or symlink.

Symlinks (tar and zip members, a folder's real links) are never followed nor
opened: each is an `Entry` of its own with `link` set to its target's text (read
from the archive's header or member, or with `os.readlink` after an `lstat`),
never a file. A target that is empty, longer than `MAX_LINK_TARGET` bytes, not
UTF-8 or holding a NUL or another control character is refused by name. Only the
importers of trees that keep their links (`sysfs-tree`, `sosreport`) take a link
entry, as a recorded link (fs_links.json, resolved inside the snapshot by
`SnapshotFs`); they clear `error` and set `kind`. A link no importer takes stays
what it was: an archive's is an error ("refused: a symlink (to ...): not
followed"), a folder's a note.

A tar member whose content is text followed by NUL bytes up to a declared size
that is a multiple of 4096 is what GNU tar stores for a file that shrank while
it read it (sysfs says 4096 bytes for every attribute, then gives "4: ACTIVE\n"):
the padding is dropped (sha256 stays that of the member as stored).

Caps (a decompression bomb stops at the cap while streaming, its size never
trusted): `MAX_TOTAL` uncompressed bytes over all inputs, `MAX_MEMBERS` entries,
`MAX_MEMBER` bytes for one entry. A member whose header declares more is refused
before a byte of it is read. Archive kinds are found by content (gzip, xz,
bzip2, zip, tar magic), whatever the file is called; an archive inside an
archive is opened too, `MAX_NESTING` deep. A corrupt or truncated input is one
error naming it, where it broke and the member being read, and the entry is
`broken`: the callers refuse the whole (`snapshot import` writes nothing, `audit`
of an archive judges nothing), since what came before the break is part of a
whole. A tar must end with its end-of-archive blocks and be whole 512-byte
blocks, and a compressed tar is read past the tar's end to its trailer, so a
cut at a block boundary or in a gzip trailer is found too.

Streaming (`Reader(stream_above=N)`, what `snapshot import` uses): a file or
member larger than N bytes is not read into memory but handed on as
`Entry.content`, a `Content` stream read once, in order, while the entry is
being imported (it is valid until the next entry is asked for); the Reader then
reads what the importer left, so size and sha256 cover the whole, and every cap
holds as before. A cap reached or corrupt data met while an importer reads is an
`InputError` to it; the Reader records it as it records it for an entry read
whole (on the archive for a compressed file or tar member). Archives inside
archives are still read whole (bounded by `MAX_MEMBER`).

The parts: `input_entries` (`Entry`, the name and link rules), `input_streams` (the caps, archive
kinds, counted streams and `Content`), and here the `Reader` that walks folders and archives; the
names callers use are importable from here too.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from agent.sources.importers.archive_bounds import TarTruncated, bounded_tarinfo, zip_entry_count
from agent.sources.importers.input_entries import MAX_LINK_TARGET, Entry, link_entry, link_target_problem, unsafe_name
from agent.sources.importers.input_streams import (
    CHUNK_BYTES,
    CORRUPT_ERRORS,
    DECOMPRESSORS,
    MAX_MEMBER,
    MAX_MEMBERS,
    MAX_TOTAL,
    Budget,
    Content,
    CountedStream,
    LimitReached,
    container_kind,
    error_text,
    failure_text,
    read_all,
    read_upto,
    sha256_hex,
    size_text,
)

__all__ = [  # what callers import from here: the Reader and what it reads into
    "MAX_FOLDER_DEPTH",
    "MAX_LINK_TARGET",
    "MAX_MEMBER",
    "MAX_MEMBERS",
    "MAX_NESTING",
    "MAX_TOTAL",
    "STREAM_ABOVE",
    "Budget",
    "Content",
    "Entry",
    "LimitReached",
    "Reader",
    "container_kind",
    "link_entry",
    "link_target_problem",
    "unsafe_name",
]

MAX_NESTING = 3  # tar.gz inside a zip inside a folder: enough for any support bundle
MAX_FOLDER_DEPTH = 32
STREAM_ABOVE = 8 << 20  # bytes: a larger file is streamed to its importer (Reader(stream_above=...))
_TAR_HEAD = 512


def _unpadded(data: bytes, declared: int) -> bytes:
    """A tar member's text without the NULs GNU tar pads a file that shrank while read with (sysfs: 4096)."""
    if not data.endswith(b"\x00") or declared % 4096:
        return data
    text = data.rstrip(b"\x00")
    return data if b"\x00" in text else text


class Reader:
    """Expands inputs into `Entry`s: containers first (filled in as they are read), then their files."""

    def __init__(self, budget: Budget | None = None, stream_above: int | None = None) -> None:
        self.budget = budget or Budget()
        self.stream_above = stream_above  # None: every file's content as bytes (Entry.data)
        self.stopped: str | None = None  # a cap over all inputs was reached

    def read_paths(self, paths: list[Path]) -> Iterator[Entry]:
        for path in paths:
            if self.stopped:
                yield Entry(str(path), error=self.stopped)
                continue
            yield from self._path(path, str(path), 0)

    # --- the file system ---------------------------------------------------------------------

    def _path(self, path: Path, shown: str, depth: int) -> Iterator[Entry]:
        try:
            info = os.stat(path)  # named by the operator: a link they gave is theirs to follow
        except OSError as exc:
            yield Entry(shown, error=f"cannot read: {exc.strerror}")
            return
        if stat.S_ISDIR(info.st_mode):
            yield from self._folder(path, shown)
        elif stat.S_ISREG(info.st_mode):
            yield from self._file(path, shown, info.st_size)
        else:
            yield Entry(shown, error="not a regular file or folder: refused (not opened)")

    def _folder(self, root: Path, shown: str) -> Iterator[Entry]:
        folder = Entry(shown, kind="folder")
        yield folder
        pending: list[tuple[Path, str, int]] = [(root, "", 0)]
        while pending:
            current, rel, depth = pending.pop()
            try:
                names = sorted(os.listdir(current), reverse=True)
            except OSError as exc:
                folder.skipped.append(f"{rel or '.'}: cannot list: {exc.strerror}")
                continue
            for name in names:
                child, child_rel = current / name, f"{rel}{name}"
                try:
                    mode = os.lstat(child).st_mode
                except OSError as exc:
                    folder.skipped.append(f"{child_rel}: {exc.strerror}")
                    continue
                if stat.S_ISDIR(mode):
                    if depth >= MAX_FOLDER_DEPTH:
                        folder.skipped.append(f"{child_rel}/: nested deeper than {MAX_FOLDER_DEPTH} folders")
                    else:
                        pending.append((child, child_rel + "/", depth + 1))
                elif stat.S_ISREG(mode):
                    try:
                        self.budget.one_more()
                    except LimitReached as exc:
                        folder.error = self.stopped = str(exc)
                        return
                    yield from self._file(child, f"{shown.rstrip('/')}/{child_rel}", None, nofollow=True)
                elif stat.S_ISLNK(mode):
                    try:
                        self.budget.one_more()
                        target = os.readlink(child)  # the link's text only: nothing is opened through it
                    except LimitReached as exc:
                        folder.error = self.stopped = str(exc)
                        return
                    except OSError as exc:
                        folder.skipped.append(f"{child_rel}: a symlink that cannot be read: {exc.strerror}")
                        continue
                    yield link_entry(f"{shown.rstrip('/')}/{child_rel}", target, in_folder=True)
                else:
                    folder.skipped.append(f"{child_rel}: a device, FIFO or socket: not followed")
            if self.stopped:
                return

    def _file(self, path: Path, shown: str, size: int | None, nofollow: bool = False) -> Iterator[Entry]:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            yield Entry(shown, error=f"cannot read: {exc.strerror}")
            return
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                yield Entry(shown, error="not a regular file: refused")
                return
            head = handle.read(_TAR_HEAD + 512)
            handle.seek(0)
            kind = container_kind(head)
            if kind is None:
                yield from self._plain(shown, handle, info.st_size)
                return
            entry = Entry(shown, size=info.st_size, sha256=_file_digest(handle), kind=f"{kind} archive")
            handle.seek(0)
            yield entry
            yield from self._container(handle, kind, entry, 0)

    def _plain(self, shown: str, handle: IO[bytes], size: int) -> Iterator[Entry]:
        if size > self.budget.member:
            yield Entry(shown, size=size, error=f"{size_text(size)} or more: larger than the "
                                                f"{size_text(self.budget.member)} one input may hold: "
                                                "refused (not read)")
            return
        entry: Entry | None = None
        try:
            if self.stream_above is not None and size > self.stream_above:
                prefix = read_upto(handle, self.stream_above)
                self.budget.take(len(prefix))
                content = Content(prefix, handle, limit=self.budget.member, what=shown, budget=self.budget)
                del prefix
                entry = Entry(shown, size=size, content=content)
                yield entry
                entry.content = None
                entry.sha256 = content.finish()
                entry.size = content.size
                return
            data = read_all(handle, self.budget.member, shown)
            self.budget.take(len(data))
        except LimitReached as exc:
            self.stopped = self.stopped or (str(exc) if "over all inputs" in str(exc) else None)
            if entry is None:
                yield Entry(shown, size=size, error=str(exc))
            else:
                entry.error = entry.error or str(exc)
            return
        except OSError as exc:
            if entry is None:
                yield Entry(shown, size=size, error=f"cannot read: {exc.strerror}", broken=True)
            else:
                entry.error = entry.error or f"cannot read: {exc.strerror}"
                entry.broken = True
            return
        yield Entry(shown, size=len(data), sha256=sha256_hex(data), data=data)

    # --- archives ------------------------------------------------------------------------------

    def _container(self, handle: IO[bytes], kind: str, entry: Entry, depth: int) -> Iterator[Entry]:
        """The files in an archive; errors land on `entry` (the archive), what was read stays read."""
        try:
            if kind == "zip":
                yield from self._zip(handle, entry, depth)
            elif kind == "tar":
                stream = CountedStream(handle, self.budget, self.budget.total, entry.name)
                yield from self._tar(stream, entry, depth)
            else:
                stream = CountedStream(DECOMPRESSORS[kind](handle), self.budget, self.budget.total, entry.name)
                head = stream.head(_TAR_HEAD + 512)
                if container_kind(head) == "tar":
                    entry.kind = f"tar.{kind} archive"
                    yield from self._tar(stream, entry, depth)
                else:
                    yield from self._single(stream, entry, depth)
        except LimitReached as exc:
            entry.error = str(exc)
            if "over all inputs" in entry.error:
                self.stopped = entry.error
        except CORRUPT_ERRORS as exc:
            entry.broken = True
            entry.error = f"corrupt or truncated {entry.kind or kind}: {error_text(exc)}{_where(handle, entry)}"

    def _single(self, stream: CountedStream, entry: Entry, depth: int) -> Iterator[Entry]:
        """A compressed single file (dmesg.gz, nvidia-bug-report.log.gz): one member, named without the suffix."""
        stream.limit = self.budget.member
        stream.what = entry.name
        head = stream.head(4096)
        if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
            entry.error = "binary data inside (no kind nodewarden imports): not read further"
            return
        name = entry.name.rsplit(".", 1)[0] if entry.name.endswith((".gz", ".xz", ".bz2")) else entry.name
        if self.stream_above is not None:
            prefix = read_upto(stream, self.stream_above + 1)
            if len(prefix) > self.stream_above:
                yield from self._streamed(f"{name} (uncompressed)", prefix, stream, depth, None, budget=None)
                return
            data = prefix
        else:
            data = read_all(stream, self.budget.member, entry.name)
        yield from self._member(f"{name} (uncompressed)", data, depth)

    def _streamed(self, name: str, prefix: bytes, rest: IO[bytes] | io.RawIOBase, depth: int, expected: int | None,
                  budget: Budget | None) -> Iterator[Entry]:
        """A file larger than `stream_above` whose first bytes are `prefix`: as a Content, or whole if an archive."""
        if container_kind(prefix[:_TAR_HEAD + 512]) is not None:  # an archive inside: read whole, as before
            data = prefix + read_all(rest, self.budget.member - len(prefix), name)
            if expected is not None and len(data) != expected:
                raise EOFError(f"{name} is truncated")
            yield from self._member(name, data, depth)
            return
        content = Content(prefix, rest, limit=self.budget.member, what=name, budget=budget, expected=expected)
        del prefix
        entry = Entry(name, size=expected, content=content)
        yield entry
        entry.content = None
        try:
            entry.sha256 = content.finish()
        except (LimitReached, *CORRUPT_ERRORS) as exc:
            entry.error = entry.error or failure_text(exc)
            raise  # recorded on the archive too, as when the file was read whole
        finally:
            entry.size = content.size if expected is None else expected

    def _member(self, name: str, data: bytes, depth: int, text: bytes | None = None) -> Iterator[Entry]:
        kind = container_kind(data[:_TAR_HEAD + 512])
        if kind is None:
            entry = Entry(name, size=len(data), sha256=sha256_hex(data), data=data if text is None else text)
            if text is not None and len(text) != len(data):
                entry.skipped.append(f"{len(data) - len(text)} NUL byte(s) at its end: the padding tar writes for "
                                     "a file that shrank while read (sysfs files say 4096 bytes): dropped")
            yield entry
            return
        entry = Entry(name, size=len(data), sha256=sha256_hex(data), kind=f"{kind} archive")
        yield entry
        if depth + 1 >= MAX_NESTING:
            entry.error = f"an archive nested deeper than {MAX_NESTING} levels: not opened"
            return
        yield from self._container(io.BytesIO(data), kind, entry, depth + 1)

    def _tar(self, stream: CountedStream, entry: Entry, depth: int) -> Iterator[Entry]:
        # A stream: members in order, never seeking; extended headers bounded before tarfile reads them.
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=bounded_tarinfo()) as archive:
            for member in archive:
                self.budget.one_more()
                shown = f"{entry.name}:{member.name}"
                entry.reading = member.name
                if member.isdir():
                    continue
                if member.issym() and unsafe_name(member.name) is None:
                    yield link_entry(shown, member.linkname, in_folder=False)
                    continue
                why = unsafe_name(member.name) or _tar_refusal(member)
                if why is None and member.size > self.budget.member:
                    why = (f"declares {size_text(member.size)}: larger than the {size_text(self.budget.member)} "
                           "one member may hold (not read)")
                if why is not None:
                    yield Entry(shown, size=member.size if member.isreg() else None, error=f"refused: {why}")
                    if member.isreg() and member.size > self.budget.member:
                        raise LimitReached(f"{member.name}: declares {size_text(member.size)}, more than one member "
                                           "may hold: the rest of this archive is not read")
                    continue
                source = archive.extractfile(member)
                if source is None:
                    continue
                if self.stream_above is not None and member.size > self.stream_above:
                    prefix = read_upto(source, self.stream_above)
                    yield from self._streamed(shown, prefix, source, depth, member.size, budget=None)
                    continue
                data = read_all(source, self.budget.member, shown)
                if len(data) != member.size:
                    raise EOFError(f"{member.name} is truncated")
                yield from self._member(shown, data, depth, _unpadded(data, member.size))
        # tarfile stops at the end-of-archive blocks: the rest (a record's padding, a gzip/xz/bzip2 trailer with
        # its checksum) is read too, so that a compressed stream cut after the tar's end is still found.
        while stream.read(CHUNK_BYTES):
            pass
        if stream.read_so_far % _TAR_HEAD:  # every tar writer writes whole 512-byte blocks
            raise TarTruncated(f"the tar data is {stream.read_so_far} bytes, not a whole number of "
                               f"{_TAR_HEAD}-byte blocks")

    def _zip(self, handle: IO[bytes], entry: Entry, depth: int) -> Iterator[Entry]:
        zip_entry_count(handle, self.budget.members - self.budget.count)  # before zipfile lists them all
        with zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            if len(infos) > self.budget.members - self.budget.count:
                raise LimitReached(f"{len(infos)} members: more than the {self.budget.members} files "
                                   "an import may hold: refused (not read)")
            for info in infos:
                self.budget.one_more()
                shown = f"{entry.name}:{info.filename}"
                entry.reading = info.filename
                if info.is_dir():
                    continue
                mode = info.external_attr >> 16
                why = unsafe_name(info.filename)
                if why is None and stat.S_ISLNK(mode):
                    yield self._zip_link(archive, info, shown)
                    continue
                if why is None and stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # no type (0o600): a file
                    why = "not a regular file"
                if why is None and info.flag_bits & 0x1:
                    why = "encrypted"
                if why is None and info.file_size > self.budget.member:
                    why = (f"declares {size_text(info.file_size)}: larger than the {size_text(self.budget.member)} "
                           "one member may hold (not read)")
                if why is not None:
                    yield Entry(shown, size=info.file_size, error=f"refused: {why}")
                    continue
                if self.stream_above is not None and info.file_size > self.stream_above:
                    yield from self._zip_streamed(archive, info, shown, depth)
                    continue
                try:
                    with archive.open(info) as source:
                        counted = CountedStream(source, self.budget, self.budget.member, shown)
                        data = read_all(counted, self.budget.member, shown)
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                    yield Entry(shown, size=info.file_size, error=f"corrupt member: {error_text(exc)}", broken=True)
                    continue
                except LimitReached as exc:
                    if "over all inputs" in str(exc):
                        raise
                    yield Entry(shown, size=info.file_size, error=str(exc))
                    continue
                yield from self._member(shown, data, depth)


    def _zip_link(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str) -> Entry:
        """A zip symlink: its member holds the target's text, read bounded; nothing is followed."""
        if info.file_size > MAX_LINK_TARGET or info.flag_bits & 0x1:
            return Entry(shown, size=info.file_size, error="refused: a symlink with a target longer than "
                                                           f"{MAX_LINK_TARGET} bytes or encrypted: not followed")
        try:
            with archive.open(info) as source:
                raw = source.read(MAX_LINK_TARGET + 1)
            target = raw.decode("utf-8")
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            return Entry(shown, size=info.file_size, error=f"corrupt member: {error_text(exc)}")
        except UnicodeDecodeError:
            return Entry(shown, size=info.file_size, error="refused: a symlink with a target that is not UTF-8: "
                                                           "not followed")
        return link_entry(shown, target, in_folder=False)

    def _zip_streamed(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str,
                      depth: int) -> Iterator[Entry]:
        """A large zip member as a Content; an error before it is handed on is an entry of its own, as before."""
        handed = False
        try:
            with archive.open(info) as source:
                counted = CountedStream(source, self.budget, self.budget.member, shown)
                prefix = read_upto(counted, self.stream_above or 0)
                for item in self._streamed(shown, prefix, counted, depth, None, budget=None):
                    handed = True
                    yield item
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            if not handed:
                yield Entry(shown, size=info.file_size, error=f"corrupt member: {error_text(exc)}", broken=True)
        except LimitReached as exc:
            if "over all inputs" in str(exc):
                raise
            if not handed:
                yield Entry(shown, size=info.file_size, error=str(exc))


def _tar_refusal(member: tarfile.TarInfo) -> str | None:
    if member.issym():
        return f"a symlink (to {member.linkname[:120]!r}): not followed"
    if member.islnk():
        return f"a hard link (to {member.linkname[:120]!r}): not followed"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    if not member.isreg():
        return "not a regular file"
    return None


def _where(handle: IO[bytes], entry: Entry) -> str:
    """Where an archive broke, for its error: the byte of the file reached and the member being read."""
    parts = []
    try:
        at = handle.tell()
        parts.append(f"at its end, byte {at}" if at == entry.size else f"at byte {at}"
                     + (f" of {entry.size}" if entry.size is not None else ""))
    except (OSError, ValueError):
        pass
    if entry.reading:
        parts.append(f"in or after member {entry.reading!r}")
    return f" ({', '.join(parts)})" if parts else ""


def _file_digest(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()
