"""Folders held by descriptor: the walk, rename and removal agent.io.fsutil builds its writers on.

Why: a path is resolved again by every system call that takes it, so a check of
`a/b` followed by a write to `a/b/c` can land wherever `b` points by then (a
user who can write `a` swaps `b` for a symlink between the two calls). Each
folder is therefore opened once, one component at a time with O_NOFOLLOW, and
every later step (mkdir, create, rename, unlink) is made relative to that
descriptor, where no rename elsewhere can redirect it.

Floor 1 of the layout: the standard library only; errors are plain OSErrors
(agent.io.fsutil turns them into operator messages).
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import posixpath
import stat
from collections.abc import Callable, Sequence
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_MAX_LINKS = 40
# renameat2(2): 316 on x86_64, 276 on the unified table (aarch64, riscv64); others use the fallback.
_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276}
_state: dict[str, Any] = {}

# `check(st, shown)` raises when a folder on the way may not be trusted; `follow(dir_fd, st, shown)`
# says whether a symlink met on the way may be followed (None: never).
Check = Callable[[os.stat_result, str], None]
Follow = Callable[[int, os.stat_result, str], bool]


def renameat2(src_fd: int, src: str, dst_fd: int, dst: str, flags: int) -> None:
    """renameat2(2) through libc's syscall(); OSError(ENOSYS) where it cannot be called."""
    call: Any = _state.get("call")
    if call is None:
        import ctypes

        number = _RENAMEAT2.get(platform.machine())
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
        except (OSError, AttributeError):
            number = None
        if number is None:
            call = _state["call"] = False
        else:
            syscall.restype = ctypes.c_long
            syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                ctypes.c_uint]
            call = _state["call"] = (number, syscall, ctypes.get_errno)
    if call is False:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    number, syscall, get_errno = call
    if syscall(number, src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), flags) != 0:
        err = get_errno()
        raise OSError(err, os.strerror(err), dst)


def _parts(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


def open_dir(root_fd: int, rel: str, *, check: Check, make: int | None = None, follow: Follow | None = None,
             shown: str = "") -> tuple[int, list[str]]:
    """The folder `rel` beneath `root_fd`, opened one component at a time without following links.

    Every folder on the way (the root included) is passed to `check`. A missing folder is
    made (mode `make`) when `make` is given, and its relative path listed in the second
    value. A symlink is followed only where `follow` allows it, resolved lexically from the
    root (`..` stops there, an absolute target starts there): nothing outside `root_fd` is
    reached. Raises OSError (ELOOP for a refused link, ENOENT, ENOTDIR, EACCES...).
    """
    check(os.fstat(root_fd), shown or ".")
    pending = list(reversed(_parts(rel)))
    done: list[str] = []
    created: list[str] = []
    fd = os.open(".", DIR_FLAGS, dir_fd=root_fd)
    links = 0
    try:
        while pending:
            part = pending.pop()
            if part == "..":  # lexical, like a recorded link: re-walk the shorter path from the root
                pending.extend(reversed(done[:-1]))
                done = []
                os.close(fd)
                fd = os.open(".", DIR_FLAGS, dir_fd=root_fd)
                continue
            here = posixpath.join(shown, *done, part)
            try:
                new = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if make is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), here) from None
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened and judged below
                    os.mkdir(part, make, dir_fd=fd)
                    created.append("/".join([*done, part]))
                new = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise OSError(exc.errno, exc.strerror, here) from None
                links += 1
                if follow is None or links > _MAX_LINKS or not follow(fd, st, here):
                    raise OSError(errno.ELOOP, f"refused: {here} is a symlink nodewarden does not follow "
                                               "(it could lead anywhere)", here) from None
                target = os.readlink(part, dir_fd=fd)
                base = [] if target.startswith("/") else done
                pending.extend(reversed([*base, *_parts(target)]))
                done = []
                os.close(fd)
                fd = os.open(".", DIR_FLAGS, dir_fd=root_fd)
                continue
            try:
                check(os.fstat(new), here)
            except BaseException:
                os.close(new)
                raise
            os.close(fd)
            fd, done = new, [*done, part]
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def empty_tree(dir_fd: int, depth: int = 0) -> None:
    """Remove everything inside the folder `dir_fd`, by descriptor and never through a link."""
    for name in os.listdir(dir_fd):
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            os.unlink(name, dir_fd=dir_fd)  # a file, link, FIFO...: the entry itself
            continue
        try:
            if depth > 256:
                raise OSError(errno.ELOOP, "folders nested too deep to remove", name)
            empty_tree(sub, depth + 1)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dir_fd)


def remove_held_dir(parent_fd: int, name: str, held_fd: int) -> None:
    """Remove the folder we hold open as `held_fd`, known in `parent_fd` as `name`: its contents by
    descriptor, the name only while it is still that folder (a name swapped under us is left alone)."""
    with contextlib.suppress(OSError):
        empty_tree(held_fd)
    with contextlib.suppress(OSError):
        if same_file(os.stat(name, dir_fd=parent_fd, follow_symlinks=False), os.fstat(held_fd)):
            os.rmdir(name, dir_fd=parent_fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process holds that number
    return True


def stale_dirs(parent_fd: int, names: Sequence[str], pid_of: Callable[[str], int | None],
               started: float) -> list[str]:
    """Those of `names` in `parent_fd` that a dead run of ours left: our own real folders (not
    links), made before this process started, by a process (`pid_of(name)`) that is gone."""
    found = []
    for name in names:
        pid = pid_of(name)
        if pid is None or pid == os.getpid():
            continue
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            continue
        if (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mtime < started
                and not pid_alive(pid)):
            found.append(name)
    return found
