"""What one Redfish read costs in requests (issue #16), counted by a real fault proxy in front of sushy-static.

sushy-static answers any query string with 404, so the HPE mockup (whose service root advertises
`$expand`) is a BMC that advertises `$expand` and refuses it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts
from agent.sources import redfish
from agent.sources.redfish import LiveRedfish, RecordedRedfish, RecordingRedfish, Walk, read_redfish
from tests.peers.redfish import FaultProxy, RedfishPeer, fault_proxy, mockup, sushy_static

PASSWORD = "s3cret-Pa55word!"
ROOTS = ("/redfish/v1", "/redfish/v1/")  # the library asks with the slash, the walk without


@pytest.fixture(scope="module")
def hpe() -> RedfishPeer:  # type: ignore[misc]
    with sushy_static(mockup("hpe-dl380a-gen11")) as peer:
        yield peer


@pytest.fixture
def proxy(hpe: RedfishPeer) -> FaultProxy:  # type: ignore[misc]
    with fault_proxy(hpe.url) as px:
        yield px


def read(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, concurrency: int = 4,
         **kw: Any) -> tuple[BmcFacts, Walk, LiveRedfish]:
    walks: list[Walk] = []
    transports: list[LiveRedfish] = []
    original = Walk.run

    def spy(self: Walk, start: Any = (redfish.ROOT,)) -> None:
        walks.append(self)
        original(self, start)

    def make() -> LiveRedfish:
        transports.append(LiveRedfish(proxy.url, "admin", PASSWORD, timeout_s=5.0, backoff_s=0.05, **kw))
        return transports[-1]

    monkeypatch.setattr(Walk, "run", spy)
    proxy.reset_requests()
    facts, status, _ = read_redfish(make, concurrency=concurrency, deadline_s=60.0)
    assert isinstance(facts, BmcFacts) and status.ok, status
    return facts, walks[0], transports[0]


def expand_requests(proxy: FaultProxy) -> list[str]:
    return [e["path"] for e in proxy.request_log() if "$expand" in e["path"]]


def test_the_service_root_is_fetched_once_per_read(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    facts, walk, transport = read(proxy, monkeypatch)
    counts = proxy.requests("GET")
    assert sum(counts.get(p, 0) for p in ROOTS) == 1, {p: counts.get(p) for p in ROOTS}
    assert walk.resources[redfish.ROOT]["@odata.type"].startswith("#ServiceRoot.")  # the login's, walked from
    assert walk.depth[redfish.ROOT] == 0  # no request of the walk's
    assert transport.login_requests == 3  # root, session POST (sushy-static has none), basic-auth check
    assert facts.vendor == "HPE"


def test_expand_is_probed_at_most_once_per_read(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    _facts, walk, _ = read(proxy, monkeypatch, concurrency=8)
    assert expand_requests(proxy) == ["/redfish/v1/Systems?$expand=.($levels=1)"]  # refused (404), never again
    assert walk.expand_refused and walk.expand_probe == "/redfish/v1/Systems"
    counts = proxy.requests("GET")
    assert counts["/redfish/v1/Systems"] == 1 and counts["/redfish/v1/Managers"] == 1  # plain, once each


def test_a_refused_expand_is_resubmitted_at_its_parents_depth(proxy: FaultProxy,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    proxy.set_rules(["query:\\$expand status 400"])  # refused the other way a BMC refuses it
    _facts, walk, _ = read(proxy, monkeypatch)
    # root (the login's, 0) -> Systems?$expand (refused, 1) -> Systems (2) -> Systems/1 (3): the chain, not
    # a fresh start at depth 1 (which understated the chain bound in benchmarks/bench_redfish.py).
    assert walk.depth["/redfish/v1/Systems"] == walk.depth[redfish.ROOT] + 2 == 2
    assert walk.depth["/redfish/v1/Systems/1"] == 3
    assert walk.depth["/redfish/v1/Managers"] == 1  # not the probe: asked plainly at once
    log = [e["path"] for e in proxy.request_log()]
    assert log.index("/redfish/v1/Systems?$expand=.($levels=1)") < log.index("/redfish/v1/Systems")


def test_the_connection_pool_is_the_walks_concurrency(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    proxy.set_rules(["latency 0.05"])  # requests overlap: 8 in flight need 8 pooled connections
    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    _facts, _walk, transport = read(proxy, monkeypatch, concurrency=8)  # the transport was made for 4
    messages = [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"]
    assert not [m for m in messages if "Connection pool is full" in m]  # none thrown away
    opened = [m for m in messages if m.startswith("Starting new HTTP connection")]
    assert 2 <= len(opened) <= 8 + 1, opened  # the walk's 8 (and the login's one, closed when resized)
    assert transport.session.get_adapter(proxy.url)._pool_maxsize == 8  # type: ignore[attr-defined]


class ExpandingRecording(RecordedRedfish):
    """A recording that serves `$expand` (members inline), and counts how it was asked."""

    supports_expand = True

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.asked: list[tuple[str, str | None]] = []
        self.walk: Walk | None = None  # set: every other answer waits until the walk took the probe's

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        self.asked.append((path, expand))
        if self.walk is not None and path not in ("/redfish/v1", "/redfish/v1/Systems"):
            # Deterministic order on a loaded machine: what was asked while the probe was in flight is
            # recorded plain above, and nothing asked later can come before the walk learnt the probe worked.
            deadline = time.monotonic() + 5
            while not self.walk.expand_works and time.monotonic() < deadline:
                time.sleep(0.005)
        body = super().get(path)
        if expand and isinstance(body.get("Members"), list):
            body = {**body, "Members": [super(ExpandingRecording, self).get(m["@odata.id"]) for m in body["Members"]]}
        return body


def test_once_the_probe_worked_collections_are_expanded() -> None:
    transport = ExpandingRecording(mockup("hpe-dl380a-gen11"))
    walk = Walk(transport, concurrency=4)
    transport.walk = walk
    walk.run()
    expanded = [p for p, e in transport.asked if e]
    assert expanded[0] == "/redfish/v1/Systems" and walk.expand_works
    assert "/redfish/v1/UpdateService/FirmwareInventory" in expanded  # asked after the probe answered
    assert ("/redfish/v1/Managers", None) in transport.asked  # asked while the probe was in flight: plain
    assert not any(p.startswith("/redfish/v1/UpdateService/FirmwareInventory/") for p, _ in transport.asked)


def test_a_recording_keeps_the_root_the_login_read(proxy: FaultProxy, tmp_path: Path) -> None:
    recorders: list[RecordingRedfish] = []

    def make() -> RecordingRedfish:
        recorders.append(RecordingRedfish(LiveRedfish(proxy.url, "admin", PASSWORD, timeout_s=5)))
        return recorders[-1]

    facts, _status, _ = read_redfish(make)
    assert redfish.ROOT in recorders[0].answers
    recorders[0].write(tmp_path)
    replayed, _, _ = read_redfish(lambda: RecordedRedfish(tmp_path))
    assert isinstance(facts, BmcFacts) and isinstance(replayed, BmcFacts)
    assert replayed.vendor == facts.vendor == "HPE"
