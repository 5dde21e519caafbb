"""Every program nodewarden runs, run one way: an argv (never a shell), its own session, bounded.

Slurm's commands, the IPMI reader process, an acceptance load and its probe, an event gate: each is
started by `spawn` (a list argv, `close_fds`, a session of its own so that it and whatever it forks die
as one group) and ended by `stop_group` (SIGTERM to the group, SIGKILL after a grace period, reaped).
`run_bounded` is the whole of a short run: output bounded in bytes, the run bounded in time as a whole,
the group killed on either; what went wrong is said in `Ran.failure`, never raised.

The one program outside this rule is the acceptance load's guard (agent/apps/accept/load_guard.py): it
runs isolated (`python -I`, standard library only), so it cannot import this module, and it stops its
own group rather than a child's.
"""

from __future__ import annotations

import contextlib
import io
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

_TIMED_OUT = "timed out"
MAX_OUTPUT = 4 << 20  # bytes of stdout (or stderr) a run may write before it is killed
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


def spawn(argv: Sequence[str], *, stdin: int | IO[bytes] | None = DEVNULL, stdout: int | None = PIPE,
          stderr: int | None = PIPE, env: Mapping[str, str] | None = None, cwd: str | None = "/",
          pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start argv as the leader of a session of its own. OSError (and ValueError) as Popen raises them."""
    if isinstance(argv, str) or not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError("a program is run from a non-empty list of arguments, never a shell line")
    return subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr,
                            env=dict(env) if env is not None else None, cwd=cwd, close_fds=True,
                            pass_fds=tuple(pass_fds), start_new_session=True)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig` to the process group `proc` leads; a group already gone is no error.

    The group id is the leader's pid (spawn made it a session leader): still valid after the leader
    was reaped for whatever it forked and left in the group.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> str:
    """End `proc`'s group: SIGTERM, SIGKILL after `grace_s`, reaped either way. Says how it ended."""
    if proc.poll() is not None:
        signal_group(proc, signal.SIGKILL)  # what it left behind in its group
        return "already ended"
    signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        how = "stopped with SIGTERM"
    except subprocess.TimeoutExpired:
        how = f"did not stop within {grace_s:g} s of SIGTERM: killed"
    signal_group(proc, signal.SIGKILL)
    proc.wait()
    return how


@dataclass(frozen=True)
class Ran:
    """A bounded run: its exit status (None when it could not start), what it wrote, what went wrong."""

    code: int | None
    stdout: bytes
    stderr: bytes
    failure: str | None = None  # "cannot run: ...", "timed out after N s", "answered more than N bytes"

    @property
    def ok(self) -> bool:
        return self.failure is None and self.code == 0


def run_bounded(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                cwd: str | None = "/", input_bytes: bytes | None = None, max_output: int = MAX_OUTPUT,
                merge_stderr: bool = False, keep_tail: bool = False) -> Ran:
    """Run argv to its end within `timeout_s` as a whole, its group killed past it.

    More than `max_output` bytes on a stream kills it (`failure` says so), unless `keep_tail`: then only
    the last `max_output` bytes are kept and the run goes on (a gate's log line is its last words).
    """
    started = time.monotonic()
    try:
        proc = spawn(argv, stdin=PIPE if input_bytes is not None else DEVNULL, env=env, cwd=cwd,
                     stderr=STDOUT if merge_stderr else PIPE)
    except (OSError, ValueError) as exc:
        return Ran(None, b"", b"", f"cannot run: {getattr(exc, 'strerror', None) or exc}")
    out, err = bytearray(), bytearray()
    failure = _pump(proc, input_bytes, out, err, started + timeout_s, max_output, keep_tail)
    if failure == _TIMED_OUT:
        failure = f"timed out after {timeout_s:g} s"
    if failure is None:
        try:
            proc.wait(timeout=max(0.0, started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            failure = f"timed out after {timeout_s:g} s"
    signal_group(proc, signal.SIGKILL)  # on a failure the run; on success what it left in its group
    code = proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return Ran(code, bytes(out), bytes(err), failure)


def _pump(proc: subprocess.Popen[bytes], input_bytes: bytes | None, out: bytearray, err: bytearray,
          deadline: float, max_output: int, keep_tail: bool) -> str | None:
    """Feed stdin and read stdout/stderr until both close, the deadline passes or one says too much."""
    with selectors.DefaultSelector() as sel:
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, memoryview(input_bytes or b""))
        for stream, buffer in ((proc.stdout, out), (proc.stderr, err)):
            if stream is not None:
                sel.register(stream, selectors.EVENT_READ, buffer)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return _TIMED_OUT
            for key, _ in sel.select(left):
                if key.events & selectors.EVENT_WRITE:
                    _feed(sel, key)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                kept: bytearray = key.data
                kept += chunk
                if len(kept) > max_output:
                    if not keep_tail:
                        return f"answered more than {max_output} bytes"
                    del kept[:-max_output]
    return None


def _feed(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    """Write what stdin can take; close it when all is written or the program stopped reading."""
    view: memoryview = key.data
    stream = key.fileobj
    assert isinstance(stream, io.IOBase)
    try:
        rest = view[os.write(key.fd, view[:65536]):] if view else view
    except BlockingIOError:
        return
    except BrokenPipeError:  # it stopped reading: its exit status and output say why
        rest = view[:0]
    if rest:
        sel.modify(stream, selectors.EVENT_WRITE, rest)
        return
    sel.unregister(stream)
    stream.close()
