"""The IPMI record parser: ipmi.json (the raw answers of a live read, or a recording) as `BmcFacts`.

The layout of ipmi.json and how it maps into `BmcFacts` are described in agent/sources/ipmi.py.
Live and recorded reads go through `facts_and_status`, so a recording exercises exactly the
parser that runs against a real BMC.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.core.facts import BmcFacts, BmcFan, BmcLogEntry, BmcPsu, BmcTemperature, BmcVoltage, FirmwareItem
from agent.core.model import SourceStatus, Unknown, Unsupported
from agent.core.numbers import MAGNITUDE, finite
from agent.sources.ipmi_const import (
    HEALTH_CRITICAL,
    HEALTH_FAILED,
    HEALTH_WARNING,
    IANA_VENDORS,
    PARTS,
    PREINIT_LIMIT,
    RECORD_FORMAT,
    SOURCE,
    THRESHOLD_KEYS,
    TIMECODE_UNSPECIFIED,
)

NOT_OVER_IPMI = Unsupported("not available over IPMI")
_TOTAL_POWER_RE = re.compile(r"total|sys|consum|platform|node|chassis|server|input power|^pwr|^power$", re.I)
_CONTEXTS = (  # sensor name (or SDR entity) -> Redfish PhysicalContext
    (re.compile(r"gpu|hgx|sxm", re.I), "GPU"),
    (re.compile(r"inlet|intake|ambient|front", re.I), "Intake"),
    (re.compile(r"exhaust|outlet|rear", re.I), "Exhaust"),
    (re.compile(r"cpu|proc|socket", re.I), "CPU"),
    (re.compile(r"dimm|mem", re.I), "Memory"),
    (re.compile(r"psu|ps\d|power supply", re.I), "PowerSupply"),
    (re.compile(r"vr|vrm|regulator", re.I), "VoltageRegulator"),
    (re.compile(r"nic|lan|ocp", re.I), "NetworkingDevice"),
    (re.compile(r"board|mb|baseboard|system", re.I), "SystemBoard"),
)
_PSU_OFFLINE_STATES = ("power input lost", "power input out of range")


class RecordError(ValueError):
    """The raw IPMI structure (ipmi.json) is not what this parser reads."""


# --- replay -------------------------------------------------------------------------------------------


def read_ipmi_recorded(data: object) -> tuple[BmcFacts | Unknown, SourceStatus]:
    """Parse a recorded ipmi.json structure exactly as a live read is parsed; never raises."""
    start = time.monotonic()
    facts, status = facts_and_status(data, 0.0)
    status.duration_s = time.monotonic() - start
    status.detail["recorded"] = True
    return facts, status


def facts_and_status(raw: object, elapsed: float) -> tuple[BmcFacts | Unknown, SourceStatus]:
    """The facts and source status of raw IPMI answers (live or recorded); never raises."""
    try:
        facts = parse_ipmi(raw)
    except RecordError as exc:
        why = f"unreadable IPMI recording: {exc}"
        return Unknown(why), SourceStatus(SOURCE, ok=False, error=why, duration_s=elapsed)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not kill the audit
        why = f"IPMI answers could not be parsed: {type(exc).__name__}: {exc}"
        return Unknown(why), SourceStatus(SOURCE, ok=False, error=why, duration_s=elapsed)
    assert isinstance(raw, dict)  # parse_ipmi checked it
    target = raw.get("target")
    detail: dict[str, Any] = {k: target[k] for k in ("host", "port") if k in target} if isinstance(target, dict) else {}
    if isinstance(facts, Unknown):
        return facts, SourceStatus(SOURCE, ok=False, error=facts.reason, duration_s=elapsed, detail=detail)
    detail["requests"] = facts.requests
    detail["sensors"] = len(raw["sensors"]) if isinstance(raw.get("sensors"), list) else 0
    detail["sel_entries"] = len(facts.events) if isinstance(facts.events, tuple) else 0
    if isinstance(facts.manager_firmware, str):
        detail["bmc_firmware"] = facts.manager_firmware
    if facts.problems:
        detail["problems"] = len(facts.problems)
    incomplete = raw.get("incomplete")
    error = incomplete if isinstance(incomplete, str) else None
    if error is None and len(facts.problems) == len(PARTS):
        error = f"every IPMI request failed; first: {facts.problems[0]}"
    return facts, SourceStatus(SOURCE, ok=error is None, error=error, duration_s=elapsed, detail=detail)


def parse_ipmi(raw: object) -> BmcFacts | Unknown:
    """The raw IPMI answers (ipmi.json) as facts. Raises RecordError on a malformed structure."""
    if not isinstance(raw, dict):
        raise RecordError(f"expected a JSON object, got {type(raw).__name__}")
    if raw.get("format") != RECORD_FORMAT:
        raise RecordError(f"not a {RECORD_FORMAT} recording (format: {str(raw.get('format'))[:40]!r})")
    requests = raw.get("requests", 0)
    if isinstance(requests, bool) or not isinstance(requests, int):
        raise RecordError("`requests` must be an integer")
    if "error" in raw:
        return Unknown(_text(raw["error"], "error"))
    missing = [part for part in PARTS if part not in raw]
    if missing:
        raise RecordError(f"missing {', '.join(missing)}")
    problems: list[str] = []

    def part(name: str, parser: Callable[[Any], Any]) -> Any:
        value = raw[name]
        if isinstance(value, dict) and "not_captured" in value:  # an imported snapshot: nobody sent it
            return Unsupported(_text(value["not_captured"], f"{name}.not_captured"))
        if isinstance(value, dict) and "error" in value:
            why = _text(value["error"], f"{name}.error")
            problems.append(f"{name}: {why}")
            return Unknown(why)
        return parser(value)

    device = part("device_id", _parse_device_id)
    power = part("power", _parse_power)
    sensors = part("sensors", _parse_sensors)
    fru = part("fru", _parse_fru)
    events = part("sel", _parse_sel)

    firmware = device if isinstance(device, Unknown) else device[0]
    vendor = device if isinstance(device, Unknown) else device[1]
    if isinstance(sensors, Unknown):
        temperatures: Any = sensors
        fans: Any = sensors
        psus: Any = sensors
        voltages: Any = sensors
        power_w: Any = sensors
        health: Any = sensors
        causes: tuple[str, ...] = ()
    else:
        # A kind of sensor the SDR (or the capture: a lone `dcmi power reading`) holds none of is not
        # reported, never "all fine": its checks skip and say so.
        temperatures = sensors.temperatures or Unsupported("the IPMI sensor list holds no temperature sensor")
        fans = sensors.fans or Unsupported("the IPMI sensor list holds no fan sensor")
        psus = sensors.psus or Unsupported("the IPMI sensor list holds no power supply sensor")
        voltages = sensors.voltages or Unsupported("the IPMI sensor list holds no voltage sensor")
        power_w, health, causes = sensors.power_w, sensors.health, sensors.causes
    return BmcFacts(
        protocol="ipmi",
        vendor=vendor,
        redfish_version=NOT_OVER_IPMI,
        manufacturer=fru if isinstance(fru, Unknown) else fru[0],
        model=fru if isinstance(fru, Unknown) else fru[1],
        bios_version=NOT_OVER_IPMI,
        health=health,
        health_rollup=NOT_OVER_IPMI,
        health_causes=causes,
        manager_model=NOT_OVER_IPMI,
        manager_firmware=firmware,
        power_state=power,
        firmware=firmware if isinstance(firmware, Unknown) else (FirmwareItem("BMC", firmware, "BMC",
                                                                              where="IPMI Get Device ID"),),
        temperatures=temperatures,
        fans=fans,
        psus=psus,
        voltages=voltages,
        redundancy=NOT_OVER_IPMI,
        leak_detectors=NOT_OVER_IPMI,
        switches=NOT_OVER_IPMI,
        power_consumed_w=power_w,
        bios_attributes=NOT_OVER_IPMI,
        events=events,
        gpus=NOT_OVER_IPMI,
        problems=tuple(problems),
        requests=requests,
    )


# --- part parsers (shared by live and recorded reads) ---------------------------------------------------


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{where}: expected text, got {type(value).__name__}")
    return value


def _parse_device_id(value: Any) -> tuple[str, str]:
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, list) or len(data) < 11 or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in data):
        raise RecordError("device_id.data: expected the 11 or more bytes of a Get Device ID answer")
    version = f"{data[2] & 0x7F}.{data[3]:02x}"  # minor revision is BCD: 0x51 -> "51"
    manufacturer = data[6] | data[7] << 8 | (data[8] & 0x0F) << 16
    vendor = IANA_VENDORS.get(manufacturer, f"IANA {manufacturer}")
    return version, vendor


def _parse_power(value: Any) -> str:
    state = value.get("state") if isinstance(value, dict) else None
    if not isinstance(state, str):
        raise RecordError("power.state: expected text")
    return {"on": "On", "off": "Off"}.get(state.lower(), state)


def _parse_fru(value: Any) -> tuple[str | Unknown, str | Unknown]:
    fields = value.get("fields") if isinstance(value, dict) else None
    if not isinstance(fields, dict):
        raise RecordError("fru.fields: expected an object")

    def first(*keys: str) -> str | Unknown:
        for key in keys:
            text = fields.get(key)
            if isinstance(text, str) and text.strip():
                return text.strip()
        return Unknown(f"FRU 0 has no {' or '.join(repr(k) for k in keys)}")

    return first("Manufacturer", "Board manufacturer"), first("Product name", "Board product name")


@dataclass
class _Sensors:
    temperatures: tuple[BmcTemperature, ...]
    fans: tuple[BmcFan, ...]
    psus: tuple[BmcPsu, ...]
    voltages: tuple[BmcVoltage, ...]
    power_w: float | Unknown
    health: str
    causes: tuple[str, ...]


def _health_word(bits: int) -> str:
    if bits & (HEALTH_CRITICAL | HEALTH_FAILED):
        return "Critical"
    if bits & HEALTH_WARNING:
        return "Warning"
    return "OK"


_HEALTH_RANK = {"OK": 0, "Warning": 1, "Critical": 2}
# A fan state the BMC's IPMI sensor gives (health bit "failed": ipmitool's `nr`, `lnr`, `unr`): a present fan
# past its non-recoverable threshold. Redfish has no such state; bmc.fans judges it critical.
NON_RECOVERABLE = "NonRecoverable"


def _opt_number(record: dict[str, Any], key: str, where: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{where}.{key}: expected a number or null, got {type(value).__name__}")
    number = finite(value)  # NaN, inf or a 4,000-digit integer: no sensor reads that
    if number is None:
        raise RecordError(f"{where}.{key}: expected a finite number within +-{MAGNITUDE:g}")
    return number


def _parse_sensors(value: Any) -> _Sensors:
    if not isinstance(value, list):
        raise RecordError("sensors: expected a list")
    temperatures: list[BmcTemperature] = []
    fans: list[BmcFan] = []
    psus: list[BmcPsu] = []
    voltages: list[BmcVoltage] = []
    watts: list[tuple[str, float]] = []
    causes: list[str] = []
    worst = "OK"
    for index, record in enumerate(value):
        where = f"sensors[{index}]"
        if not isinstance(record, dict):
            raise RecordError(f"{where}: expected an object")
        name = _text(record.get("name"), f"{where}.name")
        kind = _text(record.get("type"), f"{where}.type")
        units = _text(record.get("units"), f"{where}.units")
        sid = record.get("id")
        location = f"IPMI sensor {sid}" if isinstance(sid, str) and sid else f"IPMI sensor {name}"
        thresholds = _parse_thresholds(record.get("thresholds"), where)
        reading = _opt_number(record, "value", where)
        state: str | None = None
        health: str | None = None
        bits: Any = 0
        states: Any = []
        if "error" in record:  # Get Sensor Reading failed: this sensor is unread, the source is fine
            _text(record["error"], f"{where}.error")
            reading = None
        else:
            unavailable, bits, states = record.get("unavailable"), record.get("health"), record.get("states")
            if not isinstance(unavailable, (bool, int)):
                raise RecordError(f"{where}.unavailable: expected true or false")
            if isinstance(bits, bool) or not isinstance(bits, int):
                raise RecordError(f"{where}.health: expected pyghmi's health bits (an integer)")
            if not isinstance(states, list) or not all(isinstance(s, str) for s in states):
                raise RecordError(f"{where}.states: expected a list of text")
            if unavailable:  # ipmitool's "na": no reading, and nothing to flag
                reading, state, health = None, "Absent", None
            else:
                state, health = "Enabled", _health_word(bits)
                if health != "OK":
                    causes.append(f"{name}: {', '.join(states) or health}")
                    if _HEALTH_RANK[health] > _HEALTH_RANK[worst]:
                        worst = health
        if kind == "Temperature" and units in ("°C", "°F", "K"):
            convert = _to_celsius(units)
            temperatures.append(BmcTemperature(
                name=name, reading=convert(reading), upper_caution=convert(thresholds.get("unc")),
                upper_critical=convert(thresholds.get("uc")), upper_fatal=convert(thresholds.get("unr")),
                state=state, health=health, context=_context(name, record.get("entity")), where=location))
        elif (kind == "Fan" and units) or units == "RPM":
            fan_units = "RPM" if "RPM" in units else "Percent" if units.startswith("%") else units
            if state == "Enabled" and isinstance(bits, int) and bits & HEALTH_FAILED:
                state = NON_RECOVERABLE  # ipmitool's `nr`: past the non-recoverable threshold, the BMC's own word
            fans.append(BmcFan(name=name, reading=reading, units=fan_units, lower_critical=thresholds.get("lc"),
                               state=state, health=health, where=location))
        elif kind == "Voltage" and units == "V":
            voltages.append(BmcVoltage(
                name=name, reading=reading, lower_caution=thresholds.get("lnc"), lower_critical=thresholds.get("lc"),
                lower_fatal=thresholds.get("lnr"), upper_caution=thresholds.get("unc"),
                upper_critical=thresholds.get("uc"), upper_fatal=thresholds.get("unr"), state=state, health=health,
                where=location))
        elif kind == "Power Supply" and not units:  # discrete: presence and failure states
            psus.append(_psu(name, state, bits, states, location))
        if units == "W" and reading is not None:
            watts.append((name, reading))
    return _Sensors(tuple(temperatures), tuple(fans), tuple(psus), tuple(voltages), _power(watts), worst, tuple(causes))


def _parse_thresholds(value: Any, where: str) -> dict[str, float | None]:
    if value is None or (isinstance(value, dict) and "error" in value):
        return {}
    if not isinstance(value, dict):
        raise RecordError(f"{where}.thresholds: expected an object")
    return {key: _opt_number(value, key, f"{where}.thresholds") for key in THRESHOLD_KEYS if key in value}


def _to_celsius(units: str) -> Callable[[float | None], float | None]:
    def convert(value: float | None) -> float | None:
        if value is None:
            return None
        if units == "°F":
            return round((value - 32.0) * 5.0 / 9.0, 3)
        if units == "K":
            return round(value - 273.15, 3)
        return value

    return convert


def _context(name: str, entity: Any) -> str | None:
    for text in (name, entity if isinstance(entity, str) else ""):
        for pattern, context in _CONTEXTS:
            if text and pattern.search(text):
                return context
    return None


def _psu(name: str, sensor_state: str | None, bits: int, states: list[str], where: str) -> BmcPsu:
    """A discrete Power Supply sensor: presence and failure offsets (IPMI table 42-3, type 08h)."""
    lowered = [s.lower() for s in states]
    if sensor_state != "Enabled":  # unreadable (None) or not available (Absent: an empty slot's "na")
        return BmcPsu(name=name, state=sensor_state, health=None, where=where)
    faults = [s for s in lowered if s not in ("present", "standby")]
    if "present" not in lowered and not faults:
        return BmcPsu(name=name, state="Absent", health=None, where=where)
    if any(s.startswith(_PSU_OFFLINE_STATES) for s in lowered):
        state = "UnavailableOffline"
    elif "standby" in lowered:
        state = "StandbySpare"
    else:
        state = "Enabled"
    health = _health_word(bits) if bits else ("Warning" if faults else "OK")
    return BmcPsu(name=name, state=state, health=health, where=where)


def _power(watts: list[tuple[str, float]]) -> float | Unknown:
    named = [value for name, value in watts if _TOTAL_POWER_RE.search(name)]
    if named:
        return named[0]
    if len(watts) == 1:
        return watts[0][1]
    if not watts:
        return Unsupported("the BMC has no power sensor (in W) with a reading")
    return Unknown(f"several power sensors ({', '.join(n for n, _ in watts[:6])}), none named as the total")


def _parse_sel(value: Any) -> tuple[BmcLogEntry, ...]:
    if not isinstance(value, list):
        raise RecordError("sel: expected a list")
    return tuple(_sel_entry(record, f"sel[{index}]") for index, record in enumerate(value))


def _sel_entry(record: Any, where: str) -> BmcLogEntry:
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected an object")
    record_id = record.get("record_id")
    if isinstance(record_id, bool) or not isinstance(record_id, (int, str)):
        raise RecordError(f"{where}.record_id: expected an integer")
    for key in ("component", "component_type", "event", "event_id", "event_data"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise RecordError(f"{where}.{key}: expected text")
    severity_bits = record.get("severity")
    if severity_bits is not None and (isinstance(severity_bits, bool) or not isinstance(severity_bits, int)):
        raise RecordError(f"{where}.severity: expected pyghmi's health bits (an integer)")
    timecode = record.get("timecode")
    if timecode is not None and (isinstance(timecode, bool) or not isinstance(timecode, int)):
        raise RecordError(f"{where}.timecode: expected an integer")
    event_id = record.get("event_id")
    sensor_type = record.get("component_type_id")
    message_id = f"{sensor_type}.{event_id}" if isinstance(sensor_type, int) and event_id else event_id
    component, component_type = record.get("component"), record.get("component_type")
    if component and component_type and component.startswith("Sensor "):  # no SDR for it: say what it is
        subject = f"{component_type} ({component})"
    else:
        subject = component or component_type or "IPMI"
    event = record.get("event")
    if event:
        message = f"{subject}: {event}"
        event_type, _, offset = (event_id or "").partition(".")
        if event_type == "1" and offset.isdigit():  # threshold events: odd offsets are "going high"
            message += " going high" if int(offset) % 2 else " going low"
        if record.get("deassertion") is True:
            message += " (deasserted)"
        details = []
        reading, threshold = record.get("reading"), record.get("threshold")
        if isinstance(reading, (int, float)) and not isinstance(reading, bool):
            details.append(f"reading {reading:g}")
        if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
            details.append(f"threshold {threshold:g}")
        if record.get("event_data"):
            details.append(str(record["event_data"]))
        if details:
            message += f" ({', '.join(details)})"
    else:
        oem = record.get("oemdata")
        message = f"{subject}: OEM record {oem}" if isinstance(oem, str) else f"{subject}: undecoded record"
    severity = _health_word(severity_bits) if isinstance(severity_bits, int) else None
    return BmcLogEntry(log="SEL", entry_id=str(record_id), severity=severity, message=message,
                       created=_sel_time(timecode), message_id=message_id)


def _sel_time(timecode: int | None) -> str | None:
    """ISO time of a SEL timecode; None for "Pre-Init" (seconds since BMC start) or unspecified."""
    if timecode is None or timecode < PREINIT_LIMIT or timecode == TIMECODE_UNSPECIFIED:
        return None
    return datetime.datetime.fromtimestamp(timecode, tz=datetime.timezone.utc).isoformat()
