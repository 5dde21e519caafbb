"""A recorded Redfish tree is read in the calling thread (agent.sources.redfish_walk.InlinePool), with the
same answers as the thread pool a live BMC is read with."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.sources.redfish import ROOT, RecordedRedfish, Walk, parse_bmc
from agent.sources.redfish_walk import InlinePool

REPO = Path(__file__).resolve().parents[3]
TREES = sorted([*(p for p in (REPO / "fixtures" / "redfish").iterdir() if (p / "redfish").is_dir()),
                *(p for p in (REPO / "fixtures" / "nodes").iterdir() if (p / "redfish").is_dir())])


class Remote:
    """The same recording behind a transport the walk does not know to be local: read on threads."""

    supports_expand = False

    def __init__(self, base: Path) -> None:
        self.inner = RecordedRedfish(base)

    @property
    def requests(self) -> int:
        return self.inner.requests

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        return self.inner.get(path, expand)

    def close(self) -> None:
        return None


def test_a_recording_is_read_without_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_thread(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a thread was started to read local files")

    walk = Walk(RecordedRedfish(REPO / "fixtures" / "nodes" / "hgx-h100-drifted"))
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    walk.run()
    assert ROOT in walk.resources and len(walk.resources) > 40 and not walk.errors


@pytest.mark.parametrize("tree", TREES, ids=[p.name for p in TREES])
def test_the_inline_read_equals_the_threaded_one(tree: Path) -> None:
    inline, again, threaded = Walk(RecordedRedfish(tree)), Walk(RecordedRedfish(tree)), Walk(Remote(tree))
    for walk in (inline, again, threaded):
        walk.run()
    assert inline.resources == threaded.resources
    assert {p: e.reason for p, e in inline.errors.items()} == {p: e.reason for p, e in threaded.errors.items()}
    assert inline.depth == threaded.depth and inline.caps_hit == threaded.caps_hit
    assert inline.transport.requests == threaded.transport.requests
    # Threads answer in any order, which a tree of several chassis can show (whose missing Thermal an
    # Unknown names); the inline read always takes the priority order, so it repeats itself exactly.
    assert list(inline.resources) == list(again.resources) and parse_bmc(inline) == parse_bmc(again)


def test_the_inline_pool_runs_the_lowest_priority_first_and_hands_errors_over() -> None:
    pool = InlinePool()
    ran: list[str] = []

    def fail() -> None:
        raise ValueError("refused")

    tickets = {pool.submit(ran.append, "leaf", priority=(1, 0)): "leaf",
               pool.submit(ran.append, "deep", priority=(0, -3)): "deep",
               pool.submit(fail, priority=(0, -1)): "fail"}
    done = [ticket for _ in range(3) for ticket in pool.wait(tickets, 1.0)]
    assert ran == ["deep", "leaf"] and [tickets[t] for t in done] == ["deep", "fail", "leaf"]
    with pytest.raises(ValueError, match="refused"):
        done[1].result()
    assert list(pool.wait(tickets, 1.0)) == []


class SlowRecording(RecordedRedfish):
    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        time.sleep(0.02)
        return super().get(path, expand)


def test_an_inline_read_stops_at_its_deadline() -> None:
    walk = Walk(SlowRecording(REPO / "fixtures" / "nodes" / "hgx-h100-drifted"), deadline_s=0.1)
    walk.run()
    assert walk.timed_out and ROOT in walk.resources
    assert 0 < walk.transport.requests < 20
    assert any("deadline" in e.reason for e in walk.errors.values())
