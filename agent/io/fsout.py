"""New output folders: `snapshot capture --out DIR|FILE.tar.gz`, `snapshot import --out DIR`.

The rules of agent.io.fsutil (the one writer) for an output that is a whole folder. Issue 21: a
temporary sibling made by name and filled and renamed by name again could be swapped for a
symlink by a user who can write the parent, and root then wrote the snapshot wherever the
link pointed. Here the parent is opened once, the private folder is made and held by
descriptor, and the publishing rename is relative to the parent's descriptor (see `OutputDir`).

Floor 1 of the layout: agent.core.errors, agent.io.fsutil, agent.io.dirfd.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from agent.core.errors import EXIT_CANNOT_RUN
from agent.io import dirfd
from agent.io.fsutil import FileSafetyError, check_folder, open_folder, os_error


def _process_started() -> float:
    """When this process started (a leftover made before that is not this run's): now, less the
    time since the process started (/proc/uptime and the start time, both since boot, 10 ms)."""
    import time

    try:
        with open("/proc/self/stat", "rb") as handle:
            ticks = int(handle.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as handle:
            uptime = float(handle.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


_TEMP_DIR_RE = re.compile(r"^\..+\.nw(\d{1,10})\.[0-9a-f]{12}$")  # `.NAME.nwPID.RANDOM`: PID made it
# Before issue 21 the private folder was tempfile.mkdtemp(prefix=".NAME."): `.NAME.` and 8 of its characters,
# mode 0700, holding a snapshot's top-level entries (a capture or import) or, for an archive, the snapshot
# folder and `snapshot.tar.gz`. No PID tells whether its run is gone: age does.
_OLD_TEMP_DIR_RE = re.compile(r"^\.(.+)\.[a-z0-9_]{8}$")
_OLD_TEMP_ENTRIES = frozenset({"meta.yaml", "fs", "fs_links.json", "fs_errors.json", "kmsg.txt", "nvml.json",
                               "ipmi.json", "redfish", "snapshot.tar.gz"})
OLD_TEMP_AGE_S = 3600.0
_open_outputs: list[OutputDir] = []


def _on_terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through OutputDir.__exit__, which removes the folder


class OutputDir:
    """A new output (a snapshot folder, or one file such as an archive) built in a private 0700
    folder `.NAME.nwPID.RANDOM` beside it and published by one rename.

    The parent folder is opened once and must not be changeable by another user (exit 2,
    naming it); the private folder is made and held by descriptor, and everything inside is
    reached through `path` (/proc/self/fd/N, the held folder whatever its name becomes), so
    swapping its name for a symlink redirects nothing. Publishing is renameat2(RENAME_NOREPLACE)
    relative to the parent's descriptor, checked to have moved our folder. On failure, SIGTERM
    or SIGINT the folder is removed; one a killed run left is removed by the next run.
    """

    def __init__(self, out: Path, *, what: str = "snapshot", replace_empty: bool = True) -> None:
        import secrets

        self.out, self.what, self._shown, self.published = out, what, str(out), False
        if out.name in ("", ".", ".."):
            raise FileSafetyError("names no new entry", path=self._shown)
        self._parent = open_folder(str(out.parent), self._shown)
        self.fd = -1
        try:
            check_folder(os.fstat(self._parent), str(out.parent), what=f"folder for the {what}", named=self._shown)
            self._refuse_existing(replace_empty)
            names = [n for n in os.listdir(self._parent) if _TEMP_DIR_RE.match(n)]
            for name in dirfd.stale_dirs(self._parent, names, lambda n: int(_TEMP_DIR_RE.match(n).group(1)),  # type: ignore[union-attr]
                                         _process_started()):
                held = os.open(name, dirfd.DIR_FLAGS, dir_fd=self._parent)
                try:
                    dirfd.remove_held_dir(self._parent, name, held)
                finally:
                    os.close(held)
            remove_old_style_leftovers(self._parent)
            self.name = f".{out.name[:100]}.nw{os.getpid()}.{secrets.token_hex(6)}"
            os.mkdir(self.name, 0o700, dir_fd=self._parent)
            self.fd = os.open(self.name, dirfd.DIR_FLAGS, dir_fd=self._parent)
            st = os.fstat(self.fd)
            if st.st_uid != os.geteuid() or os.listdir(self.fd):
                raise FileSafetyError(f"the new folder {self.name} was swapped by another process; refusing",
                                      path=self._shown)
        except OSError as exc:
            self.close()
            raise os_error(exc, self._shown, f"create the {what}") from None
        except BaseException:
            self.close()
            raise
        self.path = Path(f"/proc/self/fd/{self.fd}")
        self._handlers: dict[int, object] = {}

    def _refuse_existing(self, replace_empty: bool) -> None:
        try:
            st = os.stat(self.out.name, dir_fd=self._parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not (replace_empty and stat.S_ISDIR(st.st_mode)):
            raise FileSafetyError("output exists; refusing to overwrite", path=self._shown)
        held = os.open(self.out.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._parent)
        try:
            if os.listdir(held):
                raise FileSafetyError("output exists and is not an empty directory; refusing to overwrite",
                                      path=self._shown)
        finally:
            os.close(held)

    def __enter__(self) -> OutputDir:
        import signal
        import threading

        _open_outputs.append(self)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM,):  # SIGINT already raises KeyboardInterrupt
                if signal.getsignal(signum) == signal.SIG_DFL:
                    self._handlers[signum] = signal.signal(signum, _on_terminate)
        return self

    def __exit__(self, kind: type[BaseException] | None, *_rest: object) -> None:
        import signal

        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        _open_outputs.remove(self)
        if kind is not None:
            self.discard()
        self.close()

    def publish(self, inner: str | None = None) -> None:
        """Put the folder (or the file `inner` made in it) in place at `out`, never over anything
        but an empty folder; then fsync the parent."""
        src_fd, src = (self._parent, self.name) if inner is None else (self.fd, inner)
        try:
            if inner is None:
                with contextlib.suppress(FileNotFoundError):  # an empty folder there is replaced
                    os.rmdir(self.out.name, dir_fd=self._parent)
            try:
                dirfd.renameat2(src_fd, src, self._parent, self.out.name, dirfd.RENAME_NOREPLACE)
            except OSError as exc:
                if exc.errno not in (errno.ENOSYS, errno.EINVAL):
                    raise
                if _exists_at(self._parent, self.out.name):
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST)) from None
                os.rename(src, self.out.name, src_dir_fd=src_fd, dst_dir_fd=self._parent)
            os.fsync(self._parent)
        except OSError as exc:
            raise os_error(exc, self._shown, f"put the {self.what} in place") from None
        if inner is None and not dirfd.same_file(os.stat(self.out.name, dir_fd=self._parent, follow_symlinks=False),
                                                 os.fstat(self.fd)):
            dirfd.empty_tree(self.fd)  # what we built stays nowhere; what is at `out` is not ours
            raise FileSafetyError(f"the folder being built was swapped by another process before it was put in "
                                  f"place; {self.out} is not what nodewarden wrote", path=self._shown,
                                  exit_code=EXIT_CANNOT_RUN)
        self.published = inner is None

    def discard(self) -> None:
        if self.fd >= 0 and not self.published:
            dirfd.remove_held_dir(self._parent, self.name, self.fd)

    def close(self) -> None:
        for fd in (self.fd, self._parent):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self._parent = -1


def remove_old_style_leftovers(parent_fd: int) -> list[str]:
    """Remove the pre-issue-21 private folders (`.NAME.XXXXXXXX`) a killed run left in `parent_fd`, where
    everything says they are ours: a real folder (not a link), owned by us, mode 0700, unchanged for an
    hour, holding nothing but what such a run put there. By descriptor, never through a link; anything
    else, or a folder that cannot be judged, is left alone. The names removed."""
    import time

    removed: list[str] = []
    too_new = time.time() - OLD_TEMP_AGE_S
    for name in os.listdir(parent_fd):
        match = _OLD_TEMP_DIR_RE.match(name)
        if match is None:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
                    and st.st_mtime < too_new):
                continue
            held = os.open(name, dirfd.DIR_FLAGS, dir_fd=parent_fd)
            try:
                out = match.group(1)
                allowed = _OLD_TEMP_ENTRIES
                if out.endswith((".tar.gz", ".tgz")):  # an archive's work folder: the snapshot folder in it too
                    allowed = allowed | {out.removesuffix(".tgz").removesuffix(".tar.gz") or "snapshot"}
                if dirfd.same_file(os.fstat(held), st) and set(os.listdir(held)) <= allowed:
                    dirfd.remove_held_dir(parent_fd, name, held)
                    removed.append(name)
            finally:
                os.close(held)
    return removed


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def remove_open_outputs() -> None:
    """Remove every output folder still being built (for a handler that ends the process itself)."""
    for output in list(_open_outputs):
        output.discard()


def write_output_dir(out: Path, fill: Callable[[Path], None], what: str = "snapshot") -> None:
    """Create the folder `out` whole or not at all: `fill` writes into a private `OutputDir`, which
    is then renamed into place; on any failure it is removed (an OSError becomes exit 2)."""
    with OutputDir(out, what=what) as tmp:
        try:
            fill(tmp.path)
        except OSError as exc:
            raise FileSafetyError(f"cannot write the {what}: {exc.strerror or exc}", path=str(out)) from None
        tmp.publish()
