"""File-system access for the host source: the live root or a snapshot's fs/.

The host parsers only ever see this interface (`FsRoot`). `LiveFs` reads the
machine's own /proc and /sys; `SnapshotFs` (agent.sources.fsroot_snapshot)
reads a snapshot's fake root, where symlinks are kept in `fs_links.json`
instead of real links (wheels, zip files and some copy tools cannot carry
symlinks), never leaving its fs/ folder; `RecordingFs`
(agent.sources.fsroot_recording) wraps a live root and remembers every answer
so `snapshot capture` stores exactly what was read.

What they share lives here: the readers' helpers (`read_value`, `list_dir`,
`link_name`), the lexical link resolver, and bounded reads: a whole-file read
past `MAX_FILE_BYTES` is refused (`EFBIG`, "exceeds 1 MiB"), logs are read as a
bounded tail (`read_tail_fd`), and a listing longer than `MAX_DIR_ENTRIES` is `unknown` (`list_dir`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar, overload

from agent.core.model import Unknown

T = TypeVar("T")

MAX_LINK_HOPS = 40  # the kernel's own limit on symlink hops (MAXSYMLINKS)
MAX_FILE_BYTES = 1 << 20  # a whole-file read (a sysfs/procfs value) larger than this is refused
MAX_LINK_TARGET_BYTES = 4096  # PATH_MAX: no link or target the kernel records is longer
MAX_LINK_WORK = 200_000  # link steps one snapshot's links may cost (a recorded /sys needs a few thousand)
MAX_REMEMBERED = 1 << 20  # resolved paths kept per link map
# Entries a reader walks in one listing (interfaces, PCI functions, RDMA devices, ...): a big node
# lists ~500 PCI functions; a hostile snapshot listed 200k links and each cost ~8 reads.
MAX_DIR_ENTRIES = 4096


class FsRoot(Protocol):
    """Read-only view of a root file system. Paths are absolute ("/proc/..").

    `read_bytes(path)` reads the whole file and raises OSError(EFBIG) when it
    holds more than MAX_FILE_BYTES; `read_bytes(path, limit)` reads at most
    `limit` bytes from the start (a header, a pid list) and never raises for size.
    """

    description: str

    def read_bytes(self, path: str, limit: int | None = None) -> bytes: ...

    def listdir(self, path: str) -> list[str]: ...

    def readlink(self, path: str) -> str: ...

    def is_dir(self, path: str) -> bool: ...


def read_text(fs: FsRoot, path: str) -> str:
    """Read a kernel text file. Raises OSError or UnicodeDecodeError."""
    return fs.read_bytes(path).decode("utf-8")


# --- reading kernel files as facts (shared by every host-side reader: host, pcie, rdma) ---------


def describe_os_error(path: str, exc: OSError) -> str:
    """Why a kernel file could not be read, fit for an `unknown` finding."""
    if exc.errno == errno.ENOENT:
        return f"{path} is absent"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path} is not readable by this user (needs root)"
    return f"{path}: {exc.strerror or exc}"


@overload
def read_value(fs: FsRoot, path: str) -> str | Unknown: ...


@overload
def read_value(fs: FsRoot, path: str, parse: Callable[[str], T]) -> T | Unknown: ...


def read_value(fs: FsRoot, path: str, parse: Callable[[str], Any] | None = None) -> Any:
    """Read one kernel text file, stripped; a failure becomes Unknown(reason)."""
    try:
        text = read_text(fs, path).strip()
    except OSError as exc:
        return Unknown(describe_os_error(path, exc))
    except UnicodeDecodeError as exc:
        return Unknown(f"{path} is not valid UTF-8 (byte {exc.start})")
    if parse is None:
        return text
    try:
        return parse(text)
    except ValueError:
        return Unknown(f"{path}: unexpected content {text[:60]!r}")


def list_dir(fs: FsRoot, path: str, limit: int = MAX_DIR_ENTRIES) -> list[str] | Unknown:
    """A folder's names, or Unknown(reason); past `limit` names, Unknown saying so.

    The whole listing, not its first `limit` names: judging part of a list could call an entry
    that was cut "missing" (a critical finding from absent data).
    """
    try:
        names = fs.listdir(path)
    except OSError as exc:
        return Unknown(describe_os_error(path, exc))
    if len(names) > limit:
        return Unknown(f"{path} lists {len(names):,} entries, more than the {limit:,} a reader walks: "
                       "none read (no real node has that many)")
    return names


def link_name(fs: FsRoot, path: str) -> str | None:
    """The last component of a symlink's target (sysfs `driver`, `device`), or None."""
    try:
        return os.path.basename(fs.readlink(path).rstrip("/"))
    except OSError:
        return None


def check_absolute(path: str) -> None:
    """Refuse (ValueError) a path that is not absolute or holds a NUL: every root takes "/..." only."""
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"not an absolute path: {path!r}")


def read_fd(fd: int, path: str, limit: int | None, size: int | None = None) -> bytes:
    """`limit` bytes at most; None: the whole file, refused (EFBIG) past MAX_FILE_BYTES.

    `size`: a regular file's size from fstat. A read shorter than asked is then its end,
    so a small file costs one read, not two (the second only to see end of file).
    """
    want = MAX_FILE_BYTES + 1 if limit is None else limit
    chunks: list[bytes] = []
    total = 0
    while total < want:
        ask = min(65536, want - total) if size is None else min(max(size - total, 0) + 1, want - total)
        chunk = os.read(fd, ask)
        if not chunk:
            break
        if size is not None and len(chunk) < ask:
            chunks.append(chunk)
            total += len(chunk)
            break
        chunks.append(chunk)
        total += len(chunk)
    if limit is None and total > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"exceeds {MAX_FILE_BYTES >> 20} MiB: not read (no kernel value is that large)",
                      path)
    return b"".join(chunks)


def read_tail_fd(fd: int, limit: int) -> tuple[bytes, int, int]:
    """The last `limit` bytes of the regular file open at `fd`, from its first full line on.

    Returns (data, file size, bytes read); memory stays within `limit` however large the file.
    """
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    if start:
        os.lseek(fd, start, os.SEEK_SET)
    data = read_fd(fd, "", limit)
    read = len(data)
    if start:  # begin at the first full line
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data, size, read


class LiveFs:
    """The machine's own root file system."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.description = "live" if root == "/" else f"live:{root}"

    def _p(self, path: str) -> str:
        check_absolute(path)
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        # Non-blocking open: a FIFO or a device node must not hang the audit.
        fd = os.open(self._p(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return read_fd(fd, path, limit)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._p(path)))

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def realpath(self, path: str) -> str:
        """Canonical path inside this root, links resolved (for recording)."""
        real = os.path.realpath(self._p(path))
        if self.root == "/":
            return real
        root = os.path.realpath(self.root)
        rel = os.path.relpath(real, root)
        return "/" if rel == "." else "/" + rel


def resolve_links(links: dict[str, str], path: str, follow_last: bool = True) -> str:
    """`path` (relative to fs/) with the recorded `links` followed lexically, clamped at the root:
    `..` stops there, an absolute target starts there. OSError(ELOOP) past the kernel's hop limit.

    The one resolver: SnapshotFs reads through it (as a `LinkResolver`, which remembers), and
    importers place links by it.
    """
    return LinkResolver(links).resolve(path, follow_last)


class LinkResolver:
    """`resolve_links` over one link map, bounded in total work and remembering each link's answer.

    A hostile fs_links.json may chain 200k links where an audit lists them: each path through one
    cost MAX_LINK_HOPS hops before ELOOP, times every file read under it. Each link's own resolution
    (its target from its folder: the same wherever the link is met) is kept once known, a loop too,
    and the link steps one map may cost in all (a hop plus its target's parts) stop at `work`: past
    it a link not yet resolved is not followed (ELOOP), while paths without links still resolve.
    """

    def __init__(self, links: dict[str, str], work: int = MAX_LINK_WORK) -> None:
        self.links = links
        self.work_left = work
        self._known: dict[str, tuple[str, int] | OSError] = {}  # link -> (resolved, hops it took) or why not
        # Whole paths asked before, one lookup each; a failure as (errno, strerror): plain tuples, which
        # the garbage collector stops tracking (200k kept exceptions doubled a hostile map's cost).
        self._answers: dict[tuple[str, bool], str | tuple[int | None, str | None]] = {}
        self._spent: OSError | None = None  # the one answer for every link met once the work is spent

    def resolve(self, path: str, follow_last: bool = True) -> str:
        key = (path, follow_last)
        answer = self._answers.get(key)
        if answer is None:
            try:
                answer = self._walk(path, follow_last)
            except OSError as exc:
                answer = (exc.errno, exc.strerror)
            if len(self._answers) < MAX_REMEMBERED:
                self._answers[key] = answer
        if isinstance(answer, tuple):
            raise OSError(answer[0], answer[1], path)
        return answer

    def _walk(self, path: str, follow_last: bool) -> str:
        pending = [p for p in reversed(path.split("/")) if p]  # a stack: the next part is last
        out: list[str] = []
        hops = 0
        open_links: list[tuple[str, int, int]] = []  # links being resolved: (link, pending depth, hops before)
        while True:
            while open_links and len(pending) <= open_links[-1][1]:  # a link's target is fully resolved
                link, _, before = open_links.pop()
                self._remember(link, ("/".join(out), hops - before))
            if not pending:
                break
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            candidate = "/".join([*out, part])
            target = self.links.get(candidate)
            if target is None or not (pending or follow_last):
                out.append(part)
                continue
            known = self._known.get(candidate)
            if isinstance(known, OSError):
                raise OSError(known.errno, known.strerror, path)
            if known is not None:
                hops += known[1]
                if hops > MAX_LINK_HOPS:
                    self._loop(open_links, hops, path)
                out = known[0].split("/") if known[0] else []
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                self._loop(open_links, hops, path)
            why = self._refusal(target)
            if why is not None:  # the target itself, or the map's work spent: so for every link open too
                for link, _, _ in open_links:
                    self._remember(link, why)
                self._remember(candidate, why)
                raise OSError(why.errno, why.strerror, path)
            parts = [p for p in target.split("/") if p]
            open_links.append((candidate, len(pending), hops - 1))
            if target.startswith("/"):
                out = []
            pending.extend(reversed(parts))
        return "/".join(out)

    def _loop(self, open_links: list[tuple[str, int, int]], hops: int, path: str) -> NoReturn:
        """ELOOP for `path`; a link open on the way loops by itself if its own hops are past the limit."""
        for link, _, before in open_links:
            if hops - before > MAX_LINK_HOPS:
                self._remember(link, OSError(errno.ELOOP, os.strerror(errno.ELOOP)))
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def _refusal(self, target: str) -> OSError | None:
        if len(target) > MAX_LINK_TARGET_BYTES:
            return OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        self.work_left -= 1 + target.count("/")
        if self.work_left < 0:
            if self._spent is None:
                self._spent = OSError(errno.ELOOP, f"more link steps than {MAX_LINK_WORK} in this snapshot's "
                                                   "recorded links: not followed")
            return self._spent
        return None

    def _remember(self, link: str, answer: tuple[str, int] | OSError) -> None:
        if len(self._known) < MAX_REMEMBERED:
            self._known[link] = answer
