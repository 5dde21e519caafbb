"""The BMC half of an acceptance run against a real Redfish peer (sushy-static serving recorded BMCs):
one connection, the first read a whole walk (the BMC firmware), then sensors; a BMC that reports no
power is a gap, not a reading of 0 W."""

from __future__ import annotations

from pathlib import Path

from agent.apps.accept.bmc import BmcPoller
from agent.core.series import Recording
from agent.io.credentials import BmcOptions
from tests.peers.redfish import mockup, sushy_static


def _poll(name: str, reads: int = 2) -> Recording:
    recording = Recording(run_id="r", started_at="", interval_s=1.0)
    with sushy_static(mockup(name)) as peer:
        poller = BmcPoller(BmcOptions(url=peer.url, user="operator"), 1.0, recording)
        for i in range(reads):
            poller.maybe_read(float(i))
            poller.close()  # waits for the read in flight: one at a time
    return recording


def test_inlet_psu_power_redundancy_and_firmware_from_a_real_redfish_bmc(tmp_path: Path) -> None:
    track = _poll("hpe-dl380a-gen11").bmc
    assert track is not None and track.error is None
    assert track.t == [0.0, 1.0]
    assert track.inlet_c == [24.0, 24.0] and track.psu_input_w == [565.0, 565.0]
    assert track.redundancy == ["redundant", "redundant"]
    assert track.firmware == "iLO 6 v1.66"
    assert BmcPoller(BmcOptions(url="https://x", concurrency=8), 10, Recording("r", "", 1.0)).options.concurrency == 1


def test_a_bmc_reporting_zero_watts_and_absent_fans_gives_gaps_not_zeros() -> None:
    track = _poll("supermicro-x10", reads=1).bmc
    assert track is not None and track.t == [0.0]
    assert track.psu_input_w == [None] and track.fans_rpm == [None] and track.inlet_c == [None]
