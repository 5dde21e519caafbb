"""The daemon's source poller: one thread per poll of a source, each read bounded by its timeout.

Split out of agent/apps/daemon/service.py (which re-exports it) along its seam: it knows nothing of judging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.core.errors import NodewardenError
from agent.core.model import SourceStatus
from agent.sources.deadline import DeadlineExceeded, call_with_deadline
from agent.sources.source import PollResult

log = logging.getLogger("nodewarden.daemon")


class SourcePoller:
    """Runs `read` every `interval()` seconds in a worker bounded by `timeout()`."""

    def __init__(self, name: str, read: Callable[[], tuple[Any, dict[str, SourceStatus]]], reports: tuple[str, ...],
                 interval: Callable[[], float], timeout: Callable[[], float],
                 on_result: Callable[[str, PollResult], None], stop: threading.Event) -> None:
        self.name = name
        self.reports = reports  # the sources a failed poll is reported under
        self._read, self._interval, self._timeout = read, interval, timeout
        self._on_result, self._stop = on_result, stop
        self._hung: threading.Thread | None = None
        self._hung_since = 0.0
        self._wake = threading.Event()
        self.polls = 0
        self.thread = threading.Thread(target=self._loop, name=f"poll-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def poll_now(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            result = self._poll()
            self.polls += 1
            self._on_result(self.name, result)
            delay = max(0.0, started + self._interval() - time.monotonic())
            self._wake.wait(delay)
            self._wake.clear()

    def _failed(self, error: str, duration_s: float = 0.0) -> PollResult:
        return PollResult(None, {name: SourceStatus(name, ok=False, error=error, duration_s=duration_s)
                                 for name in self.reports}, time.time())

    def _poll(self) -> PollResult:
        timeout = self._timeout()
        if self._hung is not None and self._hung.is_alive():
            since = time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - self._hung_since)))
            return self._failed(f"the previous read has not returned (hung since {since})")
        self._hung = None
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = self._read()
            except NodewardenError as exc:
                box["error"] = str(exc)
            except Exception as exc:
                log.exception("reading %s failed", self.name)
                box["error"] = f"{type(exc).__name__}: {exc}"

        start = time.monotonic()
        try:
            call_with_deadline(work, timeout_s=timeout, name=f"read-{self.name}")
        except DeadlineExceeded as exc:  # the worker is left running: not polled again until it returns
            self._hung, self._hung_since = exc.thread, start
            return self._failed(f"timed out after {timeout:g} s", time.monotonic() - start)
        elapsed = time.monotonic() - start
        if "error" in box:
            return self._failed(box["error"], elapsed)
        value, statuses = box["value"]
        return PollResult(value, statuses, time.time())
