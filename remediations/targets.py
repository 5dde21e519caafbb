"""The two places a change can land: the live root, or a snapshot's fs/."""

from __future__ import annotations

import abc
import contextlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.credentials import BmcOptions
from agent.errors import SnapshotError
from agent.fsutil import fsync_dir, remove_temp_files, replace_file
from agent.sources.deadline import call_with_deadline
from agent.sources.fsroot import FsRoot, LiveFs
from agent.sources.fsroot_snapshot import SnapshotFs, checked_write_path
from agent.sources.nvml import RecordedNvml, load_live_nvml
from agent.sources.redfish import LiveRedfish, PatchResult, RecordedRedfish, RedfishError, valid_path

_TEMP_RE = re.compile(r"^\.(.+)\.[0-9a-f]{12}\.tmp$")  # agent.fsutil's temporary names


def _check_path(path: str) -> None:
    # Paths come from actuators (sysctl keys are validated before they get
    # here); refuse anything that could climb out of the root regardless.
    parts = path.split("/")
    if not path.startswith("/") or "\x00" in path or ".." in parts:
        raise ValueError(f"refusing path {path!r}")


def write_file_atomic(real: str, data: bytes, mode: int) -> None:
    """Replace a file durably through agent.fsutil's one atomic writer (O_EXCL|O_NOFOLLOW temp file,
    fchmod on the descriptor, fsync, rename, fsync of the folder).

    Remediation semantics stay: the folders a FileEdit needs are created (the
    journal lists them, rollback removes them), and the file gets `mode` and root's ownership.
    """
    os.makedirs(os.path.dirname(real), exist_ok=True)
    replace_file(real, data, mode)


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

    def __init__(self, snapshot_dir: Path) -> None:
        self._reader = RecordedRedfish(snapshot_dir)
        self._base = snapshot_dir

    def _file(self, path: str) -> Path:
        # Inside the snapshot only: a real symlink among redfish/'s folders is refused (RefusedEntry).
        return Path(checked_write_path(str(self._base), "", valid_path(path).lstrip("/"), "index.json", path))

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
        file = self._file(clean)
        write_file_atomic(str(file), (json.dumps(updated, indent=4, sort_keys=True) + "\n").encode(),
                          stat.S_IMODE(os.stat(file).st_mode) if file.exists() else 0o644)
        return PatchResult(204, None)

    def raw(self, path: str) -> bytes | None:
        try:
            return self._file(path).read_bytes()
        except FileNotFoundError:
            return None

    def restore_raw(self, path: str, raw: bytes | None) -> None:
        file = self._file(path)
        if raw is not None:
            write_file_atomic(str(file), raw, stat.S_IMODE(os.stat(file).st_mode) if file.exists() else 0o644)
            return
        remove_file(str(file))
        remove_empty_dir(str(file.parent))  # the directory our PATCH created, if nothing else is there

    def close(self) -> None:
        return None


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

    def remove_leftover_temps(self, paths: list[str]) -> list[str]:
        """Temporary files a run killed mid-write left beside `paths` (rollback cleans them)."""
        removed: list[str] = []
        for path in paths:
            with contextlib.suppress(OSError, ValueError):
                removed += remove_temp_files(self._real(path))
        return removed

    def remove_empty_dir(self, path: str) -> None:
        remove_empty_dir(self._real(path))


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

    def _real(self, path: str) -> str:
        _check_path(path)
        # Recorded symlinks resolved (sys/class/net/eth0 -> ../../devices/...), clamped to fs/; a real
        # symlink on the way is refused (OSError naming it), so a write never lands outside the snapshot.
        return self.snapshot_fs.write_path(path)

    def remove_leftover_temps(self, paths: list[str]) -> list[str]:
        """Every temporary file of ours in the snapshot: a recording's writes all replace files
        (fs/ attributes, nvml.json, redfish/ settings), so a kill can leave one anywhere in it."""
        removed: list[str] = []
        for folder, dirs, _files in os.walk(self.path, followlinks=False):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in _files:
                match = _TEMP_RE.match(name)
                if match:
                    removed += remove_temp_files(os.path.join(folder, match.group(1)))
        return removed

    def nvml(self) -> Any:
        if self._nvml is None and self._nvml_path.is_file():
            self._nvml = RecordedNvml.from_file(self._nvml_path)
        return self._nvml

    def bmc(self) -> RecordedBmcWriter | None:
        return RecordedBmcWriter(self._redfish_dir.parent) if self._redfish_dir.is_dir() else None

    def close(self) -> None:
        return None

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

    def write_at(self, path: str, offset: int, data: bytes) -> None:
        # The recorded file is rewritten whole (atomic rename), with the bytes spliced in.
        real = self._real(path)
        with open(real, "rb") as handle:  # the file must exist, as in sysfs
            old = handle.read()
        if offset + len(data) > len(old):
            raise ValueError(f"{path}: {len(old)} bytes, cannot write {len(data)} at offset {offset}")
        write_file_atomic(real, old[:offset] + data + old[offset + len(data):], stat.S_IMODE(os.stat(real).st_mode))

    def listdir(self, path: str) -> list[str]:
        try:
            return self.snapshot_fs.listdir(path)
        except OSError:
            return []

