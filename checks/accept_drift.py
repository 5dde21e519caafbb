"""accept.drift: an acceptance run against the node's stored acceptance baseline, GPU by GPU (UUID).

Compared under load, where idle readings hide it: thermal resistance (degC/W, above inlet or per W
without one), power at the same utilization, SM clock at the same power. A GPU whose UUID the
baseline lacks (replaced), one the baseline has but this run lacks, and a changed VBIOS or driver
are said (`skip` with the reason), never judged as drift: a new part or firmware is a new baseline.
"""

from __future__ import annotations

from agent.core.expect import Expectation
from agent.core.model import Finding, Severity, Status
from agent.core.series import AcceptanceRun, GpuTrack, Recording, Steady, bmc_median, steady
from agent.policy.profiles import Profile
from checks import Check
from checks.accept import per_watt

_PCT = {"$ref": "#/$defs/expectation_or_drop"}
DRIFT = Check("accept.drift", "Drift under load against the acceptance baseline", source="nvml",
              action="check_cooling", expect_path=("accept", "drift"),
              schema={"type": ["object", "null"], "additionalProperties": False,
                      "description": "How far (%) a GPU may drift from its acceptance baseline under load.",
                      "properties": {"thermal_resistance_pct": _PCT, "power_pct": _PCT, "sm_clock_pct": _PCT}},
              evidence=("steady degC/W, power at the same utilization and SM clock at the same power against the "
                        "stored acceptance baseline, GPUs matched by UUID; replaced GPUs and new firmware are said"),
              input="series")
SAME_UTIL_PCT, SAME_POWER_FRACTION = 5.0, 0.05  # "the same" operating point: utilization points, power fraction


@DRIFT.series_evaluator
def evaluate_drift(run: AcceptanceRun, profile: Profile) -> list[Finding]:
    return judge_drift(run.recording, run.baseline, profile)


def _stats(recording: Recording) -> tuple[dict[str, tuple[GpuTrack, Steady]], float | None]:
    window = recording.steady_window()
    if window is None:
        return {}, None
    inlet = bmc_median(recording.bmc.inlet_c, recording.bmc.t, window) if recording.bmc else None
    return {g.uuid: (g, steady(g, window)) for g in recording.gpus if g.lost is None}, inlet


def _change(now: float | None, then: float | None) -> float | None:
    if now is None or then is None or then <= 0:
        return None
    return round((now - then) / then * 100, 1)


def _drop(now: float | None, then: float | None) -> float | None:
    change = _change(now, then)
    return None if change is None else -change


def judge_drift(recording: Recording, baseline: Recording | None, profile: Profile) -> list[Finding]:
    exps = {key: profile.expectation("accept", "drift", key) for key in ("thermal_resistance_pct", "power_pct",
                                                                         "sm_clock_pct")}
    first = next((e for e in exps.values() if e is not None), None)
    if baseline is None or first is None:
        return []
    now, inlet_now = _stats(recording)
    then, inlet_then = _stats(baseline)
    if not now or not then:
        return [DRIFT.finding("node", Status.SKIP, first.severity, "drift: no steady window in this run or in the "
                              f"baseline {baseline.run_id}", reason=first.reason)]
    findings: list[Finding] = []
    if (inlet_now is None) != (inlet_then is None):
        findings.append(_said("node", first, "one of this run and the baseline has a BMC inlet reading and the "
                              "other not: degC/W compared as temperature per W"))
        inlet_now = inlet_then = None
    if recording.driver != baseline.driver:
        findings.append(_said("node", first, f"the driver changed since the baseline ({baseline.driver} -> "
                              f"{recording.driver}): said, not judged as drift"))
    for uuid, (gpu, stats) in now.items():
        old = then.get(uuid)
        if old is None:
            findings.append(_said(gpu.label, first, f"{gpu.label} ({uuid}) is not in the baseline "
                                  f"{baseline.run_id}: replaced since; re-baseline with --new-baseline"))
            continue
        base_gpu, base_stats = old
        if gpu.vbios != base_gpu.vbios:
            findings.append(_said(gpu.label, first, f"{gpu.label} VBIOS changed since the baseline "
                                  f"({base_gpu.vbios} -> {gpu.vbios}): said, not judged as drift"))
            continue
        findings += _gpu_drift(gpu, stats, base_stats, exps, inlet_now, inlet_then)
    for uuid, (base_gpu, _stats_then) in then.items():
        if uuid not in now:
            findings.append(_said("node", first, f"baseline GPU {uuid} (then {base_gpu.label}) is not in "
                                  "this run (replaced, or lost)"))
    return findings


def _said(subject: str, exp: Expectation, message: str) -> Finding:
    return DRIFT.finding(subject, Status.SKIP, Severity.INFO, message, reason=exp.reason)


def _gpu_drift(gpu: GpuTrack, now: Steady, then: Steady, exps: dict[str, Expectation | None],
               inlet_now: float | None, inlet_then: float | None) -> list[Finding]:
    out = []
    label = gpu.label
    exp = exps["thermal_resistance_pct"]
    if exp is not None:
        change = _change(per_watt(now, inlet_now), per_watt(then, inlet_then))
        out.append(_judge(exp, label, change, f"{label} degC/W against the baseline (%)"))
    exp = exps["power_pct"]
    if exp is not None:
        same = (now.util_pct is not None and then.util_pct is not None
                and abs(now.util_pct - then.util_pct) <= SAME_UTIL_PCT)
        change = _drop(now.power_w, then.power_w) if same else None  # less power at the same load: positive
        out.append(_judge(exp, label, change, f"{label} power drop at the same utilization (%)",
                          None if same else "utilization differs from the baseline's"))
    exp = exps["sm_clock_pct"]
    if exp is not None:
        same = (now.power_w is not None and then.power_w is not None and then.power_w > 0
                and abs(now.power_w - then.power_w) / then.power_w <= SAME_POWER_FRACTION)
        change = _drop(now.sm_mhz, then.sm_mhz) if same else None  # a lower clock at the same power: positive
        out.append(_judge(exp, label, change, f"{label} SM clock drop at the same power (%)",
                          None if same else "power differs from the baseline's"))
    return out


def _judge(exp: Expectation, subject: str, change: float | None, what: str, why: str | None = None) -> Finding:
    if change is None:
        return DRIFT.finding(subject, Status.SKIP, exp.severity, f"{what}: {why or 'no steady reading'}",
                             expected=exp.expected, reason=exp.reason)
    return DRIFT.compare(subject, exp, change, what)
