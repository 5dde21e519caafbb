"""Bounds an archive's own structure before the standard library spends memory on it.

`zipfile.ZipFile` reads the whole central directory and builds a `ZipInfo` per entry before a
caller sees one (1M directory entries: ~500 MB), and counts entries by the directory's declared
size, not by the record's count. `zip_entry_count` walks the central directory from disk, header
by header, in constant memory, and stops one past the cap.

`tarfile` reads a PAX (`x`, `g`) or GNU long-name (`L`, `K`) header's data whole into memory,
whatever size its header declares, and follows a run of them by recursion.
`bounded_tarinfo` is a `TarInfo` class that refuses such a header past `MAX_EXTENDED_HEADER`
bytes, and a run of more than `MAX_EXTENDED_RUN` of them, from the 512-byte header alone.

`tarfile` also ends quietly where a header should be and the data stops (a tar cut at a 512-byte
boundary: a failed upload, a partial `scp`), as if the archive ended there. Every tar writer ends
an archive with zero blocks; the class raises `TarTruncated` for a header cut short or missing.
"""

from __future__ import annotations

import os
import struct
import tarfile
from typing import IO, Any

from agent.sources.importers.input_streams import LimitReached, size_text

MAX_EXTENDED_HEADER = 1 << 20  # bytes: a PAX record or GNU long name is a few hundred
MAX_EXTENDED_RUN = 16  # extended headers in a row before one member (a real archive has 1-3)
_EXTENDED = frozenset((tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                       tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK))
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_CENTRAL = b"PK\x01\x02"
_TAIL = 22 + 0xFFFF  # the end record and the longest comment it may carry


def zip_entry_count(handle: IO[bytes], cap: int) -> int:
    """Entries in the zip's central directory, counted from disk; LimitReached past `cap`.

    A zip whose end record cannot be found is left to zipfile to refuse (returns 0).
    """
    size = handle.seek(0, os.SEEK_END)
    start = max(0, size - _TAIL)
    handle.seek(start)
    tail = handle.read(size - start)
    # Where zipfile looks: the end record without a comment first, then the last one in the tail.
    at = len(tail) - 22 if tail[-22:-18] == _EOCD else tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        return 0
    declared, cd_size, cd_offset = struct.unpack("<xxxxxxxxxxHLL", tail[at:at + 20])
    end = start + at
    locator = tail[at - 20:at] if at >= 20 else b""
    if locator.startswith(_EOCD64_LOCATOR):
        handle.seek(struct.unpack("<Q", locator[8:16])[0])
        record = handle.read(56)
        if len(record) == 56 and record.startswith(b"PK\x06\x06"):
            declared, cd_size, cd_offset = struct.unpack("<QQQ", record[32:56])
            end -= 76  # the zip64 record and its locator sit between the directory and the end record
    if declared > cap:
        raise LimitReached(f"{declared} members declared: more than the {cap} files an import may hold: "
                           "refused (not read)")
    # Where the directory really starts (data may be prepended to a zip): just before its end.
    position = end - cd_size if end >= cd_size else cd_offset
    count = 0
    handle.seek(position)
    while position < end:
        head = handle.read(46)
        if len(head) < 46 or not head.startswith(_CENTRAL):
            break
        count += 1
        if count > cap:
            raise LimitReached(f"more than {cap} members: more than the files an import may hold: "
                               "refused (not read)")
        name_len, extra_len, comment_len = struct.unpack("<HHH", head[28:34])
        position += 46 + name_len + extra_len + comment_len
        handle.seek(position)
    handle.seek(0)
    return count


class TarTruncated(EOFError):
    """The tar data stops where a header should be: the archive was cut, not ended."""


def bounded_tarinfo() -> type[tarfile.TarInfo]:
    """A TarInfo class (one per archive: it counts a run of extended headers) with the bounds above."""
    run = [0]

    class BoundedTarInfo(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Any:  # tarfile types it Self (3.11+)
            if len(buf) != tarfile.BLOCKSIZE:  # tarfile would take this for the archive's end
                raise TarTruncated("the tar data ends without its end-of-archive blocks" if not buf else
                                   f"a tar header cut short ({len(buf)} of {tarfile.BLOCKSIZE} bytes)")
            info = super().frombuf(buf, encoding, errors)
            if info.type not in _EXTENDED:
                run[0] = 0
                return info
            run[0] += 1
            if info.size > MAX_EXTENDED_HEADER:
                raise LimitReached(f"an extended (PAX or long-name) header of {size_text(info.size)}: more than "
                                   f"{size_text(MAX_EXTENDED_HEADER)}: the rest of this archive is not read")
            if run[0] > MAX_EXTENDED_RUN:
                raise LimitReached(f"more than {MAX_EXTENDED_RUN} extended headers in a row: "
                                   "the rest of this archive is not read")
            return info

    return BoundedTarInfo
