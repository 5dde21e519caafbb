"""IPMI source: the node as its BMC reports it over IPMI-over-LAN (RMCP+), via pyghmi.

One parser, two ways to get its input: `read_ipmi_live` asks the BMC and
keeps every answer as plain JSON (the *raw* structure, saved as `ipmi.json` in
a snapshot), then parses it; `read_ipmi_recorded` loads the same structure
and runs the same parser. A recording therefore exercises exactly the code
that runs against a real BMC.

What is read, in this order (one pyghmi session, logged out at the end):
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

Everything runs in one daemon thread under an overall deadline. pyghmi can
loop forever (1.6.19 never finishes decoding an SDR name packed as 6-bit
ASCII) and a dead BMC costs ~4.4 s per call. If the deadline passes before
the sensors are read, the result is `Unknown("IPMI did not answer within N s
(stuck in <step>)")`; if it passes during the FRU or SEL, the facts read so
far are returned, the rest is Unknown with that reason, and the status is
not ok. The stuck thread is then sent an exception (best effort, between two
Python bytecodes) so that a spinning pyghmi loop does not eat a CPU for the
rest of the process.

Errors become facts, never exceptions. The password never appears in any
message: pyghmi's exception texts are scrubbed before they are kept.

Two pyghmi 1.6.19 bugs are worked around (see `_fix_pyghmi_lost_wakeup` and
`_forget_stale_session`): an answer that arrives before pyghmi starts waiting
for it costs a 0.5-1 s retry timeout (0-6 s per read against ipmi_sim), and
after a logout or a failed login the next read of the same BMC with the same
credentials in the same process gets the dead session back and fails.

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

import contextlib
import ctypes
import datetime
import ipaddress
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.facts import BmcFacts, BmcFan, BmcLogEntry, BmcPsu, BmcTemperature, FirmwareItem
from agent.model import SourceStatus, Unknown, Unsupported

DEFAULT_TIMEOUT_S = 10.0
RECORD_FORMAT = "nodewarden.ipmi/v1"
SOURCE = "ipmi"
FRU_CHUNK = 32  # ipmi_sim answers 0xC8 above 32 bytes; real BMCs take more, none needs less
PARTS = ("device_id", "power", "sensors", "fru", "sel")
THRESHOLD_KEYS = ("lnc", "lc", "lnr", "unc", "uc", "unr")  # Get Sensor Thresholds order
PREINIT_LIMIT = 0x20000000  # SEL timecodes below this count seconds since BMC init
TIMECODE_UNSPECIFIED = 0xFFFFFFFF
HEALTH_WARNING, HEALTH_CRITICAL, HEALTH_FAILED = 1, 2, 4  # pyghmi.constants.Health bits
MAX_USER_BYTES = 16  # IPMI 2.0 user names

# IANA enterprise numbers of common BMC vendors (Get Device ID manufacturer id).
IANA_VENDORS = {
    2: "IBM",
    9: "Cisco",
    11: "HP",
    343: "Intel",
    674: "Dell",
    2011: "Huawei",
    5703: "NVIDIA",
    7244: "Quanta",
    10368: "Fujitsu",
    10876: "Supermicro",
    15370: "GIGABYTE",
    19046: "Lenovo",
    37945: "Inspur",
    47196: "HPE",
}

NOT_OVER_IPMI = Unsupported("not available over IPMI")
AUTH_ERRORS = ("incorrect password", "unauthorized name", "invalid username", "unauthorized role",
               "unauthorized guid", "invalid integrity check")
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
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


class _Abandoned(BaseException):
    """Sent into a reader thread that outlived its deadline (not an Exception: pyghmi catches those)."""


# --- validation and scrubbing -------------------------------------------------------------------


def validate_target(host: object, port: object, user: object = "") -> str | None:
    """Why these connection settings are unusable, or None. Never mentions the password."""
    if not isinstance(host, str) or not host:
        return "IPMI host is empty: give the BMC's IP address or host name"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not _HOSTNAME_RE.match(host):
            return f"IPMI host {host[:80]!r} is neither an IP address nor a host name"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return f"IPMI port {port!r} is not a port number (1-65535)"
    if not isinstance(user, str) or any(ord(ch) < 32 for ch in user):
        return "IPMI user name must be text without control characters"
    if len(user.encode("utf-8")) > MAX_USER_BYTES:
        return f"IPMI user name is longer than {MAX_USER_BYTES} bytes (the IPMI 2.0 limit)"
    return None


def _scrubber(secret: str) -> Callable[[str], str]:
    def scrub(text: str) -> str:
        return text.replace(secret, "***") if secret else text

    return scrub


# --- live reading ---------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the worker has done so far; read by the caller if the deadline passes."""

    raw: dict[str, Any]
    step: str = "login"
    requests: int = 0
    done: bool = False
    outcome: dict[str, Any] = field(default_factory=dict)


def read_ipmi_live(host: str, port: int, user: str, password: str, timeout_s: float = DEFAULT_TIMEOUT_S
                   ) -> tuple[BmcFacts | Unknown, SourceStatus, dict[str, Any]]:
    """Read the BMC at host:port; never raises, never blocks much longer than `timeout_s`.

    Returns the facts (or why there are none), how the read went, and the raw
    answers (ipmi.json's layout) for `read_ipmi_recorded`.
    """
    start = time.monotonic()
    raw: dict[str, Any] = {"format": RECORD_FORMAT, "target": {"host": str(host)[:255], "port": port}}
    problem = validate_target(host, port, user)
    if problem is None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        problem = f"IPMI timeout {timeout_s!r} s is not a positive number"
    if problem is not None:
        raw["error"] = problem
        return Unknown(problem), SourceStatus(SOURCE, ok=False, error=problem), raw
    scrub = _scrubber(password if isinstance(password, str) else "")
    try:
        from pyghmi.ipmi import command  # noqa: F401 - imported here for its absence only
    except ImportError as exc:
        error = scrub(f"pyghmi is not installed: {exc}")
        raw["error"] = error
        return Unknown(error), SourceStatus(SOURCE, ok=False, error=error), raw

    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [IPv6] -> IPv6
    progress = _Progress(raw=dict(raw))
    thread = threading.Thread(target=_work, args=(progress, address, port, user, password, scrub),
                              name="ipmi-reader", daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed = time.monotonic() - start
    alive = thread.is_alive()
    if alive:
        _abandon(thread, progress)
    raw = dict(progress.raw)  # a copy: an abandoned worker may still write to its own
    raw["requests"] = progress.requests
    if alive and progress.step != "logout":  # a slow logout loses nothing: everything was read
        why = f"IPMI did not answer within {timeout_s:g} s (stuck in {progress.step})"
        if isinstance(raw.get("sensors"), list):  # the deadline hit the FRU or SEL: keep what was read
            for part in PARTS:
                raw.setdefault(part, {"error": why})
            raw["incomplete"] = why
        else:
            raw = {key: raw[key] for key in ("format", "target", "requests")}
            raw["error"] = why
    elif "error" in progress.outcome:
        raw = {key: raw[key] for key in ("format", "target", "requests")}
        raw["error"] = progress.outcome["error"]
    facts, status = _facts_and_status(raw, elapsed)
    return facts, status, raw


def _work(progress: _Progress, host: str, port: int, user: str, password: str,
          scrub: Callable[[str], str]) -> None:
    """The reader thread: fill progress.raw part by part."""
    try:
        cmd: Any = None
        try:
            from pyghmi.exceptions import IpmiException

            command_class = _command_class()
            _forget_stale_session(host, port, user, password)
            cmd = command_class(progress, bmc=host, port=port, userid=user, password=password)
            _fetch_parts(cmd, progress, scrub, IpmiException)
        except Exception as exc:  # noqa: BLE001 - login failures and reader bugs become the source's error
            progress.outcome["error"] = _describe_login_error(exc, host, port, user, progress.step, scrub)
        finally:
            if cmd is not None:
                progress.step = "logout"
                with contextlib.suppress(Exception):
                    cmd.ipmi_session.logout()
            progress.done = True
    except _Abandoned:
        return


def _command_class() -> Any:
    """pyghmi's Command, counting every IPMI request it sends for this read."""
    from pyghmi.ipmi import command

    _fix_pyghmi_lost_wakeup()

    class CountingCommand(command.Command):  # type: ignore[misc]  # pyghmi is untyped
        def __init__(self, progress: _Progress, **kwargs: Any) -> None:
            self._nw_progress = progress
            progress.requests += 1  # the session setup counts as one
            super().__init__(**kwargs)

        def raw_command(self, *args: Any, **kwargs: Any) -> Any:
            self._nw_progress.requests += 1
            return super().raw_command(*args, **kwargs)

        def xraw_command(self, *args: Any, **kwargs: Any) -> Any:
            self._nw_progress.requests += 1
            return super().xraw_command(*args, **kwargs)

    return CountingCommand


def _fix_pyghmi_lost_wakeup() -> None:
    """Do not sleep a retry timeout when our answer is already queued (pyghmi 1.6.19 race).

    pyghmi sends a request, then registers to be woken when the answer arrives. Its I/O thread may
    take the answer off the socket first (a fast BMC, or another thread holding the GIL): nothing
    wakes the caller, which then sleeps its whole retry timeout (0.5-1 s), resends, and only then
    handles the answer queued long ago. Against ipmi_sim this cost 0-6 s per read. The wrapper
    returns at once when a session of that BMC that is waiting for an answer has packets queued;
    pyghmi's loop then processes them. Installed once; a pyghmi without these internals is left alone.
    """
    try:
        from pyghmi.ipmi.private import session
    except ImportError:
        return
    original = getattr(session, "_io_wait", None)
    handlers = getattr(getattr(session, "Session", None), "bmc_handlers", None)
    if not callable(original) or getattr(original, "nodewarden_fix", False) or not isinstance(handlers, dict):
        return

    def io_wait(timeout: Any, myaddr: Any = None, evq: Any = None) -> Any:
        if myaddr is not None:
            with contextlib.suppress(Exception):  # a concurrent change of the handler table: just wait
                for peer in list(session.Session.bmc_handlers.get(myaddr, {}).values()):
                    if peer.pktqueue and getattr(peer, "awaitingresponse", False):
                        return None
        return original(timeout, myaddr, evq)

    io_wait.nodewarden_fix = True  # type: ignore[attr-defined]
    session._io_wait = io_wait


def _forget_stale_session(host: str, port: int, user: str, password: str) -> None:
    """Drop a dead session pyghmi would hand to the next Command for the same BMC and credentials.

    pyghmi 1.6.19 files a session being set up under (host, user, password, port, kg) as text but
    removes it with the user and password as bytes, so the entry outlives a logout or a failed
    login. The next Command with the same settings then gets that dead session back and fails
    (TypeError in raw_command, or "Session no longer connected"): every read after the first in
    one process would fail. Only a session pyghmi has marked broken is dropped.
    """
    try:
        from pyghmi.ipmi.private import session
    except ImportError:
        return
    pending = getattr(getattr(session, "Session", None), "initting_sessions", None)
    if isinstance(pending, dict):
        key = (host, user, password, port, None)
        stale = pending.get(key)
        if stale is not None and getattr(stale, "broken", False):
            pending.pop(key, None)


def _fetch_parts(cmd: Any, progress: _Progress, scrub: Callable[[str], str], ipmi_error: type[BaseException]) -> None:
    raw = progress.raw

    def attempt(part: str, step: str, func: Callable[[], Any]) -> None:
        progress.step = step
        try:
            raw[part] = func()
        except ipmi_error as exc:
            raw[part] = {"error": _ipmi_text(exc, step, scrub)}
        # pyghmi raises these (NotImplementedError included: SDR record types and
        # OEM sensors it does not decode) on answers it cannot parse; one bad part
        # must not lose the others.
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, NotImplementedError) as exc:
            raw[part] = {"error": scrub(f"{step}: unexpected answer ({type(exc).__name__}: {exc})")}

    attempt("device_id", "Get Device ID", lambda: {"data": list(cmd.xraw_command(netfn=6, command=1)["data"])})
    attempt("power", "Get Chassis Status", lambda: {"state": str(cmd.get_power()["powerstate"])})
    attempt("sensors", "reading the SDR repository", lambda: _fetch_sensors(cmd, progress, scrub, ipmi_error))
    attempt("fru", "reading FRU 0", lambda: {"fields": _jsonable(_fetch_fru(cmd, 0))})
    attempt("sel", "reading the SEL", lambda: _fetch_sel(cmd))


def _fetch_sensors(cmd: Any, progress: _Progress, scrub: Callable[[str], str], ipmi_error: type[BaseException]
                   ) -> list[dict[str, Any]]:
    sdr = cmd.init_sdr()
    out: list[dict[str, Any]] = []
    for key in list(sdr.get_sensor_numbers()):
        entry = sdr.sensors[key]
        name = str(entry.name)
        progress.step = f"reading sensor {name}"
        record: dict[str, Any] = {"id": str(key), "number": int(entry.sensor_number), "lun": int(entry.sensor_lun),
                                  "name": name, "type": str(entry.sensor_type),
                                  "entity": str(getattr(entry, "entity", "")),
                                  "reading_type": int(getattr(entry, "reading_type", 0)),
                                  "units": str(getattr(entry, "unit_suffix", ""))}
        rsp = cmd.raw_command(netfn=4, command=0x2D, rslun=entry.sensor_lun, data=(entry.sensor_number,))
        if "error" in rsp:
            code = int(rsp.get("code") or 0)
            if code == 0xCB:  # "requested sensor not present": pyghmi skips it; keep it, unavailable
                record.update(value=None, imprecision=None, unavailable=True, health=0, states=[], state_ids=[])
            else:
                record["error"] = scrub(f"Get Sensor Reading: {rsp['error']} (code 0x{code:02X})")
            out.append(record)
            continue
        reading = entry.decode_sensor_reading(cmd, rsp["data"])
        record.update(units=str(reading.units), value=_number(reading.value),
                      imprecision=_number(reading.imprecision), unavailable=bool(reading.unavailable),
                      health=int(reading.health), states=[str(s) for s in reading.states],
                      state_ids=[int(s) for s in reading.state_ids])
        if record["reading_type"] == 1 and getattr(entry, "has_thresholds", False):
            try:
                record["thresholds"] = _fetch_thresholds(cmd, entry)
            except ipmi_error as exc:
                record["thresholds"] = {"error": _ipmi_text(exc, "Get Sensor Thresholds", scrub)}
        out.append(record)
    return out


def _fetch_thresholds(cmd: Any, entry: Any) -> dict[str, float | None]:
    data = bytes(cmd.xraw_command(netfn=4, command=0x27, rslun=entry.sensor_lun,
                                  data=(entry.sensor_number,))["data"])
    readable = data[0] if data else 0
    thresholds: dict[str, float | None] = {}
    for bit, key in enumerate(THRESHOLD_KEYS):
        if readable & (1 << bit) and len(data) > bit + 1:
            thresholds[key] = _sensor_value(cmd, entry, data[bit + 1])
    return thresholds


def _sensor_value(cmd: Any, entry: Any, raw_byte: int) -> float | None:
    """A raw sensor byte (threshold, event reading) in the sensor's units, per its SDR formula."""
    fmt = getattr(entry, "numeric_format", 0)
    value = raw_byte
    if fmt == 2:
        value = raw_byte - 256 if raw_byte & 0x80 else raw_byte
    elif fmt == 1:
        value = -((~raw_byte) & 0x7F) if raw_byte & 0x80 else raw_byte
    elif fmt == 3:
        return None
    return _number(entry.decode_value(cmd, value))


def _fetch_fru(cmd: Any, fruid: int) -> dict[str, Any]:
    from pyghmi.ipmi import fru

    info = cmd.xraw_command(netfn=0xA, command=0x10, data=[fruid])["data"]
    size = info[0] | info[1] << 8
    data, offset, chunk = bytearray(), 0, FRU_CHUNK
    while offset < size:
        count = min(chunk, size - offset)
        rsp = cmd.raw_command(netfn=0xA, command=0x11, data=[fruid, offset & 0xFF, offset >> 8, count])
        code = int(rsp.get("code") or 0)
        if code in (0xC8, 0xC9, 0xCA) and chunk > 8:  # request or response too long: smaller chunks
            chunk //= 2
            continue
        if "error" in rsp:
            raise ValueError(f"Read FRU Data at offset {offset}: {rsp['error']} (code 0x{code:02X})")
        answer = bytes(rsp["data"])
        if not answer or answer[0] == 0:
            break
        data += answer[1:1 + answer[0]]
        offset += answer[0]
    return dict(fru.FRU(rawdata=data).info or {})


def _fetch_sel(cmd: Any) -> list[dict[str, Any]]:
    sdr = cmd.init_sdr()
    entries = []
    for event in cmd.get_event_log():
        record = _jsonable({k: v for k, v in event.items() if k not in ("oem_handler", "timestamp")})
        entry = sdr.sensors.get(event.get("component_id")) if isinstance(event.get("component_id"), str) else None
        if entry is not None and getattr(entry, "reading_type", None) == 1:
            for raw_key, key in (("triggered_value", "reading"), ("threshold_value", "threshold")):
                if isinstance(event.get(raw_key), int):
                    with contextlib.suppress(Exception):
                        record[key] = _sensor_value(cmd, entry, event[raw_key])
        entries.append(record)
    return entries


def _abandon(thread: threading.Thread, progress: _Progress) -> None:
    """Ask a stuck reader thread to stop: raise _Abandoned in it at its next bytecode."""
    if progress.done or thread.ident is None:
        return
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    changed = set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abandoned))
    if changed > 1:  # cannot happen for one thread id; undo rather than hit others
        set_async_exc(ctypes.c_ulong(thread.ident), None)


def _ipmi_text(exc: BaseException, step: str, scrub: Callable[[str], str]) -> str:
    text = str(exc) if exc.args and exc.args[0] not in (None, "") else "no answer (timed out)"
    code = getattr(exc, "ipmicode", 0)
    suffix = f" (code 0x{code:02X})" if isinstance(code, int) and code else ""
    return scrub(f"{step}: {text}{suffix}")


def _describe_login_error(exc: BaseException, host: str, port: int, user: str, step: str,
                          scrub: Callable[[str], str]) -> str:
    text = str(exc) if exc.args and exc.args[0] not in (None, "") else ""
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return scrub(f"cannot resolve IPMI host {host!r}: {exc}")
    if step == "login":
        if any(marker in text.lower() for marker in AUTH_ERRORS):
            return scrub(f"IPMI authentication failed for user {user!r} at {where} ({text}); "
                         "not retried, to avoid locking the account")
        if not text or "no longer connected" in text.lower():
            return scrub(f"no IPMI answer from {where} (is the BMC up, and is IPMI over LAN enabled?)")
        return scrub(f"IPMI login to {where} failed: {text}")
    return scrub(f"IPMI read of {where} failed in {step}: {type(exc).__name__}: {text or repr(exc)}")


# --- JSON conversion -------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return round(number, 6) if math.isfinite(number) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return str(value)


# --- replay -------------------------------------------------------------------------------------------


def read_ipmi_recorded(data: object) -> tuple[BmcFacts | Unknown, SourceStatus]:
    """Parse a recorded ipmi.json structure exactly as a live read is parsed; never raises."""
    start = time.monotonic()
    facts, status = _facts_and_status(data, 0.0)
    status.duration_s = time.monotonic() - start
    status.detail["recorded"] = True
    return facts, status


def _facts_and_status(raw: object, elapsed: float) -> tuple[BmcFacts | Unknown, SourceStatus]:
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
        power_w: Any = sensors
        health: Any = sensors
        causes: tuple[str, ...] = ()
    else:
        # A kind of sensor the SDR (or the capture: a lone `dcmi power reading`) holds none of is not
        # reported, never "all fine": its checks skip and say so.
        temperatures = sensors.temperatures or Unsupported("the IPMI sensor list holds no temperature sensor")
        fans = sensors.fans or Unsupported("the IPMI sensor list holds no fan sensor")
        psus = sensors.psus or Unsupported("the IPMI sensor list holds no power supply sensor")
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


def _opt_number(record: dict[str, Any], key: str, where: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{where}.{key}: expected a number or null, got {type(value).__name__}")
    return float(value)


def _parse_sensors(value: Any) -> _Sensors:
    if not isinstance(value, list):
        raise RecordError("sensors: expected a list")
    temperatures: list[BmcTemperature] = []
    fans: list[BmcFan] = []
    psus: list[BmcPsu] = []
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
            fans.append(BmcFan(name=name, reading=reading, units=fan_units, lower_critical=thresholds.get("lc"),
                               state=state, health=health, where=location))
        elif kind == "Power Supply" and not units:  # discrete: presence and failure states
            psus.append(_psu(name, state, bits, states, location))
        if units == "W" and reading is not None:
            watts.append((name, reading))
    return _Sensors(tuple(temperatures), tuple(fans), tuple(psus), _power(watts), worst, tuple(causes))


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
