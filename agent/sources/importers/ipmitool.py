"""The `ipmitool` kind: `ipmitool sensor`, `sdr elist`, `sdr`, `sel list`/`sel elist`, `fru`, `dcmi power reading`.

Each becomes the ipmi.json part agent.sources.ipmi's recorded reader parses, in
the shape its live reader records (pyghmi's answers): `sensors` (name, type,
units, value, health bits, states, thresholds), `sel` (record_id, timecode,
component, event, deassertion), `fru` (FRU 0's fields). One file may hold
several of these outputs (a collection script's log): every line is judged on
its own shape. What ipmitool prints as `na` (an empty slot, a sensor not
fitted) is recorded as unavailable: absent, never a failure. A `Pre-Init` SEL
timestamp counts seconds since the BMC started, not a date: that entry is
undated. ipmitool prints SEL dates in the capturing machine's local time,
which a file does not say; they are taken as UTC.

`dcmi power reading`'s instantaneous reading is added as one "System Power
(DCMI)" sensor in W, next to the SDR's sensors whichever input comes first.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import re
from typing import Any

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 64 << 20
MAX_SENSORS = 4096
MAX_SEL = 100_000
# What ipmi.json may hold as this importer writes it, well inside what audit reads back
# (agent.sources.bmc_source.RECORDING_MAX_BYTES, 32 MiB): 100,000 long SEL lines once made a 69 MB
# ipmi.json that audit refused (issue 31). Measured as each record's own JSON, with room for indenting.
SEL_BUDGET = 16 << 20  # the newest SEL entries that fit (a real SEL is a few thousand, ~1 MB)
SENSORS_BUDGET = 4 << 20  # 4,096 sensors of ~400 bytes: ~1.6 MB
FRU_FIELDS = 256
_SENSOR_RE = re.compile(r"^[^|]+\|\s*(?:na|0x[0-9a-fA-F]+|-?\d+(?:\.\d+)?)\s*\|(?:[^|]*\|){7}[^|]*$")
_ELIST_RE = re.compile(r"^([^|]+?)\s*\|\s*([0-9A-Fa-f]{2}h)\s*\|\s*(ok|ns|nc|cr|nr|lnc|lcr|lnr|unc|ucr|unr|na)\s*\|"
                       r"\s*(\d+\.\d+)\s*\|(.*)$")
_SDR_RE = re.compile(r"^([^|]+?)\s*\|\s*([^|]*?)\s*\|\s*(ok|ns|nc|cr|nr|na)\s*$")
_SEL_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})\s*\|\s*(Pre-Init|\d{2}/\d{2}/\d{2,4})\s*\|\s*([^|]*?)\s*\|"
                     r"\s*([^|]*?)\s*\|\s*([^|]*?)\s*(?:\|\s*(Asserted|Deasserted)\s*)?(?:\|\s*(.*?)\s*)?$")
_FRU_HEAD_RE = re.compile(r"^FRU Device Description\s*:\s*(.*?)\s*$")
_FRU_FIELD_RE = re.compile(r"^\s+([A-Za-z][A-Za-z0-9 /#.-]*?)\s*:\s*(.*?)\s*$")
_DCMI_RE = re.compile(r"^\s*Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts", re.IGNORECASE)
_DCMI_MORE_RE = re.compile(r"^\s*(?:(?:Minimum|Maximum|Average) .*Watts|IPMI timestamp:|Sampling period:"
                           r"|Power reading state is:)", re.IGNORECASE)
_NO_SEL_RE = re.compile(r"^\s*SEL has no entries\s*$")
_STATUS_BITS = {"ok": 0, "nc": 1, "lnc": 1, "unc": 1, "cr": 2, "lcr": 2, "ucr": 2, "nr": 4, "lnr": 4, "unr": 4}
_UNITS = {"degrees c": "°C", "degrees f": "°F", "degrees k": "K", "kelvin": "K", "rpm": "RPM", "watts": "W",
          "volts": "V", "amps": "A", "percent": "%", "% ": "%"}
_THRESHOLDS = ("lnr", "lc", "lnc", "unc", "uc", "unr")  # `ipmitool sensor` columns 5-10: lnr lcr lnc unc ucr unr
_PSU_RE = re.compile(r"\bpsu?\s*\d|\bps\d|power supply|\bpws\b", re.IGNORECASE)
_FAN_RE = re.compile(r"\bfan", re.IGNORECASE)
_SENSOR_TYPES = sorted((  # ipmitool's sensor type names, as `sel elist` prefixes them to the sensor's name
    "Temperature", "Voltage", "Current", "Fan", "Physical Security", "Platform Security", "Processor",
    "Power Supply", "Power Unit", "Cooling Device", "Other", "Memory", "Drive Slot / Bay", "Drive Slot (Bay)",
    "POST Memory Resize", "System Firmwares", "System Firmware Progress", "Event Logging Disabled", "Watchdog1",
    "Watchdog", "System Event", "Critical Interrupt", "Button", "Button / Switch", "Module / Board",
    "Microcontroller", "Add-in Card", "Chassis", "Chip Set", "Other FRU", "Cable / Interconnect", "Terminator",
    "System Boot Initiated", "Boot Error", "OS Boot", "OS Critical Stop", "OS Stop / Shutdown",
    "Slot / Connector", "System ACPI Power State", "Watchdog2", "Platform Alert", "Entity Presence",
    "Monitor ASIC", "LAN", "Management Subsys Health", "Management Subsystem Health", "Battery",
    "Session Audit", "Version Change", "FRU State", "Unknown"), key=len, reverse=True)
_FRU_KEYS = {  # ipmitool fru labels -> the field names pyghmi's FRU decoder gives (what the parser reads)
    "Product Manufacturer": "Manufacturer", "Product Name": "Product name", "Product Part Number": "Model",
    "Product Serial": "Serial Number", "Product Version": "Hardware Version", "Product Asset Tag": "Asset Number",
    "Board Mfg": "Board manufacturer", "Board Product": "Board product name", "Board Serial": "Board serial number",
    "Board Part Number": "Board model", "Board Mfg Date": "Board manufacture date",
    "Chassis Type": "Chassis type", "Chassis Part Number": "Chassis part number",
    "Chassis Serial": "Chassis serial number",
}
DCMI_SENSOR = "System Power (DCMI)"
_PSU_OFFSETS = ("Present", "Failed", "Predictive failure", "Power input lost", "Power input lost or out of range",
                "Power input out of range", "Configuration error", "Inactive")  # sensor type 08h


def _units(text: str) -> str:
    clean = text.strip().lower()
    if clean in ("", "discrete", "unspecified"):
        return ""
    return _UNITS.get(clean, text.strip())


def _kind(name: str, units: str, discrete: bool) -> str:
    if units in ("°C", "°F", "K"):
        return "Temperature"
    if units == "RPM" or (_FAN_RE.search(name) and units == "%"):
        return "Fan"
    if discrete and _PSU_RE.search(name):
        return "Power Supply"
    return {"V": "Voltage", "A": "Current", "W": "Power"}.get(units, "Other")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _sensor(name: str, kind: str, units: str, value: float | None, status: str, states: list[str],
            thresholds: dict[str, float] | None = None) -> dict[str, Any]:
    unavailable = status in ("na", "ns")
    record: dict[str, Any] = {"id": name, "name": name, "type": kind, "units": units, "entity": "",
                              "reading_type": 1 if units else 111, "value": None if unavailable else value,
                              "imprecision": None, "unavailable": unavailable,
                              "health": 0 if unavailable else _STATUS_BITS.get(status, 0),
                              "states": [] if unavailable else states, "state_ids": []}
    if thresholds:
        record["thresholds"] = thresholds
    return record


def _discrete_states(text: str) -> list[str]:
    """`sdr elist`'s discrete reading ("110 Watts, Presence detected") as pyghmi's state names."""
    states = []
    for part in (p.strip() for p in text.split(",")):
        if not part or re.match(r"^-?\d+(?:\.\d+)?\s+\S", part) or part.lower() in ("no reading", "disabled"):
            continue
        low = part.lower()
        states.append("Present" if low == "presence detected" else
                      "Power input lost" if "ac lost" in low or "input lost" in low else
                      "Failed" if low in ("failure detected", "predictive failure") else part)
    return states


def parse_sensor_line(line: str) -> dict[str, Any] | None:
    """One line of `ipmitool sensor` (10 columns), `sdr elist` or `sdr`; None for any other line."""
    if _SENSOR_RE.match(line):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) != 10:
            return None
        name, raw, unit_text, status = cells[0], cells[1], cells[2], cells[3].lower()
        units = _units(unit_text)
        discrete = raw.startswith("0x") or unit_text.strip().lower() == "discrete"
        value = None if discrete else _number(raw)
        status = "na" if raw == "na" else status if status in _STATUS_BITS or status in ("na", "ns") else "ok"
        thresholds = {key: n for key, cell in zip(_THRESHOLDS, cells[4:], strict=True)
                      if (n := _number(cell)) is not None}
        kind = _kind(name, units, discrete)
        states: list[str] = []
        if kind == "Power Supply" and re.fullmatch(r"0x[0-9a-fA-F]{4}", cells[3]):
            bits = int(cells[3], 16) >> 8  # ipmitool prints the two state bytes; the first holds offsets 0-7
            states = [word for bit, word in enumerate(_PSU_OFFSETS) if bits & (1 << bit)]
            status = "cr" if bits & 0b110 else "ok"
        return _sensor(name, kind, units, value, status, states, thresholds)
    if m := _ELIST_RE.match(line):
        name, status, reading = m.group(1).strip(), m.group(3).lower(), m.group(5).strip()
        first = re.match(r"^(-?\d+(?:\.\d+)?)\s+(.+?)\s*(?:,|$)", reading)
        units = _units(first.group(2)) if first else ""
        value = _number(first.group(1)) if first else None
        states = _discrete_states(reading)
        discrete = bool(states) or not first
        kind = _kind(name, units, discrete)
        if kind == "Power Supply":
            units, value = "", None
        return _sensor(name, kind, units, value, status, states)
    if m := _SDR_RE.match(line):
        name, reading, status = m.group(1).strip(), m.group(2).strip(), m.group(3).lower()
        first = re.match(r"^(-?\d+(?:\.\d+)?)\s+(.+)$", reading)
        if reading.lower() in ("no reading", "disabled", "na"):
            status = "ns"
        units = _units(first.group(2)) if first else ""
        return _sensor(name, _kind(name, units, not first), units, _number(first.group(1)) if first else None,
                       status, [])  # a discrete reading ("0x00") names no state
    return None


def _timecode(date: str, clock: str) -> int | None:
    """`MM/DD/YYYY` and `HH:MM:SS` as seconds since 1970 (taken as UTC); None when Pre-Init or unreadable."""
    if date == "Pre-Init":
        return None
    for fmt in ("%m/%d/%Y %H:%M:%S", "%m/%d/%y %H:%M:%S"):
        try:
            return calendar.timegm(dt.datetime.strptime(f"{date} {clock}", fmt).timetuple())
        except ValueError:
            continue
    return None


def parse_sel_line(line: str) -> dict[str, Any] | None:
    """One `sel list` / `sel elist` line as the record pyghmi's get_event_log gives; None otherwise."""
    m = _SEL_RE.match(line)
    if not m:
        return None
    record_id, date, clock, subject, event, direction, extra = m.groups()
    component_type = next((t for t in _SENSOR_TYPES if subject == t or subject.startswith(t + " ")), None)
    component = subject[len(component_type):].strip() if component_type else subject
    record: dict[str, Any] = {"record_id": int(record_id, 16), "timecode": _timecode(date, clock),
                              "component": component or None, "component_type": component_type,
                              "event": event or None, "deassertion": direction == "Deasserted"}
    if extra:
        record["event_data"] = extra[:300]
    return record


def parse_fru(lines: list[str]) -> dict[str, str]:
    """FRU 0 (the "Builtin FRU Device") fields, under pyghmi's names; the other FRU devices are not used."""
    fields: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        if m := _FRU_HEAD_RE.match(line):
            current = m.group(1)
            continue
        if current is not None and "(ID 0)" in current and (f := _FRU_FIELD_RE.match(line)):
            key = _FRU_KEYS.get(f.group(1), f.group(1))
            if f.group(2) and key not in fields:
                fields[key] = f.group(2)[:300]
    return fields


def _looks(line: str) -> bool:
    return bool(_SENSOR_RE.match(line) or _ELIST_RE.match(line) or _SEL_RE.match(line) or _NO_SEL_RE.match(line)
                or _FRU_HEAD_RE.match(line) or _DCMI_RE.match(line))


class IpmitoolImporter:
    kind = "ipmitool"

    def detect(self, head: bytes, name: str) -> bool:
        lines = [line for line in decode_text(head).splitlines()[:200] if line.strip()]
        if not lines:
            return False
        if any(_DCMI_RE.match(line) or _FRU_HEAD_RE.match(line) for line in lines):
            return True
        sdr = sum(bool(_SDR_RE.match(line)) for line in lines)
        hits = sum(_looks(line) for line in lines) + sdr
        return (sdr >= 3 or any(_looks(line) for line in lines)) and hits * 2 >= len(lines)

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an ipmitool output", path=builder.current)
        lines = decode_text(data).splitlines()
        sensors: list[dict[str, Any]] = []
        sel: list[dict[str, Any]] = []
        empty_sel = False
        dcmi: float | None = None
        unused = 0
        for line in lines:
            if not line.strip():
                continue
            if (record := parse_sel_line(line)) is not None:
                if len(sel) < MAX_SEL:
                    sel.append(record)
            elif _NO_SEL_RE.match(line):
                empty_sel = True
            elif (sensor := parse_sensor_line(line)) is not None:
                if len(sensors) < MAX_SENSORS:
                    sensors.append(sensor)
            elif m := _DCMI_RE.match(line):
                dcmi = float(m.group(1))
            elif not (_FRU_HEAD_RE.match(line) or _FRU_FIELD_RE.match(line) or _DCMI_MORE_RE.match(line)):
                unused += 1
        fru = dict(list(parse_fru(lines).items())[:FRU_FIELDS])
        sensors, cut = _within(sensors, SENSORS_BUDGET, newest=False)
        if cut:
            result.skipped.append(f"{cut} sensor(s) past the {SENSORS_BUDGET >> 20} MiB ipmi.json keeps of them")
        sel, cut = _within(sel, SEL_BUDGET, newest=True)
        if cut:
            result.skipped.append(f"{cut} older SEL entries past the {SEL_BUDGET >> 20} MiB ipmi.json keeps of them")
        if not (sensors or sel or empty_sel or fru or dcmi is not None):
            raise InputError("no ipmitool sensor, SDR, SEL, FRU or DCMI line in it", path=builder.current)
        if sensors:
            absent = sum(1 for s in sensors if s["unavailable"])
            if _add_sensors(builder, sensors, result):
                result.contributed.append(f"ipmi.json sensors: {len(sensors)} ({absent} not fitted or no reading)")
        if dcmi is not None and _add_sensors(builder, [_sensor(DCMI_SENSOR, "Power", "W", dcmi, "ok", [])], result):
            result.contributed.append(f"ipmi.json sensors: DCMI power reading {dcmi:g} W")
        if (sel or empty_sel) and builder.set_ipmi("sel", sel, result):
            undated = sum(1 for r in sel if r["timecode"] is None)
            result.contributed.append(f"ipmi.json sel: {len(sel)} entries" + (f" ({undated} undated: Pre-Init)"
                                                                                if undated else ""))
        if fru and builder.set_ipmi("fru", {"fields": fru}, result):
            result.contributed.append(f"ipmi.json fru: FRU 0, {len(fru)} fields")
        if unused:
            result.skipped.append(f"{unused} line(s) that are no ipmitool sensor, SEL, FRU or DCMI line")
        return result


def _within(records: list[dict[str, Any]], budget: int, *, newest: bool) -> tuple[list[dict[str, Any]], int]:
    """The records (the first, or with `newest` the last) whose JSON fits `budget`, and how many were cut."""
    used, kept = 0, 0
    for record in reversed(records) if newest else records:
        used += len(json.dumps(record, indent=1, sort_keys=True, default=str)) + 8 * (len(record) + 2)
        if used > budget:
            break
        kept += 1
    if kept == len(records):
        return records, 0
    return (records[len(records) - kept:] if newest else records[:kept]), len(records) - kept


def _add_sensors(builder: Builder, records: list[dict[str, Any]], result: Contribution) -> bool:
    """Sensors join the recording: the SDR's from the first input that has them, plus the DCMI reading."""
    have = builder.ipmi.get("sensors")
    if have is None:
        return builder.set_ipmi("sensors", records, result)
    dcmi_only = all(s.get("name") == DCMI_SENSOR for s in have)
    adding_dcmi = all(s.get("name") == DCMI_SENSOR for s in records)
    if adding_dcmi and not any(s.get("name") == DCMI_SENSOR for s in have):
        have.append(records[0])
        return True
    if dcmi_only and not adding_dcmi:
        builder.ipmi["sensors"] = [*records, *have]
        builder.ipmi_from["sensors"] = builder.current
        return True
    result.skipped.append(f"IPMI sensors: already taken from {builder.ipmi_from['sensors']}")
    return False
