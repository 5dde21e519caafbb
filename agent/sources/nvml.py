"""NVML source, availability part: can the driver's management library answer?

The full per-GPU reader arrives with the GPU checks; this module already
bounds every NVML call with a deadline because a hung GPU or driver must
never hang an audit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent.model import SourceStatus

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 10.0


class CallTimeout(Exception):
    """An NVML call did not return within its deadline."""


def call_with_deadline(func: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run `func` in a daemon thread; give up (not kill) after `timeout_s`.

    A thread stuck inside the driver cannot be killed, but a daemon thread
    does not keep the process alive, so the audit can still finish and exit.
    """
    result: list[Any] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(func())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            error.append(exc)

    thread = threading.Thread(target=runner, name=f"nvml:{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CallTimeout(f"{what} did not return within {timeout_s:g} s")
    if error:
        raise error[0]
    return result[0]  # type: ignore[no-any-return]


def _nvml_error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def probe_live_nvml(timeout_s: float = DEFAULT_TIMEOUT_S) -> SourceStatus:
    start = time.monotonic()
    try:
        import pynvml  # imported only when the live GPU path is used
    except ImportError as exc:
        return SourceStatus("nvml", ok=False, error=f"pynvml (nvidia-ml-py) is not installed: {exc}",
                            duration_s=time.monotonic() - start)

    def probe() -> dict[str, Any]:
        pynvml.nvmlInit()
        try:
            return {"driver_version": pynvml.nvmlSystemGetDriverVersion(),
                    "gpu_count": pynvml.nvmlDeviceGetCount()}
        finally:
            pynvml.nvmlShutdown()

    try:
        detail = call_with_deadline(probe, timeout_s, "nvmlInit")
    except CallTimeout as exc:
        return SourceStatus("nvml", ok=False, error=str(exc), duration_s=time.monotonic() - start)
    except pynvml.NVMLError as exc:
        return SourceStatus("nvml", ok=False, error=_nvml_error_text(exc),
                            duration_s=time.monotonic() - start)
    return SourceStatus("nvml", ok=True, duration_s=time.monotonic() - start, detail=detail)
