"""The two places a change can land: the live root, or a snapshot's fs/."""

from __future__ import annotations

import abc
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import SnapshotError
from agent.sources.fsroot import FsRoot, LiveFs, SnapshotFs
from agent.sources.nvml import RecordedNvml, call_with_deadline, load_live_nvml


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


NVML_TIMEOUT_S = 10.0


class _BoundedNvml:
    """The live binding with every call under a deadline (a hung GPU must not hang remediate)."""

    def __init__(self, binding: Any) -> None:
        self._binding = binding

    def nvmlShutdown(self) -> None:
        return None  # readers shut down after reading; remediation still needs the library

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._binding, name)
        if name.startswith("nvml") and callable(attr) and not isinstance(attr, type):
            return lambda *args: call_with_deadline(lambda: attr(*args), NVML_TIMEOUT_S, name)
        return attr


class _RootedFiles(abc.ABC):
    """File operations shared by both targets; subclasses map a path to the real file."""

    @abc.abstractmethod
    def _real(self, path: str) -> str:
        """The real file behind an absolute node path."""

    def read(self, path: str) -> bytes | None:
        try:
            with open(self._real(path), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

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

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._real(path))

    def remove_empty_dir(self, path: str) -> None:
        remove_empty_dir(self._real(path))


class LiveTarget(_RootedFiles):
    """The machine itself (or a root directory, for tests of the file paths)."""

    live = True

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.description = "live" if root == "/" else f"live:{root}"
        self.fs: FsRoot = LiveFs(root)
        self._nvml: Any = None

    def nvml(self) -> Any:
        if self._nvml is None:
            try:
                binding = load_live_nvml()
                call_with_deadline(binding.nvmlInit, NVML_TIMEOUT_S, "nvmlInit")
            except Exception:  # noqa: BLE001 - no library, no driver, hung: no NVML actions
                return None
            self._nvml = _BoundedNvml(binding)
        return self._nvml

    def nvml_commit(self) -> None:
        return None

    def nvml_raw(self) -> bytes | None:
        return None

    def nvml_restore_raw(self, raw: bytes) -> None:
        raise ValueError("a live GPU is restored through its setter, not from bytes")

    def _real(self, path: str) -> str:
        _check_path(path)
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

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

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._real(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []



class SnapshotTarget(_RootedFiles):
    """A snapshot's fs/ tree: kernel attributes are files showing what the kernel would."""

    live = False

    def __init__(self, snapshot_dir: Path, writable: bool = True) -> None:
        self.snapshot_fs = SnapshotFs(snapshot_dir)
        self.fs: FsRoot = self.snapshot_fs
        self._nvml_path = snapshot_dir / "nvml.json"
        self._nvml: RecordedNvml | None = None
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

    def nvml(self) -> Any:
        if self._nvml is None and self._nvml_path.is_file():
            self._nvml = RecordedNvml.from_file(self._nvml_path)
        return self._nvml

    def nvml_commit(self) -> None:
        if self._nvml is not None:
            write_file_atomic(str(self._nvml_path), self._nvml.to_bytes(),
                              stat.S_IMODE(os.stat(self._nvml_path).st_mode))

    def nvml_raw(self) -> bytes | None:
        return self._nvml_path.read_bytes() if self._nvml_path.is_file() else None

    def nvml_restore_raw(self, raw: bytes) -> None:
        write_file_atomic(str(self._nvml_path), raw, stat.S_IMODE(os.stat(self._nvml_path).st_mode))
        self._nvml = None  # re-read on next use

    def write_attr(self, path: str, value: str, shown: Callable[[bytes, str], bytes]) -> None:
        real = self._real(path)
        with open(real, "rb") as handle:  # an attribute must exist, as in sysfs
            old = handle.read()
        write_file_atomic(real, shown(old, value), stat.S_IMODE(os.stat(real).st_mode))

    def restore_attr(self, path: str, raw: bytes, value: str) -> None:
        real = self._real(path)
        write_file_atomic(real, raw, stat.S_IMODE(os.stat(real).st_mode))

    def listdir(self, path: str) -> list[str]:
        try:
            return self.snapshot_fs.listdir(path)
        except OSError:
            return []

