"""A hostile local user for race tests: `nobody` swapping folders with symlinks, in its own process.

The swap is renameat2(RENAME_EXCHANGE): both names always exist, so the victim's every
path lookup sees either the real folder or the symlink, never a gap (what the attacker
of issue 21 did). Tests run as root here; the child drops to `nobody` before it starts.

Two modes: `pair A B` exchanges A and B as fast as it can (a folder and a symlink beside
it); `prefix DIR PREFIX TARGET` waits for each new real folder in DIR whose name starts
with PREFIX (a writer's temporary folder) and exchanges it with a fresh symlink to TARGET.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import stat
import time
from pathlib import Path
from types import TracebackType
from typing import Any

_EXCHANGE = 2  # RENAME_EXCHANGE
_AT_FDCWD = -100


def _exchange(renameat2: Any, a: str, b: str) -> int:
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _EXCHANGE) != 0:
        return ctypes.get_errno()
    return 0


def _loop(mode: str, seconds: float, args: list[str]) -> int:
    """The attacker's loop (in the child, as nobody): the number of swaps it made."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = libc.renameat2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    end = time.monotonic() + seconds
    rounds = 0
    if mode == "pair":
        while time.monotonic() < end:
            err = _exchange(renameat2, args[0], args[1])
            if err:
                raise OSError(err, os.strerror(err))
            rounds += 1
        return rounds
    folder, prefix, target = args
    seen: set[str] = set()
    while time.monotonic() < end:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name in seen or not name.startswith(prefix):
                continue
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    continue
            except OSError:
                continue
            link = os.path.join(folder, f"planted-{rounds}")
            os.symlink(target, link)
            if _exchange(renameat2, path, link) == 0:
                seen.add(name)
                rounds += 1
            else:
                os.unlink(link)
    return rounds


def nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


class Swapper:
    """`with Swapper("pair", seconds, a, b) as s:` ... `s.rounds` afterwards (how many swaps it made).

    A forked child that drops to `nobody` (no exec: the interpreter may sit where nobody cannot
    read it) and reports its count, or its error, through a pipe.
    """

    def __init__(self, mode: str, seconds: float, *args: str | Path) -> None:
        uid, gid = nobody()
        self.seconds, self.rounds = seconds, 0
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the attacker
            status = 1
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                os.write(write_end, b"ready\n")
                result = f"ok {_loop(mode, seconds, [str(a) for a in args])}\n"
                status = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever it is
                result = f"error {exc!r}\n"
            finally:
                with contextlib.suppress(BaseException):
                    os.write(write_end, result.encode())
                os._exit(status)
        os.close(write_end)
        self._pid = pid
        self._pipe = os.fdopen(read_end, "r")
        ready = self._pipe.readline()
        if ready != "ready\n":
            self._reap()
            raise RuntimeError(f"swapper did not start: {ready or self._pipe.read()}")
        self._end = time.monotonic() + seconds

    def running(self) -> bool:
        return time.monotonic() < self._end

    def _reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._pid, 0)

    def __enter__(self) -> Swapper:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        report = self._pipe.read()
        self._pipe.close()
        self._reap()
        if kind is None:
            assert report.startswith("ok "), report
            self.rounds = int(report.split()[1])
