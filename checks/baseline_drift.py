"""baseline.drift: idle readings now against the node's baseline (`nodewarden baseline record`).

Per GPU (matched by UUID, never by index) the rise of its idle temperature and
power, per BMC temperature sensor (by name) the rise of its reading. Idle
readings only compare on idle GPUs: a busy GPU gets a `skip` saying so, and
BMC sensors are judged only while no GPU is busy. A GPU whose UUID the
baseline does not hold was replaced since (`warn`: re-record). Without a
baseline the check says nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.core.expect import Expectation
from agent.core.facts import Baseline, BaselineGpu, GpuFacts, NodeFacts, NvmlFacts, gpu_activity
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, with_source
from checks._gpu import nvml_gpus, subject

DRIFT = Check("baseline.drift", "Idle readings against the node's baseline", source="crosscheck",
              action="check_cooling", reads=("bmc",), optional_reads=("nvml",),
              evidence=("idle GPU temperature/power and BMC sensor readings against `baseline record`, GPUs matched "
                        "by UUID; a busy GPU or no baseline is skip"), parts=("nvml", "redfish", "ipmi"))

# (subject suffix, what, unit, profile key, reading now, reading in the baseline)
GPU_METRICS: tuple[tuple[str, str, str, str, Callable[[GpuFacts], object],
                         Callable[[BaselineGpu], float | None]], ...] = (
    ("temperature", "idle temperature", "C", "gpu_idle_temperature_rise_c",
     lambda g: g.temperature_c, lambda b: b.temperature_c),
    ("power", "idle power", "W", "gpu_idle_power_rise_w", lambda g: g.power_w, lambda b: b.power_w),
)


@DRIFT.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    baseline = facts.baseline
    gpu_expectations = {key: profile.expectation("baseline", key) for *_, key, _now, _base in GPU_METRICS}
    bmc_expectation = profile.expectation("baseline", "bmc_temperature_rise_c")
    first = next((e for e in (*gpu_expectations.values(), bmc_expectation) if e is not None), None)
    if isinstance(baseline, Unsupported) or first is None:
        return []  # no baseline recorded, or the profile judges nothing
    if isinstance(baseline, Unknown):
        return [DRIFT.unknown("baseline", first, baseline.reason)]
    findings = _gpu_findings(facts, baseline, gpu_expectations, first)
    if bmc_expectation is not None:
        findings += _bmc_findings(facts, baseline, bmc_expectation)
    return findings


def _when(baseline: Baseline) -> str:
    return f"the baseline of {baseline.recorded_at[:10]}"


def _gpu_findings(facts: NodeFacts, baseline: Baseline, expectations: dict[str, Expectation | None],
                  first: Expectation) -> list[Finding]:
    if not any(expectations.values()) or not baseline.gpus:
        return []
    gpus, findings = nvml_gpus(DRIFT, facts, first)
    seen: set[str] = set()
    for gpu in gpus:
        if isinstance(gpu.uuid, Unknown):
            findings.append(_nvml(DRIFT.missing(subject(gpu), first, gpu.uuid,
                                                f"{gpu.label} cannot be matched with the baseline: UUID")))
            continue
        seen.add(gpu.uuid)
        recorded = baseline.gpu_by_uuid(gpu.uuid)
        if recorded is None:
            findings.append(_nvml(DRIFT.finding(
                subject(gpu), Status.WARN, Severity.WARNING,
                f"{gpu.label} (UUID {gpu.uuid}) is not in {_when(baseline)}: GPU replaced since the baseline "
                "(re-record with `nodewarden baseline record`)",
                observed=gpu.uuid, expected="a UUID in the baseline", reason=first.reason,
                action="record_baseline")))
            continue
        activity = gpu_activity(gpu)
        for suffix, what, unit, key, now_of, base_of in GPU_METRICS:
            expectation = expectations[key]
            if expectation is None:
                continue
            name = f"{subject(gpu)}:{suffix}"
            if isinstance(activity, Unknown):
                findings.append(_nvml(DRIFT.missing(name, expectation, activity,
                                                    f"{gpu.label} {what}: cannot tell whether the GPU is idle")))
            elif activity is not None:
                findings.append(_nvml(DRIFT.finding(
                    name, Status.SKIP, expectation.severity,
                    f"{gpu.label} {what}: not compared, the GPU is not idle ({activity})",
                    expected=expectation.expected, reason=expectation.reason)))
            else:
                findings.append(_nvml(_rise(name, expectation, now_of(gpu), base_of(recorded),
                                            f"{gpu.label} {what}", unit, baseline)))
    if isinstance(facts.nvml, NvmlFacts):
        findings += _missing_gpus(facts.nvml, baseline, seen, first)
    return findings


def _missing_gpus(nvml: NvmlFacts, baseline: Baseline, seen: set[str], expectation: Expectation) -> list[Finding]:
    """Baseline GPUs not seen now: lost ones say so; a replaced one is reported by its successor."""
    findings = []
    readable = {g.index for g in nvml.gpus if g.lost is None}
    lost = {g.index for g in nvml.gpus if g.lost is not None}
    for recorded in baseline.gpus:
        if recorded.uuid is None or recorded.uuid in seen or recorded.index in readable:
            continue
        why = "is lost now (gpu.lost reports it)" if recorded.index in lost else (
            "is not seen now (gpu.count reports missing GPUs)")
        findings.append(_nvml(DRIFT.finding(
            f"gpu{recorded.index}", Status.SKIP, expectation.severity,
            f"GPU {recorded.index} of {_when(baseline)} (UUID {recorded.uuid}) {why}: nothing to compare")))
    return findings


def _rise(name: str, expectation: Expectation, now: object, recorded: float | None, what: str, unit: str,
          baseline: Baseline) -> Finding:
    if recorded is None:
        return DRIFT.missing(name, expectation, Unsupported("not in the baseline"), what)
    if isinstance(now, Unknown):
        return DRIFT.missing(name, expectation, now, what)
    assert isinstance(now, (int, float))
    rise: float = round(float(now) - recorded, 1)
    if rise.is_integer():
        rise = int(rise)  # "rise (C) is 11", not 11.0
    return DRIFT.compare(name, expectation, rise,
                         f"{what} {float(now):g} {unit}, {recorded:g} {unit} in {_when(baseline)}: rise ({unit})")


def _nvml(finding: Finding) -> Finding:
    finding.source = "nvml"
    return finding


def _bmc_findings(facts: NodeFacts, baseline: Baseline, expectation: Expectation) -> list[Finding]:
    if not baseline.bmc_temperatures_c:
        return []
    bmc, findings = bmc_facts(DRIFT, facts, expectation, "temperatures")
    if bmc is None or isinstance(bmc.temperatures, Unknown):
        return findings
    now: dict[str, float] = {}
    for sensor in bmc.temperatures:
        if sensor.reading is not None and sensor.state != "Absent":
            now.setdefault(sensor.name, float(sensor.reading))
    busy = _busy_gpus(facts)
    for name, recorded in baseline.bmc_temperatures_c.items():
        what = f"BMC sensor {name}"
        if name not in now:
            finding = DRIFT.missing(name, expectation, Unsupported("not reported by the BMC now"), what)
        elif busy:
            finding = DRIFT.finding(name, Status.SKIP, expectation.severity,
                                    f"{what}: not compared, GPU(s) {', '.join(busy)} not idle",
                                    expected=expectation.expected, reason=expectation.reason)
        else:
            finding = _rise(name, expectation, now[name], recorded, what, "C", baseline)
        findings.append(with_source(finding, facts))
    return findings


def _busy_gpus(facts: NodeFacts) -> list[str]:
    """GPUs known to be busy now (BMC sensors then read load, not drift)."""
    if not isinstance(facts.nvml, NvmlFacts):
        return []
    return [str(g.index) for g in facts.nvml.gpus if g.lost is None and isinstance(gpu_activity(g), str)]
