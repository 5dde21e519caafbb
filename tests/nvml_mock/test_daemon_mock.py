"""The daemon over time on the real NVML ABI (issue 23, items 4 and 6).

Faults written into MOCK_NVML_OVERRIDES while the daemon runs show on /metrics within a poll and
clear when removed; an Xid the mock delivers through the NVML event set reaches /metrics and the
findings within a second of the poll that tripped it, counted once; the NVML calls per GPU per poll,
counted in the mock's own call log (MOCK_NVML_DEBUG), stay within 16 in steady state; a GPU lost
mid-poll costs the other seven none of their readings.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.nvml_mock.conftest import OVERRIDES_TTL_S, POLL_S, mock_daemon, series, write_config

pytestmark = pytest.mark.nvml_mock

ONE_POLL_S = POLL_S + OVERRIDES_TTL_S + 1.0 + 0.5  # a poll, the mock's re-read, the judging throttle, slack
CLOCKS = 'nodewarden_check_status{action="check_cooling",check="gpu.clocks.events",severity="critical",subject="gpu4"}'


def gpu_value(body: str, family: str, gpu: int, having: str = "") -> float | None:
    """One GPU's series of a family (its labels carry UUID, bus id and model too)."""
    return next((v for k, v in series(body, family + "{").items() if f'gpu="{gpu}"' in k and having in k), None)


def _enforced(body: str, gpu: int) -> float | None:
    return gpu_value(body, "nodewarden_gpu_power_limit_watts", gpu, '"enforced"')


def _settled(daemon: object, predicate: object, timeout: float, what: str) -> float:
    started = time.monotonic()
    daemon.wait_for(predicate, timeout=timeout, what=what)  # type: ignore[attr-defined]
    return time.monotonic() - started


def test_faults_injected_mid_run_show_within_a_poll_and_clear(tmp_path: Path) -> None:
    with mock_daemon(tmp_path) as (daemon, overrides):
        assert _enforced(daemon.scrape()[1], 2) == 700.0
        assert CLOCKS not in daemon.scrape()[1]
        write_config(overrides, {"devices": {
            "2": {"power": {"enforced_limit_mw": 500_000}},
            "4": {"clocks_throttle_reasons": {"gpu_idle": False, "hw_thermal_slowdown": True}}}})
        took = _settled(daemon, lambda: _enforced(daemon.scrape()[1], 2) == 500.0 and CLOCKS in daemon.scrape()[1],
                        2 * ONE_POLL_S, "the power cap and the thermal slowdown on /metrics")
        assert took <= ONE_POLL_S
        write_config(overrides, {"all": {}})
        took = _settled(daemon, lambda: _enforced(daemon.scrape()[1], 2) == 700.0 and CLOCKS not in
                        daemon.scrape()[1], 2 * ONE_POLL_S, "the faults cleared")
        assert took <= ONE_POLL_S


XID = 'nodewarden_xid_errors_total{gpu="5",xid="48"}'
XID_FINDING = 'nodewarden_check_status{action="reset_gpu",check="gpu.xid",severity="critical",subject="gpu5"}'
UNCORRECTED = re.compile(r'nodewarden_gpu_ecc_errors_total\{[^}]*gpu="5"[^}]*scope="volatile",type="uncorrected"\} '
                         r'([0-9.]+)')


def test_an_xid_from_the_event_set_reaches_metrics_and_findings_within_a_second_once(tmp_path: Path) -> None:
    with mock_daemon(tmp_path) as (daemon, overrides):
        write_config(overrides, {"devices": {"5": {"failure": {"mode": "ecc_uncorrectable", "xid": {"code": 48}}}}})
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 3 * ONE_POLL_S
        while len(seen) < 2 and time.monotonic() < deadline:
            body = daemon.scrape()[1]
            now = time.monotonic()
            match = UNCORRECTED.search(body)
            if match and float(match.group(1)) > 0:
                seen.setdefault("tripped", now)  # the poll that tripped the GPU (and so the event)
            if XID in body and XID_FINDING in body:
                seen.setdefault("xid", now)
            time.sleep(0.05)
        assert set(seen) == {"tripped", "xid"}, seen
        assert seen["xid"] - seen["tripped"] <= 1.0
        time.sleep(3 * POLL_S)  # more polls of a tripped GPU: the one Xid stays one
        body = daemon.scrape()[1]
        assert daemon.value(XID, body) == 1.0
        events = [e for e in daemon.log_events() if e.get("event") == "xid"]
        assert [(e["xid"], e["pci"]) for e in events] == [(48, "0000:8b:00.0")]
        changed = [e for e in daemon.log_events() if e.get("check") == "gpu.xid" and e.get("to") == "fail"]
        assert changed and "NVML event set" in changed[0]["msg"]


CALL = re.compile(r"^\[NVML\] (nvmlDevice\w+)(\(count=)?")


def api_calls(log_text: str) -> list[str]:
    """The nvmlDevice* calls nodewarden made, from the mock's call log (MOCK_NVML_DEBUG).

    The mock answers nvmlDeviceGetFieldValues by calling its own getters, and logs those too, before
    its `nvmlDeviceGetFieldValues(count=N)` line; the reader asks nvmlDeviceGetMigMode just before
    the batch, so what the log shows between the two is the mock's, not ours.
    """
    calls: list[str] = []
    inside = False
    for line in log_text.splitlines():
        match = CALL.match(line)
        if match is None:
            continue
        name, batch = match.group(1), match.group(2)
        if inside and not batch:
            continue
        inside = name == "nvmlDeviceGetMigMode"
        calls.append(name)
    return calls


def test_nvml_calls_per_gpu_per_poll_stay_within_16(tmp_path: Path) -> None:
    """Counted on the ABI, in the mock's own log of the calls it answers."""
    with mock_daemon(tmp_path, debug=True) as (daemon, _):
        time.sleep(3 * POLL_S)  # past the first reads (handles, static values)
        start = daemon.log_path.stat().st_size
        time.sleep(5 * POLL_S)
        with open(daemon.log_path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
    calls = api_calls(text)
    gpu_polls = calls.count("nvmlDeviceGetEccMode")  # once per GPU per poll
    assert gpu_polls >= 8 * 3 and calls.count("nvmlDeviceGetFieldValues") == gpu_polls
    assert "nvmlDeviceGetHandleByIndex" not in calls and "nvmlDeviceGetPciInfo" not in calls  # cached
    assert len(calls) / gpu_polls <= 16, sorted(set(calls))


def test_a_gpu_lost_mid_poll_keeps_the_other_seven(tmp_path: Path) -> None:
    with mock_daemon(tmp_path) as (daemon, overrides):
        write_config(overrides, {"devices": {"3": {"failure": {"mode": "fallen_off_bus", "after_calls": 5}}}})
        daemon.wait_for(lambda: gpu_value(daemon.scrape()[1], "nodewarden_gpu_up", 3) == 0.0,
                        timeout=3 * ONE_POLL_S, what="GPU 3 down")
        time.sleep(POLL_S + 0.5)
        body = daemon.scrape()[1]
        assert [gpu_value(body, "nodewarden_gpu_up", i) for i in range(8)] == [1, 1, 1, 0, 1, 1, 1, 1]
        for i in (0, 1, 2, 4, 5, 6, 7):  # every reading of the seven others is still there
            assert gpu_value(body, "nodewarden_gpu_temperature_celsius", i) == 34.0
            assert _enforced(body, i) == 700.0
            assert gpu_value(body, "nodewarden_gpu_nvlink_active_links", i) == 18.0
        assert daemon.value('nodewarden_check_status{action="drain",check="gpu.lost",severity="critical",'
                            'subject="gpu3"}', body) is not None


def test_the_xid_of_a_gpu_lost_mid_run_is_judged_on_that_gpu(tmp_path: Path) -> None:
    """Xid 79 comes with the GPU falling off the bus: its finding is gpu3's (the address read before it
    went), and the Xid of another GPU keeps its own subject (not `pci:...` for all once one is lost)."""
    lost = {"3": {"failure": {"mode": "fallen_off_bus", "xid": {"code": 79}}}}
    with mock_daemon(tmp_path) as (daemon, overrides):
        write_config(overrides, {"devices": lost})
        daemon.wait_for(lambda: daemon.value('nodewarden_xid_errors_total{gpu="3",xid="79"}') == 1.0,
                        timeout=3 * ONE_POLL_S, what="Xid 79 on gpu 3")
        write_config(overrides, {"devices": {
            **lost, "5": {"failure": {"mode": "ecc_uncorrectable", "xid": {"code": 48}}}}})
        daemon.wait_for(lambda: daemon.value('nodewarden_xid_errors_total{gpu="5",xid="48"}') == 1.0,
                        timeout=3 * ONE_POLL_S, what="Xid 48 on gpu 5")
        daemon.wait_for(lambda: XID_FINDING in daemon.scrape()[1], timeout=2.0, what="gpu5's Xid finding")
        body = daemon.scrape()[1]
        assert 'check="gpu.xid",severity="critical",subject="gpu3"}' in body
        assert 'subject="pci:' not in body
