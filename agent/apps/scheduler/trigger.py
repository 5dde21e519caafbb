"""The event-driven gate's trigger (issue 30.11): a fault the daemon sees reaches Slurm in seconds,
not at the next HealthCheckInterval.

The daemon (unprivileged) cannot run scontrol as root, and must not: so it only says that the
verdict changed, by rewriting verdict.json beside daemon.json (agent.apps.scheduler.state). Something
root then runs one event gate, `nodewarden health-check --slurm --event`: the daemon's state file
by the usual trust and freshness rules, the same policy, breaker, ownership, deadline and trail as
the periodic check, the node's gate lock, and drains only (resuming stays with the periodic check's
hysteresis). Two triggers start it:

* systemd: nodewarden-gate.path (PathChanged= on verdict.json) starts nodewarden-gate.service;
* without systemd as PID 1 (containers, CI, other inits): `nodewarden health-check --slurm --follow`,
  this module: a root process that stats verdict.json every POLL_S (nothing of it is read: a change
  is all it says) and runs the same command as its own process per change. Runs are one at a time;
  changes during a run make one more run after it. A run is never killed half-way by a stop (a
  drain between its update and the breaker's re-count must finish); only its own time limit ends it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.apps.scheduler.state import VERDICT_FILE
from agent.core.errors import NodewardenError
from agent.io.programs import run_bounded
from agent.state.layout import daemon_folder

log = logging.getLogger("nodewarden.scheduler")

POLL_S = 0.1  # a stat of one file ten times a second: the trigger's whole cost
MAX_OUTPUT = 4096  # of a run's output kept for the log line
Stamp = tuple[int, int, int]  # inode, mtime (ns), size: replace_file gives every write a new inode


def stamp(state_dir: Path) -> Stamp | None:
    """The verdict file's identity now, or None (no daemon yet, or a folder that is not trusted)."""
    try:
        st = os.stat(daemon_folder(state_dir, create=False) / VERDICT_FILE, follow_symlinks=False)
    except (OSError, NodewardenError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def run_once(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """One event gate as its own process (its own session: a run over its limit dies whole)."""
    ran = run_bounded(argv, timeout_s=timeout_s, merge_stderr=True, keep_tail=True, max_output=MAX_OUTPUT)
    if ran.code is None:
        return -1, f"could not start the gate: {ran.failure}"
    if ran.failure:
        return -9, f"the gate ran past {timeout_s:g} s and was killed"
    text = ran.stdout.decode("utf-8", "replace").strip()
    return ran.code, text.splitlines()[-1] if text else ""


def follow(state_dir: Path, argv: Sequence[str], stop: threading.Event, *, timeout_s: float,
           poll_s: float = POLL_S, on_run: Callable[[int, str], None] | None = None,
           run: Callable[[Sequence[str], float], tuple[int, str]] = run_once) -> int:
    """Run `argv` once now if the verdict file exists (a change missed while nobody watched), then once
    per change of it, until `stop` is set. Returns how many runs were made."""
    runs = 0
    last: Stamp | None = None
    first = True
    while not stop.is_set():
        now = stamp(state_dir)
        if now is not None and (first or now != last):
            last, first = now, False
            started = time.monotonic()
            code, said = run(argv, timeout_s)
            runs += 1
            log.info("event gate: exit %d in %.2f s: %s", code, time.monotonic() - started, said,
                     extra={"fields": {"event": "event_gate", "exit": code, "said": said}})
            if on_run is not None:
                on_run(code, said)
            continue  # a change while it ran: looked at at once
        stop.wait(poll_s)
    return runs
