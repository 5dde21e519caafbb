"""The IPMI source against a real BMC simulator (OpenIPMI ipmi_sim, see tests/peers/ipmi_sim.py).

Needs `ipmi_sim` and `sdrcomp` (`python -m tests.peers.setup` installs them); without them these tests fail.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Any, NamedTuple

import pytest

from agent.core.facts import BmcFacts, BmcFan, BmcLogEntry, BmcPsu, BmcTemperature, BmcVoltage, FirmwareItem
from agent.core.model import SourceStatus, Unknown, Unsupported
from agent.sources.ipmi import RECORD_FORMAT, read_ipmi_live, read_ipmi_recorded, validate_target
from tests.integration.test_ipmi_worker import reader_processes, worker_running
from tests.peers import ipmi_sim as sim_harness
from tests.peers.ipmi_sim import (
    BMC_FIRMWARE,
    FRU_MANUFACTURER,
    FRU_PRODUCT,
    IpmiSim,
    StartSim,
    free_port,
    ipmi_sim_factory_fixture,  # noqa: F401 - the `ipmi_sim_factory` fixture
    ipmi_sim_fixture,  # noqa: F401 - the `ipmi_sim` fixture
)

WRONG_PASSWORD = "Wr0ng-Pa55-Zebra-7"


class LiveRead(NamedTuple):
    facts: BmcFacts | Unknown
    status: SourceStatus
    raw: dict[str, Any]
    elapsed_s: float


def live(sim: IpmiSim, password: str | None = None, timeout_s: float = 10.0, worker: list[str] | None = None
         ) -> LiveRead:
    start = time.monotonic()
    facts, status, raw = read_ipmi_live(sim.host, sim.port, sim.user,
                                        sim.password if password is None else password, timeout_s, worker=worker)
    return LiveRead(facts, status, raw, time.monotonic() - start)


def known(facts: BmcFacts | Unknown) -> BmcFacts:
    assert isinstance(facts, BmcFacts), f"expected facts, got {facts!r}"
    return facts


def by_name(items: Any) -> dict[str, Any]:
    assert isinstance(items, tuple), f"expected a tuple of items, got {items!r}"
    return {item.name: item for item in items}


def everything_said(*objects: object) -> str:
    """Every text a result can show: str, repr, JSON of each object and of its parts."""
    parts: list[str] = []
    for obj in objects:
        parts += [str(obj), repr(obj)]
        if isinstance(obj, SourceStatus):
            parts.append(json.dumps(obj.to_json(), default=repr))
        if isinstance(obj, dict):
            parts.append(json.dumps(obj, default=repr))
        if isinstance(obj, BmcFacts):
            parts += [repr(value) for value in obj]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def healthy(ipmi_sim: IpmiSim) -> LiveRead:
    """One live read of the shared healthy simulator."""
    return live(ipmi_sim)


# --- against the simulator ------------------------------------------------------------------------


def test_healthy_read(healthy: LiveRead) -> None:
    facts = known(healthy.facts)
    assert healthy.status.ok and healthy.status.error is None, healthy.status
    assert facts.protocol == "ipmi"
    assert facts.problems == ()
    assert facts.power_state == "On"
    assert facts.manufacturer == FRU_MANUFACTURER
    assert facts.model == FRU_PRODUCT
    assert facts.vendor == "NVIDIA"  # IANA 5703 in Get Device ID
    assert facts.manager_firmware == BMC_FIRMWARE
    assert facts.firmware == (FirmwareItem("BMC", BMC_FIRMWARE, "BMC", where="IPMI Get Device ID"),)
    assert facts.health == "OK" and facts.health_causes == ()
    assert facts.requests > 10
    assert facts.redfish_version == Unsupported("not available over IPMI")

    temps = by_name(facts.temperatures)
    assert set(temps) == {"GPU0_Temp", "GPU1_Temp", "Inlet_Temp"}
    assert temps["GPU0_Temp"] == BmcTemperature(
        "GPU0_Temp", 45.0, upper_caution=85.0, upper_critical=90.0, upper_fatal=95.0, state="Enabled",
        health="OK", context="GPU", where="IPMI sensor 32.1.0")
    assert temps["GPU1_Temp"].reading == 47.0 and temps["GPU1_Temp"].upper_fatal == 95.0
    inlet = temps["Inlet_Temp"]
    assert (inlet.reading, inlet.upper_caution, inlet.upper_critical, inlet.upper_fatal) == (24.0, 40.0, 45.0, None)
    assert inlet.context == "Intake"

    fans = by_name(facts.fans)
    assert fans["FAN1"] == BmcFan("FAN1", 4800.0, "RPM", lower_critical=1000.0, state="Enabled", health="OK",
                                  where="IPMI sensor 32.4.0")
    assert fans["FAN2"].reading == 5200.0

    psus = by_name(facts.psus)
    assert psus["PSU1_Status"] == BmcPsu("PSU1_Status", state="Enabled", health="OK", where="IPMI sensor 32.6.0")
    # the empty slot ("na" in ipmitool) is reported, but not as a fault
    assert psus["PSU2_Status"] == BmcPsu("PSU2_Status", state="Absent", health=None, where="IPMI sensor 32.7.0")
    assert facts.power_consumed_w == 1240.0

    assert isinstance(facts.events, tuple) and len(facts.events) == 1, facts.events
    (event,) = facts.events
    assert event.log == "SEL" and event.severity == "Warning" and "Correctable" in event.message
    assert event.message.startswith("Memory (Sensor 32.16.0)")
    assert event.created is None  # a "Pre-Init" timestamp: valid, but not a date
    assert event.message_id == "12.111.0"  # memory, sensor-specific, offset 0

    # the 12 V rail with its six thresholds (issue 31.2: voltages are read and judged both ways)
    assert facts.voltages == (BmcVoltage("P12V", 12.06, lower_caution=11.4, lower_critical=10.8, lower_fatal=10.2,
                                         upper_caution=12.6, upper_critical=13.2, upper_fatal=13.8, state="Enabled",
                                         health="OK", where="IPMI sensor 32.9.0"),)

    assert healthy.status.detail["sensors"] == 9 and healthy.status.detail["sel_entries"] == 1


def test_recorded_round_trip(healthy: LiveRead) -> None:
    text = json.dumps(healthy.raw)
    assert healthy.raw["format"] == RECORD_FORMAT
    assert sim_harness.PASSWORD not in text
    facts, status = read_ipmi_recorded(json.loads(text))
    assert facts == healthy.facts
    assert status.ok and status.detail["recorded"] is True
    assert status.detail["sensors"] == healthy.status.detail["sensors"]


def test_runtime_faults(ipmi_sim_factory: StartSim) -> None:
    sim = ipmi_sim_factory()
    before = known(live(sim).facts)
    assert isinstance(before.events, tuple)
    old_ids = {event.entry_id for event in before.events}

    sim.set_sensor("GPU0_Temp", 95)  # past UNC 85, UC 90 and UNR 95: three SEL events
    sim.set_sensor("FAN1", 5)  # 500 RPM, below LC 1000
    sim.inject("sel_add 0x20 2 0x00 0x00 0x00 0x00 0x20 0x00 0x04 0x0c 0x07 0x6f 0x01 0xff 0xff")  # memory UE
    after = live(sim)
    facts = known(after.facts)
    assert after.status.ok, after.status

    gpu0 = by_name(facts.temperatures)["GPU0_Temp"]
    assert gpu0.reading == 95.0 and gpu0.health == "Critical" and gpu0.upper_fatal == 95.0
    assert by_name(facts.temperatures)["GPU1_Temp"].health == "OK"
    fan1 = by_name(facts.fans)["FAN1"]
    assert fan1.reading == 500.0 and fan1.lower_critical == 1000.0 and fan1.health == "Critical"
    assert facts.health == "Critical"
    assert any(cause.startswith("GPU0_Temp:") for cause in facts.health_causes)
    assert any(cause.startswith("FAN1:") for cause in facts.health_causes)

    assert isinstance(facts.events, tuple)
    new = [event for event in facts.events if event.entry_id not in old_ids]
    severity = {event.message.split(" (")[0]: event.severity for event in new}
    assert severity.get("GPU0_Temp: Upper critical going high") == "Critical", new
    assert severity.get("GPU0_Temp: Upper non-critical going high") == "Warning", new
    assert severity.get("FAN1: Lower Critical going low") == "Critical", new
    uc = next(event for event in new if event.message_id == "1.1.9")
    assert uc.message == "GPU0_Temp: Upper critical going high (reading 95, threshold 90)"
    ue = [event for event in new if "Uncorrectable" in event.message]
    assert len(ue) == 1 and ue[0].severity == "Critical", new


def test_repeated_reads_in_one_process(ipmi_sim: IpmiSim, healthy: LiveRead) -> None:
    # pyghmi 1.6.19 hands a dead session to the next Command with the same settings in one process:
    # each read runs in a fresh reader process, so none is ever handed on
    for _ in range(2):
        again = live(ipmi_sim)
        assert again.status.ok and known(again.facts).problems == (), again.status
        # the same facts (the request count is left out of the comparison)
        assert known(again.facts)._replace(requests=0) == known(healthy.facts)._replace(requests=0)


def test_wrong_password_is_an_authentication_failure_without_the_password(ipmi_sim: IpmiSim) -> None:
    for _ in range(2):  # the second attempt must not inherit the first one's dead session
        result = live(ipmi_sim, password=WRONG_PASSWORD)
        assert isinstance(result.facts, Unknown), result.facts
        assert "authentication failed" in result.facts.reason and ipmi_sim.user in result.facts.reason
        assert not result.status.ok and result.status.error == result.facts.reason
        assert result.elapsed_s < 2.0  # rejected at once: no retry loop
        said = everything_said(result.facts, result.status, result.raw)
        assert WRONG_PASSWORD not in said and ipmi_sim.password not in said
    # the simulator still serves the right password afterwards
    after = live(ipmi_sim)
    assert after.status.ok and known(after.facts).problems == ()


def test_password_is_scrubbed_from_pyghmi_errors() -> None:
    # pyghmi's exception text (raised in the reader process) quotes the password: it is scrubbed there
    leaky = worker_running(
        "from pyghmi.exceptions import IpmiException\n"
        "class Leaky:\n"
        "    def __init__(self, **kwargs):\n"
        "        raise IpmiException(f\"session failed for {kwargs['userid']}:{kwargs['password']}\")\n"
        "w.command_class = lambda channel: Leaky\n")
    facts, status, raw = read_ipmi_live("127.0.0.1", 623, "admin", WRONG_PASSWORD, 5.0, worker=leaky)
    assert isinstance(facts, Unknown) and "session failed for admin:***" in facts.reason, facts
    assert WRONG_PASSWORD not in everything_said(facts, status, raw)


def test_dead_port_is_unknown_within_the_deadline() -> None:
    port = free_port()  # UDP, nobody listening
    start = time.monotonic()
    facts, status, raw = read_ipmi_live("127.0.0.1", port, "admin", "password", timeout_s=2.0)
    elapsed = time.monotonic() - start
    assert elapsed < 4.0
    assert isinstance(facts, Unknown)
    assert facts.reason == "IPMI did not answer within 2 s (stuck in login)"
    assert not status.ok and status.error == facts.reason and status.detail["port"] == port
    assert raw["error"] == facts.reason
    assert read_ipmi_recorded(raw)[0] == facts


def test_six_bit_sdr_names_do_not_hang_the_read(ipmi_sim_factory: StartSim) -> None:
    sim = ipmi_sim_factory(six_bit_names=True)
    result = live(sim, timeout_s=3.0)
    assert result.elapsed_s < 5.0
    assert isinstance(result.facts, Unknown), "pyghmi decoded 6-bit SDR names: update this test and the docs"
    assert result.facts.reason == "IPMI did not answer within 3 s (stuck in reading the SDR repository)"
    # the stuck reader process is killed rather than left spinning on a CPU, and no thread stays behind
    assert reader_processes() == []
    assert not any(t.name == "ipmi-reader" or "IOWorker" in type(t).__name__ for t in threading.enumerate())


def test_deadline_in_the_sel_keeps_what_was_read(ipmi_sim: IpmiSim) -> None:
    stuck_sel = worker_running("w.fetch_sel = lambda cmd: time.sleep(3600)\n")
    result = live(ipmi_sim, timeout_s=5.0, worker=stuck_sel)
    facts = known(result.facts)
    why = "IPMI did not answer within 5 s (stuck in reading the SEL)"
    assert facts.events == Unknown(why)
    assert isinstance(facts.temperatures, tuple) and len(facts.temperatures) == 3
    assert facts.model == FRU_PRODUCT
    assert not result.status.ok and result.status.error == why
    assert result.raw["incomplete"] == why and result.raw["sel"] == {"error": why}
    replay = read_ipmi_recorded(json.loads(json.dumps(result.raw)))
    assert replay[0] == facts and replay[1].error == why
    assert reader_processes() == []


# --- validation and recorded data (no simulator) ----------------------------------------------------


@pytest.mark.parametrize(("host", "port"), [
    ("", 623), ("bmc 01", 623), ("bmc;reboot", 623), ("-bmc", 623), ("a" * 300, 623),
    ("10.0.0.5", 0), ("10.0.0.5", 65536), ("10.0.0.5", "623"), ("10.0.0.5", True),
])
def test_bad_targets_are_refused_before_any_io(host: str, port: Any) -> None:
    start = time.monotonic()
    facts, status, raw = read_ipmi_live(host, port, "admin", "secret-pw")
    assert time.monotonic() - start < 0.5
    assert isinstance(facts, Unknown) and not status.ok and raw["error"] == facts.reason
    assert "IPMI host" in facts.reason or "IPMI port" in facts.reason
    assert "secret-pw" not in everything_said(facts, status, raw)


@pytest.mark.parametrize("host", ["10.0.0.5", "::1", "[fe80::1]", "bmc-01.example.com", "bmc01"])
def test_good_targets(host: str) -> None:
    assert validate_target(host, 623, "admin") is None


def test_long_user_name_is_refused() -> None:
    assert "16 bytes" in str(validate_target("10.0.0.5", 623, "u" * 17))


def _healthy_raw(healthy: LiveRead) -> dict[str, Any]:
    return copy.deepcopy(healthy.raw)


def _sensor(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in raw["sensors"] if s["name"] == name)


BAD_RECORDINGS = [
    ("not an object", lambda raw: ["a", "list"], "expected a JSON object"),
    ("wrong format", lambda raw: {**raw, "format": "nodewarden.redfish/v1"}, "not a nodewarden.ipmi/v1"),
    ("missing parts", lambda raw: {"format": RECORD_FORMAT}, "missing device_id, power, sensors, fru, sel"),
    ("sensors not a list", lambda raw: {**raw, "sensors": {"a": 1}}, "sensors: expected a list"),
    ("sensor value text", lambda raw: _set(raw, "sensors", 0, "value", "45"), "sensors[0].value"),
    ("sensor health text", lambda raw: _set(raw, "sensors", 0, "health", "ok"), "sensors[0].health"),
    ("sensor name missing", lambda raw: _drop(raw, "sensors", 0, "name"), "sensors[0].name"),
    ("thresholds a list", lambda raw: _set(raw, "sensors", 0, "thresholds", [85]), "sensors[0].thresholds"),
    ("short device id", lambda raw: {**raw, "device_id": {"data": [0, 3]}}, "device_id.data"),
    ("power state number", lambda raw: {**raw, "power": {"state": 1}}, "power.state"),
    ("fru without fields", lambda raw: {**raw, "fru": {}}, "fru.fields"),
    ("sel entry text", lambda raw: {**raw, "sel": ["boom"]}, "sel[0]: expected an object"),
    ("sel timecode text", lambda raw: _set(raw, "sel", 0, "timecode", "now"), "sel[0].timecode"),
    ("requests text", lambda raw: {**raw, "requests": "many"}, "`requests`"),
    ("error not text", lambda raw: {**raw, "error": 5}, "error: expected text"),
]


def _set(raw: dict[str, Any], part: str, index: int, key: str, value: Any) -> dict[str, Any]:
    raw[part][index][key] = value
    return raw


def _drop(raw: dict[str, Any], part: str, index: int, key: str) -> dict[str, Any]:
    del raw[part][index][key]
    return raw


@pytest.mark.parametrize(("label", "damage", "expected"), BAD_RECORDINGS, ids=[b[0] for b in BAD_RECORDINGS])
def test_bad_recorded_data_is_unknown_with_a_reason(healthy: LiveRead, label: str, damage: Any,
                                                    expected: str) -> None:
    facts, status = read_ipmi_recorded(damage(_healthy_raw(healthy)))
    assert isinstance(facts, Unknown), label
    assert facts.reason.startswith("unreadable IPMI recording: ") and expected in facts.reason, facts.reason
    assert not status.ok and status.error == facts.reason


def test_recorded_failures_replay_as_facts(healthy: LiveRead) -> None:
    raw = _healthy_raw(healthy)
    raw["fru"] = {"error": "reading FRU 0: Invalid command (code 0xC1)"}
    raw["sensors"][0] = {k: v for k, v in raw["sensors"][0].items()
                         if k in ("id", "number", "lun", "name", "type", "entity", "reading_type", "units")}
    raw["sensors"][0]["error"] = "Get Sensor Reading: timeout (code 0xC3)"
    facts = known(read_ipmi_recorded(raw)[0])
    assert facts.model == Unknown("reading FRU 0: Invalid command (code 0xC1)")
    assert facts.problems == ("fru: reading FRU 0: Invalid command (code 0xC1)",)
    gpu0 = by_name(facts.temperatures)["GPU0_Temp"]
    assert (gpu0.reading, gpu0.state, gpu0.health) == (None, None, None)
    assert facts.health == "OK"  # an unread sensor is not a fault


def test_sensor_and_event_mapping_edge_cases(healthy: LiveRead) -> None:
    raw = _healthy_raw(healthy)
    psu2 = _sensor(raw, "PSU2_Status")
    psu2.update(unavailable=False, states=[], health=0)  # readable, presence bit clear: empty slot
    psu1 = _sensor(raw, "PSU1_Status")
    psu1.update(states=["Present", "Failure"], health=2)
    inlet = _sensor(raw, "Inlet_Temp")
    inlet.update(units="°F", value=77.0, thresholds={"unc": 104.0, "uc": 113.0})
    fan2 = _sensor(raw, "FAN2")
    fan2.update(unavailable=True, value=None)  # "na"
    raw["sensors"].append({**_sensor(raw, "Sys_Power"), "id": "32.10.0", "name": "PSU1_Input", "value": 640.0})
    raw["sel"] = [
        {"record_id": 7, "timecode": 1_700_000_000, "component": "CPU0", "component_type": "Processor",
         "event": "Thermal trip", "event_id": "111.1", "component_type_id": 7, "severity": 4, "deassertion": False},
        {"record_id": 8, "timecode": 100, "component": "GPU0_Temp", "component_type": "Temperature",
         "event": "Upper critical", "event_id": "1.9", "severity": 0, "deassertion": True},
        {"record_id": 9, "timecode": 0xFFFFFFFF, "oemdata": "00112233"},
    ]
    facts = known(read_ipmi_recorded(raw)[0])
    psus = by_name(facts.psus)
    assert (psus["PSU2_Status"].state, psus["PSU2_Status"].health) == ("Absent", None)
    assert (psus["PSU1_Status"].state, psus["PSU1_Status"].health) == ("Enabled", "Critical")
    temps = by_name(facts.temperatures)
    assert (temps["Inlet_Temp"].reading, temps["Inlet_Temp"].upper_caution) == (25.0, 40.0)
    fan = by_name(facts.fans)["FAN2"]
    assert (fan.reading, fan.state, fan.health) == (None, "Absent", None)
    assert facts.power_consumed_w == 1240.0  # "Sys_" names the total, not PSU1_Input
    assert facts.events == (
        BmcLogEntry("SEL", "7", "Critical", "CPU0: Thermal trip", "2023-11-14T22:13:20+00:00", "7.111.1"),
        BmcLogEntry("SEL", "8", "OK", "GPU0_Temp: Upper critical going high (deasserted)", None, "1.9"),
        BmcLogEntry("SEL", "9", None, "IPMI: OEM record 00112233", None, None),
    )
    assert facts.health == "Critical" and facts.health_causes == ("PSU1_Status: Present, Failure",)


def test_several_power_sensors_without_a_total_are_unknown(healthy: LiveRead) -> None:
    raw = _healthy_raw(healthy)
    _sensor(raw, "Sys_Power")["name"] = "PSU1_Input"
    raw["sensors"].append({**_sensor(raw, "PSU1_Input"), "id": "32.9.0", "name": "PSU2_Input", "value": 600.0})
    facts = known(read_ipmi_recorded(raw)[0])
    assert isinstance(facts.power_consumed_w, Unknown) and "PSU1_Input, PSU2_Input" in facts.power_consumed_w.reason


# --- the harness itself ---------------------------------------------------------------------------------


def test_harness_fails_without_ipmi_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"ipmi_sim and sdrcomp not found.*tests\.peers\.setup"):
        sim_harness.require_tools()


def test_harness_reports_rejected_console_commands(ipmi_sim: IpmiSim) -> None:
    with pytest.raises(sim_harness.SimError, match="Unknown command"):
        ipmi_sim.inject("no_such_command 1 2")
    assert "no_such_command 1 2" not in ipmi_sim.injected
