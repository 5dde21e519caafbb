"""host.gpu.pci_count: GPUs enumerated on PCI, which does not depend on NVML.

A GPU that fell off the bus, or one the driver failed to claim, still shows
(or visibly stops showing) here; comparing with NVML is the GPU issue's job.
"""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.matching import board_fit
from agent.policy.profiles import Profile
from checks import Check, expectation_schema
from checks._gpu import pci_without_gpus

PCI_COUNT = Check("host.gpu.pci_count", "GPUs on PCI", source="host", action="contact_support",
                  expect_path=("gpu_pci", "count"),
                  schema=expectation_schema("NVIDIA display/3D functions on PCI, independent of the driver."),
                  evidence="NVIDIA display/3D functions in /sys/bus/pci, independent of NVML", parts=("pci",))


@PCI_COUNT.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = PCI_COUNT.expectation(profile)
    if expectation is None:
        return []
    gpus = facts.host.nvidia_gpus
    if isinstance(gpus, Unknown):
        return [PCI_COUNT.missing("node", expectation, gpus, "NVIDIA GPUs on PCI")]
    blind = pci_without_gpus(facts)
    if blind is not None:
        return [PCI_COUNT.finding("node", Status.SKIP, Severity.INFO, f"NVIDIA GPUs on PCI not judged: {blind}",
                                  observed=0, expected=expectation.expected, reason=expectation.reason)]
    fit = board_fit(profile, facts)
    if not fit.full:
        return [PCI_COUNT.finding("node", Status.SKIP, Severity.INFO,
                                  f"{len(gpus)} NVIDIA GPU(s) on PCI, not judged by the board's count: {fit.why}",
                                  observed=len(gpus), expected=expectation.expected, reason=expectation.reason)]
    finding = PCI_COUNT.compare("node", expectation, len(gpus), "NVIDIA GPUs on PCI")
    if gpus:
        finding.message += " (" + ", ".join(g.address for g in sorted(gpus, key=lambda g: g.address)) + ")"
    return [finding]
