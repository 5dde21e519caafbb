"""The two places a change can land: the live root, or a snapshot's fs/."""

from __future__ import annotations

import abc
import contextlib
import errno
import json
import os
import posixpath
import re
import stat
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.errors import SnapshotError
from agent.io import dirfd
from agent.io.credentials import BmcOptions
from agent.io.fsutil import FileSafetyError, check_folder, remove_temp_files, replace_at
from agent.sources.deadline import call_with_deadline
from agent.sources.fsroot import MAX_FILE_BYTES, FsRoot, LiveFs, read_fd
from agent.sources.fsroot_snapshot import RefusedEntry, SnapshotFs, open_write_dir
from agent.sources.nvml import RecordedNvml, load_live_nvml
from agent.sources.redfish import LiveRedfish, PatchResult, RecordedRedfish, RedfishError, valid_path

_TEMP_RE = re.compile(r"^\.(.+)\.[0-9a-f]{12}\.tmp$")  # agent.io.fsutil's temporary names


def _check_path(path: str) -> None:
    # Paths come from actuators (sysctl keys are validated before they get
    # here); refuse anything that could climb out of the root regardless.
    parts = path.split("/")
    if not path.startswith("/") or "\x00" in path or ".." in parts:
        raise ValueError(f"refusing path {path!r}")


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_MAX_LINKS = 40  # the kernel's own limit on symlink hops
_MAX_RECORDED_BYTES = 32 << 20  # a recorded JSON file (nvml.json, a Redfish index.json), as its readers cap it


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _refuse_shared(st: os.stat_result, shown: str) -> None:
    """A folder on the way to a write that another user could change under us: the action fails."""
    try:
        check_folder(st, shown, what="folder to write in", named=shown)
    except FileSafetyError as exc:
        raise PermissionError(errno.EPERM, exc.message, shown) from None


def check_target_root(fd: int, shown: str) -> None:
    """Refuse (exit 2, naming it) a target root another non-root user can change (issue 21, 1)."""
    check_folder(os.fstat(fd), shown, what="target", named=shown)


def _read_at(dir_fd: int, name: str, shown: str = "", max_bytes: int = MAX_FILE_BYTES) -> tuple[bytes, int] | None:
    """A regular file's bytes and mode inside a held folder, never through a link (ELOOP) nor from a
    FIFO or device (EINVAL, checked before the open); None when missing; past `max_bytes`, EFBIG."""
    shown = shown or name
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, f"refused: {shown} is a symlink (not followed)", shown)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"refused: {shown} is not a regular file (not opened)", shown)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"refused: {shown} is not a regular file", shown)
        if max_bytes == MAX_FILE_BYTES:
            return read_fd(fd, shown, None), stat.S_IMODE(st.st_mode)
        data = read_fd(fd, shown, max_bytes + 1)
        if len(data) > max_bytes:
            raise OSError(errno.EFBIG, f"exceeds {max_bytes >> 20} MiB: not read", shown)
        return data, stat.S_IMODE(st.st_mode)
    finally:
        os.close(fd)


def _remove_at(dir_fd: int, name: str, *, folder: bool = False) -> None:
    """Unlink a file (or remove an empty folder we made) inside a held folder; gone already is fine,
    a folder someone else filled since is kept."""
    try:
        if folder:
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError:
        if folder:
            return
        raise
    os.fsync(dir_fd)


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
            return lambda *args: call_with_deadline(attr, *args, timeout_s=NVML_TIMEOUT_S, name=f"nvml:{name}")
        return attr


class LiveBmcWriter:
    """A live BMC: GETs and PATCHes through the audit's Redfish client (same TLS and credential rules)."""

    def __init__(self, options: BmcOptions) -> None:
        assert options.url is not None
        self._client = LiveRedfish(options.url, options.user or "",
                                   options.password.reveal() if options.password else "",
                                   ca_file=options.ca_file, insecure=options.insecure, timeout_s=options.timeout_s)

    def get(self, path: str) -> dict[str, Any]:
        return self._client.get(path)

    def patch(self, path: str, body: dict[str, Any], etag: str | None = None) -> PatchResult:
        return self._client.patch(path, body, etag)

    def raw(self, path: str) -> bytes | None:
        return None

    def restore_raw(self, path: str, raw: bytes | None) -> None:
        raise ValueError("a live BMC is restored with a PATCH, not from bytes")

    def close(self) -> None:
        self._client.close()


class RecordedBmcWriter:
    """A snapshot's redfish/ tree: a PATCH to a settings object is merged into its index.json.

    The current resource is left alone, as on a real BMC: the BIOS applies
    the pending settings at the next boot.
    """

    def __init__(self, snapshot_dir: Path, open_dir: Callable[[str, str, bool], int]) -> None:
        self._reader = RecordedRedfish(snapshot_dir)
        self._open_dir = open_dir  # (folder relative to the snapshot, path shown, make) -> held folder

    def _replace(self, path: str, data: bytes) -> None:
        fd = self._open_dir(valid_path(path).lstrip("/"), path, True)
        try:
            old = _read_at(fd, "index.json", f"{path}/index.json", _MAX_RECORDED_BYTES)
            replace_at(fd, "index.json", data, old[1] if old else 0o644, shown=path)
        finally:
            os.close(fd)

    def get(self, path: str) -> dict[str, Any]:
        return self._reader.get(path)

    def patch(self, path: str, body: dict[str, Any], etag: str | None = None) -> PatchResult:
        clean = valid_path(path)
        try:
            current = self._reader.get(clean)
        except RedfishError as exc:
            if exc.status != 404:
                raise
            # iDRAC-style: the settings object lists only what is pending.
            current = {"@odata.id": clean, "@odata.type": "#Bios.v1_2_1.Bios", "Id": clean.rsplit("/", 1)[-1],
                       "Name": "BIOS Configuration Pending Settings", "Attributes": {}}
        attributes = dict(current.get("Attributes") or {})
        attributes.update(body.get("Attributes") or {})
        updated = {**current, "Attributes": attributes}
        if "@Redfish.SettingsApplyTime" in body:
            updated["@Redfish.SettingsApplyTime"] = body["@Redfish.SettingsApplyTime"]
        self._replace(clean, (json.dumps(updated, indent=4, sort_keys=True) + "\n").encode())
        return PatchResult(204, None)

    def raw(self, path: str) -> bytes | None:
        """The settings object's recorded bytes (rollback puts them back), read relative to the folder
        its writes use: a folder on the way swapped for a symlink redirects nothing (issue 21, 1)."""
        try:
            fd = self._open_dir(valid_path(path).lstrip("/"), path, False)
        except FileNotFoundError:
            return None
        try:
            got = _read_at(fd, "index.json", f"{path}/index.json", _MAX_RECORDED_BYTES)
        finally:
            os.close(fd)
        return None if got is None else got[0]

    def restore_raw(self, path: str, raw: bytes | None) -> None:
        if raw is not None:
            self._replace(path, raw)
            return
        folder = valid_path(path).lstrip("/")
        parent, _, last = folder.rpartition("/")
        try:
            fd = self._open_dir(parent, path, False)
        except FileNotFoundError:
            return
        try:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                held = os.open(last, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    _remove_at(held, "index.json")
                finally:
                    os.close(held)
            _remove_at(fd, last, folder=True)  # the directory our PATCH created, if nothing else is there
        finally:
            os.close(fd)

    def close(self) -> None:
        return None


class _RootedFiles(abc.ABC):
    """File operations shared by both targets; subclasses map a path to the real file."""

    @abc.abstractmethod
    def _real(self, path: str) -> str:
        """The real file behind an absolute node path."""

    @abc.abstractmethod
    def _open_parent(self, path: str, make: bool) -> tuple[int, str]:
        """The folder holding `path`, opened once without following a link it may not (missing
        folders made when `make`), and the name in it: every write is relative to it (issue 21, 1)."""

    def _follow_last(self, dir_fd: int, name: str, path: str, exc: OSError) -> str:
        """The node path a refused last component leads to, where this target follows it; else raise."""
        raise exc

    def _held(self, path: str) -> tuple[int, str, str]:
        """The folder the writes of `path` use (held), the name in it, and the node path reached."""
        for _hop in range(_MAX_LINKS + 1):
            fd, name = self._open_parent(path, False)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return fd, name, path
            except BaseException:
                os.close(fd)
                raise
            if not stat.S_ISLNK(st.st_mode):
                return fd, name, path
            try:
                path = self._follow_last(fd, name, path, OSError(
                    errno.ELOOP, f"refused: {path} is a symlink nodewarden does not follow", path))
            finally:
                os.close(fd)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def read(self, path: str) -> bytes | None:
        """The file's bytes, or None when absent. Read relative to the folder its writes use, the file
        itself with O_NOFOLLOW and bounded: what rollback records and puts back is what was there,
        never what a link planted meanwhile points to (issue 21, 1)."""
        try:
            fd, name, path = self._held(path)
        except FileNotFoundError:
            return None
        try:
            got = _read_at(fd, name, path)
        finally:
            os.close(fd)
        return None if got is None else got[0]

    def write_file(self, path: str, data: bytes | None, mode: int) -> None:
        try:
            fd, name = self._open_parent(path, data is not None)
        except FileNotFoundError:
            if data is None:
                return  # nothing to remove
            raise
        try:
            if data is None:
                _remove_at(fd, name)
            else:
                replace_at(fd, name, data, mode, shown=path)
        finally:
            os.close(fd)

    def file_mode(self, path: str) -> int | None:
        try:
            fd, name, _path = self._held(path)
        except FileNotFoundError:
            return None
        try:
            return stat.S_IMODE(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._real(path))

    def remove_leftover_temps(self, paths: list[str]) -> list[str]:
        """Temporary files a run killed mid-write left beside `paths` (rollback cleans them)."""
        removed: list[str] = []
        for path in paths:
            with contextlib.suppress(OSError, ValueError):
                fd, name = self._open_parent(path, False)
                try:
                    removed += remove_temp_files(name, dir_fd=fd)
                finally:
                    os.close(fd)
        return removed

    def remove_empty_dir(self, path: str) -> None:
        try:
            fd, name = self._open_parent(path, False)
        except FileNotFoundError:
            return
        try:
            _remove_at(fd, name, folder=True)
        finally:
            os.close(fd)


class LiveTarget(_RootedFiles):
    """The machine itself (or a root directory, for tests of the file paths)."""

    live = True

    def __init__(self, root: str = "/", bmc_options: BmcOptions | None = None) -> None:
        self.root = root
        self.description = "live" if root == "/" else f"live:{root}"
        self.fs: FsRoot = LiveFs(root)
        self._nvml: Any = None
        self._bmc_options = bmc_options
        self._bmc: LiveBmcWriter | None = None

    def bmc(self) -> LiveBmcWriter | None:
        """Logs in on first use (a plan without BIOS actions never touches the BMC)."""
        if self._bmc is None and self._bmc_options is not None and self._bmc_options.url:
            self._bmc = LiveBmcWriter(self._bmc_options)
        return self._bmc

    def close(self) -> None:
        if self._bmc is not None:
            self._bmc.close()
            self._bmc = None

    def nvml(self) -> Any:
        if self._nvml is None:
            try:
                binding = load_live_nvml()
                call_with_deadline(binding.nvmlInit, timeout_s=NVML_TIMEOUT_S, name="nvml:nvmlInit")
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

    def _open_parent(self, path: str, make: bool) -> tuple[int, str]:
        _check_path(path)
        parent, _, name = path.rpartition("/")
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # A link on the way is followed only where root or we made it (the folder holding it
            # was checked already): /etc entries may be links on some systems, never someone else's.
            fd, _made = dirfd.open_dir(root, parent.lstrip("/"), check=_refuse_shared,
                                       make=0o755 if make else None, follow=lambda _fd, st, _s: _trusted(st.st_uid),
                                       shown=self.root)
        finally:
            os.close(root)
        return fd, name

    def _follow_last(self, dir_fd: int, name: str, path: str, exc: OSError) -> str:
        # A link root or we own, in a folder already checked (no one else could have swapped it):
        # /etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf on many distributions. Resolved lexically.
        if not _trusted(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid):
            raise exc
        target = os.readlink(name, dir_fd=dir_fd)
        return posixpath.normpath(posixpath.join(posixpath.dirname(path), target))

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

    def write_at(self, path: str, offset: int, data: bytes) -> None:
        # sysfs `config` takes writes at any offset (root only); never truncate it.
        fd = os.open(self._real(path), os.O_WRONLY | os.O_CLOEXEC)
        try:
            if os.pwrite(fd, data, offset) != len(data):
                raise OSError(f"short write to {path} at offset {offset}")
        finally:
            os.close(fd)

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
        self._redfish_dir = snapshot_dir / "redfish"
        self.path = snapshot_dir.resolve()  # the lock of this target is this folder's own flock
        self.description = f"snapshot:{self.path}"
        if writable and not os.access(self.snapshot_fs.base, os.W_OK):
            raise SnapshotError("snapshot is read-only; copy it first with "
                                "`nodewarden snapshot capture --snapshot DIR --out NEW`", path=str(snapshot_dir))
        # Opened once: every write below is relative to this folder, wherever its name goes meanwhile.
        self._root_fd = os.open(snapshot_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._finalizer = weakref.finalize(self, os.close, self._root_fd)
        if writable:
            check_target_root(self._root_fd, str(snapshot_dir))

    def _open_held(self, rel: str, path: str, make: bool) -> int:
        return open_write_dir(self._root_fd, rel, path, make=make, check=_refuse_shared)

    def _open_parent(self, path: str, make: bool) -> tuple[int, str]:
        _check_path(path)
        parent, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            raise ValueError(f"refusing path {path!r}")
        rel = self.snapshot_fs.resolve(parent) if parent else ""  # recorded links, clamped to fs/
        return self._open_held(posixpath.join("fs", rel), path, make), name

    def _follow_last(self, dir_fd: int, name: str, path: str, exc: OSError) -> str:
        # A snapshot keeps its links in fs_links.json: a real one could point anywhere (exit 2 when planning).
        raise RefusedEntry(errno.ELOOP, f"refused: fs{path} is a symlink inside the snapshot (a snapshot keeps "
                                        "its links in fs_links.json; a real link could point outside it)", path)

    def _replace_top(self, name: str, data: bytes) -> None:
        fd = self._open_held("", name, False)
        try:
            mode = stat.S_IMODE(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
            replace_at(fd, name, data, mode, shown=name)
        finally:
            os.close(fd)

    def _real(self, path: str) -> str:
        _check_path(path)
        # Recorded symlinks resolved (sys/class/net/eth0 -> ../../devices/...), clamped to fs/; a real
        # symlink on the way is refused (OSError naming it), so a write never lands outside the snapshot.
        return self.snapshot_fs.write_path(path)

    def remove_leftover_temps(self, paths: list[str]) -> list[str]:
        """Every temporary file of ours in the snapshot: a recording's writes all replace files
        (fs/ attributes, nvml.json, redfish/ settings), so a kill can leave one anywhere in it."""
        removed: list[str] = []
        for _folder, _dirs, files, folder_fd in os.fwalk(".", dir_fd=self._root_fd):  # never through a link
            for name in files:
                match = _TEMP_RE.match(name)
                if match:
                    removed += remove_temp_files(match.group(1), dir_fd=folder_fd)
        return removed

    def nvml(self) -> Any:
        if self._nvml is None and self._nvml_path.is_file():
            self._nvml = RecordedNvml.from_file(self._nvml_path)
        return self._nvml

    def bmc(self) -> RecordedBmcWriter | None:
        if not self._redfish_dir.is_dir():
            return None
        return RecordedBmcWriter(self._redfish_dir.parent, self._open_held)

    def close(self) -> None:
        self._finalizer()

    def nvml_commit(self) -> None:
        if self._nvml is not None:
            self._replace_top("nvml.json", self._nvml.to_bytes())

    def nvml_raw(self) -> bytes | None:
        got = _read_at(self._root_fd, "nvml.json", "nvml.json", _MAX_RECORDED_BYTES)
        return None if got is None else got[0]

    def nvml_restore_raw(self, raw: bytes) -> None:
        self._replace_top("nvml.json", raw)
        self._nvml = None  # re-read on next use

    def _rewrite(self, path: str, change: Callable[[bytes], bytes]) -> None:
        """Replace the recorded attribute file `path` (it must exist, as in sysfs) with `change(old)`."""
        fd, name = self._open_parent(path, False)
        try:
            got = _read_at(fd, name)
            if got is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            replace_at(fd, name, change(got[0]), got[1], shown=path)
        finally:
            os.close(fd)

    def write_attr(self, path: str, value: str, shown: Callable[[bytes, str], bytes]) -> None:
        self._rewrite(path, lambda old: shown(old, value))

    def restore_attr(self, path: str, raw: bytes, value: str) -> None:
        self._rewrite(path, lambda _old: raw)

    def write_at(self, path: str, offset: int, data: bytes) -> None:
        # The recorded file is rewritten whole (atomic rename), with the bytes spliced in.
        def splice(old: bytes) -> bytes:
            if offset + len(data) > len(old):
                raise ValueError(f"{path}: {len(old)} bytes, cannot write {len(data)} at offset {offset}")
            return old[:offset] + data + old[offset + len(data):]

        self._rewrite(path, splice)

    def listdir(self, path: str) -> list[str]:
        try:
            return self.snapshot_fs.listdir(path)
        except OSError:
            return []

