"""NVML's event set for the daemon: an Xid reaches /metrics and the findings within a second.

`NvmlEventWatcher` is one thread that owns an NVML event set (nvmlEventSetCreate, each GPU registered
with nvmlDeviceRegisterEvents for the critical-Xid and clock/power events it supports) and waits in
nvmlEventSetWait_v2 for at most WAIT_MS, so `stop()` is never held up longer than that. It hands each
event to the daemon's callback; it never reads or judges anything itself.

The kernel log stays the history and the source of the Xids the set missed (before the daemon started,
a GPU registered late). `XidLedger` makes one Xid count once whichever way it came first: an event and
a kernel-log record for the same GPU and code within MATCH_WINDOW_S of each other are one Xid. An event
the kernel log has not (yet) shown is judged as a kernel-log record would be (`records()`: the driver's
own line format, so gpu.xid parses it with the same code).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from agent.core.facts import KmsgRecord, XidEvent
from agent.sources.nvml_facts import normalize_bus_id

log = logging.getLogger("nodewarden.nvml.events")

WAIT_MS = 250  # one nvmlEventSetWait: the longest stop() waits for the thread
MATCH_WINDOW_S = 30.0  # an event and a kernel-log Xid this close (same GPU and code) are one Xid
MAX_PENDING = 256  # event Xids kept for matching and judging: a storming GPU cannot grow memory
MAX_ERRORS = 20  # consecutive failed waits before the thread gives up (the kernel log still follows)
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
EVENT_XID_NOTE = "reported through the NVML event set"  # the text of an event Xid the log has not shown yet
CLOCK_POWER_EVENTS = 0x10 | 0x80  # nvmlEventTypeClock, nvmlEventTypePowerSourceChange
CLOCK_EVENT_GAP_S = 2.0  # clock events come in bursts under load: passed on at most this often (each polls NVML)


class NvmlEvent(NamedTuple):
    pci_bus_id: str  # sysfs form, "0000:8b:00.0"
    xid: int | None  # None: a clock or power event
    at: float  # time.monotonic(): the kernel log's clock since boot


def _since_boot_usec(monotonic: float) -> int:
    return int(monotonic * 1_000_000)  # CLOCK_MONOTONIC is the clock /dev/kmsg stamps records with


class XidLedger:
    """Each Xid once, from the event set or the kernel log, whichever came first; thread-safe."""

    def __init__(self, window_s: float = MATCH_WINDOW_S) -> None:
        self._lock = threading.Lock()
        self._window_us = int(window_s * 1_000_000)
        self._events: list[tuple[str, int, int, bool]] = []  # bus, xid, since-boot usec, matched by the log
        self._logged: list[tuple[str, int, int | None]] = []  # kernel-log Xids, to match later events

    def from_event(self, event: NvmlEvent) -> bool:
        """True if this Xid is new (the kernel log has not shown it)."""
        assert event.xid is not None
        at = _since_boot_usec(event.at)
        with self._lock:
            for index, (bus, code, ts) in enumerate(self._logged):
                if (bus, code) == (event.pci_bus_id, event.xid) and (ts is None or abs(ts - at) <= self._window_us):
                    del self._logged[index]  # one log record matches one event
                    return False
            self._events.append((event.pci_bus_id, event.xid, at, False))
            del self._events[:-MAX_PENDING]
            return True

    def from_kmsg(self, xid: XidEvent) -> bool:
        """True if this kernel-log Xid is new (no event counted it already)."""
        with self._lock:
            for index, (bus, code, at, matched) in enumerate(self._events):
                if not matched and (bus, code) == (xid.pci_bus_id, xid.xid) and (
                        xid.ts_usec is None or abs(xid.ts_usec - at) <= self._window_us):
                    self._events[index] = (bus, code, at, True)
                    return False
            self._logged.append((xid.pci_bus_id, xid.xid, xid.ts_usec))
            del self._logged[:-MAX_PENDING]
            return True

    def records(self) -> tuple[KmsgRecord, ...]:
        """The event Xids the kernel log has not shown, as the driver's own kernel-log lines."""
        with self._lock:
            pending = [(bus, code, at) for bus, code, at, matched in self._events if not matched]
        return tuple(KmsgRecord(f"NVRM: Xid (PCI:{bus}): {code}, {EVENT_XID_NOTE}", 3, None, at)
                     for bus, code, at in pending)


class NvmlEventWatcher:
    """The waiting thread: `on_event` gets every Xid and clock/power event, from that thread."""

    def __init__(self, load: Callable[[], Any], on_event: Callable[[NvmlEvent], None], wait_ms: int = WAIT_MS) -> None:
        self._load, self._on_event, self._wait_ms = load, on_event, wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered = 0  # GPUs registered (tests, logs)
        self.error: str | None = None  # why the event set is not (or no longer) watched

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # bounded: a wait returns within wait_ms

    def _run(self) -> None:
        try:
            nvml = self._load()
            nvml.nvmlInit()  # reference-counted: the poller's session keeps its own
        except Exception as exc:  # noqa: BLE001 - no binding or no driver: the kernel log still follows
            self.error = f"NVML event set not watched: {exc}"
            log.info("%s", self.error)
            return
        events: Any = None
        try:
            events = nvml.nvmlEventSetCreate()
            buses = self._register(nvml, events)
            self._wait(nvml, events, buses)
        except Exception as exc:  # noqa: BLE001 - the thread ends; the kernel log and polls go on
            self.error = f"NVML event set failed: {exc}"
            log.warning("%s", self.error)
        finally:
            with contextlib.suppress(Exception):
                if events is not None:
                    nvml.nvmlEventSetFree(events)
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _register(self, nvml: Any, events: Any) -> dict[int | None, str]:
        """Each GPU for the wanted events it supports; its bus id by handle (an event names the handle)."""
        buses: dict[int | None, str] = {}
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                wanted = int(nvml.nvmlDeviceGetSupportedEventTypes(handle)) & (XID_EVENT | CLOCK_POWER_EVENTS)
                bus = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
                if wanted:
                    nvml.nvmlDeviceRegisterEvents(handle, wanted, events)
                    buses[ctypes.cast(handle, ctypes.c_void_p).value] = bus
            except nvml.NVMLError as exc:  # a lost GPU: the others are still watched
                log.info("GPU %d not registered for NVML events: %s", index, exc)
        self.registered = len(buses)
        return buses

    def _wait(self, nvml: Any, events: Any, buses: dict[int | None, str]) -> None:
        errors = 0
        last_clock = -CLOCK_EVENT_GAP_S
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(events, self._wait_ms)
            except nvml.NVMLError_Timeout:
                errors = 0
                continue
            except nvml.NVMLError as exc:
                errors += 1
                if errors >= MAX_ERRORS:
                    raise
                log.debug("NVML event wait: %s", exc)
                self._stop.wait(self._wait_ms / 1000)
                continue
            errors = 0
            bus = buses.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            if bus is None:
                continue
            kind = int(data.eventType)
            xid = int(data.eventData) if kind & XID_EVENT else None
            if xid is not None and not 0 < xid < 1 << 16:
                continue  # not an Xid code: nothing to count
            now = time.monotonic()
            if xid is None:
                if now - last_clock < CLOCK_EVENT_GAP_S:
                    continue
                last_clock = now
            self._on_event(NvmlEvent(bus, xid, now))
