"""The acceptance sampler: one NVML read of every GPU per tick, through the daemon's `NvmlSession`.

The session keeps NVML initialised and each GPU's statics cached, so a tick asks only what changes
(~16 calls per GPU, all under one deadline: agent.sources.nvml_facts). On top of it, once per run,
each GPU's maximum SM clock (`nvmlDeviceGetMaxClockInfo`), and each tick the Xid events waiting in
an NVML event set (non-blocking). Nothing here calls an NVML setter.
"""

from __future__ import annotations

import contextlib
from typing import Any

from agent.core.facts import GpuFacts, NvmlFacts
from agent.core.model import Unknown
from agent.core.series import GpuTrack, Recording
from agent.sources.deadline import DeadlineExceeded, call_with_deadline
from agent.sources.nvml_live import NvmlSession, load_live_nvml

MAX_EVENTS_PER_TICK = 16


def _num(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def counters(gpu: GpuFacts) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in (("ecc_corrected", gpu.ecc_volatile_corrected), ("ecc_uncorrected", gpu.ecc_volatile_uncorrected),
                       ("pcie_replays", gpu.pcie_replays)):
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    links = gpu.nvlink_errors
    if isinstance(links, dict):
        out["nvlink_errors"] = sum(v for v in links.values() if isinstance(v, int))
    return out


class Sampler:
    """Reads the GPUs into `recording` tick by tick; `session` may be any NvmlSession (tests: live over the mock)."""

    def __init__(self, recording: Recording, session: NvmlSession | None = None, timeout_s: float = 5.0) -> None:
        self.recording = recording
        self.session = session or NvmlSession.live()
        self.timeout_s = timeout_s
        self.by_index: dict[int, GpuTrack] = {}
        self.nvml: Any = None
        self.events: Any = None
        self.calls_s = 0.0  # time spent reading (the benchmark's overhead figure)
        self.ticks = 0
        self.first: NvmlFacts | None = None

    def start(self) -> str | None:
        """The first read: the GPUs by UUID, their statics and counters. An error text when NVML is down."""
        facts = self._read()
        if isinstance(facts, Unknown):
            return facts.reason
        self.first = facts
        self.recording.driver = _text(facts.driver_version)
        unreadable = []
        for gpu in facts.gpus:
            if not isinstance(gpu.uuid, str):
                # counted by NVML, not readable: no series can be kept, and accept.gpu.lost fails the run
                unreadable.append({"gpu": f"gpu{gpu.index}", "pci_bus_id": _text(gpu.pci_bus_id),
                                   "why": str(gpu.lost or "no UUID from NVML")[:300]})
                continue
            track = GpuTrack(uuid=gpu.uuid, index=gpu.index, name=_text(gpu.name), serial=_text(gpu.serial),
                             pci_bus_id=_text(gpu.pci_bus_id), vbios=_text(gpu.vbios),
                             default_limit_w=_num(gpu.default_limit_w), memory_max_c=_int(gpu.memory_max_c),
                             counters_start=counters(gpu))
            if gpu.lost is not None:
                self._lost(track, 0.0, f"lost at the start: {gpu.lost}")
            self.by_index[gpu.index] = track
            self.recording.gpus.append(track)
        self.recording.inventory["start"] = {"nvml_count": _int(facts.device_count), "unreadable": unreadable,
                                             "error": _text(facts.incomplete)}
        self._statics_from_binding()
        return None

    def finish(self, t: float) -> None:
        """The end of the run: one more read, so a GPU that left (or stopped answering) during cool-down
        is seen, and the inventory's `end` says what NVML counted then."""
        facts = self._read()
        if isinstance(facts, Unknown):
            self.recording.inventory["end"] = {"error": f"NVML could not be read at the end: {facts.reason}"[:300]}
            return
        unreadable = []
        seen = set()
        for gpu in facts.gpus:
            track = self.by_index.get(gpu.index)
            if gpu.lost is not None or not isinstance(gpu.uuid, str):
                why = str(gpu.lost or "no UUID from NVML")[:300]
                unreadable.append({"gpu": f"gpu{gpu.index}", "pci_bus_id": _text(gpu.pci_bus_id), "why": why})
                if track is not None:
                    self._lost(track, t, why)
            elif track is not None and gpu.uuid != track.uuid:
                self._lost(track, t, f"index {gpu.index} is now {gpu.uuid}")
            seen.add(gpu.index)
        for index, track in self.by_index.items():
            if index not in seen:
                self._lost(track, t, "no longer counted by NVML")
        self.recording.inventory["end"] = {"nvml_count": _int(facts.device_count), "unreadable": unreadable,
                                           "error": _text(facts.incomplete)}

    def _read(self) -> NvmlFacts | Unknown:
        import time

        t0 = time.perf_counter()
        facts, _status = self.session.read(self.timeout_s)
        self.calls_s += time.perf_counter() - t0
        self.ticks += 1
        return facts

    def _statics_from_binding(self) -> None:
        """Max SM clocks and the Xid event set, through the live binding (absent for a replay)."""
        if self.session.recorded:
            self.recording.xid_source = "unavailable: a recorded session"
            return
        try:
            self.nvml = load_live_nvml()
            call_with_deadline(self._prepare, timeout_s=self.timeout_s, name="accept-statics")
        except (ImportError, DeadlineExceeded) as exc:
            self.recording.xid_source = f"unavailable: {exc}"

    def _prepare(self) -> None:
        nvml = self.nvml
        handles = {}
        for index, track in self.by_index.items():
            with contextlib.suppress(nvml.NVMLError):
                handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                track.max_sm_mhz = int(nvml.nvmlDeviceGetMaxClockInfo(handles[index], nvml.NVML_CLOCK_SM))
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in handles.values():
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError as exc:
            self.recording.xid_source = f"unavailable: NVML event set: {exc}"
            return
        self.events = events
        self.recording.xid_source = "nvml events"

    def tick(self, t: float) -> None:
        facts = self._read()
        recording = self.recording
        if isinstance(facts, Unknown):
            recording.notes.append(f"t={t:.1f}s: NVML read failed: {facts.reason}"[:300])
            return
        seen = set()
        for gpu in facts.gpus:
            track = self.by_index.get(gpu.index)
            if track is None:
                continue
            seen.add(gpu.index)
            if gpu.lost is not None or (isinstance(gpu.uuid, str) and gpu.uuid != track.uuid):
                self._lost(track, t, gpu.lost or f"index {gpu.index} is now {gpu.uuid}")
                continue
            series = track.series
            for key, value in (("t", round(t, 3)), ("power_w", _num(gpu.power_w)),
                               ("limit_w", _num(gpu.enforced_limit_w)),
                               ("temp_c", _num(gpu.temperature_c)), ("mem_temp_c", _num(gpu.memory_temperature_c)),
                               ("sm_mhz", _num(gpu.sm_clock_mhz)), ("mem_mhz", _num(gpu.memory_clock_mhz)),
                               ("util_pct", _num(gpu.utilization_gpu_pct)), ("events", _num(gpu.clock_events))):
                series[key].append(value)
            track.counters_end = counters(gpu)
        for index, track in self.by_index.items():
            if index not in seen:
                self._lost(track, t, "no longer counted by NVML")
        if self.events is not None:
            self._drain_xids(t)

    def _lost(self, track: GpuTrack, t: float, why: str) -> None:
        if track.lost is None:
            track.lost, track.lost_at = why[:300], round(t, 3)

    def _drain_xids(self, t: float) -> None:
        nvml = self.nvml

        def drain() -> list[tuple[str | None, int]]:
            found = []
            for _ in range(MAX_EVENTS_PER_TICK):
                try:
                    data = nvml.nvmlEventSetWait_v2(self.events, 0)
                except nvml.NVMLError_Timeout:
                    break
                uuid = None
                with contextlib.suppress(nvml.NVMLError):
                    uuid = str(nvml.nvmlDeviceGetUUID(data.device))
                found.append((uuid, int(data.eventData)))
            return found

        try:
            for uuid, code in call_with_deadline(drain, timeout_s=self.timeout_s, name="accept-xid"):
                if len(self.recording.xids) < 1000:
                    self.recording.xids.append({"t": round(t, 3), "uuid": uuid, "code": code})
        except Exception as exc:  # noqa: BLE001 - a failing event set must not end the run; said once
            self.recording.xid_source = f"unavailable after t={t:.0f}s: {type(exc).__name__}: {exc}"[:300]
            self.events = None

    def close(self) -> None:
        events, self.events = self.events, None
        if events is not None:
            with contextlib.suppress(Exception):
                call_with_deadline(lambda: self.nvml.nvmlEventSetFree(events), timeout_s=2.0, name="accept-free")
        self.session.close()


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
