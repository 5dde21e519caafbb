"""Peer processes (ipmi_sim, sushy, mitmdump, prometheus, alertmanager, ...) that never outlive the test run.

Every peer is started by `spawn`: in a session of its own (`start_new_session=True`, so its process
group is its PID and `stop` takes the peer's own children with it by `killpg`), with
PR_SET_PDEATHSIG (the kernel sends it SIGTERM if pytest dies, even by SIGKILL), and recorded here
until `stop` reaps it. Fixtures stop their peers in their finalizers; as a safety net for the runs
that end otherwise, `stop_all` runs at interpreter exit (atexit), at the end of the pytest session
(tests/conftest.py) and on SIGTERM and SIGHUP (a `timeout`, a closed terminal), after which the
signal does what it did before. Ctrl-C (SIGINT) becomes KeyboardInterrupt: pytest tears the
fixtures down, and atexit catches what is left. Only the processes started here are signalled,
each by its own process group, never by name. The handlers are Python's, run by the main thread
between bytecodes: a test blocked in one long system call (a 300 s `time.sleep`) may see a signal
that landed just before the call only when the call returns, so waits in tests are kept short.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any

STOP_TIMEOUT_S = 5.0
SAFETY_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

# pid -> (peer, the PID of the process that started it): a forked worker (multiprocessing) inherits this
# table and the signal handlers, and must never stop its parent's peers.
_live: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
_lock = threading.Lock()
_state = {"atexit": False}  # the atexit hook is registered once per process
_previous: dict[int, Any] = {}


def die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan if pytest is killed


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen(argv, **popen) in its own session, recorded for `stop_all` (stdin defaults to /dev/null).

    Call it from the thread that outlives the peer (the main thread, in fixtures): the kernel's
    parent-death signal follows the thread that forked.
    """
    install_safety_net()
    popen.setdefault("stdin", subprocess.DEVNULL)
    proc: subprocess.Popen[bytes] = subprocess.Popen(
        argv, start_new_session=True, preexec_fn=die_with_parent, **popen)  # noqa: PLW1509
    with _lock:
        _live[proc.pid] = (proc, os.getpid())
    return proc


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the peer's process group (its PID: it leads its own session), or the peer if the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            if proc.poll() is None:
                proc.send_signal(sig)


def _exited(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until the peer exits, without reaping it: while it is a zombie its process group id stays
    its own, so the group can still be signalled without any risk of hitting a reused PID."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.returncode is not None:
            return True
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # reaped elsewhere
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the peer's process group, SIGKILL after `timeout_s`; what is left of the group is
    killed before the peer is reaped (a worker, a shell's child). Idempotent."""
    try:
        if proc.returncode is None:
            _signal_group(proc, signal.SIGTERM)
            if not _exited(proc, timeout_s):
                _signal_group(proc, signal.SIGKILL)
                _exited(proc, timeout_s)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the leader is a zombie: the group is still its own
            proc.wait(timeout=timeout_s)
    finally:
        with _lock:
            _live.pop(proc.pid, None)


def live() -> list[subprocess.Popen[bytes]]:
    """The peers this process started that are not stopped yet."""
    me = os.getpid()
    with _lock:
        return [proc for proc, owner in _live.values() if owner == me]


def stop_all(timeout_s: float = 2.0) -> None:
    """Stop every peer still recorded (the safety net; fixtures normally stopped theirs already)."""
    for proc in live():
        with contextlib.suppress(Exception):
            stop(proc, timeout_s)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    # The default action (terminate) or an ignored signal, as before the net was installed.
    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    if previous in (signal.SIG_DFL, None):
        os.kill(os.getpid(), signum)


def install_safety_net() -> None:
    """atexit, and SIGTERM/SIGHUP handlers (from the main thread only), that stop every recorded peer. Idempotent."""
    with _lock:
        first = not _state["atexit"]
        _state["atexit"] = True
    if first:
        atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit and PDEATHSIG still hold
    for sig in SAFETY_SIGNALS:
        current = signal.getsignal(sig)
        if current is _on_signal or current is signal.SIG_IGN:
            continue  # already ours; or nohup and friends: the run survives the signal, and so do its peers
        _previous[sig] = current
        signal.signal(sig, _on_signal)
