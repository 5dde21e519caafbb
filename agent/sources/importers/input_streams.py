"""Bounded reading for `agent.sources.importers.inputs`: the caps over all inputs (`Budget`), archive kinds by
their magic, decompressed streams counted against the caps (`CountedStream`), and `Content`, a large
file handed to its importer as a stream, hashed and capped as it is read.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

from agent.sources.importers.base import HEAD_BYTES, InputError

MAX_TOTAL = 2 << 30  # uncompressed bytes over all inputs
MAX_MEMBERS = 100_000
MAX_MEMBER = 512 << 20
CHUNK_BYTES = 1 << 20  # one read from a stream


class LimitReached(Exception):
    """A cap was reached: the message says which; the rest of this input is not read."""


@dataclass
class Budget:
    total: int = MAX_TOTAL
    members: int = MAX_MEMBERS
    member: int = MAX_MEMBER
    used: int = 0
    count: int = 0

    def take(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.total:
            raise LimitReached(f"more than {size_text(self.total)} uncompressed over all inputs: the rest is not read")

    def one_more(self) -> None:
        self.count += 1
        if self.count > self.members:
            raise LimitReached(f"more than {self.members} files over all inputs: the rest is not read")


def size_text(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} bytes"


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gz"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bz2"), (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"),
)
DECOMPRESSORS: dict[str, Callable[[IO[bytes]], IO[bytes]]] = {  # closed with the stream they wrap
    "gz": lambda f: cast("IO[bytes]", gzip.GzipFile(fileobj=f, mode="rb")),
    "xz": lambda f: lzma.LZMAFile(f, mode="rb"),  # noqa: SIM115
    "bz2": lambda f: bz2.BZ2File(f, mode="rb"),
}
CORRUPT_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile, ValueError)


def container_kind(head: bytes) -> str | None:
    """"gz", "xz", "bz2", "zip" or "tar" from the first bytes; None for anything else."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


class CountedStream(io.RawIOBase):
    """A decompressed stream that counts into the budget and stops at `limit` bytes, with bytes pushed back."""

    def __init__(self, inner: IO[bytes], budget: Budget, limit: int, what: str) -> None:
        self.inner, self.budget, self.limit, self.what = inner, budget, limit, what
        self.read_so_far = 0
        self.pushed = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.pushed:
            n = min(len(view), len(self.pushed))
            view[:n] = self.pushed[:n]
            self.pushed = self.pushed[n:]
            return n
        chunk = self.inner.read(min(len(view), CHUNK_BYTES))
        if not chunk:
            return 0
        self.read_so_far += len(chunk)
        if self.read_so_far > self.limit:
            raise LimitReached(f"{self.what}: more than {size_text(self.limit)} uncompressed: "
                               "refused (not read further)")
        self.budget.take(len(chunk))
        view[:len(chunk)] = chunk
        return len(chunk)

    def head(self, nbytes: int) -> bytes:
        got = b""
        while len(got) < nbytes:
            more = self.read(nbytes - len(got))
            if not more:
                break
            got += more
        self.pushed = got + self.pushed
        return got


class Content(io.RawIOBase):
    """A large file's content, read once and in order by its importer: counted, hashed and capped as it goes.

    `head` is its first HEAD_BYTES (what kind detection sees). A cap reached or a corrupt stream
    underneath is raised to the importer as InputError and kept in `failure` for the Reader.
    """

    def __init__(self, prefix: bytes, rest: IO[bytes] | io.RawIOBase, *, limit: int, what: str,
                 budget: Budget | None = None, expected: int | None = None) -> None:
        super().__init__()
        self.head = prefix[:HEAD_BYTES]
        self._prefix: bytes | memoryview = prefix
        self._rest, self._budget, self.limit, self.what, self.expected = rest, budget, limit, what, expected
        self.size = len(prefix)
        self._digest = hashlib.sha256(prefix)
        self.failure: BaseException | None = None
        self._ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n] = self._prefix[:n]
            self._prefix = memoryview(self._prefix)[n:] if n < len(self._prefix) else b""
            return n
        if self.failure is not None:
            raise InputError(failure_text(self.failure))
        if self._ended:
            return 0
        try:
            chunk = self._rest.read(min(len(view), CHUNK_BYTES))
            if not chunk:
                self._ended = True
                if self.expected is not None and self.size != self.expected:
                    raise EOFError(f"{self.what}: truncated")
                return 0
            self.size += len(chunk)
            if self.size > self.limit:
                raise LimitReached(f"{self.what}: more than {size_text(self.limit)}: refused (not read further)")
            if self._budget is not None:
                self._budget.take(len(chunk))
        except (LimitReached, *CORRUPT_ERRORS) as exc:
            self.failure = exc
            raise InputError(failure_text(exc)) from None
        self._digest.update(chunk)
        view[:len(chunk)] = chunk
        return len(chunk)

    def finish(self) -> str:
        """Read what the importer left (counted, hashed); the whole content's sha256, or the failure raised."""
        self._prefix = b""
        while not self._ended and self.failure is None:
            try:
                self.readinto(bytearray(CHUNK_BYTES))
            except InputError:
                break
        if self.failure is not None:
            raise self.failure
        return self._digest.hexdigest()


def failure_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, LimitReached) else f"corrupt or truncated: {error_text(exc)}"


def read_upto(stream: IO[bytes] | io.RawIOBase, nbytes: int) -> bytes:
    """Up to `nbytes` (fewer only at the end of the stream)."""
    chunks: list[bytes] = []
    total = 0
    while total < nbytes and (chunk := stream.read(min(CHUNK_BYTES, nbytes - total))):
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_all(stream: IO[bytes] | io.RawIOBase, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while chunk := stream.read(CHUNK_BYTES):
        total += len(chunk)
        if total > limit:
            raise LimitReached(f"{what}: more than {size_text(limit)}: refused (not read further)")
        chunks.append(chunk)
    return b"".join(chunks)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]
