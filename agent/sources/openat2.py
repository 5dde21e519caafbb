"""openat2(2) confined to a folder: one race-free open of a path at any depth beneath it.

`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` makes the kernel refuse,
atomically during its own path walk, any symlink on the way and any step out of the
folder (`..` past it, an absolute link). That is what `SnapshotFs` otherwise does by
opening every component with O_NOFOLLOW: the same guarantee in one system call instead
of one per component (a snapshot's ~1,500 files sit in ~1,500 different folders, so the
component walk cost a third of reading a node).

Python has no wrapper (as of 3.13), so it is called through libc's `syscall()`. Linux
5.6 or later; where the call is missing (older kernel, a seccomp filter, another OS,
an architecture with another number) `available()` is False and callers walk components.
"""

from __future__ import annotations

import errno
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
CONFINED = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

# 437 on every architecture using the unified syscall table since Linux 5.1 (x86_64,
# aarch64, ppc64le, s390x, riscv64); others are left to the component walk.
_NUMBERS = {"x86_64": 437, "aarch64": 437, "ppc64le": 437, "s390x": 437, "riscv64": 437}

_state: dict[str, Any] = {}  # "call": the bound caller, or False once known to be unusable
_hows: dict[int, tuple[Any, int]] = {}  # flags -> (prepared `struct open_how`, its address)


def _setup() -> Any:
    number = _NUMBERS.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        _state["call"] = False
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        _state["call"] = False
        return False
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    size = ctypes.sizeof(OpenHow)
    get_errno, strerror = ctypes.get_errno, os.strerror

    def call(dir_fd: int, path: str, flags: int) -> int:
        how = _hows.get(flags)
        if how is None:  # one prepared `struct open_how` per flag set, kept alive here
            prepared = OpenHow(flags | os.O_CLOEXEC, 0, CONFINED)
            how = _hows[flags] = (prepared, ctypes.addressof(prepared))
        fd: int = syscall(number, dir_fd, path.encode("utf-8", "surrogateescape"), how[1], size)
        if fd < 0:
            err = get_errno()
            raise OSError(err, strerror(err))
        return fd

    _state["call"] = call
    return call


def opener() -> Callable[[int, str, int], int] | None:
    """`open_beneath` itself (for a hot loop), or None where openat2 cannot be called."""
    call = _state["call"] if "call" in _state else _setup()
    return None if call is False else call


def open_beneath(dir_fd: int, path: str, flags: int) -> int:
    """Open `path` (relative, no NUL) beneath `dir_fd`: no symlink followed, nothing outside reached.

    Raises OSError: ELOOP for a symlink on the way, EXDEV for a step out of the folder,
    ENOSYS where openat2 cannot be called. O_CLOEXEC is always added.
    """
    call = opener()
    if call is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    return call(dir_fd, path, flags)


def available(dir_fd: int) -> bool:
    """Whether openat2 works here (probed by opening `dir_fd`'s own folder)."""
    try:
        os.close(open_beneath(dir_fd, ".", os.O_RDONLY | os.O_DIRECTORY))
    except OSError:
        return False
    return True
