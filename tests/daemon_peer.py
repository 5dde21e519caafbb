"""Start `nodewarden daemon` as a real process for tests and benchmarks, and scrape it.

Every daemon started here writes its state under the test's folder, never the machine's
/var/lib/nodewarden (a test daemon's stale health-check state file there once made every simulated
health-check on the machine answer Unknown): `running_daemon` gives it a config with `state_dir`
under `tmp` and fails the test if the default state folder changed while it ran.
"""

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

import yaml

from agent.policy.config import DEFAULT_STATE_DIR
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

    def settled_scrape(self, timeout: float = 60.0) -> str:
        """One /metrics scrape once every source has been read (none pending): the steady state."""
        def settled() -> str | None:
            status, body = self.scrape()
            pending = [line for line in body.splitlines()
                       if line.startswith("nodewarden_source_pending{") and not line.endswith(" 0.0")]
            return body if status == 200 and "nodewarden_build_info{" in body and not pending else None

        text: str = self.wait_for(settled, timeout=timeout, what="every source read")
        return text

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


def state_listing(root: Path = DEFAULT_STATE_DIR) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its (mtime_ns, size): what a test must leave as it found it."""
    listing = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # gone while we looked: another run's temporary file
                st = os.lstat(os.path.join(folder, name))
                listing[os.path.join(folder, name)] = (st.st_mtime_ns, st.st_size)
    return listing


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(path for path, seen in after.items() if before.get(path) != seen)


def isolated_args(tmp: Path, args: tuple[str, ...], port: int) -> tuple[str, ...]:
    """ARGS with a config whose state_dir is under `tmp`: a config of the test's without one gets one
    (written back as JSON, which YAML reads); no config at all gets a config of just that."""
    state = tmp / "state"
    for i, arg in enumerate(args):
        named = args[i + 1] if arg == "--config" and i + 1 < len(args) else (
            arg.removeprefix("--config=") if arg.startswith("--config=") else None)
        if named is None:
            continue
        config = Path(named)
        with contextlib.suppress(OSError, yaml.YAMLError):  # unreadable: the daemon says why and exits
            doc = yaml.safe_load(config.read_text()) or {}
            if isinstance(doc, dict) and "state_dir" not in doc:
                config.write_text(json.dumps({**doc, "state_dir": str(state)}, default=str) + "\n")
        return args
    config = tmp / f"daemon-{port}.yaml"
    config.write_text(f"state_dir: {json.dumps(str(state))}\n")
    return (*args, "--config", str(config))


@contextlib.contextmanager
def running_daemon(tmp: Path, *args: str, env: dict[str, str] | None = None, port: int | None = None,
                   scheme: str = "http", context: ssl.SSLContext | None = None,
                   ready: bool = True, defaults: bool = False, cwd: Path = REPO) -> Iterator[DaemonProcess]:
    """`nodewarden daemon ARGS --listen 127.0.0.1:PORT`, stopped (SIGKILL if need be) at exit.

    Its state_dir is under `tmp` (isolated_args), and a change under /var/lib/nodewarden while it
    ran fails the test, unless `defaults` (a test of the default paths, which writes there)."""
    port = port or free_port()
    log_path = tmp / f"daemon-{port}.log"
    args = args if defaults else isolated_args(tmp, args, port)
    before = state_listing()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "daemon", "--listen", f"127.0.0.1:{port}", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
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
    wrote = [] if defaults else changed_files(before, state_listing())
    assert not wrote, f"the daemon wrote under {DEFAULT_STATE_DIR}: {wrote} (give it a state_dir under tmp_path)"
