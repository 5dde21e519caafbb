"""The bounded one-shot audit: when no daemon state file exists, audit the node in a child process
and give up (killing the child's whole process group) at a total deadline.

Why a child process and not the engine's per-source deadlines: those bound each read, but a
health-check must answer before slurmd's 60 s kill whatever the sum is, and work stuck inside C
(an NVML ioctl, a TLS read) cannot be stopped in a thread. A forked child can be: SIGKILL to its
process group ends the audit and anything it started. The child sends its summary (bounded) through
a pipe; a child that dies, overruns, or sends something malformed gives no verdict.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from typing import Any

from agent.apps.scheduler.answer import Answer, SummaryError, parse_summary, summarise
from agent.engine.audit import AuditRequest, run_audit

HOW = "one-shot audit"
MAX_SUMMARY_BYTES = 256 << 10


def _child(request: AuditRequest, conn: Any) -> None:
    os.setpgid(0, 0)  # its own group: the parent kills whatever the audit started, too
    try:
        text = json.dumps(summarise(run_audit(request)), separators=(",", ":"), allow_nan=False)
    except Exception as exc:  # noqa: BLE001 - the parent reports it; the child only exits
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]})
    conn.send_bytes(text.encode()[: MAX_SUMMARY_BYTES + 1])
    conn.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def audit_once(request: AuditRequest, deadline_s: float) -> Answer:
    """The node's verdict from a fresh audit, or no verdict when it did not finish within `deadline_s`."""
    started = time.monotonic()
    context = multiprocessing.get_context("fork")  # the request and loaded modules as they are: no re-import
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(request, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(max(deadline_s, 0.0)):
            return Answer(None, HOW, f"audit deadline hit ({deadline_s:g} s): no verdict")
        try:
            data = receive.recv_bytes(MAX_SUMMARY_BYTES)
        except (EOFError, OSError) as exc:
            return Answer(None, HOW, f"audit ended without an answer ({type(exc).__name__}, "
                          f"exit {child.exitcode})")
    finally:
        receive.close()
        if child.pid is not None:
            _kill(child.pid)
        child.join(timeout=max(0.5, deadline_s - (time.monotonic() - started)))
    try:
        doc = json.loads(data)
    except ValueError:
        return Answer(None, HOW, "audit answered garbage")
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return Answer(None, HOW, f"audit could not run: {doc['error']}")
    try:
        return parse_summary(doc, HOW)
    except SummaryError as exc:
        return Answer(None, HOW, f"audit answered a malformed summary: {exc}")
