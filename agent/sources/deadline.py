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

Every deadline thread in the agent goes through `call_with_deadline`: the NVML
read and its single calls, the daemon's per-source read, the Redfish login.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """A bounded call did not return in time; `thread` is the worker, still running (abandoned)."""

    def __init__(self, message: str, name: str, timeout_s: float, thread: threading.Thread) -> None:
        super().__init__(message)
        self.name = name
        self.timeout_s = timeout_s
        self.thread = thread


def call_with_deadline(fn: Callable[..., T], *args: Any, timeout_s: float, name: str) -> T:
    """`fn(*args)` in a daemon thread named `name`; its result, or its exception re-raised here.

    Raises DeadlineExceeded when it has not returned after `timeout_s` seconds;
    the thread is then left running, never joined (see the module docstring).
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
        raise DeadlineExceeded(f"{name} did not return within {timeout_s:g} s", name, timeout_s, thread)
    if error:
        raise error[0]
    return result[0]
