"""The two places a change can land: the live root, or a snapshot's fs/."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.errors import SnapshotError
from agent.sources.fsroot import FsRoot, LiveFs, SnapshotFs


def _check_path(path: str) -> None:
    # Paths come from actuators (sysctl keys are validated before they get
    # here); refuse anything that could climb out of the root regardless.
    parts = path.split("/")
    if not path.startswith("/") or "\x00" in path or ".." in parts:
        raise ValueError(f"refusing path {path!r}")


def write_file_atomic(real: str, data: bytes, mode: int) -> None:
    """Replace a file durably: temp file in the same directory, fsync, rename, fsync dir."""
    directory = os.path.dirname(real)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nodewarden-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def remove_file(real: str) -> None:
    try:
        os.unlink(real)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(real))


def remove_empty_dir(real: str) -> None:
    """Remove a directory we created, only if nothing else was put there since."""
    try:
        os.rmdir(real)
    except FileNotFoundError:
        return
    except OSError:  # not empty: someone else uses it now; keep it
        return
    fsync_dir(os.path.dirname(real))


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LiveTarget:
    """The machine itself (or a root directory, for tests of the file paths)."""

    live = True

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.description = "live" if root == "/" else f"live:{root}"
        self.fs: FsRoot = LiveFs(root)

    def _real(self, path: str) -> str:
        _check_path(path)
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str) -> bytes | None:
        try:
            with open(self._real(path), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_attr(self, path: str, value: str, shown: Callable[[bytes, str], bytes]) -> None:
        # Kernel attributes take the bare value in one write(); no temp file
        # or rename is possible in procfs/sysfs.
        fd = os.open(self._real(path), os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def restore_attr(self, path: str, raw: bytes, value: str) -> None:
        self.write_attr(path, value, lambda old, new: raw)

    def write_file(self, path: str, data: bytes | None, mode: int) -> None:
        real = self._real(path)
        if data is None:
            remove_file(real)
        else:
            write_file_atomic(real, data, mode)

    def file_mode(self, path: str) -> int | None:
        try:
            return stat.S_IMODE(os.stat(self._real(path)).st_mode)
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._real(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._real(path))

    def remove_empty_dir(self, path: str) -> None:
        remove_empty_dir(self._real(path))


class SnapshotTarget:
    """A snapshot's fs/ tree: kernel attributes are files showing what the kernel would."""

    live = False

    def __init__(self, snapshot_dir: Path, writable: bool = True) -> None:
        self.snapshot_fs = SnapshotFs(snapshot_dir)
        self.fs: FsRoot = self.snapshot_fs
        self.description = f"snapshot:{snapshot_dir.resolve()}"
        if writable and not os.access(self.snapshot_fs.base, os.W_OK):
            raise SnapshotError("snapshot is read-only; copy it first with "
                                "`nodewarden snapshot capture --snapshot DIR --out NEW`", path=str(snapshot_dir))

    def _real(self, path: str) -> str:
        _check_path(path)
        # Resolve recorded symlinks (sys/class/net/eth0 -> ../../devices/...).
        parent, _, name = path.rpartition("/")
        real_parent = self.snapshot_fs.resolve(parent) if parent else ""
        return os.path.join(self.snapshot_fs.base, real_parent, name)

    def read(self, path: str) -> bytes | None:
        try:
            with open(self._real(path), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_attr(self, path: str, value: str, shown: Callable[[bytes, str], bytes]) -> None:
        real = self._real(path)
        with open(real, "rb") as handle:  # an attribute must exist, as in sysfs
            old = handle.read()
        write_file_atomic(real, shown(old, value), stat.S_IMODE(os.stat(real).st_mode))

    def restore_attr(self, path: str, raw: bytes, value: str) -> None:
        real = self._real(path)
        write_file_atomic(real, raw, stat.S_IMODE(os.stat(real).st_mode))

    def write_file(self, path: str, data: bytes | None, mode: int) -> None:
        real = self._real(path)
        if data is None:
            remove_file(real)
        else:
            write_file_atomic(real, data, mode)

    def file_mode(self, path: str) -> int | None:
        try:
            return stat.S_IMODE(os.stat(self._real(path)).st_mode)
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return self.snapshot_fs.listdir(path)
        except OSError:
            return []

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._real(path))

    def remove_empty_dir(self, path: str) -> None:
        remove_empty_dir(self._real(path))
