"""Start `nodewarden daemon` as a real process for tests and benchmarks, and scrape it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.peers.redfish import _die_with_parent, free_port

REPO = Path(__file__).resolve().parents[1]


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    context: ssl.SSLContext | None = None

    def scrape(self, auth: tuple[str, str] | None = None, timeout: float = 5.0) -> tuple[int, str]:
        request = urllib.request.Request(f"{self.url}/metrics")  # noqa: S310 - 127.0.0.1 only
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        handlers: list[Any] = [urllib.request.ProxyHandler({})]
        if self.context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        try:
            with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def value(self, series: str, body: str | None = None) -> float | None:
        """The value of one exact series line (`name{labels}` as the exposition prints it)."""
        text = body if body is not None else self.scrape()[1]
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def wait_for(self, predicate: Any, timeout: float = 20.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log_path.read_text()[-3000:]}")
            try:
                last = predicate()
            except OSError:
                last = None
            if last:
                return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r}); log: "
                             f"{self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> float:
        """Send `sig`, wait for the exit; returns how long it took."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
                raise
        return time.monotonic() - start


@contextlib.contextmanager
def running_daemon(tmp: Path, *args: str, env: dict[str, str] | None = None, port: int | None = None,
                   scheme: str = "http", context: ssl.SSLContext | None = None,
                   ready: bool = True) -> Iterator[DaemonProcess]:
    """`nodewarden daemon ARGS --listen 127.0.0.1:PORT`, stopped (SIGKILL if need be) at exit."""
    port = port or free_port()
    log_path = tmp / f"daemon-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "daemon", "--listen", f"127.0.0.1:{port}", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=_die_with_parent)  # noqa: PLW1509 - no threads fork here concurrently
    daemon = DaemonProcess(proc, f"{scheme}://127.0.0.1:{port}", log_path, context)
    try:
        if ready:
            daemon.wait_for(lambda: any(e.get("event") == "ready" for e in daemon.log_events()), what="ready")
        yield daemon
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
