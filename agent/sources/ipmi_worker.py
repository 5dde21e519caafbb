"""The IPMI reader process: `python -m agent.sources.ipmi_worker`, started by agent.sources.ipmi_live.

One process per read, as ipmi_exporter runs freeipmi: pyghmi can loop forever (1.6.19 never
finishes decoding an SDR name packed as 6-bit ASCII) and waits ~4.4 s per call on a dead BMC, so
the parent does not wait for it to give up: at its deadline it kills this process's group. Nothing
of a read survives in the parent (no thread, no pyghmi session: the parent never imports pyghmi),
and each read starts from a fresh pyghmi, so no dead session or stale SDR cache is carried from
one read to the next (pyghmi 1.6.19 handed a dead session to the next read in the same process).
The one pyghmi race still worked around (`fix_lost_wakeup`) is worked around in here only.

Request, on stdin (never on the command line or in the environment, which `ps` and /proc show):
one JSON object {"host", "port", "user", "password", "deadline_s"}, then end of file.

Answer, on stdout: one JSON object a line, each with "requests" (IPMI requests sent so far):

    {"step": "Get Device ID", "requests": 1}       # what is being asked now (the parent names
                                                  # it when the deadline passes)
    {"part": "device_id", "value": {...}, ...}     # one ipmi.json part, as soon as it is read
    {"error": "IPMI authentication failed ..."}    # the read as a whole failed (login, ...)
    {"end": true, "requests": 42}                  # finished (after the logout)

The parent (agent.sources.ipmi_live) puts the parts together into the ipmi.json document
(RECORD_FORMAT) and bounds what it reads. A part arrives as soon as it is read so that a deadline
in the FRU or the SEL keeps the sensors. This process never logs (logging is disabled), and every text it sends passes
through the password scrubber first; it imports no more of the agent than ipmi_const (fast start).
As a last guard (a parent killed before it could kill this process), SIGALRM, left at its
default action, ends it a few seconds after the deadline.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from agent.sources.ipmi_const import AUTH_ERRORS, FRU_CHUNK, LOGIN_STEP, LOGOUT_STEP, THRESHOLD_KEYS

MAX_REQUEST_BYTES = 8192
ALARM_MARGIN_S = 5  # the process ends itself this long after its deadline, whatever it is doing
EXIT_BAD_REQUEST = 2


class Channel:
    """This process's answer (stdout, unbuffered), and what the read is doing now."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.step = LOGIN_STEP
        self.requests = 0

    def send(self, **message: Any) -> None:
        message["requests"] = self.requests
        data = json.dumps(jsonable(message), separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def enter(self, step: str) -> None:
        self.step = step
        self.send(step=step)


def scrubber(secret: str) -> Callable[[str], str]:
    def scrub(text: str) -> str:
        return text.replace(secret, "***") if secret else text

    return scrub


def parse_request(data: bytes) -> dict[str, Any] | None:
    """The parent's request, or None when it is not one."""
    if len(data) > MAX_REQUEST_BYTES:
        return None
    try:
        request = json.loads(data)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    port, deadline = request.get("port"), request.get("deadline_s")
    if not all(isinstance(request.get(key), str) for key in ("host", "user", "password")):
        return None
    if isinstance(port, bool) or not isinstance(port, int):
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 0 < deadline < 1e6:
        return None
    return request


def main() -> int:
    logging.disable(logging.CRITICAL)  # this process never logs: pyghmi's log lines would land on stderr
    channel = Channel()
    request = parse_request(sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1))
    if request is None:
        channel.send(error="the IPMI reader process got no usable request on stdin")
        return EXIT_BAD_REQUEST
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its default action ends the process
    signal.alarm(math.ceil(request["deadline_s"]) + ALARM_MARGIN_S)
    read(channel, request["host"], request["port"], request["user"], request["password"])
    return 0


def read(channel: Channel, host: str, port: int, user: str, password: str) -> None:
    """The whole read: login, then each part, then logout; every outcome is a message."""
    scrub = scrubber(password)
    try:
        from pyghmi.exceptions import IpmiException
    except ImportError as exc:
        channel.send(error=scrub(f"pyghmi is not installed: {exc}"))
        channel.send(end=True)
        return
    fix_lost_wakeup()
    cmd: Any = None
    try:
        channel.enter(LOGIN_STEP)
        cmd = command_class(channel)(bmc=host, port=port, userid=user, password=password)
        fetch_parts(cmd, channel, scrub, IpmiException)
    except Exception as exc:  # noqa: BLE001 - login failures and reader bugs become the source's error
        channel.send(error=describe_login_error(exc, host, port, user, channel.step, scrub))
    finally:
        if cmd is not None:
            channel.enter(LOGOUT_STEP)
            with contextlib.suppress(Exception):
                cmd.ipmi_session.logout()
    channel.send(end=True)


def command_class(channel: Channel) -> Any:
    """pyghmi's Command, counting every IPMI request it sends for this read."""
    from pyghmi.ipmi import command

    class CountingCommand(command.Command):  # type: ignore[misc]  # pyghmi is untyped
        def __init__(self, **kwargs: Any) -> None:
            channel.requests += 1  # the session setup counts as one
            super().__init__(**kwargs)

        def raw_command(self, *args: Any, **kwargs: Any) -> Any:
            channel.requests += 1
            return super().raw_command(*args, **kwargs)

        def xraw_command(self, *args: Any, **kwargs: Any) -> Any:
            channel.requests += 1
            return super().xraw_command(*args, **kwargs)

    return CountingCommand


def fix_lost_wakeup() -> None:
    """Do not sleep a retry timeout when our answer is already queued (pyghmi 1.6.19 race).

    pyghmi sends a request, then registers to be woken when the answer arrives. Its I/O thread may
    take the answer off the socket first (a fast BMC, or a loaded machine that deschedules the
    caller right after its sendto): nothing wakes the caller, which then sleeps its whole retry
    timeout (0.5-1 s) and only then handles the answer queued long ago. Without this, a read of
    ipmi_sim (73 requests) took 0.4-13 s (median 6.7 s) on a loaded machine instead of ~0.1 s: past
    the default 10 s deadline. The wrapper returns at once when a session of that BMC that is
    waiting for an answer has packets queued; pyghmi's loop then processes them.

    This is the one change to pyghmi's behaviour left; it lives in this process only (each read
    is a fresh process, so nothing else ever runs with it) and a pyghmi without these internals
    is left alone (the read is then only slower). The pyghmi range in pyproject.toml is the one
    it is tested with.
    """
    try:
        from pyghmi.ipmi.private import session
    except ImportError:
        return
    original = getattr(session, "_io_wait", None)
    handlers = getattr(getattr(session, "Session", None), "bmc_handlers", None)
    if not callable(original) or not isinstance(handlers, dict):
        return

    def io_wait(timeout: Any, myaddr: Any = None, evq: Any = None) -> Any:
        if myaddr is not None:
            with contextlib.suppress(Exception):  # a concurrent change of the handler table: just wait
                for peer in list(session.Session.bmc_handlers.get(myaddr, {}).values()):
                    if peer.pktqueue and getattr(peer, "awaitingresponse", False):
                        return None
        return original(timeout, myaddr, evq)

    session._io_wait = io_wait


def fetch_parts(cmd: Any, channel: Channel, scrub: Callable[[str], str], ipmi_error: type[BaseException]) -> None:
    def attempt(part: str, step: str, func: Callable[[], Any]) -> None:
        channel.enter(step)
        try:
            value = func()
        except ipmi_error as exc:
            value = {"error": ipmi_text(exc, step, scrub)}
        # pyghmi raises these (NotImplementedError included: SDR record types and
        # OEM sensors it does not decode) on answers it cannot parse; one bad part
        # must not lose the others.
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, NotImplementedError) as exc:
            value = {"error": scrub(f"{step}: unexpected answer ({type(exc).__name__}: {exc})")}
        channel.send(part=part, value=value)

    attempt("device_id", "Get Device ID", lambda: {"data": list(cmd.xraw_command(netfn=6, command=1)["data"])})
    attempt("power", "Get Chassis Status", lambda: {"state": str(cmd.get_power()["powerstate"])})
    attempt("sensors", "reading the SDR repository", lambda: fetch_sensors(cmd, channel, scrub, ipmi_error))
    attempt("fru", "reading FRU 0", lambda: {"fields": jsonable(fetch_fru(cmd, 0))})
    attempt("sel", "reading the SEL", lambda: fetch_sel(cmd))


def fetch_sensors(cmd: Any, channel: Channel, scrub: Callable[[str], str], ipmi_error: type[BaseException]
                  ) -> list[dict[str, Any]]:
    sdr = cmd.init_sdr()
    out: list[dict[str, Any]] = []
    for key in list(sdr.get_sensor_numbers()):
        entry = sdr.sensors[key]
        name = str(entry.name)
        channel.enter(f"reading sensor {name}")
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
        record.update(units=str(reading.units), value=number(reading.value),
                      imprecision=number(reading.imprecision), unavailable=bool(reading.unavailable),
                      health=int(reading.health), states=[str(s) for s in reading.states],
                      state_ids=[int(s) for s in reading.state_ids])
        if record["reading_type"] == 1 and getattr(entry, "has_thresholds", False):
            try:
                record["thresholds"] = fetch_thresholds(cmd, entry)
            except ipmi_error as exc:
                record["thresholds"] = {"error": ipmi_text(exc, "Get Sensor Thresholds", scrub)}
        out.append(record)
    return out


def fetch_thresholds(cmd: Any, entry: Any) -> dict[str, float | None]:
    data = bytes(cmd.xraw_command(netfn=4, command=0x27, rslun=entry.sensor_lun,
                                  data=(entry.sensor_number,))["data"])
    readable = data[0] if data else 0
    thresholds: dict[str, float | None] = {}
    for bit, key in enumerate(THRESHOLD_KEYS):
        if readable & (1 << bit) and len(data) > bit + 1:
            thresholds[key] = sensor_value(cmd, entry, data[bit + 1])
    return thresholds


def sensor_value(cmd: Any, entry: Any, raw_byte: int) -> float | None:
    """A raw sensor byte (threshold, event reading) in the sensor's units, per its SDR formula."""
    fmt = getattr(entry, "numeric_format", 0)
    value = raw_byte
    if fmt == 2:
        value = raw_byte - 256 if raw_byte & 0x80 else raw_byte
    elif fmt == 1:
        value = -((~raw_byte) & 0x7F) if raw_byte & 0x80 else raw_byte
    elif fmt == 3:
        return None
    return number(entry.decode_value(cmd, value))


def fetch_fru(cmd: Any, fruid: int) -> dict[str, Any]:
    """FRU `fruid` in FRU_CHUNK-byte reads; pyghmi's get_inventory asks for 224 bytes, which ipmi_sim refuses."""
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


def fetch_sel(cmd: Any) -> list[dict[str, Any]]:
    sdr = cmd.init_sdr()
    entries = []
    for event in cmd.get_event_log():
        record = jsonable({k: v for k, v in event.items() if k not in ("oem_handler", "timestamp")})
        entry = sdr.sensors.get(event.get("component_id")) if isinstance(event.get("component_id"), str) else None
        if entry is not None and getattr(entry, "reading_type", None) == 1:
            for raw_key, key in (("triggered_value", "reading"), ("threshold_value", "threshold")):
                if isinstance(event.get(raw_key), int):
                    with contextlib.suppress(Exception):
                        record[key] = sensor_value(cmd, entry, event[raw_key])
        entries.append(record)
    return entries


def ipmi_text(exc: BaseException, step: str, scrub: Callable[[str], str]) -> str:
    text = str(exc) if exc.args and exc.args[0] not in (None, "") else "no answer (timed out)"
    code = getattr(exc, "ipmicode", 0)
    suffix = f" (code 0x{code:02X})" if isinstance(code, int) and code else ""
    return scrub(f"{step}: {text}{suffix}")


def describe_login_error(exc: BaseException, host: str, port: int, user: str, step: str,
                         scrub: Callable[[str], str]) -> str:
    text = str(exc) if exc.args and exc.args[0] not in (None, "") else ""
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return scrub(f"cannot resolve IPMI host {host!r}: {exc}")
    if step == LOGIN_STEP:
        if any(marker in text.lower() for marker in AUTH_ERRORS):
            return scrub(f"IPMI authentication failed for user {user!r} at {where} ({text}); "
                         "not retried, to avoid locking the account")
        if not text or "no longer connected" in text.lower():
            return scrub(f"no IPMI answer from {where} (is the BMC up, and is IPMI over LAN enabled?)")
        return scrub(f"IPMI login to {where} failed: {text}")
    return scrub(f"IPMI read of {where} failed in {step}: {type(exc).__name__}: {text or repr(exc)}")


# --- JSON conversion -------------------------------------------------------------------------------


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return round(result, 6) if math.isfinite(result) else None


def jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
