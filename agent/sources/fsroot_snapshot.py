"""A snapshot's fs/ tree read as a root (`SnapshotFs`), and the confined opens that keep it inside.

A snapshot is untrusted input (a customer's files): `SnapshotFs` never leaves
its fs/ folder. Recorded links resolve lexically inside it (`..` stops at its
root, an absolute target starts there; agent.sources.fsroot.resolve_links); the
folder is then walked one component at a time with O_NOFOLLOW, so a real OS
symlink inside it is refused (it could point anywhere on the auditor's machine),
and only directories and regular files are opened (a FIFO, socket or device is
refused, never opened). Where the kernel has openat2, one open confined beneath
fs/ replaces the walk. Writers into a snapshot (remediate --snapshot) go through
`open_write_dir`, which refuses the same entries and hands back a held folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import weakref
from collections.abc import Callable
from pathlib import Path

from agent.core.errors import SnapshotError
from agent.io.jsonfile import load_json_file
from agent.sources import openat2
from agent.sources.fsroot import MAX_REMEMBERED, LinkResolver, check_absolute, read_fd

_stat, _fstat, _S_ISREG = os.stat, os.fstat, stat.S_ISREG  # bound once: the hot path runs per file
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_MAX_DIR_FDS = 512  # folder descriptors one snapshot keeps open (the soft fd limit is usually 1024)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


class RefusedEntry(SnapshotError, OSError):
    """A snapshot entry that is not followed or opened (a real symlink, a FIFO, a device).

    An OSError, so the readers turn it into an unknown finding naming the file and
    a remediation step into a failed action; a SnapshotError, so where nothing
    catches it (planning) the CLI prints one line and exits 2.
    """

    def __init__(self, err: int, message: str, path: str) -> None:
        OSError.__init__(self, err, message, path)
        self.path, self.line = path, None

    @property
    def message(self) -> str:
        return str(self.strerror)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _refusal(mode: int, shown: str, path: str) -> OSError:
    """Why a snapshot entry is not opened: a RefusedEntry naming it (IsADirectoryError for a folder)."""
    if stat.S_ISDIR(mode):
        return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if stat.S_ISLNK(mode):
        return RefusedEntry(errno.ELOOP, f"refused: {shown} is a symlink inside the snapshot (a snapshot keeps "
                                         "its links in fs_links.json; a real link could point outside it)", path)
    return RefusedEntry(errno.EINVAL, f"refused: {shown} is {_kind(mode)}, not a regular file (not opened)", path)


def checked_write_path(base: str, shown_base: str, rel: str, name: str, path: str) -> str:
    """`base/rel/name` for a writer, checked to stay inside `base` (a snapshot folder).

    Every folder of `rel` that exists must be a real folder: a symlink is refused
    (RefusedEntry naming it, `shown_base/...`), as is an existing `name` that is
    neither a regular file nor a folder. Missing folders are the writer's to create.
    """
    parts = rel.split("/") if rel else []
    shown = [shown_base] if shown_base else []
    fd = os.open(base, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            try:
                new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                break  # the writer creates the rest: new folders, holding no links
            except OSError as exc:
                mode = _lstat_at(fd, part, path)
                if stat.S_ISLNK(mode):
                    raise _refusal(mode, "/".join([*shown, *parts[:i + 1]]), path) from None
                raise OSError(exc.errno, exc.strerror, path) from None
            os.close(fd)
            fd = new
        else:
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                mode = stat.S_IFREG
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise _refusal(mode, "/".join([*shown, *parts, name]), path)
    finally:
        os.close(fd)
    return os.path.join(base, rel, name)


def open_write_dir(root_fd: int, rel: str, path: str, *, make: bool,
                   check: Callable[[os.stat_result, str], None]) -> int:
    """The folder `rel` beneath a snapshot folder held as `root_fd`, for a writer: opened once, one
    component at a time without following links (agent.io.dirfd.open_dir), missing folders made 0755
    when `make`. Every later step is relative to the descriptor returned, so a folder swapped for
    a symlink after this redirects nothing (issue 21, 1); a symlink on the way is a RefusedEntry."""
    from agent.io import dirfd

    try:
        return dirfd.open_dir(root_fd, rel, check=check, make=0o755 if make else None)[0]
    except OSError as exc:
        if exc.errno == errno.ELOOP and isinstance(exc.filename, str):
            raise _refusal(stat.S_IFLNK, exc.filename, path) from None
        raise OSError(exc.errno, exc.strerror, path) from None


def _lstat_at(dir_fd: int, name: str, path: str) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class SnapshotFs:
    """A snapshot's fs/ tree with symlinks resolved through fs_links.json."""

    LINKS_FILE = "fs_links.json"
    ERRORS_FILE = "fs_errors.json"

    def __init__(self, snapshot_dir: Path) -> None:
        self.base = snapshot_dir / "fs"
        self._base = str(self.base)
        self.description = f"snapshot:{snapshot_dir}"
        try:
            mode = os.lstat(self.base).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            raise SnapshotError("fs/ is a symlink: refused (a snapshot is read only inside its folder)",
                                path=str(snapshot_dir))
        if not stat.S_ISDIR(mode):
            raise SnapshotError("snapshot has no fs/ directory", path=str(snapshot_dir))
        self.links = _load_json_map(snapshot_dir / self.LINKS_FILE)
        self.errors = _load_json_map(snapshot_dir / self.ERRORS_FILE)
        self._resolver = LinkResolver(self.links)  # bounded in total work, remembers (a hostile map chains 200k)
        # Directory listings must show link names too (sys/class/net/eth0 is a link).
        self._link_children: dict[str, set[str]] = {}
        # A folder's resolution, or why it has none as (errno, strerror, path): a plain tuple, untracked by the GC.
        self._dir_cache: dict[str, str | tuple[int | None, str | None, str]] = {}
        # Verified folder descriptors (every component opened with O_NOFOLLOW once): ~1,500 reads
        # of a node share a few hundred folders, and walking each path again cost a fifth of an audit.
        self._dir_fds: dict[str, int] = {}
        weakref.finalize(self, _close_all, self._dir_fds)
        # Where the kernel has openat2, one confined open per file replaces the component walk
        # (the same guarantee, atomically); the walk stays for other kernels and for saying
        # precisely why an entry is refused.
        self._root_fd: int | None = None
        self._beneath = openat2.opener()
        self._root_fds: dict[str, int] = {}
        weakref.finalize(self, _close_all, self._root_fds)
        try:
            root_fd = os.open(self._base, _DIR_FLAGS)
        except OSError:
            root_fd = None
        if root_fd is not None:
            self._root_fds["fs"] = root_fd
            if self._beneath is not None and openat2.available(root_fd):
                self._root_fd = root_fd
        for link in self.links:
            parent, _, name = link.rpartition("/")
            if name not in ("", ".", ".."):  # a hostile key must not list "." or ".." as an entry
                self._link_children.setdefault(parent, set()).add(name)

    def resolve(self, path: str) -> str:
        """`path` with recorded links resolved, relative to fs/ (for writers)."""
        return self._resolve(path)

    def write_path(self, path: str) -> str:
        """The file behind `path` for a writer (remediate --snapshot): always inside fs/.

        The parent's recorded links are resolved (clamped to fs/); every folder on the
        way that exists must be a real folder (a symlink is refused: it could lead out
        of the snapshot), and an existing last component a regular file or folder.
        """
        check_absolute(path)
        parent, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            raise ValueError(f"refusing path {path!r}")
        rel = self._resolve(parent) if parent else ""
        return checked_write_path(self._base, "fs", rel, name, path)

    def open_file(self, path: str) -> int:
        """A descriptor of the regular file at `path` (recorded links resolved, errors replayed).

        Never follows a real symlink nor opens a FIFO, socket or device (OSError naming it).
        """
        return self._open_regular(path)[0]

    def _open_regular(self, path: str) -> tuple[int, int]:
        """open_file's descriptor and the file's size.

        The fast path, where the kernel has openat2: the type checked before the open (a
        device is never opened), one openat2 beneath fs/ refusing every symlink, the type
        checked again on the descriptor. Any anomaly goes to the component walk, which
        refuses or reports it precisely. (Inline: it runs for each of a node's ~1,500 files.)
        """
        rel = self._resolve(path)
        if self.errors:
            self._raise_recorded_error(rel, path)
        root, beneath = self._root_fd, self._beneath
        if root is not None and beneath is not None and rel:
            try:
                if _S_ISREG(_stat(rel, dir_fd=root, follow_symlinks=False).st_mode):
                    fd = beneath(root, rel, _FILE_FLAGS)
                    info = _fstat(fd)
                    if _S_ISREG(info.st_mode):
                        return fd, info.st_size
                    os.close(fd)
            except OSError:
                pass
        return self._open_walked(rel, path)

    def _open_walked(self, rel: str, path: str) -> tuple[int, int]:
        parent, _, name = rel.rpartition("/")
        if not name:
            fd = self._open_rel(rel, path)
            return fd, os.fstat(fd).st_size
        dir_fd = self._folder_fd(parent, path)
        shown = "fs/" + rel
        if not stat.S_ISREG(mode := _lstat_at(dir_fd, name, path)):
            raise _refusal(mode, shown, path)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP and stat.S_ISLNK(mode := _lstat_at(dir_fd, name, path)):
                raise _refusal(mode, shown, path) from None
            raise OSError(exc.errno, exc.strerror, path) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise _refusal(mode, shown, path)
        return fd, info.st_size

    def _open_dir(self, rel: str, path: str) -> int:
        """A new descriptor of the folder fs/`rel` (confined openat2, else the component walk)."""
        if self._root_fd is not None and self._beneath is not None:
            try:
                return self._beneath(self._root_fd, rel or ".", _DIR_FLAGS)
            except OSError:
                pass  # the walk says precisely why (absent, a symlink, not a folder)
        return self._open_rel(rel, path, directory=True)

    def _folder_fd(self, rel: str, path: str) -> int:
        """A kept descriptor of the folder fs/`rel`: opened from its nearest kept ancestor, one
        component at a time with O_NOFOLLOW|O_DIRECTORY (a real symlink on the way is refused)."""
        fd = self._dir_fds.get(rel)
        if fd is not None:
            return fd
        parent, _, name = rel.rpartition("/")
        if not name:
            return self._keep(rel, self._open_rel(rel, path, directory=True))
        parent_fd = self._folder_fd(parent, path)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(mode := _lstat_at(parent_fd, name, path)):
                raise _refusal(mode, "fs/" + rel, path) from None
            raise OSError(exc.errno, exc.strerror, path) from None
        return self._keep(rel, fd)

    def _keep(self, rel: str, fd: int) -> int:
        if len(self._dir_fds) >= _MAX_DIR_FDS:
            os.close(self._dir_fds.pop(next(iter(self._dir_fds))))
        self._dir_fds[rel] = fd
        return fd

    def _open_rel(self, rel: str, path: str, directory: bool = False) -> int:
        """Open fs/`rel` one component at a time with O_NOFOLLOW: nothing outside fs/ is ever reached.

        A real symlink on the way is refused, the last component is opened only if it
        is a directory (`directory`) or a regular file (checked before the open, so a
        device is never opened, and again on the descriptor).
        """
        parts = rel.split("/") if rel else []
        try:
            fd = os.open(self._base, _DIR_FLAGS)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        try:
            for i, part in enumerate(parts):
                shown = "fs/" + "/".join(parts[:i + 1])
                file = not directory and i == len(parts) - 1
                if file and not stat.S_ISREG(mode := _lstat_at(fd, part, path)):
                    raise _refusal(mode, shown, path)
                try:
                    new = os.open(part, _FILE_FLAGS if file else _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    # O_NOFOLLOW fails with ELOOP (ENOTDIR with O_DIRECTORY) on a symlink: say so.
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(mode := _lstat_at(fd, part, path)):
                        raise _refusal(mode, shown, path) from None
                    raise OSError(exc.errno, exc.strerror, path) from None
                os.close(fd)
                fd = new
            mode = os.fstat(fd).st_mode
            if directory and not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if not directory and not stat.S_ISREG(mode):
                raise _refusal(mode, "fs/" + rel, path)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _resolve(self, path: str, follow_last: bool = True) -> str:
        """Resolve `path` lexically against the link map, clamped at the root."""
        check_absolute(path)
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
        # building on the already resolved parent. A failure is kept too: every file read
        # under a looping link (a hostile map's 200k) would otherwise ask the resolver again.
        cached = self._dir_cache.get(path)
        if cached is None:
            try:
                cached = self._resolve_dir_uncached(path)
            except OSError as exc:
                cached = (exc.errno, exc.strerror, exc.filename)
            if len(self._dir_cache) < MAX_REMEMBERED:
                self._dir_cache[path] = cached
        if isinstance(cached, tuple):
            raise OSError(*cached)
        return cached

    def _resolve_dir_uncached(self, path: str) -> str:
        parent, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            return self._resolve_uncached(path, True)
        base = self._resolve_dir(parent) if parent else ""
        candidate = f"{base}/{name}" if base else name
        if candidate in self.links:
            candidate = self._resolve_uncached("/" + candidate, True)
        return candidate

    def _resolve_uncached(self, path: str, follow_last: bool) -> str:
        return self._resolver.resolve(path, follow_last)

    def _raise_recorded_error(self, rel: str, path: str) -> None:
        code = self.errors.get(rel)
        if code is not None:
            num = getattr(errno, code, errno.EIO)
            raise OSError(num, os.strerror(num), path)

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        # os.open/os.read: a snapshot holds thousands of tiny files and the
        # buffered-file machinery costs more than the read itself.
        fd, size = self._open_regular(path)
        try:
            return read_fd(fd, path, limit, size)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        rel = self._resolve(path)
        self._raise_recorded_error(rel, path)
        names: set[str] = set(self._link_children.get(rel, ()))
        try:
            fd = self._open_dir(rel, path)
        except FileNotFoundError:
            if not names:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
            return sorted(names)
        try:
            names.update(n for n in os.listdir(fd) if n != ".keep")
        finally:
            os.close(fd)
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
        if rel in self._link_children:
            return True
        try:
            os.close(self._open_dir(rel, path))
        except OSError:  # absent, a file, or a real symlink (refused)
            return False
        return True


def _load_json_map(path: Path) -> dict[str, str]:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise SnapshotError("a symlink: refused (a snapshot is read only inside its folder)", path=str(path))
    except FileNotFoundError:
        return {}
    try:  # a path -> target map (depth 1); a whole recorded /sys holds ~100 KB of links
        data = load_json_file(path, max_bytes=64 << 20, max_depth=4)
    except OSError as exc:
        raise SnapshotError(f"unreadable: {exc}", path=str(path)) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise SnapshotError("must be a JSON object of path -> string", path=str(path))
    return {k.strip("/"): v for k, v in data.items()}
