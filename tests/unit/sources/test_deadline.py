"""agent.sources.deadline: the one bounded call (a daemon thread, abandoned on timeout)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.sources.deadline import Cancel, DeadlineExceeded, call_with_deadline
from agent.sources.nvml_facts import read_nvml
from agent.sources.nvml_replay import RecordedNvml

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "nodes"


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


# ---- issue 21, item 7: the deadline stops the work, not only the wait ----

def test_the_work_is_cancelled_at_the_deadline_and_its_thread_ends() -> None:
    cancel = Cancel()
    steps: list[int] = []

    def loop() -> None:
        while True:  # Python work: a step, then the check, as the NVML reader does per call
            cancel.check()
            steps.append(1)
            time.sleep(0.01)

    with pytest.raises(DeadlineExceeded) as caught:
        call_with_deadline(loop, timeout_s=0.2, name="looping", cancel=cancel)
    assert cancel.is_set
    caught.value.thread.join(1.0)
    assert not caught.value.thread.is_alive()  # it unwound (Cancelled), not abandoned to run on
    done = len(steps)
    time.sleep(0.1)
    assert len(steps) == done


class SlowNvml:
    """A recorded node whose every NVML call takes 20 ms (a slow driver), counting the calls made."""

    def __init__(self, recorded: RecordedNvml) -> None:
        self._recorded = recorded
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._recorded, name)
        if not name.startswith("nvml") or not callable(attr) or isinstance(attr, type):
            return attr

        def slow(*args: Any) -> Any:
            self.calls += 1
            time.sleep(0.02)
            return attr(*args)
        return slow


def test_an_nvml_read_past_its_deadline_stops_calling_nvml() -> None:
    nvml = SlowNvml(RecordedNvml.from_file(FIXTURES / "hgx-h100-drifted" / "nvml.json"))
    _facts, status = read_nvml(nvml, timeout_s=0.3)  # 8 GPUs x ~40 calls x 20 ms: ~6 s of work
    assert not status.ok and "did not answer within 0.3 s" in str(status.error)
    time.sleep(0.1)
    after_deadline = nvml.calls
    time.sleep(0.5)
    assert nvml.calls <= after_deadline + 1, (after_deadline, nvml.calls)  # at most the call in flight
