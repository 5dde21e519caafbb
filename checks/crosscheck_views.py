"""crosscheck.gpu_views: the GPUs' PCI ids as the PCI tree, NVML and a bound BMC report them.

Profiles match on the PCI tree's ids, on NVML's (pciDeviceId) when the tree lists no GPU (a container
or VM that sees the GPUs only through the driver), and on the BMC's GPU processors in a BMC-only
audit (agent.policy.matching.identify). Where the views disagree, the profile was chosen from one of them:
that is said here, never a silent fallback.
"""

from __future__ import annotations

from collections import Counter

from agent.core.facts import BmcFacts, NodeFacts, NvmlFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.matching import GPU_MODEL_PCI_IDS
from agent.policy.profiles import Profile
from checks import Check

VIEWS = Check("crosscheck.gpu_views", "GPU identity: PCI tree vs NVML vs BMC", source="crosscheck",
              action="contact_support", optional_reads=("bmc",), parts=("pci", "nvml", "redfish"),
              evidence=("the GPUs' PCI ids from the PCI tree, NVML (pciDeviceId) and a BMC bound to this host "
                        "(its GPU processors' names); which view the profile was matched on when they differ"))

_MAX_LISTED = 4


def _ids(counts: Counter[str]) -> str:
    items = [f"{n}x {pci_id}" for pci_id, n in sorted(counts.items())]
    return ", ".join(items[:_MAX_LISTED]) + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED
                                            else "") or "none"


@VIEWS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    nvml = facts.nvml if isinstance(facts.nvml, NvmlFacts) else None
    if nvml is None or not nvml.gpus or nvml.attached is not None:
        return []  # nothing to compare (a dump of selected GPUs is compared by gpu.count)
    by_nvml = Counter(g.pci_id.lower() for g in nvml.gpus if isinstance(g.pci_id, str))
    views = {"NVML": by_nvml}
    findings: list[Finding] = []
    on_pci = facts.host.nvidia_gpus
    if not isinstance(on_pci, Unknown) and facts.sources.get("host") is not None and facts.sources["host"].ok:
        by_pci = Counter(g.pci_id for g in on_pci)
        views["PCI"] = by_pci
        if not by_pci:
            findings.append(VIEWS.finding(
                "node", Status.WARN, Severity.INFO,
                f"the PCI tree lists no NVIDIA GPU while NVML sees {sum(by_nvml.values())} ({_ids(by_nvml)}): a "
                "container or VM without the GPUs' PCI functions; the profile was matched on NVML's PCI ids",
                observed={"pci": {}, "nvml": dict(by_nvml)}, expected="the same GPUs in every view",
                reason="Without the PCI tree, PCIe link, NUMA and topology checks cannot see the GPUs"))
        elif set(by_pci) != set(by_nvml):  # models, not counts: a count that differs is crosscheck.gpu_count's
            findings.append(VIEWS.finding(
                "node", Status.WARN, Severity.WARNING,
                f"the PCI tree lists {_ids(by_pci)} and NVML {_ids(by_nvml)}: the profile was matched on the PCI "
                "tree; the driver and the bus see different GPU models (a GPU swapped, or another VM's function)",
                observed={"pci": dict(by_pci), "nvml": dict(by_nvml)}, expected="the same GPUs in every view",
                reason="Views that name different GPU models judge the node by the wrong profile"))
    bmc = facts.bmc if isinstance(facts.bmc, BmcFacts) else None
    if bmc is not None and facts.binding is not None and facts.binding.state == "bound" and \
            not isinstance(bmc.gpus, Unknown) and bmc.gpus:
        named = [GPU_MODEL_PCI_IDS.get(g.model or "") or GPU_MODEL_PCI_IDS.get(g.name) for g in bmc.gpus]
        by_bmc = Counter(i for i in named if i is not None)
        if by_bmc and set(by_bmc) != set(by_nvml):
            findings.append(VIEWS.finding(
                "node", Status.WARN, Severity.WARNING,
                f"the BMC names GPUs of {_ids(by_bmc)} and NVML {_ids(by_nvml)}: the profile was matched on this "
                "host's view; the BMC's inventory is stale or describes other GPUs",
                observed={"bmc": dict(by_bmc), "nvml": dict(by_nvml)}, expected="the same GPU models in every view",
                reason="A BMC whose GPU inventory differs from the host's drives fans and power for other parts"))
    if findings:
        return findings
    names = " and ".join(views)
    return [VIEWS.finding("node", Status.PASS, Severity.INFO, f"{names} agree on the GPUs ({_ids(by_nvml)})",
                          observed={k.lower(): dict(v) for k, v in views.items()},
                          expected="the same GPUs in every view")]
