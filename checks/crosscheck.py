"""crosscheck.*: where the BMC and the GPUs (NVML, PCI) disagree, say so."""

from __future__ import annotations

from agent.facts import BmcFacts, NodeFacts, NvmlFacts
from agent.model import Finding, Severity, Status, Unknown
from agent.profiles import Profile
from checks import Check

COUNT = Check("crosscheck.gpu_count", "GPU count: BMC vs NVML vs PCI", source="crosscheck", action="contact_support")
TEMPERATURE = Check("crosscheck.gpu_temperature", "GPU temperature: BMC vs NVML", source="crosscheck",
                    action="check_bmc_sensors")
HEALTH = Check("crosscheck.gpu_health", "GPU health: BMC vs NVML", source="crosscheck", action="reset_gpu")


def _views(facts: NodeFacts) -> tuple[BmcFacts | None, NvmlFacts | None]:
    bmc = facts.bmc if isinstance(facts.bmc, BmcFacts) else None
    nvml = facts.nvml if isinstance(facts.nvml, NvmlFacts) else None
    return bmc, nvml


@COUNT.evaluator
def evaluate_count(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("crosscheck", "gpu_count")
    bmc, nvml = _views(facts)
    if expectation is None or bmc is None or isinstance(bmc.gpus, Unknown):
        return []
    counts = {"bmc": len(bmc.gpus)}
    if nvml is not None:
        counts["nvml"] = nvml.device_count
    pci = facts.host.nvidia_gpus
    if not isinstance(pci, Unknown):
        counts["pci"] = len(pci)
    if len(counts) < 2:
        return []
    agree = len(set(counts.values())) == 1
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    return [COUNT.finding("node", Status.PASS if agree else expectation.status_on_mismatch(), expectation.severity,
                          f"GPUs seen: {text}" + ("" if agree else " (the views disagree)"),
                          observed=counts, expected="the same count in every view", reason=expectation.reason)]


def _bmc_gpu_temperatures(bmc: BmcFacts) -> list[float] | None:
    if isinstance(bmc.temperatures, Unknown):
        return None
    sensors = sorted((t for t in bmc.temperatures if (t.context or "").upper() == "GPU" and t.reading is not None
                      and t.state != "Absent"), key=lambda t: _natural(t.name))
    return [float(t.reading) for t in sensors if t.reading is not None]


def _natural(name: str) -> tuple[int, str]:
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else 0, name)


@TEMPERATURE.evaluator
def evaluate_temperature(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("crosscheck", "gpu_temperature")
    bmc, nvml = _views(facts)
    if expectation is None or bmc is None or nvml is None:
        return []
    bmc_temps = _bmc_gpu_temperatures(bmc)
    if not bmc_temps:
        return []
    if len(bmc_temps) != nvml.device_count:
        return [TEMPERATURE.finding("node", Status.SKIP, Severity.INFO,
                                    f"the BMC reports {len(bmc_temps)} GPU temperature(s), NVML {nvml.device_count}:"
                                    " cannot pair them")]
    findings = []
    for gpu, bmc_temp in zip(nvml.gpus, bmc_temps, strict=True):
        if not isinstance(gpu.temperature_c, int):
            continue
        difference = round(abs(gpu.temperature_c - bmc_temp), 1)
        findings.append(TEMPERATURE.compare(
            f"gpu{gpu.index}", expectation, difference,
            f"GPU {gpu.index}: NVML {gpu.temperature_c} C vs BMC {bmc_temp:g} C, difference (C)"))
    return findings


@HEALTH.evaluator
def evaluate_health(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("crosscheck", "gpu_health")
    bmc, nvml = _views(facts)
    if expectation is None or bmc is None or nvml is None or isinstance(bmc.gpus, Unknown):
        return []
    if len(bmc.gpus) != nvml.device_count:
        return []  # crosscheck.gpu_count reports the mismatch
    findings = []
    ordered = sorted(bmc.gpus, key=lambda g: _natural(g.name))
    for gpu, seen in zip(nvml.gpus, ordered, strict=True):
        nvml_ok = gpu.lost is None
        bmc_ok = (seen.health or "OK") == "OK" and seen.state not in ("UnavailableOffline", "Absent")
        observed = {"nvml": "ok" if nvml_ok else "lost", "bmc": f"{seen.health or '?'}/{seen.state or '?'}"}
        if nvml_ok == bmc_ok:
            status, message = Status.PASS, f"GPU {gpu.index}: NVML and BMC agree ({'healthy' if nvml_ok else 'failed'})"
        else:
            status = expectation.status_on_mismatch()
            worse = "the BMC" if nvml_ok else "NVML"
            message = (f"GPU {gpu.index}: {worse} reports a fault the other view does not see "
                       f"(NVML {observed['nvml']}, BMC {observed['bmc']} for {seen.name})")
        findings.append(HEALTH.finding(f"gpu{gpu.index}", status, expectation.severity, message, observed=observed,
                                       expected="both views agree", reason=expectation.reason))
    return findings
