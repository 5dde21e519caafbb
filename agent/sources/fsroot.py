"""File-system access for the host source: the live root or a snapshot's fs/.

The host parsers only ever see this interface. `LiveFs` reads the machine's
own /proc and /sys; `SnapshotFs` reads a snapshot's fake root, where symlinks
are kept in `fs_links.json` instead of real links (wheels, zip files and
some copy tools cannot carry symlinks); `RecordingFs` wraps a live root and
remembers every answer so `snapshot capture` stores exactly what was read.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
from pathlib import Path
from typing import Protocol

from agent.errors import SnapshotError

_MAX_LINK_HOPS = 40  # the kernel's own limit on symlink hops (MAXSYMLINKS)
MAX_FILE_BYTES = 4 * 1024 * 1024  # no kernel attribute we read is larger


class FsRoot(Protocol):
    """Read-only view of a root file system. Paths are absolute ("/proc/..")."""

    description: str

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes: ...

    def listdir(self, path: str) -> list[str]: ...

    def readlink(self, path: str) -> str: ...

    def is_dir(self, path: str) -> bool: ...


def read_text(fs: FsRoot, path: str) -> str:
    """Read a kernel text file. Raises OSError or UnicodeDecodeError."""
    return fs.read_bytes(path).decode("utf-8")


def _check_abs(path: str) -> None:
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"not an absolute path: {path!r}")


class LiveFs:
    """The machine's own root file system."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.description = "live" if root == "/" else f"live:{root}"

    def _p(self, path: str) -> str:
        _check_abs(path)
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        # Non-blocking open: a FIFO or a device node must not hang the audit.
        fd = os.open(self._p(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            chunks: list[bytes] = []
            total = 0
            while total < limit:
                chunk = os.read(fd, min(65536, limit - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks)
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


class SnapshotFs:
    """A snapshot's fs/ tree with symlinks resolved through fs_links.json."""

    LINKS_FILE = "fs_links.json"
    ERRORS_FILE = "fs_errors.json"

    def __init__(self, snapshot_dir: Path) -> None:
        self.base = snapshot_dir / "fs"
        self._base = str(self.base)
        self.description = f"snapshot:{snapshot_dir}"
        if not self.base.is_dir():
            raise SnapshotError("snapshot has no fs/ directory", path=str(snapshot_dir))
        self.links = _load_json_map(snapshot_dir / self.LINKS_FILE)
        self.errors = _load_json_map(snapshot_dir / self.ERRORS_FILE)
        # Directory listings must show link names too (sys/class/net/eth0 is a link).
        self._link_children: dict[str, set[str]] = {}
        self._dir_cache: dict[str, str] = {}
        for link in self.links:
            parent, _, name = link.rpartition("/")
            self._link_children.setdefault(parent, set()).add(name)

    def resolve(self, path: str) -> str:
        """`path` with recorded links resolved, relative to fs/ (for writers)."""
        return self._resolve(path)

    def _resolve(self, path: str, follow_last: bool = True) -> str:
        """Resolve `path` lexically against the link map, clamped at the root."""
        _check_abs(path)
        parent, _, name = path.rpartition("/")
        if not follow_last or name in ("", ".", ".."):
            return self._resolve_uncached(path, follow_last)
        resolved_parent = self._resolve_dir(parent) if parent else ""
        candidate = f"{resolved_parent}/{name}" if resolved_parent else name
        if candidate in self.links:
            return self._resolve_uncached(candidate and "/" + candidate, True)
        return candidate

    def _resolve_dir(self, path: str) -> str:
        # Thousands of reads share a few hundred directories: resolve each once,
        # building on the already resolved parent.
        cached = self._dir_cache.get(path)
        if cached is None:
            parent, _, name = path.rpartition("/")
            if name in ("", ".", ".."):
                cached = self._resolve_uncached(path, True)
            else:
                base = self._resolve_dir(parent) if parent else ""
                candidate = f"{base}/{name}" if base else name
                if candidate in self.links:
                    candidate = self._resolve_uncached("/" + candidate, True)
                cached = candidate
            self._dir_cache[path] = cached
        return cached

    def _resolve_uncached(self, path: str, follow_last: bool) -> str:
        pending = [p for p in path.split("/") if p]
        out: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part == ".":
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            candidate = "/".join([*out, part])
            target = self.links.get(candidate)
            if target is not None and (pending or follow_last):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    out = []
                pending = [p for p in target.split("/") if p] + pending
                continue
            out.append(part)
        return "/".join(out)

    def _raise_recorded_error(self, rel: str, path: str) -> None:
        code = self.errors.get(rel)
        if code is not None:
            num = getattr(errno, code, errno.EIO)
            raise OSError(num, os.strerror(num), path)

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        rel = self._resolve(path)
        if self.errors:
            self._raise_recorded_error(rel, path)
        try:
            # os.open/os.read: a snapshot holds thousands of tiny files and the
            # buffered-file machinery costs more than the read itself.
            fd = os.open(f"{self._base}/{rel}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        try:
            chunks = [os.read(fd, min(limit, 65536))]
            while chunks[-1] and sum(map(len, chunks)) < limit:
                chunks.append(os.read(fd, 65536))
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        finally:
            os.close(fd)
        return b"".join(chunks)[:limit]

    def listdir(self, path: str) -> list[str]:
        rel = self._resolve(path)
        self._raise_recorded_error(rel, path)
        names: set[str] = set(self._link_children.get(rel, ()))
        full = self.base / rel
        try:
            names.update(n for n in os.listdir(full) if n != ".keep")
        except FileNotFoundError:
            if not names:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        return sorted(names)

    def readlink(self, path: str) -> str:
        parent, _, name = path.rstrip("/").rpartition("/")
        rel = posixpath.join(self._resolve(parent or "/"), name).lstrip("/")
        target = self.links.get(rel)
        if target is None:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return target

    def is_dir(self, path: str) -> bool:
        try:
            rel = self._resolve(path)
        except OSError:  # a link loop is "not a directory", as os.path.isdir says
            return False
        return rel in self._link_children or (self.base / rel).is_dir()


def _load_json_map(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"unreadable: {exc}", path=str(path)) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise SnapshotError("must be a JSON object of path -> string", path=str(path))
    return {k.strip("/"): v for k, v in data.items()}


class RecordingFs:
    """Wraps a live root and remembers every answer for `snapshot capture`.

    Files are stored at their canonical (link-resolved) path and every link met
    on the way is stored under its canonical parent, which is exactly how
    `SnapshotFs` resolves paths on replay.
    """

    def __init__(self, inner: LiveFs) -> None:
        self.inner = inner
        self.description = inner.description
        self.files: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = set()
        self.errors: dict[str, str] = {}
        self._checked: set[str] = set()

    def _canonical_key(self, path: str) -> str:
        parent, _, name = path.rstrip("/").rpartition("/")
        return posixpath.join(self.inner.realpath(parent or "/"), name).lstrip("/")

    def _record_links_on(self, path: str, depth: int = 0) -> None:
        if depth > _MAX_LINK_HOPS:
            return
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if prefix in self._checked:
                continue
            self._checked.add(prefix)
            try:
                target = self.inner.readlink(prefix)
            except OSError:
                continue
            self.links[self._canonical_key(prefix)] = target
            # The target may itself hold links (class/net/X -> .../net/X/device).
            self._record_links_on(
                posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target)), depth + 1
            )

    def _error(self, path: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0)
        if name and exc.errno != errno.ENOENT:
            self.errors[self.inner.realpath(path).lstrip("/")] = name

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        self._record_links_on(path)
        try:
            data = self.inner.read_bytes(path, limit)
        except OSError as exc:
            self._error(path, exc)
            raise
        self.files[self.inner.realpath(path).lstrip("/")] = data
        return data

    def listdir(self, path: str) -> list[str]:
        self._record_links_on(path)
        try:
            names = self.inner.listdir(path)
        except OSError as exc:
            self._error(path, exc)
            raise
        real = self.inner.realpath(path).lstrip("/")
        self.dirs.add(real)
        for name in names:
            child = f"{path.rstrip('/')}/{name}"
            try:
                self.links[f"{real}/{name}".lstrip("/")] = self.inner.readlink(child)
            except OSError:
                if self.inner.is_dir(child):
                    self.dirs.add(f"{real}/{name}".lstrip("/"))
        return names

    def readlink(self, path: str) -> str:
        self._record_links_on(path)
        return self.inner.readlink(path)

    def is_dir(self, path: str) -> bool:
        # A directory the reader only tested for (bonding/, efivars/) must exist
        # on replay too, or the replay would answer differently.
        self._record_links_on(path)
        found = self.inner.is_dir(path)
        if found:
            self.dirs.add(self.inner.realpath(path).lstrip("/"))
        return found
