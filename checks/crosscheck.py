"""crosscheck.*: where the BMC and the GPUs (NVML, PCI) disagree, say so.

Only a BMC bound to this host is compared with it (crosscheck.identity: Redfish UUID or serial
equal to DMI's). A BMC of another node, or one whose identity cannot be told, is never compared:
its GPUs are not this host's, and a mismatch would be a fault that exists nowhere.
"""

from __future__ import annotations

from agent.core.facts import BmcBinding, BmcFacts, NodeFacts, NvmlFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import pci_without_gpus

COUNT = Check("crosscheck.gpu_count", "GPU count: BMC vs NVML vs PCI", source="crosscheck", action="contact_support",
              evidence=("GPU counts from a BMC bound to this host vs NVML vs PCI; a remote or unbound BMC is never "
                        "compared"), parts=("nvml", "pci", "redfish"))
TEMPERATURE = Check("crosscheck.gpu_temperature", "GPU temperature: BMC vs NVML", source="crosscheck",
                    action="check_bmc_sensors",
                    evidence=("the bound BMC's GPU temperature vs NVML's for the same GPU, beyond the profile's "
                              "tolerance"), parts=("nvml", "redfish", "ipmi.sensors"))
HEALTH = Check("crosscheck.gpu_health", "GPU health: BMC vs NVML", source="crosscheck", action="reset_gpu",
               evidence="a GPU the bound BMC reports Warning/Critical while NVML sees it healthy (or the reverse)",
               parts=("nvml", "redfish"))
IDENTITY = Check("crosscheck.identity", "BMC bound to this host (Redfish UUID/serial vs DMI)", source="crosscheck",
                 action="check_bmc_address", reads=("bmc",),
                 evidence=("Redfish ComputerSystem UUID/serial vs DMI product_uuid/serial; no host identity means the"
                           " BMC is not compared"), parts=("dmi", "redfish", "ipmi.fru"))


def _configured_bmc(facts: NodeFacts) -> bool:
    return any(facts.sources[s].configured for s in ("redfish", "ipmi") if s in facts.sources)


@IDENTITY.evaluator
def evaluate_identity(facts: NodeFacts, profile: Profile) -> list[Finding]:
    binding = facts.binding
    if binding is None or binding.state == "no_bmc" or not _configured_bmc(facts):
        return []
    observed = binding.observed
    if binding.state == "bound":
        return [IDENTITY.finding("bmc", Status.PASS, Severity.INFO, binding.message, observed=observed,
                                 expected="the BMC of this host")]
    if binding.state == "bmc_only":
        return [IDENTITY.finding("bmc", Status.SKIP, Severity.INFO, binding.message + "; host and GPU checks and "
                                 "cross-checks are not in this audit", observed=observed)]
    if binding.state == "remote":
        return [IDENTITY.finding(
            "bmc", Status.WARN, Severity.WARNING, binding.message + ": the BMC findings are that node's, and no "
            "cross-check compares it with this host's PCI and NVML view", observed=observed,
            expected="the BMC of this host", reason="A BMC address in the config that belongs to another node reports "
            "that node's faults as this one's; from a jump host this is expected")]
    hint = " (run as root, which can read /sys/class/dmi/id/product_uuid, to bind the BMC)" if (
        "needs root" in binding.message) else ""
    return [IDENTITY.finding("bmc", Status.SKIP, Severity.INFO, f"{binding.message}; cross-checks not run{hint}",
                             observed=observed, expected="the BMC of this host")]


def _unbound(check: Check, binding: BmcBinding | None) -> list[Finding] | None:
    """A skip for a cross-check against a BMC that is not this host's; None when it may run."""
    if binding is None or binding.describes_node or binding.state == "no_bmc":
        return None
    if binding.state == "bmc_only":
        return []
    why = "describes another node" if binding.state == "remote" else "cannot be bound to this host"
    return [check.finding("node", Status.SKIP, Severity.INFO,
                          f"not compared: the BMC {why} (crosscheck.identity says why)")]


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
    unbound = _unbound(COUNT, facts.binding)
    if unbound is not None:
        return unbound
    counts = {"bmc": len(bmc.gpus)}
    if nvml is not None:
        counts["nvml"] = nvml.device_count
    pci = facts.host.nvidia_gpus
    if not isinstance(pci, Unknown) and pci_without_gpus(facts) is None:  # a container's PCI tree is no view
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
    unbound = _unbound(TEMPERATURE, facts.binding)
    if unbound is not None:
        return unbound
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
    unbound = _unbound(HEALTH, facts.binding)
    if unbound is not None:
        return unbound
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
