"""gpu.count and gpu.lost: are all the GPUs there, in NVML and on PCI?"""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.matching import board_fit
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import nvml_gpus

COUNT = Check("gpu.count", "GPU count (NVML, profile, PCI)", source="nvml", action="contact_support",
              evidence=("NVML device count against the board's; a partial view (one GPU in a VM, a one-GPU dump) is "
                        "skip unless the evidence shows the whole board"))
LOST = Check("gpu.lost", "GPUs lost from the bus", source="nvml", action="drain",
             evidence="a GPU on PCI that NVML cannot open (fallen off the bus), or NVML's own GPU_IS_LOST")


@COUNT.evaluator
def evaluate_count(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "count")
    _gpus, early = nvml_gpus(COUNT, facts, expectation)
    if early or isinstance(facts.nvml, Unknown):
        return early
    nvml = facts.nvml
    findings: list[Finding] = []
    if expectation is not None:
        fit = board_fit(profile, facts)
        if fit.full and nvml.attached is not None:  # a dump of selected GPUs: its "Attached GPUs" is NVML's count
            findings.append(COUNT.compare("node", expectation, nvml.attached,
                                          f"GPUs attached (the dump's 'Attached GPUs'; {nvml.device_count} of them "
                                          "in this dump, the others not in this dump)"))
        elif fit.full:
            findings.append(COUNT.compare("node", expectation, nvml.device_count, "GPUs seen by NVML"))
        else:  # one GPU of an SXM part in a VM or a dump is not a board that lost seven
            findings.append(COUNT.finding("node", Status.SKIP, Severity.INFO,
                                          f"{nvml.device_count} GPU(s) seen by NVML, not judged by the board's "
                                          f"count: {fit.why}", observed=nvml.device_count,
                                          expected=expectation.expected, reason=expectation.reason))
    pci = facts.host.nvidia_gpus
    if not isinstance(pci, Unknown):
        nvml_buses = {g.pci_bus_id for g in nvml.gpus if isinstance(g.pci_bus_id, str)}
        missing = sorted(g.address for g in pci if g.address not in nvml_buses)
        nvml_only = sorted(nvml_buses - {g.address for g in pci})
        # A lost GPU has no bus id from NVML; gpu.lost reports it, so only the
        # GPUs that NVML does not list at all are counted here.
        lost = sum(1 for g in nvml.gpus if g.lost)
        # NVML lists a GPU the PCI tree lacks: the two views are not of the same GPUs. (No NVIDIA function on
        # PCI at all is a container's or VM's view, said by the GPU checks: judged as before.)
        if nvml_only and pci:
            findings.append(COUNT.finding(
                "pci", Status.UNKNOWN, Severity.WARNING,
                f"NVML and the PCI tree do not describe the same GPUs (inputs from two machines, or a partial "
                f"PCI view), so whether NVML sees every GPU cannot be told: only in NVML: {_list(nvml_only)}; "
                f"only on PCI: {_list(missing) or 'none'}", observed=nvml.device_count, expected=len(pci)))
        elif len(missing) > lost:
            findings.append(COUNT.finding(
                "pci", Status.FAIL, Severity.CRITICAL,
                f"{len(pci)} NVIDIA GPU(s) on PCI but NVML sees {nvml.device_count}; not in NVML: "
                f"{', '.join(missing)} (driver failed to initialise them?)",
                observed=nvml.device_count, expected=len(pci),
                reason="A GPU on PCI that NVML cannot see is unusable", action="reset_gpu"))
        else:
            findings.append(COUNT.finding("pci", Status.PASS, Severity.CRITICAL,
                                          f"NVML sees all {len(pci)} NVIDIA GPU(s) on PCI",
                                          observed=nvml.device_count, expected=len(pci)))
    return findings


@LOST.evaluator
def evaluate_lost(facts: NodeFacts, profile: Profile) -> list[Finding]:
    _gpus, early = nvml_gpus(LOST, facts, None)
    if early or isinstance(facts.nvml, Unknown):
        return early
    findings = []
    for gpu in facts.nvml.gpus:
        if gpu.lost:
            findings.append(LOST.finding(
                f"gpu{gpu.index}", Status.FAIL, Severity.CRITICAL,
                f"GPU {gpu.index} has fallen off the bus: {gpu.lost}",
                observed="lost", expected="present",
                reason="A lost GPU needs the node drained and rebooted (often a PCIe, power or board fault)"))
        else:
            findings.append(LOST.finding(f"gpu{gpu.index}", Status.PASS, Severity.CRITICAL,
                                         f"{gpu.label} answers", observed="present", expected="present"))
    if facts.nvml.incomplete:
        findings.append(LOST.finding("node", Status.UNKNOWN, Severity.CRITICAL, facts.nvml.incomplete))
    return findings


def _list(addresses: list[str], most: int = 8) -> str:
    return ", ".join(addresses[:most]) + (f" and {len(addresses) - most} more" if len(addresses) > most else "")
