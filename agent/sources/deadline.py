"""One bounded call: run a function in a daemon thread, give up waiting after a deadline.

Why a thread that is abandoned rather than stopped: the calls this bounds sit
inside C code (libnvidia-ml's ioctls into the driver, a TLS handshake or a
socket read in a BMC client library). Python cannot interrupt a thread that is
inside a C call: there is no safe way to kill a thread, and signals reach only
the main thread, and only between bytecodes. So the caller stops *waiting*
instead. The worker is a daemon thread, so one that never returns does not
keep the process alive at exit; it is never joined after its deadline. Its
result, if it ever comes, is dropped. Callers that must not start the same
work again while it is still stuck (the daemon's pollers) keep the thread from
`DeadlineExceeded.thread` and ask `is_alive()` before the next try.

Abandoning the wait must also stop the *work* where the work is Python (issue
21: a reader looping over a hostile GPU count ran on, growing, after its
deadline). So a caller may pass a `Cancel`: at the deadline it is set, and the
work calls `cancel.check()` between steps (each NVML call, each GPU), which
raises `Cancelled` and unwinds the thread. Only a step stuck inside C is left
to finish on its own.

Every deadline thread in the agent goes through `call_with_deadline`: the NVML
read and its single calls, the daemon's per-source read, the Redfish login.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Cancelled(Exception):
    """The caller stopped waiting for this work (its deadline passed): unwind, the result is dropped."""


class Cancel:
    """Set by `call_with_deadline` at the deadline; the work asks `check()` between its steps."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("the deadline passed; work stopped")


class DeadlineExceeded(TimeoutError):
    """A bounded call did not return in time; `thread` is the worker, still running (abandoned)."""

    def __init__(self, message: str, name: str, timeout_s: float, thread: threading.Thread) -> None:
        super().__init__(message)
        self.name = name
        self.timeout_s = timeout_s
        self.thread = thread


def call_with_deadline(fn: Callable[..., T], *args: Any, timeout_s: float, name: str,
                       cancel: Cancel | None = None) -> T:
    """`fn(*args)` in a daemon thread named `name`; its result, or its exception re-raised here.

    Raises DeadlineExceeded when it has not returned after `timeout_s` seconds;
    `cancel` (if given, and checked by `fn`) is set then, so the work stops at its
    next check; the thread is never joined (see the module docstring).
    """
    result: list[T] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            error.append(exc)

    thread = threading.Thread(target=runner, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if cancel is not None:
            cancel.set()
        raise DeadlineExceeded(f"{name} did not return within {timeout_s:g} s", name, timeout_s, thread)
    if error:
        raise error[0]
    return result[0]
