"""host.numa.*: automatic NUMA balancing and GPU <-> RDMA NIC NUMA pairing."""

from __future__ import annotations

from agent.core.facts import NodeFacts, PciFunction
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check, expectation_schema

BALANCING = Check("host.numa.balancing", "Automatic NUMA balancing", source="host", remediation="sysctl",
                  expect_path=("numa", "balancing"), schema=expectation_schema("kernel.numa_balancing"),
                  evidence="the sysctl kernel.numa_balancing", parts=("sysctl",))
AFFINITY = Check("host.numa.affinity", "GPU and RDMA NIC NUMA pairing", source="host",
                 expect_path=("numa", "affinity"), schema=expectation_schema(
                     "Per GPU: 'local' (an RDMA NIC on its NUMA node), 'no-local-rdma-nic', or "
                     "'firmware-unknown' (numa_node -1 on a multi-node host)."),
                 evidence="each GPU's NUMA node (sysfs numa_node) against the RDMA NICs'", parts=("pci", "numa", "net"))


@BALANCING.evaluator
def evaluate_balancing(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = BALANCING.expectation(profile)
    if expectation is None:
        return []
    observed = facts.host.sysctl.get("kernel.numa_balancing", Unknown("kernel.numa_balancing was not read"))
    return [BALANCING.compare("node", expectation, observed, "kernel.numa_balancing")]


def gpu_numa_placement(gpu: PciFunction, numa_nodes: tuple[int, ...], rdma_nic_nodes: set[int | None]) -> str:
    """Classify one GPU: local | remote | single-node | no-rdma-nic | firmware-unknown."""
    if len(numa_nodes) <= 1:
        return "single-node"
    if gpu.numa_node is None:
        return "firmware-unknown"
    if not rdma_nic_nodes:
        return "no-rdma-nic"
    return "local" if gpu.numa_node in rdma_nic_nodes else "remote"


@AFFINITY.evaluator
def evaluate_affinity(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = AFFINITY.expectation(profile)
    if expectation is None:
        return []
    host = facts.host
    gpus = host.nvidia_gpus
    for value in (gpus, host.numa_nodes, host.interfaces, host.pci):
        if isinstance(value, Unknown):
            return [AFFINITY.missing("node", expectation, value, "NUMA pairing")]
    assert not isinstance(gpus, Unknown) and not isinstance(host.numa_nodes, Unknown)
    assert not isinstance(host.interfaces, Unknown) and not isinstance(host.pci, Unknown)
    by_address = {f.address: f for f in host.pci}
    rdma_nics = [by_address[i.pci_address] for i in host.interfaces
                 if i.rdma_device and i.pci_address in by_address]
    nic_nodes = {nic.numa_node for nic in rdma_nics}
    findings = []
    for index, gpu in enumerate(sorted(gpus, key=lambda g: g.address)):
        placement = gpu_numa_placement(gpu, host.numa_nodes, nic_nodes)
        where = f"GPU at {gpu.address} (NUMA node {gpu.numa_node if gpu.numa_node is not None else -1})"
        finding = AFFINITY.compare(f"gpu{index}", expectation, placement, f"{where} placement")
        if placement == "remote":
            nodes = sorted(n for n in nic_nodes if n is not None)
            finding.message += f"; RDMA NICs sit on NUMA node(s) {nodes}"
        elif placement == "firmware-unknown":
            finding.message += "; the firmware (ACPI SRAT/_PXM) reports no NUMA node for it"
        findings.append(finding)
    return findings
