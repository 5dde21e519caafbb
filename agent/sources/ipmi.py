"""IPMI source: the node as its BMC reports it over IPMI-over-LAN (RMCP+), via pyghmi.

One parser, two ways to get its input: `read_ipmi_live` asks the BMC and
keeps every answer as plain JSON (the *raw* structure, saved as `ipmi.json` in
a snapshot), then parses it; `read_ipmi_recorded` loads the same structure
and runs the same parser. A recording therefore exercises exactly the code
that runs against a real BMC.

What is read, in this order (one pyghmi session in one reader process, logged out at the end):
  1. log in (RMCP+ through pyghmi; a wrong password is never retried, so an
     audit cannot lock the account);
  2. Get Device ID (raw netfn 6 cmd 1): BMC firmware "major.minor"
     (minor is BCD, as ipmitool prints it) and the IANA manufacturer id;
  3. chassis power state;
  4. the SDR repository, then each sensor's reading (Get Sensor Reading)
     and, for threshold sensors, its thresholds (Get Sensor Thresholds):
     pyghmi's `get_sensor_data` exposes no thresholds, and it aborts on
     the first sensor that errors, so the loop is ours (per-sensor errors);
  5. FRU 0 in 32-byte chunks (raw netfn 0xa cmd 0x11) decoded by
     `pyghmi.ipmi.fru.FRU(rawdata=...)`: pyghmi's `get_inventory` asks for
     224 bytes and fails on BMCs (ipmi_sim among them) that answer 0xC8;
  6. the SEL (`get_event_log`).

The read runs in a process of its own (agent/sources/ipmi_worker.py, started and bounded by
agent/sources/ipmi_live.py), as ipmi_exporter runs freeipmi: pyghmi can loop forever (1.6.19
never finishes decoding an SDR name packed as 6-bit ASCII) and a dead BMC costs ~4.4 s per call,
so at the deadline the reader process is killed (SIGTERM, then SIGKILL) and nothing of it stays
behind in this process. If the deadline passes before the sensors are read, the result is
`Unknown("IPMI did not answer within N s (stuck in <step>)")`; if it passes during the FRU or
SEL, the facts read so far are returned, the rest is Unknown with that reason, and the status is
not ok. A reader process that crashes, exits early or writes something that is not its answer
gives an Unknown that says so. The password reaches it on stdin, never on its command line or
in its environment. This process never imports pyghmi; the one pyghmi 1.6.19 race still worked
around (an answer that arrives before pyghmi waits for it costs a 0.5-1 s retry timeout) is
worked around inside the reader process (`ipmi_worker.fix_lost_wakeup`).

Errors become facts, never exceptions. The password never appears in any message: pyghmi's
exception texts are scrubbed before they are kept.

Modules: ipmi_const (constants, shared by both sides), ipmi_worker (the reader process: pyghmi),
ipmi_live (the parent: target checks, the process, its deadline), ipmi_parse (ipmi.json ->
`BmcFacts`, for live and recorded reads alike). This module keeps the names the rest of the
agent imports.

ipmi.json layout (format "nodewarden.ipmi/v1"). Each of the five parts is
either its data or {"error": "why"} (that call failed; the facts it feeds
become Unknown with the reason and the problem is listed in `problems`):

    {
      "format": "nodewarden.ipmi/v1",
      "target": {"host": "10.0.0.5", "port": 623},
      "requests": 42,                          # IPMI requests sent
      "incomplete": "IPMI did not answer ...", # optional: deadline hit in FRU/SEL
      "error": "IPMI authentication ...",      # optional: nothing could be read
      "device_id": {"data": [0, 3, 2, 81, 2, 159, 71, 22, 0, 2, 15]},
                                               # Get Device ID response bytes
      "power": {"state": "on"},                # pyghmi get_power: on | off
      "sensors": [                             # one per SDR sensor, SDR order
        {"id": "32.1.0",                       # owner.number.lun (pyghmi's key)
         "number": 1, "lun": 0,
         "name": "GPU0_Temp", "type": "Temperature", "entity": "Processor",
         "reading_type": 1,                    # 1 threshold, 0x6f sensor specific, ...
         "units": "°C",                        # pyghmi's unit suffix: °C, RPM, W, ...
         "value": 45.0,                        # null: discrete sensor or unavailable
         "imprecision": 0.5,
         "unavailable": false,                 # ipmitool's "na" (scanning off / no reading)
         "health": 0,                          # pyghmi Health bits: 1 warning, 2 critical, 4 failed
         "states": ["upper critical threshold"], "state_ids": [65797],
         "thresholds": {"unc": 85.0, "uc": 90.0, "unr": 95.0},
                                               # readable ones; lnc lc lnr unc uc unr;
                                               # absent for non-threshold sensors,
                                               # or {"error": "..."}
         "error": "..."}                       # instead of the reading fields when
                                               # Get Sensor Reading failed
      ],
      "fru": {"fields": {"Manufacturer": "Acme", "Product name": "G8X", ...}},
                                               # pyghmi FRU.info, bytes as hex
      "sel": [                                 # pyghmi get_event_log entries
        {"record_id": 3, "timecode": 3575,     # seconds; < 0x20000000: since BMC init
         "component": "GPU0_Temp", "component_type": "Temperature",
         "event": "Upper critical", "event_id": "1.9",  # event/reading type . offset
         "component_type_id": 1,               # sensor type; message_id "1.1.9" = type.event_id
         "deassertion": false,
         "severity": 2,                        # pyghmi Health bits, as for sensors
         "triggered_value": 95, "threshold_value": 90,  # raw bytes (threshold events)
         "reading": 95.0, "threshold": 90.0}   # the same converted with the SDR
      ]
    }

Mapping into `BmcFacts` (protocol "ipmi"): sensors of type Temperature ->
`temperatures` (°C; thresholds unc -> upper_caution, uc -> upper_critical,
unr -> upper_fatal), Fan -> `fans` (lc -> lower_critical), discrete Power
Supply sensors -> `psus` (presence/failure states; an unavailable sensor or a
clear presence bit is an empty slot: state "Absent", no health), the watt
sensor named like a total (or the only one) -> `power_consumed_w`. Health
words are Redfish's: OK, Warning, Critical; `health` is the worst sensor and
`health_causes` names the sensors behind it. SEL severities come from the
event (threshold going high past upper critical -> Critical, upper
non-critical -> Warning, memory uncorrectable ECC -> Critical, ...); SEL
times before the BMC clock was set ("Pre-Init") give created=None, others are
the BMC clock read as UTC. What IPMI cannot tell (Redfish version, BIOS
attributes, redundancy, leak detectors, GPUs) is `Unsupported`.
"""

from __future__ import annotations

from agent.sources.ipmi_const import (
    AUTH_ERRORS,
    DEFAULT_TIMEOUT_S,
    FRU_CHUNK,
    HEALTH_CRITICAL,
    HEALTH_FAILED,
    HEALTH_WARNING,
    IANA_VENDORS,
    MAX_USER_BYTES,
    PARTS,
    PREINIT_LIMIT,
    RECORD_FORMAT,
    SOURCE,
    THRESHOLD_KEYS,
    TIMECODE_UNSPECIFIED,
)
from agent.sources.ipmi_live import read_ipmi_live, validate_target, worker_command
from agent.sources.ipmi_parse import NOT_OVER_IPMI, RecordError, facts_and_status, parse_ipmi, read_ipmi_recorded

__all__ = [
    "AUTH_ERRORS",
    "DEFAULT_TIMEOUT_S",
    "FRU_CHUNK",
    "HEALTH_CRITICAL",
    "HEALTH_FAILED",
    "HEALTH_WARNING",
    "IANA_VENDORS",
    "MAX_USER_BYTES",
    "NOT_OVER_IPMI",
    "PARTS",
    "PREINIT_LIMIT",
    "RECORD_FORMAT",
    "SOURCE",
    "THRESHOLD_KEYS",
    "TIMECODE_UNSPECIFIED",
    "RecordError",
    "facts_and_status",
    "parse_ipmi",
    "read_ipmi_live",
    "read_ipmi_recorded",
    "validate_target",
    "worker_command",
]
