"""`nodewarden accept` end to end through the real NVML ABI (NVIDIA's mock libnvidia-ml, tests/accept/mocknode.py).

Each case is one real run (10 s steady, 0.2 s samples) of an 8x H100 node the mock simulates under
load, judged as expected: healthy passes; a GPU 8 degC hotter at the same power, one with HW thermal
slowdown injected mid-steady (MOCK_NVML_OVERRIDES), one capped at 500 of 700 W, one falling off the bus
mid-run (`failure: after_calls`) each give their finding and only theirs; a stored baseline and a
second run with one GPU degraded give the drift finding.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.accept.mocknode import (
    base_config,
    busy,
    device,
    failed,
    findings,
    finish,
    run_accept,
    start_accept,
    wait_for,
    write,
)
from tests.peers.redfish import mockup, sushy_static

pytestmark = pytest.mark.nvml_mock  # run where ../shared/peers/nvml-mock is (.ci/run); deselected by default


def test_healthy_node_is_accepted_and_becomes_the_baseline(tmp_path: Path) -> None:
    code, report = run_accept(tmp_path, write(tmp_path / "mock.yaml", base_config()))
    assert code == 0, failed(report)
    assert failed(report) == set()
    power = findings(report, "accept.power")
    assert set(power) == {f"gpu{i}" for i in range(8)} and all(f["status"] == "pass" for f in power.values())
    assert power["gpu0"]["observed"]["enforced_limit_w"] == 700.0
    assert findings(report, "accept.load")["node"]["status"] == "pass"
    assert findings(report, "accept.errors", "pass").keys() == power.keys()
    inventory = findings(report, "accept.gpu.lost")["node"]  # the mock's GPUs are not this host's PCI: not compared
    assert inventory["status"] == "pass" and "NVML counts 8, the board has 8" in inventory["message"]
    assert report["acceptance"]["became_baseline"] is True
    assert report["acceptance"]["xid_source"] == "nvml events"
    last = json.loads((tmp_path / "state" / "accept" / "last.json").read_text())
    assert last["passed"] is True and last["baseline"] == report["acceptance"]["run"]
    assert last["finished_at"].startswith(report["started_at"][:10])


def test_one_gpu_8c_hotter_at_the_same_power_is_a_thermal_finding(tmp_path: Path) -> None:
    doc = base_config()
    device(doc, 3)["dynamic_metrics"] = busy(temp_c=68)
    code, report = run_accept(tmp_path, write(tmp_path / "mock.yaml", doc))
    assert code == 1
    assert failed(report) == {("accept.temperature.spread", "node"), ("accept.thermal.siblings", "gpu3")}
    spread = findings(report, "accept.temperature.spread")["node"]
    assert spread["observed"] >= 6 and "hottest gpu3" in spread["message"]
    assert findings(report, "accept.thermal.siblings")["gpu3"]["observed"] > 10


def test_hw_thermal_slowdown_injected_mid_steady_is_a_finding(tmp_path: Path) -> None:
    doc = base_config()
    overrides = write(tmp_path / "overrides.yaml", {})
    started = tmp_path / "load-started"
    script = f"import time; open({str(started)!r}, 'w').close(); time.sleep(120)"
    proc = start_accept(tmp_path, write(tmp_path / "mock.yaml", doc), "--load", "command", "--", sys.executable,
                        "-c", script, overrides=overrides)
    wait_for(started.exists)  # the load starts after idle; steady follows within 3 samples at load
    time.sleep(4.0)  # well inside the 10 s steady window
    # Overrides are a map by device index, deep-merged over the config and re-read every second.
    write(tmp_path / "overrides.yaml", {"devices": {"5": {"clocks_throttle_reasons": {"hw_thermal_slowdown": True}}}})
    code, report = finish(proc)
    assert code == 1
    assert failed(report) == {("accept.clocks.events", "gpu5")}
    finding = findings(report, "accept.clocks.events")["gpu5"]
    assert finding["severity"] == "critical"
    steady = report["acceptance"]["phases"]["steady"]
    samples = (steady[1] - steady[0]) / 0.2
    assert 0 < finding["observed"]["hw_thermal"] < samples - 5  # set part-way through steady, not from the start


def test_gpu_capped_at_500_of_700_w_is_a_power_finding(tmp_path: Path) -> None:
    doc = base_config()
    gpu = device(doc, 2)
    gpu["power"] = {**doc["device_defaults"]["power"], "enforced_limit_mw": 500_000}
    gpu["dynamic_metrics"] = busy(power_mw=490_000)
    code, report = run_accept(tmp_path, write(tmp_path / "mock.yaml", doc))
    assert code == 1
    assert ("accept.power", "gpu2") in failed(report)
    assert {c for c, s in failed(report) if s != "gpu2"} <= {"accept.thermal.siblings"}  # less power: more degC/W
    finding = findings(report, "accept.power")["gpu2"]
    assert "capped at 500 W of its 700 W default" in finding["message"]


def test_gpu_falling_off_the_bus_mid_run_is_a_critical_finding(tmp_path: Path) -> None:
    doc = base_config()
    device(doc, 6)["failure"] = {"mode": "fallen_off_bus", "after_calls": 400}
    code, report = run_accept(tmp_path, write(tmp_path / "mock.yaml", doc))
    assert code == 1
    assert failed(report) == {("accept.gpu.lost", "gpu6")}
    finding = findings(report, "accept.gpu.lost")["gpu6"]
    assert finding["severity"] == "critical" and "lost" in finding["message"]
    assert finding["observed"]["at_s"] > report["acceptance"]["phases"]["idle"][1]  # under load, not at start
    assert "gpu6" not in findings(report, "accept.power")  # no readings after it is lost: not judged


def test_a_gpu_off_the_bus_from_the_start_fails_acceptance_and_is_never_the_baseline(tmp_path: Path) -> None:
    doc = base_config()
    device(doc, 7)["failure"] = {"mode": "fallen_off_bus"}  # lost before the first read: NVML counts 8, reads 7
    code, report = run_accept(tmp_path, write(tmp_path / "mock.yaml", doc))
    assert code == 1
    assert failed(report) == {("accept.gpu.lost", "gpu7")}
    finding = findings(report, "accept.gpu.lost")["gpu7"]
    assert finding["severity"] == "critical" and "could not be read at the start" in finding["message"]
    assert "fallen off the bus" in finding["message"]
    assert report["acceptance"]["passed"] is False and report["acceptance"]["became_baseline"] is False
    accept_dir = tmp_path / "state" / "accept"
    assert not (accept_dir / "baseline.json").exists()
    assert json.loads((accept_dir / "last.json").read_text())["passed"] is False


def test_second_run_with_one_gpu_degraded_drifts_from_the_baseline(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code, first = run_accept(tmp_path, write(tmp_path / "mock.yaml", base_config()), state=state)
    assert code == 0 and first["acceptance"]["became_baseline"]
    doc = base_config()
    device(doc, 1)["dynamic_metrics"] = busy(temp_c=68)  # +8 degC at the same power as at acceptance
    code, second = run_accept(tmp_path, write(tmp_path / "mock2.yaml", doc), state=state)
    assert code == 1
    assert {s for c, s in failed(second) if c == "accept.drift"} == {"gpu1"}
    assert failed(second) - {("accept.drift", "gpu1")} <= {("accept.temperature.spread", "node"),
                                                         ("accept.thermal.siblings", "gpu1")}
    drift = [f for f in second["findings"] if f["check"] == "accept.drift" and f["subject"] == "gpu1"
             and f["status"] == "fail"]
    assert "degC/W against the baseline" in drift[0]["message"] and drift[0]["observed"] > 10
    assert second["acceptance"]["baseline"] == first["acceptance"]["run"]
    # The report says what judged it and when it ended (the fleet report reads both)
    assert first["acceptance"]["compared_with"] is None
    assert second["acceptance"]["compared_with"] == first["acceptance"]["run"]
    assert second["acceptance"]["finished_at"] >= second["started_at"][:19]
    last = json.loads((state / "accept" / "last.json").read_text())
    assert last == {**last, "passed": False, "baseline": first["acceptance"]["run"], "drift": ["gpu1"]}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_load_and_still_writes_the_result(tmp_path: Path, sig: signal.Signals) -> None:
    pids = tmp_path / "load.pid"
    script = f"import os, time; open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    proc = start_accept(tmp_path, write(tmp_path / "mock.yaml", base_config()), "--load", "command", "--",
                        sys.executable, "-c", script)
    wait_for(pids.exists)
    time.sleep(3.0)  # into steady
    during = json.loads((tmp_path / "state" / "accept" / "last.json").read_text())
    assert during["passed"] is False and during["in_progress"] is True and during["pid"] == proc.pid
    proc.send_signal(sig)
    code, report = finish(proc, timeout_s=60)
    assert code == 1
    load = findings(report, "accept.load")["node"]
    assert load["status"] == "fail" and f"interrupted by {sig.name}" in load["message"]
    assert report["acceptance"]["load"]["stopped"] == "stopped with SIGTERM"
    assert not Path(f"/proc/{pids.read_text()}").exists()
    last = json.loads((tmp_path / "state" / "accept" / "last.json").read_text())
    assert last["passed"] is False and last["interrupted"] == sig.name and "in_progress" not in last


def test_with_a_bmc_inlet_gives_thermal_resistance_and_psu_cross_check(tmp_path: Path) -> None:
    """A real Redfish peer as the BMC: inlet 24 degC gives degC/W above inlet; its PSU input (565 W, the
    recorded server at idle) is far below the GPUs' summed draw, which the cross-check calls out."""
    password = tmp_path / "bmc-password"
    password.write_text("secret\n")
    password.chmod(0o600)
    with sushy_static(mockup("hpe-dl380a-gen11")) as peer:
        proc = start_accept(tmp_path, write(tmp_path / "mock.yaml", base_config()), "--bmc", peer.url,
                            "--bmc-user", "operator", "--bmc-password-file", str(password))
        code, report = finish(proc)
    assert code == 1
    assert failed(report) == {("accept.psu", "node")}
    psu = findings(report, "accept.psu")["node"]
    assert psu["observed"] < 0.2 and "565 W vs" in psu["message"]
    resistance = findings(report, "accept.thermal.resistance")
    assert {f["status"] for f in resistance.values()} == {"pass"} and len(resistance) == 8
    assert 0.04 < resistance["gpu0"]["observed"] < 0.07  # (60 - 24) / 680
    assert report["sources"]["bmc"]["ok"] is True
