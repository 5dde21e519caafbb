"""The load's guard: the load dies with `accept`, even when accept is killed with SIGKILL (issue 30.9).

`accept` starts this file (`python -I load_guard.py FD GRACE -- PROGRAM ARGS...`) as the leader of a
session of its own, holding the read end of a pipe whose write end only accept holds. The guard
runs the load in its own process group, so every process the load starts (gpu-burn forks one per
GPU) is in that group too. When accept ends in any way, the kernel closes the write end: the guard
reads EOF and stops the whole group, SIGTERM, then SIGKILL after GRACE seconds. PR_SET_PDEATHSIG
alone would reach the load's first process only, not the workers it forked.

The guard ignores SIGTERM, which accept's own stop sends to the group: the load gets it and ends,
and the guard then ends as the load did (its exit status, or the same signal), so accept reports the
load's end unchanged. Standard library only, and nothing but this file is imported: it runs isolated.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def _end_like(code: int) -> None:
    """Exit as the load did: the same status, or killed by the same signal."""
    sys.stdout.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # a signal that does not end a process by default (SIGCHLD...): exit instead
        os._exit(128 - code)
    os._exit(code)


def _stop_group(load: subprocess.Popen[bytes], grace_s: float) -> None:
    """accept is gone: SIGTERM to the group (the guard ignores it), SIGKILL after the grace period."""
    group = os.getpgrp()
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while load.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # what is left of the group, the guard with it


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: load_guard.py FD GRACE_S -- PROGRAM [ARGS...]\n")
        return 2
    fd, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the load's to act on; the guard follows the load
    try:
        load = subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True,
                                preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))  # noqa: PLW1509
    except OSError as exc:
        sys.stderr.write(f"{command[0]}: {exc.strerror or exc}\n")
        return 127
    while True:
        code = load.poll()
        if code is not None:
            _end_like(code)
        readable, _, _ = select.select([fd], [], [], 0.2)
        if readable and not os.read(fd, 1):  # EOF: accept, the only writer, has ended
            _stop_group(load, grace_s)
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
