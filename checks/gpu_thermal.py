"""GPU temperatures against the device's own thresholds, and node-level imbalance."""

from __future__ import annotations

import statistics

from agent.facts import NodeFacts
from agent.model import Finding, Status
from agent.profiles import Profile
from checks import Check
from checks._gpu import gpu_refs, nvml_gpus, per_gpu, subject

TEMPERATURE = Check("gpu.temperature", "GPU temperature margin", source="nvml", action="check_cooling")
MEMORY_TEMPERATURE = Check("gpu.memory_temperature", "HBM temperature margin", source="nvml",
                           action="check_cooling")
IMBALANCE = Check("gpu.thermal.imbalance", "GPU temperature vs the node's median", source="nvml",
                  action="check_cooling")


@TEMPERATURE.evaluator
def evaluate_temperature(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(TEMPERATURE, facts, profile.expectation("gpu", "temperature"),
                   lambda g: g.temperature_c, "temperature (C)")


@MEMORY_TEMPERATURE.evaluator
def evaluate_memory_temperature(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(MEMORY_TEMPERATURE, facts, profile.expectation("gpu", "memory_temperature"),
                   lambda g: g.memory_temperature_c, "memory temperature (C)")


@IMBALANCE.evaluator
def evaluate_imbalance(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "thermal_imbalance")
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(IMBALANCE, facts, expectation)
    temps = {g.index: g.temperature_c for g in gpus if isinstance(g.temperature_c, int)}
    if len(temps) < 2:
        return findings
    median = statistics.median(temps.values())
    for gpu in gpus:
        if gpu.index not in temps:
            continue
        delta = round(temps[gpu.index] - median, 1)
        finding = IMBALANCE.compare(subject(gpu), expectation, delta,
                                    f"{gpu.label} temperature above the node median ({median:g} C)",
                                    refs=gpu_refs(gpu))
        if finding.status is not Status.PASS:
            finding.message += "; GPUs sharing an airflow path running hot points at fans or blocked flow"
        findings.append(finding)
    return findings
