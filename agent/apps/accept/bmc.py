"""BMC readings during an acceptance run: inlet/exhaust temperatures, slowest fan, PSU input power, redundancy.

One read at a time, in one background thread, every `interval_s` (default 10 s: a BMC answers in
seconds and has a small connection budget): the daemon's sensors-only read (agent.sources'
BMC source, `sensors_only`; the first read is a whole walk, for the BMC firmware) with one
connection (`concurrency=1`) under the configured deadline.
A read still running when the next is due is not doubled up; a failed read is one gap and a note.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

from agent.core.facts import BmcFacts, FirmwareItem
from agent.core.model import Unknown
from agent.core.series import BmcTrack, Recording
from agent.io.credentials import BmcOptions

MAX_NOTES = 5


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def reading(bmc: BmcFacts) -> dict[str, Any]:
    """The few values the run records from one sensors read."""
    temps = bmc.temperatures if isinstance(bmc.temperatures, tuple) else ()
    inlet = [t.reading for t in temps if (t.context or "").lower() in ("intake", "inlet") and t.reading is not None]
    exhaust = [t.reading for t in temps if (t.context or "").lower() == "exhaust" and t.reading is not None]
    fans = bmc.fans if isinstance(bmc.fans, tuple) else ()
    rpm = [f.reading for f in fans if f.reading is not None and f.state != "Absent"
           and (f.units or "RPM").upper() == "RPM"]
    psus = bmc.psus if isinstance(bmc.psus, tuple) else ()
    power = _finite(bmc.power_consumed_w)
    if power is None:
        outputs = [p.output_w for p in psus if p.output_w is not None]
        power = sum(outputs) if outputs else None
    if power is not None and power <= 0:
        power = None  # a node under load drawing nothing: the BMC does not measure it, not a reading
    groups = bmc.redundancy if isinstance(bmc.redundancy, tuple) else ()
    states = [(g.health or "").lower() for g in groups if g.state != "Absent"]
    redundancy = None if not states else "redundant" if all(s in ("ok", "") for s in states) else (
        f"degraded ({', '.join(g.name for g in groups if (g.health or '').lower() not in ('ok', ''))})")
    return {"inlet_c": min(inlet) if inlet else None, "exhaust_c": max(exhaust) if exhaust else None,
            "fans_rpm": min(rpm) if rpm else None, "psu_input_w": power, "redundancy": redundancy}


def firmware(bmc: BmcFacts) -> str | None:
    manager = bmc.manager_firmware
    if isinstance(manager, str):
        return manager
    items = bmc.firmware if isinstance(bmc.firmware, tuple) else ()
    found = next((f for f in items if isinstance(f, FirmwareItem) and "bmc" in f.name.lower()), None)
    return found.version if found is not None else None


class BmcPoller:
    def __init__(self, options: BmcOptions, interval_s: float, recording: Recording, node: Any = None) -> None:
        self.options = dataclasses.replace(options, concurrency=1)
        self.interval_s = max(interval_s, 1.0)
        self.track = recording.bmc = BmcTrack()
        self.node = node
        self.next_at = 0.0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.notes = 0

    def maybe_read(self, t: float) -> None:
        if t < self.next_at or (self.thread is not None and self.thread.is_alive()):
            return
        self.next_at = t + self.interval_s
        self.thread = threading.Thread(target=self._read, args=(t,), name="accept-bmc", daemon=True)
        self.thread.start()

    def _read(self, t: float) -> None:
        from agent.sources.registry import BMC
        from agent.sources.source import ReadOptions

        try:
            # The first read walks the whole BMC once (its firmware goes in the recording); then sensors only.
            full = not self.track.t
            facts, _statuses = BMC.read_live(self.node, ReadOptions(bmc=self.options, sensors_only=not full))
        except Exception as exc:  # noqa: BLE001 - a BMC bug is a gap in the series, never the end of the run
            facts = Unknown(f"{type(exc).__name__}: {exc}")
        with self.lock:
            track = self.track
            if not isinstance(facts, BmcFacts):
                reason = facts.reason if isinstance(facts, Unknown) else "no answer"
                if self.notes < MAX_NOTES:
                    track.error = f"t={t:.0f}s: {reason}"[:300]
                    self.notes += 1
                return
            values = reading(facts)
            track.firmware = track.firmware or firmware(facts)
            track.t.append(round(t, 3))
            for key in ("inlet_c", "exhaust_c", "psu_input_w", "redundancy", "fans_rpm"):
                getattr(track, key).append(values[key])

    def close(self) -> None:
        thread = self.thread
        if thread is not None:
            with contextlib.suppress(RuntimeError):
                thread.join(timeout=self.options.deadline_s + 5)
