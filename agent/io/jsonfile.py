"""JSON from outside (BMC answers, snapshots, dumps, fleet files), with size and depth bounds.

`json.loads` has neither: a 100,000-deep `[[[...]]]` raises RecursionError
(the last-resort handler turns that into "internal error", exit 3), and a
700-deep one parses but breaks whatever walks the value later (`json.dumps`
in a renderer, a recursive parser). Every parse of outside data goes
through `load_json_bytes` / `load_json_file`, which refuse, by name:

* input larger than `max_bytes` (a file is read only up to that);
* nesting deeper than `max_depth`, found by a scan of the brackets *before*
  parsing (strings and escapes removed with C-speed byte operations, so a
  deep document costs at most `max_depth` linear passes, never recursion);
* anything `json` refuses (with its line), and text that is not UTF-8.

`JsonInputError` is a `SnapshotError` (exit 2, "FILE:LINE: message") and a
`ValueError`, so code that skips bad input (`except ValueError`: fleet files,
Redfish bodies) keeps working unchanged.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from agent.core.errors import SnapshotError

MAX_BYTES = 64 << 20  # the default; callers pass their own (see docs/decisions.md)
MAX_DEPTH = 64  # Redfish OEM blocks nest ~12 deep, audit reports ~6, nvml.json ~5

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_ONE_BRACKET = bytes.maketrans(b"{}", b"[]")


class JsonInputError(SnapshotError, ValueError):
    """JSON from outside that is too big, nested too deeply, or not JSON."""


def nesting_depth(data: bytes, limit: int) -> int:
    """How deep `[`/`{` nest in JSON text (strings ignored), or `limit + 1` when deeper than `limit`.

    Invalid JSON (brackets that do not balance) returns 0: the parser then says what is wrong.
    """
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)  # escapes first: `\"` and `\\` must not open or close a string
    # Keep brackets and quotes only; `""` pairs (strings without brackets, or the empty gap between
    # two strings) go at once, the few strings holding brackets by a split on the remaining quotes.
    shape = data.translate(_ONE_BRACKET, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in shape:
        shape = b"".join(shape.split(b'"')[::2])
    depth = 0
    while shape:
        # A run of more openers than levels left is too deep at once (`[[[[...`, `{"a":{"a":...`).
        if depth == limit or b"[" * (limit + 1 - depth) in shape:
            return limit + 1
        inner = shape.replace(b"[]", b"")  # one pass removes the innermost level
        if len(inner) == len(shape):
            return 0
        shape, depth = inner, depth + 1
    return depth


def load_json_bytes(data: bytes | str, *, what: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON from outside; JsonInputError (naming `what`) unless it is JSON within the bounds."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JsonInputError(f"{len(raw)} bytes or more: larger than the {max_bytes} bytes this input may hold",
                             path=what)
    if nesting_depth(raw, max_depth) > max_depth:
        raise JsonInputError(f"JSON nested deeper than {max_depth} levels", path=what)
    try:
        text = data if isinstance(data, str) else raw.decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise JsonInputError(f"not UTF-8 text (byte {exc.start})", path=what) from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"not JSON: {exc.msg} (column {exc.colno})", path=what, line=exc.lineno) from None
    except RecursionError:  # unbalanced brackets that the scan left to the parser
        raise JsonInputError(f"JSON nested deeper than {max_depth} levels", path=what) from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise JsonInputError(f"not usable JSON: {exc}", path=what) from None


def read_fd(fd: int, max_bytes: int) -> bytes:
    """At most max_bytes + 1 bytes from an open descriptor: one more than allowed tells the caller it is too big."""
    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes, at most `max_bytes + 1` of them; OSError as `open` raises it (EINVAL: not a file).

    Non-blocking open: a FIFO or device planted in a snapshot must not hang the read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def load_json_file(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
                   what: str | None = None) -> Any:
    """`load_json_bytes` of a file, read only up to `max_bytes`; OSError (e.g. FileNotFoundError) passes."""
    return load_json_bytes(read_bounded(path, max_bytes), what=what or str(path), max_bytes=max_bytes,
                           max_depth=max_depth)
