"""accept.*: judgement of an acceptance run under full load (`nodewarden accept`), over its recording.

These checks judge the recorded series (agent.core.series), not one reading: each is a `Check` whose
input is "series" (issue 32.3), run by `nodewarden accept` through the registry and never by an audit.
They are registered like every check so waivers, `--only`, the README table and the profile schema
treat them alike. Each threshold sits in the profile (`expect.accept.*`) with its source.
A critical finding needs positive evidence: a fault reason NVML set, a counter that moved, an Xid
event, NVML saying the GPU is lost. A missing reading is `skip` or `unknown`, never `fail`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.core.expect import Expectation
from agent.core.model import Finding, Severity, Status
from agent.core.series import (
    FORBIDDEN_EVENTS,
    AcceptanceRun,
    GpuTrack,
    Recording,
    Steady,
    bmc_median,
    steady,
    thermal_resistance,
)
from agent.policy.profiles import Profile
from checks import Check, expectation_schema


def _check(id_: str, title: str, key: str, what: str, evidence: str, action: str | None = None,
           source: str = "nvml") -> Check:
    return Check(id_, title, source=source, action=action, expect_path=("accept", key),
                 schema=expectation_schema(what), evidence=evidence, input="series")


LOAD = _check("accept.load", "Load reached and held", "load_utilization_pct",
              "GPU utilization (%) every GPU must reach for the steady phase to start and hold through it.",
              "the load runner's outcome (started, ran through steady) and each GPU's median steady utilization")
POWER = _check("accept.power", "Steady power against the enforced limit", "power_fraction",
               "Steady median power draw as a fraction of the enforced limit (min: 0.9).",
               "NVML power draw and enforced limit, medians over the steady window; an enforced limit below the "
               "default limit is itself a cap", action="check_power_delivery")
SPREAD = _check("accept.temperature.spread", "Temperature spread across same-model GPUs", "temperature_spread_c",
                "Highest minus lowest steady median GPU temperature (degC) among the node's same-model GPUs.",
                "NVML GPU temperature, median over the steady window, per model", action="check_cooling")
RESISTANCE = _check("accept.thermal.resistance", "Thermal resistance within the model envelope",
                    "thermal_resistance_c_per_w",
                    "degC per W above the BMC inlet temperature, steady medians (needs a BMC).",
                    "steady GPU temperature minus BMC inlet, per W of steady power draw", action="check_cooling",
                    source="crosscheck")
SIBLINGS = _check("accept.thermal.siblings", "Thermal resistance against sibling GPUs", "thermal_sibling_pct",
                  "How far (%) a GPU's degC per W may sit above the median of its same-model siblings.",
                  "steady degC per W (above inlet; without a BMC, temperature per W) against the node median",
                  action="check_cooling")
EVENTS = _check("accept.clocks.events", "No fault clock events under steady load", "clock_event_samples",
                "Steady samples with HW slowdown, HW thermal, HW power brake or SW thermal set (max: 0).",
                "NVML clock event reasons in every steady sample; SW power cap at the limit is expected",
                action="check_cooling_and_power")
SM_CLOCK = _check("accept.clocks.sm", "SM clock under steady load", "sm_clock_fraction",
                  "Steady median SM clock as a fraction of the GPU's maximum SM clock.",
                  "NVML SM clock (median over steady) against nvmlDeviceGetMaxClockInfo", action="check_cooling")
MEMORY = _check("accept.memory.temperature", "Memory temperature margin under load", "memory_temperature_margin_c",
                "degC between the hottest steady memory temperature and the GPU's memory max threshold.",
                "NVML memory temperature (max over steady) against the NVML memory max threshold",
                action="check_cooling")
PSU = _check("accept.psu", "PSU input and redundancy under load", "psu_input_ratio",
             "BMC PSU input power over the GPUs' summed NVML draw, steady medians (min: 1.0).",
             "BMC PSU input power and redundancy state read during the run, against the GPUs' summed draw",
             action="check_power_delivery", source="crosscheck")
ERRORS = _check("accept.errors", "No new GPU errors during the run", "new_errors",
                "New Xid events, ECC, NVLink and PCIe replay counts during the run (max: 0).",
                "NVML Xid events, volatile ECC, NVLink error and PCIe replay counter deltas",
                action="reset_gpu")
GPU_LOST = Check("accept.gpu.lost", "Every GPU the node has was read from start to end", source="nvml",
                 action="drain",
                 evidence="NVML's device count and each GPU's reads at the start, every sample and the end; the NVIDIA "
                          "GPUs on PCI by address at the start and the end; the board's GPU count from the profile "
                          "where the evidence shows the whole board", input="series")


def _pct(value: float) -> str:
    return f"{value:.0%}"


# The order a person reads an acceptance report in: did the load run, is every GPU there, new errors,
# then each GPU's power, clocks and temperatures, then the node-wide comparisons.
READING_ORDER = ("accept.load", "accept.gpu.lost", "accept.errors", "accept.power", "accept.clocks.events",
                 "accept.clocks.sm", "accept.memory.temperature", "accept.thermal.resistance",
                 "accept.temperature.spread", "accept.thermal.siblings", "accept.psu", "accept.drift")


def judge_run(run: AcceptanceRun, profile: Profile, skip: tuple[str, ...] = ()) -> list[Finding]:
    """Every series check of the registry over one run (`nodewarden accept`), in READING_ORDER."""
    from checks import all_checks

    series = sorted((c for c in all_checks() if c.input == "series" and c.id not in skip),
                    key=lambda c: READING_ORDER.index(c.id) if c.id in READING_ORDER else len(READING_ORDER))
    return [finding for check in series for finding in check.run_series(run, profile)]


def judge(recording: Recording, profile: Profile) -> list[Finding]:
    """Every accept.* finding for one run but drift (which needs a baseline: checks.accept_drift)."""
    return judge_run(AcceptanceRun(recording), profile, skip=("accept.drift",))


@LOAD.series_evaluator
def evaluate_load(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _load(run.recording, profile)


@GPU_LOST.series_evaluator
def evaluate_gpu_lost(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return gpu_inventory(run.recording)


@ERRORS.series_evaluator
def evaluate_errors(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _errors(run.recording, profile)


PerGpu = Callable[[GpuTrack, Steady, Expectation, "float | None"], Finding]


def _each_gpu(run: AcceptanceRun, profile: Profile, check: Check, judge_one: PerGpu) -> list[Finding]:
    """One finding per GPU still there, over the steady window (none without one: accept.load says why)."""
    view, exp = run.steady_view, check.expectation(profile)
    if view is None or exp is None:
        return []
    return [judge_one(gpu, view.stats[gpu.uuid], exp, view.inlet) for gpu in view.live]


@POWER.series_evaluator
def evaluate_power(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _each_gpu(run, profile, POWER, lambda gpu, stats, exp, _inlet: _power(gpu, stats, exp))


@EVENTS.series_evaluator
def evaluate_clock_events(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _each_gpu(run, profile, EVENTS, _events)


@SM_CLOCK.series_evaluator
def evaluate_sm_clock(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _each_gpu(run, profile, SM_CLOCK, _sm_clock)


@MEMORY.series_evaluator
def evaluate_memory_temperature(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _each_gpu(run, profile, MEMORY, _memory)


@RESISTANCE.series_evaluator
def evaluate_thermal_resistance(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return _each_gpu(run, profile, RESISTANCE, _resistance)


@SPREAD.series_evaluator
def evaluate_spread(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    view = run.steady_view
    return [] if view is None else _spread(list(view.live), view.stats, profile)


@SIBLINGS.series_evaluator
def evaluate_siblings(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    view = run.steady_view
    return [] if view is None else _siblings(list(view.live), view.stats, profile, view.inlet)


@PSU.series_evaluator
def evaluate_psu(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    view = run.steady_view
    return [] if view is None else _psu(run.recording, view.stats, profile, view.window)


def _load(recording: Recording, profile: Profile) -> list[Finding]:
    exp = LOAD.expectation(profile)
    severity = exp.severity if exp else Severity.WARNING
    outcome = str(recording.load.get("outcome") or "no outcome recorded")
    kind = recording.load.get("kind", "?")
    if outcome != "ok":
        return [LOAD.finding("node", Status.FAIL, severity, f"load {kind}: {outcome}", observed=outcome,
                             expected="the load runs through the steady window",
                             reason=exp.reason if exp else None)]
    findings = [LOAD.finding("node", Status.PASS, severity, f"load {kind} ran through the steady window",
                             observed=outcome)]
    window = recording.steady_window()
    if exp is not None and window is not None:
        for gpu in recording.gpus:
            if gpu.lost is None:
                findings.append(LOAD.compare(gpu.label, exp, _round(steady(gpu, window).util_pct),
                                             f"{gpu.label} steady utilization (%)"))
    return findings


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _observe(check: Check, subject: str, exp: Expectation, value: float | None, what: str,
             why_missing: str) -> Finding:
    if value is None:
        return check.finding(subject, Status.SKIP, exp.severity, f"{what}: {why_missing}", expected=exp.expected,
                             reason=exp.reason)
    return check.compare(subject, exp, value, what)


def _events(gpu: GpuTrack, stats: Steady, exp: Expectation, inlet: float | None) -> Finding:
    label = gpu.label
    bad = {name: n for name, n in stats.event_samples.items() if n}
    finding = EVENTS.compare(label, exp, sum(bad.values()), f"{label} steady samples with fault clock events")
    if bad:
        finding.message = (f"{label}: {', '.join(f'{name} in {n}' for name, n in bad.items())} of "
                           f"{stats.samples} steady samples (expected none of {', '.join(FORBIDDEN_EVENTS)})")
        finding.observed = bad
    return finding


def _sm_clock(gpu: GpuTrack, stats: Steady, exp: Expectation, inlet: float | None) -> Finding:
    label = gpu.label
    ratio = stats.sm_mhz / gpu.max_sm_mhz if stats.sm_mhz is not None and gpu.max_sm_mhz else None
    finding = _observe(SM_CLOCK, label, exp, _round(ratio), f"{label} steady SM clock / max",
                       "no SM clock or max clock reading")
    if ratio is not None:
        finding.message += f" ({stats.sm_mhz:.0f} of {gpu.max_sm_mhz} MHz)"
    return finding


def _memory(gpu: GpuTrack, stats: Steady, exp: Expectation, inlet: float | None) -> Finding:
    margin = (gpu.memory_max_c - stats.mem_temp_max_c if gpu.memory_max_c is not None
              and stats.mem_temp_max_c is not None else None)
    return _observe(MEMORY, gpu.label, exp, margin, f"{gpu.label} memory temperature margin (degC)",
                    "no memory temperature or threshold from NVML")


def _resistance(gpu: GpuTrack, stats: Steady, exp: Expectation, inlet: float | None) -> Finding:
    return _observe(RESISTANCE, gpu.label, exp, thermal_resistance(stats, inlet),
                    f"{gpu.label} thermal resistance (degC/W above inlet)",
                    "no BMC inlet temperature (--bmc) or no steady power/temperature")


def _power(gpu: GpuTrack, stats: Steady, exp: Expectation) -> Finding:
    label = gpu.label
    limit, default = stats.limit_w, gpu.default_limit_w
    if stats.power_w is None or not limit:
        return POWER.finding(label, Status.SKIP, exp.severity, f"{label}: no steady power or enforced limit reading",
                             expected=exp.expected, reason=exp.reason)
    observed = {"power_w": round(stats.power_w, 1), "enforced_limit_w": limit, "default_limit_w": default}
    if default is not None and limit < default - 1:
        return POWER.finding(label, exp.status_on_mismatch(), exp.severity,
                             f"{label} is capped at {limit:g} W of its {default:g} W default limit (drew "
                             f"{stats.power_w:.0f} W): it cannot be accepted at full power", observed=observed,
                             expected=exp.expected, reason=exp.reason)
    finding = POWER.compare(label, exp, round(stats.power_w / limit, 3), f"{label} steady power / enforced limit")
    finding.message += f" ({stats.power_w:.0f} of {limit:g} W)"
    finding.observed = {**observed, "fraction": round(stats.power_w / limit, 3)}
    return finding


def _models(gpus: list[GpuTrack]) -> dict[str, list[GpuTrack]]:
    groups: dict[str, list[GpuTrack]] = {}
    for gpu in gpus:
        groups.setdefault(gpu.name or "unknown", []).append(gpu)
    return groups


def _spread(gpus: list[GpuTrack], stats: dict[str, Steady], profile: Profile) -> list[Finding]:
    exp = SPREAD.expectation(profile)
    if exp is None:
        return []
    out = []
    for model, group in _models(gpus).items():
        temps: dict[str, float] = {}
        for gpu in group:
            value = stats[gpu.uuid].temp_c
            if value is not None:
                temps[gpu.label] = value
        if len(temps) < 2:
            continue
        hot = max(temps, key=lambda k: temps[k])
        cold = min(temps, key=lambda k: temps[k])
        spread = round(temps[hot] - temps[cold], 1)
        finding = SPREAD.compare("node", exp, spread, f"steady temperature spread of {len(temps)} {model} (degC)")
        finding.message += f" (hottest {hot} {temps[hot]:g}, coolest {cold} {temps[cold]:g})"
        out.append(finding)
    return out


def per_watt(stats: Steady, inlet: float | None) -> float | None:
    """degC/W above inlet, or temperature per W where no inlet is known (siblings and drift only)."""
    if inlet is not None:
        return thermal_resistance(stats, inlet)
    return thermal_resistance(stats, 0.0)


def _siblings(gpus: list[GpuTrack], stats: dict[str, Steady], profile: Profile, inlet: float | None) -> list[Finding]:
    exp = SIBLINGS.expectation(profile)
    if exp is None:
        return []
    out = []
    basis = "above inlet" if inlet is not None else "no inlet: temperature per W"
    for group in _models(gpus).values():
        values = {g.label: per_watt(stats[g.uuid], inlet) for g in group}
        known = [v for v in values.values() if v is not None]
        if len(known) < 3:  # a median of two says nothing about which one is off
            continue
        import statistics  # only when an acceptance run is judged: an audit never pays for it

        median = statistics.median(known)
        for label, value in values.items():
            if value is None or median <= 0:
                continue
            above = round((value - median) / median * 100, 1)
            finding = SIBLINGS.compare(label, exp, above, f"{label} degC/W against its siblings' median (%)")
            finding.message += f" ({value:.4f} vs {median:.4f} degC/W, {basis})"
            out.append(finding)
    return out


def _psu(recording: Recording, stats: dict[str, Steady], profile: Profile,
         window: tuple[float, float]) -> list[Finding]:
    exp = PSU.expectation(profile)
    if exp is None:
        return []
    bmc = recording.bmc
    if bmc is None or not bmc.t:
        why = bmc.error if bmc is not None and bmc.error else "no BMC configured (--bmc URL)"
        return [PSU.finding("node", Status.SKIP, exp.severity, f"PSU input under load: {why}",
                            expected=exp.expected, reason=exp.reason)]
    out = []
    lost = [r for r, t in zip(bmc.redundancy, bmc.t, strict=False) if r and r != "redundant" and t >= window[0]]
    if lost and bmc.redundancy and bmc.redundancy[0] == "redundant":
        out.append(PSU.finding("node", Status.FAIL, Severity.CRITICAL,
                               f"PSU redundancy was lost under load (BMC: {lost[0]})", observed=lost[0],
                               expected="redundant", reason=exp.reason))
    psu_w = bmc_median(bmc.psu_input_w, bmc.t, window)
    gpu_w = sum(s.power_w for s in stats.values() if s.power_w is not None)
    ratio = round(psu_w / gpu_w, 3) if psu_w is not None and gpu_w > 0 else None
    finding = _observe(PSU, "node", exp, ratio, "PSU input / GPUs' summed draw under load",
                       "no PSU input power from the BMC")
    if ratio is not None:
        finding.message += f" ({psu_w:.0f} W vs {gpu_w:.0f} W)"
    out.append(finding)
    return out


_COUNTER_NAMES: dict[str, str] = {"ecc_uncorrected": "uncorrectable ECC", "ecc_corrected": "correctable ECC",
                                  "pcie_replays": "PCIe replays", "nvlink_errors": "NVLink errors"}


def _errors(recording: Recording, profile: Profile) -> list[Finding]:
    exp = ERRORS.expectation(profile)
    if exp is None:
        return []
    watched = "" if recording.xid_source == "nvml events" else f"; Xid not watched ({recording.xid_source})"
    out = []
    for gpu in recording.gpus:
        label = gpu.label
        if gpu.lost is not None:
            continue  # no counters after it was lost: accept.gpu.lost says so
        moved: dict[str, int] = {}
        for key, name in _COUNTER_NAMES.items():
            start, end = gpu.counters_start.get(key), gpu.counters_end.get(key)
            if start is not None and end is not None and end > start:
                moved[name] = end - start
        xids = [x["code"] for x in recording.xids if x.get("uuid") == gpu.uuid]
        if xids:
            moved["Xid"] = len(xids)
        finding = ERRORS.compare(label, exp, sum(moved.values()), f"{label} new errors during the run")
        if moved:
            finding.message = (f"{label}: new during the run: "
                               + ", ".join(f"{name} +{n}" for name, n in moved.items())
                               + (f" (Xid {', '.join(map(str, sorted(set(xids))))})" if xids else ""))
            finding.observed = moved
        else:
            finding.message += watched
        out.append(finding)
    return out


def _phase_at(recording: Recording, t: float | None) -> str:
    for name, span in recording.phases.items():
        if t is not None and len(span) == 2 and span[0] <= t <= span[1]:
            return f"during {name}"
    return "after the phases"



# --- accept.gpu.lost: the GPUs the node has, at the start and the end -------------------------------------


def gpu_inventory(recording: Recording) -> list[Finding]:
    """A GPU the node has but NVML cannot read, that left NVML or PCI during the run, or a full board
    NVML counts short of: each a critical failure on positive evidence (NVML counting it, PCI listing
    it, the board's size where the board is shown whole). What cannot be compared is said, not failed."""
    start, end = recording.inventory.get("start"), recording.inventory.get("end") or {}
    if start is None:
        return [GPU_LOST.finding("node", Status.UNKNOWN, Severity.WARNING,
                                 "no GPU inventory in this recording: whether every GPU was read cannot be told")]
    out: list[Finding] = []
    for gpu in recording.gpus:
        if gpu.lost is not None:
            out.append(GPU_LOST.finding(gpu.label, Status.FAIL, Severity.CRITICAL,
                                        f"{gpu.label} ({gpu.uuid}) was lost at t={gpu.lost_at or 0:.1f} s "
                                        f"({_phase_at(recording, gpu.lost_at)}): {gpu.lost}",
                                        observed={"lost": gpu.lost, "at_s": gpu.lost_at}, expected="present",
                                        reason=_LOST_REASON))
    told = {f.subject for f in out}
    for when, part in (("start", start), ("end", end)):
        for gpu_doc in part.get("unreadable") or []:
            subject = str(gpu_doc.get("gpu"))
            if subject in told:
                continue
            told.add(subject)
            bus = f" ({gpu_doc['pci_bus_id']})" if gpu_doc.get("pci_bus_id") else ""
            out.append(GPU_LOST.finding(subject, Status.FAIL, Severity.CRITICAL,
                                        f"{subject}{bus} is counted by NVML but could not be read at the {when} of "
                                        f"the run: {gpu_doc.get('why')}", observed={"unreadable_at": when,
                                                                                    "why": gpu_doc.get("why")},
                                        expected="readable", reason=_LOST_REASON))
    views, cannot = _compare_views(recording, start, end, out)
    if any(f.status is Status.FAIL for f in out):
        return out
    if not views:
        out.append(GPU_LOST.finding("node", Status.UNKNOWN, Severity.WARNING,
                                    f"{len(recording.gpus)} GPU(s) read at the start and the end, but whether the "
                                    f"node has more cannot be told: {'; '.join(cannot)}", observed=len(recording.gpus)))
        return out
    out.append(GPU_LOST.finding("node", Status.PASS, Severity.CRITICAL,
                                f"all {len(recording.gpus)} GPU(s) read at the start and the end ({'; '.join(views)})",
                                observed=len(recording.gpus)))
    return out


_LOST_REASON = "A GPU the node has but cannot read is unusable: the node cannot be accepted (drain, reset or RMA)"


def _compare_views(recording: Recording, start: dict[str, Any], end: dict[str, Any],
                   out: list[Finding]) -> tuple[list[str], list[str]]:
    """Append failures from NVML's count, PCI and the board's size; (what agreed, what could not be compared)."""
    views: list[str] = []
    cannot: list[str] = []
    count_start, count_end = start.get("nvml_count"), end.get("nvml_count")
    if isinstance(count_start, int) and isinstance(count_end, int) and count_end < count_start:
        out.append(GPU_LOST.finding("node", Status.FAIL, Severity.CRITICAL,
                                    f"NVML counted {count_start} GPU(s) at the start and {count_end} at the end",
                                    observed=count_end, expected=count_start, reason=_LOST_REASON))
    board, full = start.get("board_gpus"), start.get("board_full")
    if isinstance(board, int) and isinstance(count_start, int) and full is True:
        if count_start < board:
            out.append(GPU_LOST.finding("node", Status.FAIL, Severity.CRITICAL,
                                        f"NVML counts {count_start} of the board's {board} GPUs "
                                        f"({start.get('board_why')})",
                                        observed=count_start, expected=board, reason=_LOST_REASON))
        else:
            views.append(f"NVML counts {count_start}, the board has {board}")
    elif isinstance(board, int):
        cannot.append(f"the board's {board} GPUs not compared: {start.get('board_why') or 'a partial view'}")
    else:
        cannot.append("the profile names no board size")
    readable = {g.pci_bus_id for g in recording.gpus if g.pci_bus_id}
    unreadable = {str(u.get("pci_bus_id")) for part in (start, end) for u in (part.get("unreadable") or [])
                  if isinstance(u, dict) and u.get("pci_bus_id")}
    pci_start, pci_end = start.get("pci"), end.get("pci")
    if not isinstance(pci_start, list):
        cannot.append(f"PCI not read ({start.get('pci_error') or 'no host view'})")
    elif not pci_start or not readable <= set(pci_start):
        # a container's or a simulated NVML's GPUs are not this PCI's: it is no evidence either way
        cannot.append(f"PCI lists {len(pci_start)} NVIDIA GPU(s), not the ones NVML reads: not compared")
    else:
        missing = sorted(set(pci_start) - readable - unreadable)
        if missing:
            out.append(GPU_LOST.finding("pci", Status.FAIL, Severity.CRITICAL,
                                        f"{len(missing)} NVIDIA GPU(s) on PCI that NVML does not list: "
                                        f"{', '.join(missing)}", observed=missing, expected="listed by NVML",
                                        reason=_LOST_REASON))
        gone = sorted(set(pci_start) - set(pci_end)) if isinstance(pci_end, list) else []
        if gone:
            out.append(GPU_LOST.finding("pci", Status.FAIL, Severity.CRITICAL,
                                        f"{len(gone)} NVIDIA GPU(s) left PCI during the run: {', '.join(gone)}",
                                        observed=gone, expected="on PCI at the end", reason=_LOST_REASON))
        views.append(f"PCI lists the same {len(pci_start)}" + ("" if isinstance(pci_end, list) else
                                                             ", PCI not read again at the end"))
    return views, cannot
