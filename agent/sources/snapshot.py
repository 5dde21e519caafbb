"""Snapshots: a recorded node on disk (DESIGN.md "Snapshot = recorded node").

    SNAPSHOT/meta.yaml      hostname, captured_at, nodewarden_version, captured: [...]
    SNAPSHOT/fs/            fake root holding the files the host source read
    SNAPSHOT/fs_links.json  symlinks (path -> target), since zip/wheel cannot hold links
    SNAPSHOT/fs_errors.json paths whose read failed live, with the errno name
    SNAPSHOT/kmsg.txt       /dev/kmsg records
    SNAPSHOT/inputs.jsonl   an import's per-input index (agent.sources.snapshot_index; in meta.yaml before issue 31)

`capture` writes into a private temporary sibling held by descriptor and renames it into
place (agent.io.fsout.OutputDir), so an interrupted capture never leaves a half-written
snapshot behind, and a user who can write the parent cannot redirect the writes.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import __version__
from agent.core.errors import SnapshotError
from agent.io.yamlfile import load_yaml_file
from agent.policy.profiles import data_dir
from agent.sources.fsroot import LiveFs
from agent.sources.kmsg import KMSG_DEVICE
from agent.sources.local_sources import CAPTURE_SYSCTLS
from agent.sources.registry import SOURCES
from agent.sources.snapshot_dir import Snapshot
from agent.sources.snapshot_index import INDEX_FILE, LINE_MAX_BYTES, index_max_bytes, read_index
from agent.sources.source import CaptureOptions, Recording

if TYPE_CHECKING:
    from agent.io.fsout import OutputDir

log = logging.getLogger("nodewarden.snapshot")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Read on capture besides the profiles' own keys: what support engineers ask for.


def simulated_nodes_dir() -> Path:
    return data_dir("fixtures") / "nodes"


def list_simulated() -> list[str]:
    base = simulated_nodes_dir()
    return sorted(p.name for p in base.iterdir() if (p / "meta.yaml").is_file())


def simulated_path(name: str) -> Path:
    if not _NAME_RE.match(name):
        raise SnapshotError(f"invalid simulated node name {name!r}")
    path = simulated_nodes_dir() / name
    if not (path / "meta.yaml").is_file():
        raise SnapshotError(f"no simulated node {name!r} (available: {', '.join(list_simulated())})")
    return path


# What a snapshot holds at its top: each must be itself, never a symlink out of the folder.
__all__ = ["CAPTURE_SYSCTLS", "INDEX_FILE", "Snapshot", "capture_live", "copy_snapshot", "index_max_bytes",
           "open_snapshot"]
_RECORDED = ("meta.yaml", "fs", "fs_links.json", "fs_errors.json", "kmsg.txt", "nvml.json", "ipmi.json", "redfish",
             INDEX_FILE)
_DIR_ENTRIES = ("fs", "redfish")
# meta.yaml holds a few KB as capture and import write it (the per-input index is in INDEX_FILE since
# issue 31; an older import's meta.yaml holds its index within this bound, and still reads).
META_MAX_BYTES = 1 << 20
INDEX_LINE_MAX_BYTES = LINE_MAX_BYTES


def _check_recorded_entries(path: Path) -> None:
    """A snapshot is untrusted input: its recorded files are its own regular files and folders."""
    for name in _RECORDED:
        try:
            info = os.lstat(path / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SnapshotError(f"unreadable: {exc.strerror}", path=str(path / name)) from None
        want_dir = name in _DIR_ENTRIES
        if stat.S_ISLNK(info.st_mode):
            raise SnapshotError("a symlink: refused (a snapshot is read only inside its folder)", path=str(path / name))
        if not (stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)):
            raise SnapshotError(f"not a {'folder' if want_dir else 'regular file'}: refused", path=str(path / name))
        if name == "meta.yaml" and info.st_size > META_MAX_BYTES:
            raise SnapshotError(f"{info.st_size} bytes: larger than the {META_MAX_BYTES} bytes meta.yaml may hold",
                                path=str(path / name))
        if name == INDEX_FILE and info.st_size > index_max_bytes():  # read_index checks again, on its descriptor
            raise SnapshotError(f"{info.st_size} bytes: larger than the {index_max_bytes()} bytes {INDEX_FILE} "
                                "may hold", path=str(path / name))


def open_snapshot(path: Path) -> Snapshot:
    if not path.is_dir():
        raise SnapshotError("snapshot directory does not exist", path=str(path))
    meta_path = path / "meta.yaml"
    _check_recorded_entries(path)
    if not meta_path.is_file():
        raise SnapshotError("not a snapshot: meta.yaml is missing", path=str(path))
    meta, lines = load_yaml_file(meta_path, SnapshotError)
    if not isinstance(meta, dict):
        raise SnapshotError("meta.yaml must be a mapping", path=str(meta_path), line=1)
    captured = meta.get("captured")
    if not isinstance(captured, list) or not all(isinstance(c, str) for c in captured):
        raise SnapshotError("`captured` must list the recorded sources, e.g. [host, kmsg]",
                            path=str(meta_path), line=lines.line_for(("captured",)))
    if "host" in captured and not (path / "fs").is_dir():
        raise SnapshotError("partial snapshot: meta.yaml says host was captured but fs/ is missing",
                            path=str(path))
    if "kmsg" in captured and not (path / "kmsg.txt").is_file():
        raise SnapshotError("partial snapshot: meta.yaml says kmsg was captured but kmsg.txt is missing",
                            path=str(path))
    if (path / INDEX_FILE).is_file():  # the index beside meta.yaml wins over an `inputs` list inside it
        rows, total = read_index(path / INDEX_FILE)
        meta = {**meta, "inputs": rows, "inputs_total": total}
    return Snapshot(path, meta)


def _prepare_out(out: Path) -> OutputDir:
    """A private (0700) folder beside `out`, held by descriptor, to fill (agent.io.fsout.OutputDir: its
    parent must exist and be safe, `out` missing or an empty folder; exit 2 otherwise)."""
    from agent.io.fsout import OutputDir  # capture-only imports stay off the audit path

    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # the friendly message; OutputDir re-checks
        raise SnapshotError("output exists and is not an empty directory; refusing to overwrite",
                            path=str(out))
    return OutputDir(out)


def write_meta(path: Path, hostname: str, captured: list[str], **extra: Any) -> None:
    import yaml

    from agent.io.fsutil import create_file
    meta = {
        "hostname": hostname,
        "captured_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "nodewarden_version": __version__,
        "captured": captured,
        **extra,
    }
    create_file(path, "meta.yaml", yaml.safe_dump(meta, sort_keys=False))


def capture_live(out: Path, sysctl_keys: list[str], root: LiveFs | None = None,
                 kmsg_device: str = KMSG_DEVICE, nvml_backend: Any = None, bmc: Any = None) -> list[str]:
    """Record this node into `out`: every source of the registry records what it reads (host files,
    kernel log, NVML answers, the BMC when one is configured).

    `root`, `kmsg_device` and `nvml_backend` exist for tests, which capture a
    fake root and a replayed NVML.
    """
    options = CaptureOptions(sysctl_keys=tuple(sysctl_keys), bmc=bmc, root=root, kmsg_device=kmsg_device,
                             nvml_backend=nvml_backend)
    with _prepare_out(out) as work:  # removed on failure, SIGTERM or SIGINT
        done = Recording()
        for source in SOURCES:
            source.record(work.path, options, done)
        write_meta(work.path, done.hostname or "unknown", done.captured, notes=done.notes)
        work.publish()
    return done.captured


def copy_snapshot(source: Snapshot, out: Path) -> list[str]:
    """A writable copy of a recorded (or simulated) node, e.g. to practise on.

    Only the snapshot's own regular files and folders are copied, never through a
    link: a symlink (which could point anywhere on this machine), FIFO, socket or
    device in it is left out, with a warning naming it.
    """
    with _prepare_out(out) as work:
        left_out: list[str] = []
        root = os.open(source.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _copy_inside(root, work.path, "", left_out)
        finally:
            os.close(root)
        for entry in left_out[:_LEFT_OUT_SHOWN]:
            log.warning("snapshot copy: not copied: %s", entry)
        if len(left_out) > _LEFT_OUT_SHOWN:
            log.warning("snapshot copy: %d more entries not copied", len(left_out) - _LEFT_OUT_SHOWN)
        work.publish()
    return source.captured


_COPY_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_COPY_MAX_DEPTH = 64  # /sys nests ~15 deep; deeper is not a recording
_LEFT_OUT_SHOWN = 20


def _copy_inside(src_fd: int, dst: Path, rel: str, left_out: list[str]) -> None:
    """Copy the folder open at `src_fd` into the existing folder `dst`, entry by entry with O_NOFOLLOW."""
    for name in sorted(os.listdir(src_fd)):
        shown = rel + name
        info = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        mode = stat.S_IMODE(info.st_mode) & 0o777
        if stat.S_ISDIR(info.st_mode):
            if rel.count("/") >= _COPY_MAX_DEPTH:
                left_out.append(f"{shown}/ (nested deeper than {_COPY_MAX_DEPTH} folders)")
                continue
            sub = os.open(name, _COPY_DIR_FLAGS, dir_fd=src_fd)
            try:
                os.mkdir(dst / name, 0o700)
                _copy_inside(sub, dst / name, shown + "/", left_out)
            finally:
                os.close(sub)
            os.chmod(dst / name, mode | 0o700)  # a copy to practise on stays writable
        elif stat.S_ISREG(info.st_mode):
            _copy_file(src_fd, name, dst / name, mode | 0o600, info)
        else:
            kind = ("a symlink" if stat.S_ISLNK(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "a device")
            left_out.append(f"{shown} ({kind})")


def _copy_file(src_fd: int, name: str, dst: Path, mode: int, info: os.stat_result) -> None:
    fd = os.open(name, _COPY_FILE_FLAGS, dir_fd=src_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the check: not ours to copy
            raise SnapshotError("changed while being copied; refused", path=str(dst))
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(fd, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, mode)
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)
