"""GPU temperatures against the device's own thresholds, and imbalance among GPUs under the same load.

A busy GPU runs hotter than idle ones; that is load, not cooling. The imbalance check therefore
compares each GPU only with the GPUs in the same load state: power draws within
`same_load_power_pct` of their power limits and utilizations within `same_load_utilization_pct`
points of each other (every pair of a group, so a group cannot chain from idle to busy).
"""

from __future__ import annotations

from typing import NamedTuple

from agent.core.facts import GpuFacts, NodeFacts
from agent.core.model import Finding, Status
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import gpu_refs, nvml_gpus, per_gpu, subject

TEMPERATURE = Check("gpu.temperature", "GPU temperature margin", source="nvml", action="check_cooling",
                    evidence="NVML core temperature against the device's own slowdown/shutdown thresholds")
MEMORY_TEMPERATURE = Check("gpu.memory_temperature", "HBM temperature margin", source="nvml",
                           action="check_cooling",
                           evidence=("NVML memory temperature against the device's own memory thresholds; not "
                                     "reported is skip"))
IMBALANCE = Check("gpu.thermal.imbalance", "GPU temperature vs GPUs under the same load", source="nvml",
                  action="check_cooling",
                  evidence=("core temperatures compared only among GPUs in the same load state (power and utilization"
                            " close)"))
SAME_LOAD_POWER_PCT = 10.0  # of the power limit: 70 W on a 700 W H100
SAME_LOAD_UTILIZATION_PCT = 20.0


@TEMPERATURE.evaluator
def evaluate_temperature(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(TEMPERATURE, facts, profile.expectation("gpu", "temperature"),
                   lambda g: g.temperature_c, "temperature (C)")


@MEMORY_TEMPERATURE.evaluator
def evaluate_memory_temperature(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(MEMORY_TEMPERATURE, facts, profile.expectation("gpu", "memory_temperature"),
                   lambda g: g.memory_temperature_c, "memory temperature (C)")


def _median(values: list[int]) -> float:
    """`statistics.median` (the middle value, or the mean of the two middle ones), without importing
    `statistics`: its import (random, fractions, decimal) costs ~4 ms, more than all of this check."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


@IMBALANCE.evaluator
def evaluate_imbalance(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "thermal_imbalance")
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(IMBALANCE, facts, expectation)
    hot = [g for g in gpus if isinstance(g.temperature_c, int)]
    if len(hot) < 2:
        return findings
    power_tol = float(expectation.option("same_load_power_pct", SAME_LOAD_POWER_PCT))
    util_tol = float(expectation.option("same_load_utilization_pct", SAME_LOAD_UTILIZATION_PCT))
    by_index: dict[int, Finding] = {}
    for group in load_groups(hot, power_tol, util_tol):
        gpu, load = group[0]
        if len(group) == 1:
            status, what = ((Status.UNKNOWN, "its power draw and utilization cannot be read, so no GPU is known to "
                             "share its load") if load == Load(None, None) else
                            (Status.SKIP, f"no other GPU is under the same load ({load.describe()})"))
            by_index[gpu.index] = IMBALANCE.finding(
                subject(gpu), status, expectation.severity, f"{gpu.label} temperature not compared: {what}",
                observed=gpu.temperature_c, expected=expectation.expected, reason=expectation.reason)
            continue
        median = _median([int(g.temperature_c) for g, _ in group])  # type: ignore[arg-type]
        loads = describe_loads([load for _, load in group])
        for gpu, _ in group:
            delta = round(int(gpu.temperature_c) - median, 1)  # type: ignore[arg-type]
            finding = IMBALANCE.compare(
                subject(gpu), expectation, delta,
                f"{gpu.label} temperature above the median ({median:g} C) of the {len(group)} GPUs under the same "
                f"load ({loads})", refs=gpu_refs(gpu))
            if finding.status is not Status.PASS:
                finding.message += "; GPUs sharing an airflow path running hot points at fans or blocked flow"
            by_index[gpu.index] = finding
    return findings + [by_index[g.index] for g in hot]


class Load(NamedTuple):
    """A GPU's load state: power draw as % of its power limit, and utilization (None: not readable)."""

    power_pct: float | None
    utilization: int | None

    def describe(self) -> str:
        parts = ([f"{self.power_pct:.0f} % of its power limit"] if self.power_pct is not None else []) + (
            [f"{self.utilization} % utilization"] if self.utilization is not None else [])
        return ", ".join(parts) or "load unknown"


def load_of(gpu: GpuFacts) -> Load:
    limits = (gpu.enforced_limit_w, gpu.power_limit_w, gpu.default_limit_w, gpu.max_limit_w)
    limit = next((float(v) for v in limits if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0),
                 None)
    draw = gpu.power_w
    power = (round(100.0 * float(draw) / limit, 1) if limit and isinstance(draw, (int, float))
             and not isinstance(draw, bool) else None)
    util = gpu.utilization_gpu_pct
    return Load(power, util if isinstance(util, int) and not isinstance(util, bool) else None)


def same_load(a: Load, b: Load, power_tol: float, util_tol: float) -> bool:
    """Both known readings within tolerance, and at least one reading known for both."""
    compared = False
    for mine, theirs, tolerance in ((a.power_pct, b.power_pct, power_tol), (a.utilization, b.utilization, util_tol)):
        if mine is None or theirs is None:
            continue
        if abs(mine - theirs) > tolerance:
            return False
        compared = True
    return compared


def load_groups(gpus: list[GpuFacts], power_tol: float, util_tol: float) -> list[list[tuple[GpuFacts, Load]]]:
    """GPUs in the same load state, lightest first: a GPU joins the first group it matches every member of."""
    loaded = sorted(((g, load_of(g)) for g in gpus), key=lambda item: (
        -1.0 if item[1].power_pct is None else item[1].power_pct, -1 if item[1].utilization is None
        else item[1].utilization, item[0].index))
    groups: list[list[tuple[GpuFacts, Load]]] = []
    for gpu, load in loaded:
        for group in groups:
            if all(same_load(load, other, power_tol, util_tol) for _, other in group):
                group.append((gpu, load))
                break
        else:
            groups.append([(gpu, load)])
    return groups


def describe_loads(loads: list[Load]) -> str:
    def span(values: list[float]) -> str:
        low, high = f"{min(values):.0f}", f"{max(values):.0f}"
        return low if low == high else f"{low}-{high}"

    power = [x.power_pct for x in loads if x.power_pct is not None]
    util = [float(x.utilization) for x in loads if x.utilization is not None]
    parts = ([f"{span(power)} % of their power limits"] if power else []) + (
        [f"{span(util)} % utilization"] if util else [])
    return ", ".join(parts)
