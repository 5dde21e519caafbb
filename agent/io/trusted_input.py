"""Reading the files that decide what root writes: site profiles, overrides, waivers, the config.

Whoever can change such a file chooses what `remediate --apply` writes as root (a profile asking
for `kernel.core_pattern = |/tmp/x`), so it is read only when nobody but root or the running user
could have written it: the rule the state dir already follows (agent.io.fsutil.trusted_dir, sshd's
StrictModes). The file must be a regular file owned by root or the running user and writable by
nobody else; so must each folder above it, up to the first root-owned folder nobody else can
write (that one ends the chain: nobody else can rename what lies below it). A sticky
world-writable folder such as /tmp is acceptable above the file's own folder only, never as it:
anybody could add a profile there. A symlink on the way must be root's or ours, in a folder
others cannot change. The file is opened without following a link and judged by the descriptor
its bytes are then read from, so what was checked is what is parsed.

Floor 2: imports agent.core.errors only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.core.errors import NodewardenError
from agent.io.jsonfile import read_fd

_WRITABLE = stat.S_IWGRP | stat.S_IWOTH
_MAX_LINKS = 40  # as the kernel allows in one path


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _who_writes(mode: int) -> str:
    writable = mode & _WRITABLE
    return "group and others" if writable == _WRITABLE else ("its group" if writable & stat.S_IWGRP else "others")


def _judge(st: os.stat_result, shown: str, what: str, *, own_folder: bool, error: type[NodewardenError],
           named: str) -> None:
    if not _trusted_owner(st.st_uid):
        raise error(f"unsafe {what}: {shown} is owned by uid {st.st_uid}, not root or the user running "
                    "nodewarden (another user could choose what nodewarden writes as root)", path=named)
    if st.st_mode & _WRITABLE and (own_folder or not st.st_mode & stat.S_ISVTX):
        raise error(f"unsafe {what}: {shown} is writable by {_who_writes(st.st_mode)} (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}); remove that write permission (chmod go-w) or move it",
                    path=named)


def _resolve(path: str, what: str, error: type[NodewardenError]) -> str:
    """The real path of `path`, one entry at a time; each symlink on the way (links to links
    included) must be root's or ours, in a folder others cannot change (sticky is enough)."""
    pending = [c for c in reversed(path.split("/")) if c not in ("", ".")]
    current, links = "/", 0
    while pending:
        part = pending.pop()
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except OSError:
            return os.path.join(candidate, *reversed(pending))  # the open below names what is missing
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        links += 1
        if links > _MAX_LINKS:
            raise error(f"unsafe {what}: more than {_MAX_LINKS} symlinks on the way", path=path)
        if not _trusted_owner(st.st_uid):
            raise error(f"unsafe {what}: the symlink {candidate} is owned by uid {st.st_uid}, not root or the "
                        "user running nodewarden", path=path)
        folder = os.lstat(current)
        if folder.st_mode & _WRITABLE and not folder.st_mode & stat.S_ISVTX:
            raise error(f"unsafe {what}: the symlink {candidate} sits in a folder writable by "
                        f"{_who_writes(folder.st_mode)}", path=path)
        target = os.readlink(candidate)
        if target.startswith("/"):
            current = "/"
        pending.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
    return current


def real_path(path: str, what: str, error: type[NodewardenError]) -> str:
    """`path` with every symlink resolved, each judged on the way (for a program run, not read)."""
    return _resolve(path, what, error)


def judge_file(st: os.stat_result, shown: str, what: str, error: type[NodewardenError], named: str) -> None:
    """The file's own owner and mode, by the rule above (the folders: check_folders)."""
    _judge(st, shown, what, own_folder=True, error=error, named=named)


def check_folders(folder: str, what: str, error: type[NodewardenError], named: str) -> None:
    """`folder` (a real path) and its parents up to a root-owned one nobody else can write."""
    current, own = folder, True
    while True:
        try:
            st = os.lstat(current)
        except OSError as exc:
            raise error(f"cannot check the folder {current}: {exc.strerror}", path=named) from None
        _judge(st, current, what, own_folder=own, error=error, named=named)
        if (st.st_uid == 0 and not st.st_mode & _WRITABLE) or current == "/":
            return
        current, own = os.path.dirname(current), False


def read_trusted(path: Path, max_bytes: int, what: str, error: type[NodewardenError]) -> bytes:
    """The bytes of `path` (at most `max_bytes + 1`), if it and its folders pass the rules above."""
    real = _resolve(os.path.abspath(path), what, error)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", path=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"the {what} is not a regular file", path=str(path))
        _judge(st, real, what, own_folder=True, error=error, named=str(path))
        check_folders(os.path.dirname(real), what, error, str(path))
        return read_fd(fd, max_bytes)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", path=str(path)) from None
    finally:
        os.close(fd)
