"""The one place nodewarden writes files: outputs the user named, state it trusts, locks.

Why one module: nodewarden runs as root and writes into folders other users
may own or share (node_exporter's textfile folder, /tmp, a snapshot copy).
Every writer used to roll its own `mkstemp` + `chmod(path)` + `os.replace`,
and each copy had its own hole: `audit --output /dev/null` replaced the
device with a regular file, `mkdir -p` silently created mistyped folders, and
a chmod *by path* after the write let a process racing in a folder it can
write swap the temporary file for a symlink, so root made any file
world-readable. The rules below hold for every output and are tested once:

* `replace_file`: a regular file is replaced atomically. All steps are
  relative to one descriptor of the folder: a temporary file created with
  `O_CREAT|O_EXCL|O_NOFOLLOW`, `fchown`/`fchmod` on its descriptor (never by
  path), fsync, rename, fsync of the folder, and a check that the name now
  holds our inode.
* `write_output`: the policy for a path the user named. `-` and
  `/dev/stdout` (`/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`) write to
  that descriptor; a character device or FIFO is written in place and never
  replaced; an existing regular file keeps its mode and owner; a missing
  folder is an error (exit 2), never a silent `mkdir -p`. A symlink at the
  name is followed only when root or we made it in a folder nobody else can
  change; otherwise the link itself is replaced, never its target.
* `trusted_dir`: state nodewarden later acts on as root (the remediation
  journal) is used only when the folder and every parent are owned by root
  or the running user and writable by nobody else (sshd's `StrictModes`); a
  sticky world-writable parent such as /tmp is acceptable as a parent only.
  An existing folder is never chmod'ed.
* Writes beneath a folder held by descriptor (`replace_at`, with agent.io.dirfd
  walking it once without following links) and new output folders
  (agent.io.fsout.OutputDir: built in a private folder held by descriptor,
  published with renameat2(RENAME_NOREPLACE); issue 21).

Floor 1 of the layout: imports nothing from agent but agent.core.errors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from agent.core.errors import EXIT_CANNOT_RUN, NodewardenError

_MAX_LINKS = 8  # symlinks followed from an output name (the kernel allows 40 in a whole path)
_MAX_WALK_LINKS = 40
_STD_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}
_FD_PATH_RE = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d{1,9})$")
_WRITE_BATCH = 1 << 20  # `write_output_stream` gathers small chunks into writes of about this size


class FileSafetyError(NodewardenError):
    """An output or state path that is missing, of the wrong kind, or not safe to use (exit 2)."""

    def __init__(self, message: str, *, path: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message, path=path)
        if exit_code is not None:
            self.exit_code = exit_code


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _os_error(exc: OSError, path: str, doing: str) -> FileSafetyError:
    """An OSError as an operator message: a permission or path problem is exit 2, the rest exit 3."""
    usage = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                          errno.ELOOP, errno.ENXIO, errno.ENOTEMPTY, errno.EEXIST)
    return FileSafetyError(f"cannot {doing}: {exc.strerror or exc}", path=path,
                           exit_code=None if usage else EXIT_CANNOT_RUN)


def fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_folder(folder: str, shown: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileSafetyError(f"folder {folder} does not exist (nodewarden does not create it)",
                              path=shown) from None
    except NotADirectoryError:
        raise FileSafetyError(f"{folder} is not a folder", path=shown) from None
    except OSError as exc:
        raise _os_error(exc, shown, f"open the folder {folder}") from None


def _temp_name(name: str) -> str:
    import secrets  # here, not at import: it pulls in hashlib (OpenSSL), random, base64

    return f".{name[:200]}.{secrets.token_hex(6)}.tmp"


def remove_temp_files(path: str | Path, *, dir_fd: int | None = None, min_age_s: float = 0.0,
                      own_only: bool = False) -> list[str]:
    """Delete the temporary files a killed `replace_file` of `path` left in its folder.

    Only names of our own pattern for exactly this file, only regular files (never a symlink
    someone planted under such a name), only in the folder as opened without following links
    (or the folder `dir_fd` already held, where `path` is just the file's name in it). A writer
    that may share the folder with another live writer passes `min_age_s` (their names carry no
    pid: age is what tells a killed write from one in flight) and `own_only` (our euid's files).
    """
    folder, name = os.path.split(os.fspath(path))
    pattern = re.compile(rf"^\.{re.escape(name[:200])}\.[0-9a-f]{{12}}\.tmp$")
    try:
        fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return []
    removed = []
    try:
        now = time.time()
        for entry in os.listdir(fd):
            if not pattern.match(entry):
                continue
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= min_age_s and (
                    not own_only or st.st_uid == os.geteuid()):
                os.unlink(entry, dir_fd=fd)
                removed.append(entry)
        if removed:
            os.fsync(fd)
    finally:
        os.close(fd)
    return removed


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, or an OSError: a short write is retried, a write of nothing is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no space left on device (short write)")
        view = view[written:]


write_all = _write_all  # for the journal, which appends rather than replaces


def create_file(root: Path, rel: str, data: bytes | str | Iterable[bytes]) -> None:
    """A new file `rel` inside `root`, a private folder being filled (`new_output_dir`): a snapshot
    being captured or imported. Never through a link and never over a file (O_EXCL | O_NOFOLLOW),
    never outside `root` (`rel` is relative, without `..`), folders on the way made 0755; `data`
    whole or in parts (a kernel log is written in pieces, never one more copy in memory)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        raise FileSafetyError(f"refusing to create {rel!r} (not a plain relative path)", path=str(root))
    target = root.joinpath(*parts)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        for part in [data] if isinstance(data, (bytes, str)) else data:
            _write_all(fd, _as_bytes(part))
    finally:
        os.close(fd)


def _replace_in(dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int] | None, shown: str) -> None:
    """Atomically replace `name` inside the folder `dir_fd` (see the module docstring)."""
    _replace_in_chunks(dir_fd, name, (data,), mode, owner, shown)


def _replace_in_chunks(dir_fd: int, name: str, chunks: Iterable[bytes | str], mode: int,
                       owner: tuple[int, int] | None, shown: str) -> None:
    """`_replace_in` of the concatenated `chunks`, written as they come (never joined in memory)."""
    for _attempt in range(16):
        tmp = _temp_name(name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            break
        except FileExistsError:
            continue  # someone holds that name (maybe a planted symlink): never touch it, pick another
    else:
        raise FileSafetyError("cannot create a temporary file: every name tried exists", path=shown)
    try:
        try:
            pending: list[bytes] = []
            size = 0
            for chunk in chunks:  # a failure here (the producer raised) leaves the old file in place
                data = _as_bytes(chunk)
                pending.append(data)
                size += len(data)
                if size >= _WRITE_BATCH:
                    _write_all(fd, b"".join(pending))
                    pending, size = [], 0
            if pending:
                _write_all(fd, b"".join(pending) if len(pending) > 1 else pending[0])
            if owner is not None:
                with contextlib.suppress(PermissionError):  # not root: the new file stays ours
                    os.fchown(fd, owner[0], owner[1])
            os.fchmod(fd, mode & 0o777)  # after fchown, which may clear bits; never setuid/setgid
            os.fsync(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                # Only our own inode: a name swapped under us is left to whoever swapped it.
                if os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
        ours, now = os.fstat(fd), os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino):
            raise FileSafetyError("was replaced by another process while nodewarden wrote it (its folder is "
                                  "writable by others); the output is not what nodewarden wrote",
                                  path=shown, exit_code=EXIT_CANNOT_RUN)
    finally:
        os.close(fd)


def replace_file(path: str | Path, data: bytes | str, mode: int, *, owner: tuple[int, int] | None = None) -> None:
    """Replace (or create) the regular file `path` atomically with `data`, mode `mode`.

    The folder must exist. Whatever is at `path` (file, symlink) is replaced by
    rename, never written through. `owner` (uid, gid) is applied when we may.
    """
    text = os.fspath(path)
    folder, name = os.path.split(text)
    dir_fd = _open_folder(folder or ".", text)
    try:
        _replace_in(dir_fd, name, _as_bytes(data), mode, owner, text)
    finally:
        os.close(dir_fd)


def _write_stream(fd: int, data: bytes) -> None:
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    if stream is not None:
        stream.flush()
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
        else:
            stream.write(data.decode("utf-8", "replace"))
        stream.flush()
        return
    _write_all(fd, data)


def _folder_trusted(st: os.stat_result, link_owner: int) -> bool:
    """May an entry owned by `link_owner` in this folder be trusted not to change under us?"""
    if not _trusted_owner(st.st_uid) or not _trusted_owner(link_owner):
        return False
    return not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or bool(st.st_mode & stat.S_ISVTX)


def _write_special(dir_fd: int, name: str, st: os.stat_result, data: bytes, shown: str) -> None:
    """A character device or FIFO: open the very node we looked at and write to it; never replace it."""
    if stat.S_ISFIFO(st.st_mode) and not _folder_trusted(os.fstat(dir_fd), st.st_uid):
        raise FileSafetyError("is a FIFO another user made in a folder others can write; refusing to write "
                              "to it (a reader that never comes would hang nodewarden)", path=shown)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise _os_error(exc, shown, "open it for writing") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise FileSafetyError("changed while nodewarden opened it; not written", path=shown)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_socket(path: str, data: bytes, shown: str) -> None:
    import socket  # only for an output that is a Unix socket

    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_UNIX, kind) as sock:
            try:
                sock.connect(path)
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:
                    continue
                raise _os_error(exc, shown, "connect to the socket") from None
            sock.sendall(data)
            return
    raise FileSafetyError("is a socket nodewarden cannot write to", path=shown)


def write_output(path: str | Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Write `data` to a path the user named (`--output`, `--out`), by the rules in the module docstring.

    `mode` is for a new file; an existing regular file keeps its own mode and owner.
    """
    payload = _as_bytes(data)
    text = os.fspath(path)
    if text == "-":
        _write_stream(1, payload)
        return
    shown = text
    for _hop in range(_MAX_LINKS + 1):
        fd_match = _FD_PATH_RE.match(text)
        stream = int(fd_match.group(1)) if fd_match else _STD_STREAMS.get(text)
        if stream is not None:
            _write_stream(stream, payload)  # what a shell redirection to that name means
            return
        folder, name = os.path.split(text)
        if not name or name in (".", ".."):
            raise FileSafetyError("names a folder, not a file", path=shown)
        dir_fd = _open_folder(folder or ".", shown)
        try:
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except OSError as exc:
                raise _os_error(exc, shown, "look at it") from None
            if st is not None and stat.S_ISLNK(st.st_mode):
                if _folder_trusted(os.fstat(dir_fd), st.st_uid):
                    target = os.readlink(name, dir_fd=dir_fd)
                    text = target if os.path.isabs(target) else os.path.join(folder or ".", target)
                    continue  # a link root or we made where nobody else can change it: follow it
                st = None  # planted where others can write: replace the link itself, never its target
            if st is None:
                _replace_in(dir_fd, name, payload, mode, None, shown)
            elif stat.S_ISREG(st.st_mode):
                _replace_in(dir_fd, name, payload, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid), shown)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
                _write_special(dir_fd, name, st, payload, shown)
            elif stat.S_ISSOCK(st.st_mode):
                _write_socket(os.path.join(folder or ".", name), payload, shown)
            elif stat.S_ISDIR(st.st_mode):
                raise FileSafetyError("is a folder; name a file", path=shown)
            else:
                raise FileSafetyError("is a block device; refusing to write to it", path=shown)
            return
        except OSError as exc:
            raise _os_error(exc, shown, "write it") from None
        finally:
            os.close(dir_fd)
    raise FileSafetyError(f"more than {_MAX_LINKS} symlinks to follow", path=shown)


def write_output_stream(path: str | Path, chunks: Iterable[bytes | str], *, mode: int = 0o644) -> None:
    """`write_output` of the concatenation of `chunks`, for outputs made in pieces (the fleet report).

    A missing or regular file at `path` is replaced exactly as `write_output` replaces it (a
    temporary file made O_EXCL|O_NOFOLLOW in the same folder, fchown/fchmod on its descriptor,
    fsync, rename, folder fsync, inode check), but the chunks are written as they come, never
    joined in memory; if producing them fails, the temporary file is removed and the old file
    stays. Anything else at `path` (stdout, a descriptor path, a device, a FIFO, a socket, a
    symlink) is handed to `write_output` whole, by its rules.
    """
    text = os.fspath(path)
    folder, name = os.path.split(text)
    if (text != "-" and _FD_PATH_RE.match(text) is None and text not in _STD_STREAMS
            and name not in ("", ".", "..")):
        dir_fd = _open_folder(folder or ".", text)
        try:
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except OSError as exc:
                raise _os_error(exc, text, "look at it") from None
            if st is None or stat.S_ISREG(st.st_mode):
                owner = None if st is None else (st.st_uid, st.st_gid)
                try:
                    _replace_in_chunks(dir_fd, name, chunks, mode if st is None else stat.S_IMODE(st.st_mode),
                                       owner, text)
                except OSError as exc:
                    raise _os_error(exc, text, "write it") from None
                return
        finally:
            os.close(dir_fd)
    write_output(path, b"".join(_as_bytes(chunk) for chunk in chunks), mode=mode)


# --- folders nodewarden trusts (the remediation state) ------------------------------------------


def _check_dir(path: str, st: os.stat_result, *, final: bool, what: str, named: str) -> None:
    if not _trusted_owner(st.st_uid):
        raise FileSafetyError(f"unsafe {what}: {path} is owned by uid {st.st_uid}, not root or the running "
                              "user (another user could plant files nodewarden acts on)", path=named)
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (final or not st.st_mode & stat.S_ISVTX):
        who = "group and others" if writable == (stat.S_IWGRP | stat.S_IWOTH) else (
            "its group" if writable & stat.S_IWGRP else "others")
        sticky = " (sticky folders are acceptable only above it)" if final and st.st_mode & stat.S_ISVTX else ""
        raise FileSafetyError(f"unsafe {what}: {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
                              f"{sticky}; remove that write permission or choose another folder "
                              "(nodewarden never changes an existing folder's mode)", path=named)


def _walk(path: str, what: str) -> tuple[str, os.stat_result | None]:
    """Resolve `path` one entry at a time, checking each folder and symlink on the way.

    Returns the real path and its lstat (None when only the last entry is missing).
    """
    text = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    pending = [c for c in reversed(text.split("/")) if c not in ("", ".")]
    current = "/"
    st = os.lstat("/")
    _check_dir("/", st, final=False, what=what, named=path)
    links = 0
    while pending:
        part = pending.pop()
        if part == "..":
            current = os.path.dirname(current)
            st = os.lstat(current)
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if pending:
                raise FileSafetyError(f"{what}: folder {candidate} does not exist "
                                      "(nodewarden does not create missing parents)", path=path) from None
            return candidate, None
        except OSError as exc:
            raise _os_error(exc, path, f"use the {what}") from None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_WALK_LINKS:
                raise FileSafetyError(f"{what}: too many symlinks", path=path)
            if not _trusted_owner(st.st_uid):
                raise FileSafetyError(f"unsafe {what}: the symlink {candidate} is owned by uid {st.st_uid}, "
                                      "not root or the running user", path=path)
            target = os.readlink(candidate)
            if os.path.isabs(target):
                current = "/"
            pending.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
            continue
        if not stat.S_ISDIR(st.st_mode):
            kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a folder"
            raise FileSafetyError(f"{what}: {candidate} is {kind}", path=path)
        _check_dir(candidate, st, final=False, what=what, named=path)
        current = candidate
    _check_dir(current, st, final=True, what=what, named=path)
    return current, st


def trusted_dir(path: str | Path, *, create: bool = False, what: str = "state directory",
                mode: int = 0o700) -> Path:
    """The real path of a folder safe to keep root's state in; created (mode 0700) only when asked.

    Refused (exit 2, naming the path): a parent or the folder owned by someone
    other than root or the running user, group/other-writable (a sticky parent
    like /tmp is fine; the folder itself never), a device or file in its place,
    a missing parent. An existing folder's mode is never changed. Raises
    FileNotFoundError when the folder is missing and `create` is false. `mode` (never group/other
    writable) is for a folder another user must read, whatever the umask.
    """
    real, st = _walk(os.fspath(path), what)
    if st is None:
        if not create:
            raise FileNotFoundError(errno.ENOENT, "no such folder", real)
        try:
            os.mkdir(real, mode & 0o755)
            os.chmod(real, mode & 0o755)  # the umask narrows mkdir's mode; a new folder gets what was asked
        except FileExistsError:
            pass  # made meanwhile: judged below like any existing folder
        except OSError as exc:
            raise _os_error(exc, os.fspath(path), f"create the {what}") from None
        real, st = _walk(real, what)
        if st is None:
            raise FileSafetyError(f"{what} vanished while being created", path=os.fspath(path))
    return Path(real)


def open_lock_file(path: str | Path) -> int:
    """Open (creating, mode 0600) a lock file without following a symlink; it must be ours or root's."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, 0o600)
    except OSError as exc:
        raise _os_error(exc, os.fspath(path), "open the lock") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st.st_uid):
        os.close(fd)
        raise FileSafetyError("the lock is not a regular file of root or the running user", path=os.fspath(path))
    return fd


def create_private_file(path: str | Path) -> None:
    """A new empty file, mode 0600, for a program that then opens it by name and updates it in place (the
    ledger's SQLite): never through a link, never over an existing file (O_EXCL|O_NOFOLLOW), never
    wider than 0600 whatever the umask. The folder must already be trusted (agent.state.layout)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, 0o600)
    except OSError as exc:
        raise _os_error(exc, os.fspath(path), "create") from None
    try:
        os.fchmod(fd, 0o600)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(os.fspath(path)) or ".")


def open_dir_nofollow(path: str | Path) -> int:
    """A descriptor of the folder itself (to flock it); a symlink in its place is refused."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(exc, os.fspath(path), "open the folder to lock it") from None


# --- new output folders (snapshots) and writes beneath a held folder -----------------------------


def replace_at(dir_fd: int, name: str, data: bytes | str, mode: int, *, shown: str,
               owner: tuple[int, int] | None = None) -> None:
    """`replace_file` of `name` inside a folder already held by descriptor (agent.io.dirfd.open_dir)."""
    _replace_in(dir_fd, name, _as_bytes(data), mode, owner, shown)


def check_folder(st: os.stat_result, path: str, *, what: str, named: str) -> None:
    """Refuse (exit 2) a folder another user could change under us: owned by someone other than root
    or the running user, or group/other-writable without the sticky bit."""
    _check_dir(path, st, final=False, what=what, named=named)


open_folder, os_error = _open_folder, _os_error  # for agent.io.fsout, which builds output folders
