"""The acceptance recording: per-GPU series (by UUID) and per-node BMC series, and its steady-state view.

Plain data, no I/O: the sampler fills it, checks/accept.py judges it, agent.state.acceptance keeps it as
versioned, bounded JSON. `from_json` treats the file as hostile (a state dir a user could have
filled): types, lengths and the number of GPUs and samples are bounded before anything loops.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.core.facts import CLOCK_EVENT_BITS

SCHEMA = "nodewarden.accept/v1"
MAX_GPUS = 64
MAX_SAMPLES = 40_000  # 10 h at 1 s; the CLI refuses a longer run before it starts
MAX_XIDS = 1_000
MAX_TEXT = 512
PHASES = ("idle", "ramp", "steady", "cooldown")
SERIES = ("t", "power_w", "limit_w", "temp_c", "mem_temp_c", "sm_mhz", "mem_mhz", "util_pct", "events")
COUNTERS = ("ecc_corrected", "ecc_uncorrected", "pcie_replays", "nvlink_errors")
# Clock event reasons that are faults under steady load; SW power cap at the limit is the expected one.
FORBIDDEN_EVENTS = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")


class RecordingError(ValueError):
    """A stored recording that is not one of ours (wrong schema, types or sizes)."""


@dataclass
class GpuTrack:
    uuid: str
    index: int
    name: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    vbios: str | None = None
    default_limit_w: float | None = None
    max_sm_mhz: int | None = None
    memory_max_c: int | None = None
    series: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in SERIES})
    counters_start: dict[str, int] = field(default_factory=dict)
    counters_end: dict[str, int] = field(default_factory=dict)
    lost: str | None = None
    lost_at: float | None = None

    @property
    def label(self) -> str:
        return f"gpu{self.index}"


@dataclass
class BmcTrack:
    firmware: str | None = None
    t: list[float] = field(default_factory=list)
    inlet_c: list[float | None] = field(default_factory=list)
    exhaust_c: list[float | None] = field(default_factory=list)
    psu_input_w: list[float | None] = field(default_factory=list)
    redundancy: list[str | None] = field(default_factory=list)
    fans_rpm: list[float | None] = field(default_factory=list)  # the slowest fan at each reading
    error: str | None = None


@dataclass
class Recording:
    run_id: str
    started_at: str
    interval_s: float
    hostname: str | None = None
    profile: str | None = None
    driver: str | None = None
    load: dict[str, Any] = field(default_factory=dict)  # kind, argv, outcome (ok | why not)
    phases: dict[str, list[float]] = field(default_factory=dict)  # name -> [start, end] seconds from start
    gpus: list[GpuTrack] = field(default_factory=list)
    bmc: BmcTrack | None = None
    xids: list[dict[str, Any]] = field(default_factory=list)  # {t, uuid, code}
    xid_source: str = "none"
    finished_at: str | None = None
    notes: list[str] = field(default_factory=list)
    # what the node had at the start and the end, beside what was sampled: {"start"|"end": {nvml_count,
    # unreadable: [{gpu, pci_bus_id, why}], pci: [bus ids] | None, pci_error, board_gpus, board_full,
    # board_why, error}} (checks.accept's accept.gpu.lost judges it)
    inventory: dict[str, dict[str, Any]] = field(default_factory=dict)

    def steady_window(self) -> tuple[float, float] | None:
        window = self.phases.get("steady")
        return (window[0], window[1]) if window and len(window) == 2 and window[1] > window[0] else None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["schema"] = SCHEMA
        return doc


@dataclass(frozen=True)
class Steady:
    """One GPU over the steady window: medians, extremes and how many samples carried each fault."""

    samples: int
    power_w: float | None
    limit_w: float | None
    temp_c: float | None
    mem_temp_max_c: float | None
    sm_mhz: float | None
    util_pct: float | None
    event_samples: dict[str, int]


def _median(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    import statistics  # imported when a recording is judged: the audit imports this module and never needs it

    return statistics.median(numbers) if numbers else None


def steady(track: GpuTrack, window: tuple[float, float]) -> Steady:
    series = track.series
    rows = [i for i, t in enumerate(series["t"]) if window[0] <= t <= window[1]]

    def pick(key: str) -> list[Any]:
        column = series[key]
        return [column[i] for i in rows if i < len(column)]

    counts = {name: 0 for name in FORBIDDEN_EVENTS}
    for mask in pick("events"):
        if isinstance(mask, int):
            for name in FORBIDDEN_EVENTS:
                counts[name] += bool(mask & CLOCK_EVENT_BITS[name])
    mem = [float(v) for v in pick("mem_temp_c") if isinstance(v, int | float)]
    return Steady(samples=len(rows), power_w=_median(pick("power_w")), limit_w=_median(pick("limit_w")),
                  temp_c=_median(pick("temp_c")), mem_temp_max_c=max(mem) if mem else None,
                  sm_mhz=_median(pick("sm_mhz")), util_pct=_median(pick("util_pct")), event_samples=counts)


def bmc_median(values: Sequence[Any], t: Sequence[float], window: tuple[float, float]) -> float | None:
    return _median([v for v, when in zip(values, t, strict=False) if window[0] <= when <= window[1]])


def thermal_resistance(stats: Steady, reference_c: float | None) -> float | None:
    """degC per W above `reference_c` (the inlet); None without the readings."""
    if stats.temp_c is None or reference_c is None or not stats.power_w or stats.power_w <= 0:
        return None
    return round((stats.temp_c - reference_c) / stats.power_w, 5)


# --- reading a stored recording back (hostile input) ----------------------------------------------


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordingError(f"expected text, got {type(value).__name__}")
    return value[:MAX_TEXT]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RecordingError(f"expected a number, got {str(value)[:40]!r}")
    return value


def _numbers(values: Any, what: str) -> list[Any]:
    if not isinstance(values, list) or len(values) > MAX_SAMPLES:
        raise RecordingError(f"{what}: expected a list of at most {MAX_SAMPLES} samples")
    return [_number(v) for v in values]


def _counters(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise RecordingError("counters: expected an object")
    return {k: int(v) for k, v in value.items() if k in COUNTERS and isinstance(v, int) and not isinstance(v, bool)}


def _gpu(doc: Any) -> GpuTrack:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("uuid"), str) or not isinstance(doc.get("index"), int):
        raise RecordingError("a GPU entry without uuid and index")
    series = doc.get("series")
    if not isinstance(series, Mapping):
        raise RecordingError("a GPU entry without series")
    track = GpuTrack(uuid=doc["uuid"][:MAX_TEXT], index=int(doc["index"]), name=_text(doc.get("name")),
                     serial=_text(doc.get("serial")), pci_bus_id=_text(doc.get("pci_bus_id")),
                     vbios=_text(doc.get("vbios")), default_limit_w=_number(doc.get("default_limit_w")),
                     series={k: _numbers(series.get(k, []), k) for k in SERIES},
                     counters_start=_counters(doc.get("counters_start", {})),
                     counters_end=_counters(doc.get("counters_end", {})),
                     lost=_text(doc.get("lost")), lost_at=_number(doc.get("lost_at")))
    for key in ("max_sm_mhz", "memory_max_c"):
        value = _number(doc.get(key))
        setattr(track, key, int(value) if value is not None else None)
    return track


def _bmc(doc: Any) -> BmcTrack | None:
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise RecordingError("bmc: expected an object")
    redundancy = doc.get("redundancy", [])
    if not isinstance(redundancy, list) or len(redundancy) > MAX_SAMPLES:
        raise RecordingError("bmc.redundancy: expected a list")
    return BmcTrack(firmware=_text(doc.get("firmware")), t=_numbers(doc.get("t", []), "bmc.t"),
                    inlet_c=_numbers(doc.get("inlet_c", []), "bmc.inlet_c"),
                    exhaust_c=_numbers(doc.get("exhaust_c", []), "bmc.exhaust_c"),
                    psu_input_w=_numbers(doc.get("psu_input_w", []), "bmc.psu_input_w"),
                    redundancy=[_text(r) for r in redundancy],
                    fans_rpm=_numbers(doc.get("fans_rpm", []), "bmc.fans_rpm"), error=_text(doc.get("error")))


def _load(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, Mapping):
        return {}
    argv = doc.get("argv")
    out: dict[str, Any] = {k: _text(doc.get(k)) for k in ("kind", "outcome", "described", "stopped")
                           if isinstance(doc.get(k), str)}
    if isinstance(argv, list):
        out["argv"] = [a[:MAX_TEXT] for a in argv[:64] if isinstance(a, str)]
    return out


def _bus_ids(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_GPUS * 2 or not all(isinstance(v, str) for v in value):
        raise RecordingError(f"{what}: expected a short list of PCI addresses")
    return [v[:64] for v in value]


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4096:
        raise RecordingError(f"{what}: expected a GPU count")
    return value


def _inventory(doc: Any) -> dict[str, dict[str, Any]]:
    if doc is None:
        return {}  # a recording from before the inventory was kept
    if not isinstance(doc, Mapping):
        raise RecordingError("inventory: expected an object")
    out: dict[str, dict[str, Any]] = {}
    for when in ("start", "end"):
        part = doc.get(when)
        if part is None:
            continue
        if not isinstance(part, Mapping):
            raise RecordingError(f"inventory.{when}: expected an object")
        unreadable = part.get("unreadable", [])
        if not isinstance(unreadable, list) or len(unreadable) > MAX_GPUS:
            raise RecordingError(f"inventory.{when}.unreadable: expected a short list")
        board_full = part.get("board_full")
        out[when] = {
            "nvml_count": _count(part.get("nvml_count"), f"inventory.{when}.nvml_count"),
            "unreadable": [{"gpu": _text(u.get("gpu")) or "gpu?", "pci_bus_id": _text(u.get("pci_bus_id")),
                            "why": _text(u.get("why")) or "unreadable"} for u in unreadable if isinstance(u, Mapping)],
            "pci": _bus_ids(part.get("pci"), f"inventory.{when}.pci"),
            "pci_error": _text(part.get("pci_error")),
            "board_gpus": _count(part.get("board_gpus"), f"inventory.{when}.board_gpus"),
            "board_full": board_full if isinstance(board_full, bool) else None,
            "board_why": _text(part.get("board_why")), "error": _text(part.get("error"))}
    return out


def from_json(doc: Any) -> Recording:
    """A stored recording, checked; RecordingError names what is wrong."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        raise RecordingError(f"not a {SCHEMA} recording")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise RecordingError(f"gpus: expected a list of at most {MAX_GPUS}")
    phases = doc.get("phases", {})
    if not isinstance(phases, Mapping):
        raise RecordingError("phases: expected an object")
    xids = doc.get("xids", [])
    if not isinstance(xids, list) or len(xids) > MAX_XIDS:
        raise RecordingError("xids: expected a short list")
    load = doc.get("load", {})
    interval = _number(doc.get("interval_s"))
    return Recording(
        run_id=_text(doc.get("run_id")) or "unknown", started_at=_text(doc.get("started_at")) or "",
        interval_s=float(interval or 1.0), hostname=_text(doc.get("hostname")), profile=_text(doc.get("profile")),
        driver=_text(doc.get("driver")),
        load=_load(load),
        phases={str(k)[:16]: [float(x) for x in _numbers(v, "phase") if x is not None][:2]
                for k, v in phases.items() if k in PHASES},
        gpus=[_gpu(g) for g in gpus], bmc=_bmc(doc.get("bmc")),
        xids=[{"t": _number(x.get("t")), "uuid": _text(x.get("uuid")), "code": int(x["code"])}
              for x in xids if isinstance(x, Mapping) and isinstance(x.get("code"), int)],
        xid_source=_text(doc.get("xid_source")) or "none", finished_at=_text(doc.get("finished_at")),
        notes=[n[:MAX_TEXT] for n in doc.get("notes", []) if isinstance(n, str)][:100]
        if isinstance(doc.get("notes"), list) else [],
        inventory=_inventory(doc.get("inventory")))


@dataclass(frozen=True)
class SteadyView:
    """The steady window of a run and what every check of it reads: the GPUs still there, their steady
    statistics by UUID, the BMC inlet median (None without a BMC)."""

    window: tuple[float, float]
    live: tuple[GpuTrack, ...]
    stats: dict[str, Steady]
    inlet: float | None


@dataclass
class AcceptanceRun:
    """What a series check (checks.Check with input "series") judges: an acceptance run's recording and
    the node's stored acceptance baseline, if any. The steady view is computed once for all the checks."""

    recording: Recording
    baseline: Recording | None = None

    @functools.cached_property
    def steady_view(self) -> SteadyView | None:
        """None when the run never reached a steady state (accept.load says why)."""
        window = self.recording.steady_window()
        if window is None:
            return None
        live = tuple(g for g in self.recording.gpus if g.lost is None)
        bmc = self.recording.bmc
        inlet = bmc_median(bmc.inlet_c, bmc.t, window) if bmc else None
        return SteadyView(window, live, {g.uuid: steady(g, window) for g in live}, inlet)
