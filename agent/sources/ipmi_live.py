"""The live IPMI read: one reader process per read (agent.sources.ipmi_worker), bounded by one deadline.

The parent side. It validates the target, starts `python -m agent.sources.ipmi_worker` in a
session of its own (its own process group), hands it the request (password included) on stdin,
and reads its answer lines from stdout until the worker ends or the deadline passes. At the
deadline, and whenever the read ends in any other way, the worker's process group gets SIGTERM,
then SIGKILL if it is still there `KILL_GRACE_S` later: nothing of a read is left behind, neither
a process nor a thread. The bytes read are capped (`MAX_OUTPUT_BYTES`, each line parsed with the
bounded JSON loader), and every failure (deadline, crash, non-zero exit, bad or oversized output)
becomes an Unknown with its reason, as a BMC that does not answer does.

The worker gets a minimal environment (`WORKER_ENV_KEYS`), so that a password the agent was given
in its own environment does not travel on; its command line holds no secret either.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.core.facts import BmcFacts
from agent.core.model import SourceStatus, Unknown
from agent.io.jsonfile import load_json_bytes
from agent.io.programs import PIPE, spawn, stop_group
from agent.sources.ipmi_const import (
    DEFAULT_TIMEOUT_S,
    LOGIN_STEP,
    LOGOUT_STEP,
    MAX_USER_BYTES,
    PARTS,
    RECORD_FORMAT,
    SOURCE,
)
from agent.sources.ipmi_parse import facts_and_status

WORKER_MODULE = "agent.sources.ipmi_worker"
MAX_OUTPUT_BYTES = 16 << 20  # a SEL of a few thousand entries is ~2 MB
MAX_STDERR_TAIL = 4096
KILL_GRACE_S = 0.5  # between SIGTERM and SIGKILL
# What the worker inherits of the environment: enough to start Python and find its packages.
WORKER_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH",
                   "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding agent/: the worker runs the same code


def validate_target(host: object, port: object, user: object = "") -> str | None:
    """Why these connection settings are unusable, or None. Never mentions the password."""
    if not isinstance(host, str) or not host:
        return "IPMI host is empty: give the BMC's IP address or host name"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not _HOSTNAME_RE.match(host):
            return f"IPMI host {host[:80]!r} is neither an IP address nor a host name"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return f"IPMI port {port!r} is not a port number (1-65535)"
    if not isinstance(user, str) or any(ord(ch) < 32 for ch in user):
        return "IPMI user name must be text without control characters"
    if len(user.encode("utf-8")) > MAX_USER_BYTES:
        return f"IPMI user name is longer than {MAX_USER_BYTES} bytes (the IPMI 2.0 limit)"
    return None


def worker_command() -> list[str]:
    """How the reader process is started (no secret in it: `ps` shows it)."""
    return [sys.executable, "-m", WORKER_MODULE]


def read_ipmi_live(host: str, port: int, user: str, password: str, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                   worker: Sequence[str] | None = None
                   ) -> tuple[BmcFacts | Unknown, SourceStatus, dict[str, Any]]:
    """Read the BMC at host:port; never raises, never takes much longer than `timeout_s`.

    Returns the facts (or why there are none), how the read went, and the raw answers
    (ipmi.json's layout) for `read_ipmi_recorded`. `worker` replaces the reader process's
    command (tests); it gets the same request on stdin.
    """
    start = time.monotonic()
    raw: dict[str, Any] = {"format": RECORD_FORMAT, "target": {"host": str(host)[:255], "port": port}}
    problem = validate_target(host, port, user)
    if problem is None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                            or not 0 < timeout_s < 1e6):
        problem = f"IPMI timeout {timeout_s!r} s is not a positive number"
    if problem is None and worker is None and importlib.util.find_spec("pyghmi") is None:
        problem = "pyghmi is not installed: IPMI cannot be read (pip install pyghmi)"
    if problem is not None:
        raw["error"] = problem
        return Unknown(problem), SourceStatus(SOURCE, ok=False, error=problem), raw

    password = password if isinstance(password, str) else ""
    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [IPv6] -> IPv6
    request = json.dumps({"host": address, "port": port, "user": user, "password": password,
                          "deadline_s": timeout_s}).encode("utf-8")
    run = WorkerRun(list(worker) if worker is not None else worker_command(), start + timeout_s, password)
    run.run(request)
    raw.update(run.parts)
    raw["requests"] = run.requests
    why = run.failure(timeout_s)
    if why is not None:
        raw = _cut_short(raw, why, keep_parts=run.protocol_error is None and run.error is None)
    facts, status = facts_and_status(raw, time.monotonic() - start)
    return facts, status, raw


def _cut_short(raw: dict[str, Any], why: str, keep_parts: bool) -> dict[str, Any]:
    """A read that did not finish: keep what was read when the sensors were, else nothing."""
    if keep_parts and isinstance(raw.get("sensors"), list):  # the deadline hit the FRU or SEL: keep what was read
        for part in PARTS:
            raw.setdefault(part, {"error": why})
        raw["incomplete"] = why
        return raw
    bare = {key: raw[key] for key in ("format", "target", "requests")}
    bare["error"] = why
    return bare


class WorkerRun:
    """One reader process: started, fed, read until it ends or the deadline passes, then gone."""

    def __init__(self, command: list[str], deadline: float, secret: str) -> None:
        self.command, self.deadline, self.secret = command, deadline, secret
        self.parts: dict[str, Any] = {}
        self.step = LOGIN_STEP
        self.requests = 0
        self.error: str | None = None  # the worker's own verdict: the read failed as a whole
        self.protocol_error: str | None = None  # what it wrote is not its answer
        self.start_error: str | None = None
        self.ended = False
        self.timed_out = False
        self.returncode: int | None = None
        self.stderr_tail = b""
        self._pending: list[bytes] = []  # the start of a line not ended yet
        self._total = 0

    def run(self, request: bytes) -> None:
        try:
            proc = spawn(self.command, stdin=PIPE, cwd=str(_PACKAGE_ROOT),
                         env=self._environment())  # its own process group: killed as one
        except (OSError, ValueError) as exc:
            self.start_error = self._scrub(f"cannot start the IPMI reader process: {exc}")
            return
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            with contextlib.suppress(BrokenPipeError):  # it died at once: its exit status says why
                proc.stdin.write(request)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            self._read(proc)
            if not self.timed_out and self.protocol_error is None:  # it closed its output: let it exit
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, self.deadline - time.monotonic()))
                if proc.returncode is None and not self._finished:
                    self.timed_out = True
        finally:
            stop_group(proc, KILL_GRACE_S)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.returncode = proc.returncode

    @property
    def _finished(self) -> bool:
        """Everything was read (a slow logout loses nothing)."""
        return self.ended or self.error is not None or self.step == LOGOUT_STEP

    def _environment(self) -> dict[str, str]:
        return {key: value for key, value in os.environ.items()
                if key in WORKER_ENV_KEYS and not (self.secret and self.secret in value)}

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ, "out")
            selector.register(proc.stderr, selectors.EVENT_READ, "err")
            while selector.get_map():
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self.timed_out = True
                    return
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.data == "err":
                        self.stderr_tail = (self.stderr_tail + chunk)[-MAX_STDERR_TAIL:]
                    elif not self._take(chunk):
                        return

    def _take(self, chunk: bytes) -> bool:
        """Take stdout bytes; False once the answer is refused (the caller stops reading)."""
        self._total += len(chunk)
        if self._total > MAX_OUTPUT_BYTES:
            self.protocol_error = f"it wrote more than {MAX_OUTPUT_BYTES} bytes"
            return False
        if b"\n" not in chunk:  # a long line (the SEL, say) comes in many chunks: join them once
            self._pending.append(chunk)
            return True
        *lines, rest = b"".join([*self._pending, chunk]).split(b"\n")
        self._pending = [rest] if rest else []
        for line in lines:
            try:
                message = load_json_bytes(line, what="IPMI reader output", max_bytes=MAX_OUTPUT_BYTES)
                self._message(message)
            except ValueError as exc:
                self.protocol_error = str(exc)[:300]
                return False
        return True

    def _message(self, message: Any) -> None:
        if not isinstance(message, dict):
            raise ValueError(f"expected a JSON object a line, got {type(message).__name__}")
        requests = message.get("requests")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
            raise ValueError("a line without its `requests` count")
        self.requests = requests
        if isinstance(message.get("step"), str):
            self.step = message["step"][:200]
        elif message.get("part") in PARTS and "value" in message:
            self.parts[message["part"]] = message["value"]
        elif isinstance(message.get("error"), str):
            self.error = self._scrub(message["error"])
        elif message.get("end") is True:
            self.ended = True
        else:
            raise ValueError(f"an unknown line: {sorted(message)[:5]}")

    def failure(self, timeout_s: float) -> str | None:
        """Why this read has no complete answer, or None."""
        if self.start_error is not None:
            return self.start_error
        if self.protocol_error is not None:
            return f"the IPMI reader process's answer was refused: {self.protocol_error}"
        if self.error is not None:
            return self.error
        if self._finished:
            return None
        if self.timed_out:
            return f"IPMI did not answer within {timeout_s:g} s (stuck in {self.step})"
        return f"the IPMI reader process ended unexpectedly in {self.step}: {self._exit_text()}"

    def _exit_text(self) -> str:
        code = self.returncode
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit status {code}"
        last = [line.strip() for line in self.stderr_tail.decode("utf-8", "replace").splitlines() if line.strip()]
        return f"{how} ({self._scrub(last[-1])[:200]})" if last else how

    def _scrub(self, text: str) -> str:
        return text.replace(self.secret, "***") if self.secret else text
