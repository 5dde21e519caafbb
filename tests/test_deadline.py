"""agent.sources.deadline: the one bounded call (a daemon thread, abandoned on timeout)."""

from __future__ import annotations

import threading
import time

import pytest

from agent.sources.deadline import DeadlineExceeded, call_with_deadline


def test_returns_the_result_and_passes_arguments() -> None:
    assert call_with_deadline(lambda a, b: a + b, 2, 3, timeout_s=1.0, name="add") == 5


def test_re_raises_the_callers_exception() -> None:
    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        call_with_deadline(boom, timeout_s=1.0, name="boom")


def test_a_call_that_hangs_is_abandoned_not_joined() -> None:
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"stuck did not return within 0\.2 s") as caught:
        call_with_deadline(release.wait, 30, timeout_s=0.2, name="stuck")
    assert time.monotonic() - start < 1.5
    thread = caught.value.thread
    assert thread.daemon and thread.name == "stuck" and thread.is_alive()  # left running, never joined
    assert isinstance(caught.value, TimeoutError) and caught.value.timeout_s == 0.2
    release.set()
    thread.join(2.0)
    assert not thread.is_alive()


def test_nvml_timeouts_are_the_helpers_own_exception() -> None:
    # remediations/targets.py bounds NVML setters with the helper; its CallTimeout is DeadlineExceeded.
    from agent.sources import nvml
    from agent.sources.deadline import DeadlineExceeded, call_with_deadline

    assert nvml.CallTimeout is DeadlineExceeded
    assert call_with_deadline(lambda: 7, timeout_s=1.0, name="nvml:nvmlInit") == 7
    with pytest.raises(nvml.CallTimeout, match="nvml:nvmlInit did not return"):
        call_with_deadline(lambda: time.sleep(2), timeout_s=0.1, name="nvml:nvmlInit")
