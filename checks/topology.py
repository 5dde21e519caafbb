"""topology.gpu_nic: each GPU's nearest RDMA rail NIC, in `nvidia-smi topo -m` terms.

PIX: one PCIe switch between them; PXB: several bridges, no host bridge; PHB:
through a root port; NODE: across host bridges of one NUMA node; SYS: across
the socket interconnect. Rail-optimised fabrics put one NIC beside each GPU
on its own switch, so GPUDirect RDMA never leaves the switch.

A virtual machine sees the PCIe tree its hypervisor builds: QEMU puts each passed-through device
behind its own emulated root port, Hyper-V gives each its own PCI domain. There a GPU and its
rail look PHB/NODE/SYS apart whatever the physical server wires, so a distance that would not
pass is `skip` with that reason (a VM that exposes the switches is judged as a server).
"""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Status, Unknown
from agent.policy.profiles import Profile
from agent.sources.pcie import LEVELS, path_between
from checks import Check
from checks._rails import virtual_machine
from checks.ib import rails_of

GPU_NIC = Check("topology.gpu_nic", "GPU to RDMA NIC PCIe distance", source="host", action="check_cabling",
                evidence=("the PCIe path from each GPU to its rail NIC (same switch, same root, or across the CPU); a"
                          " VM's flattened topology is skip"), parts=("pci", "dmi"))


@GPU_NIC.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("topology", "gpu_nic")
    if expectation is None:
        return []
    host = facts.host
    gpus = host.nvidia_gpus
    rails = rails_of(facts, profile)
    for value in (host.pci, gpus, rails):
        if isinstance(value, Unknown):
            return [GPU_NIC.missing("node", expectation, value, "GPU <-> NIC topology")]
    assert not isinstance(host.pci, Unknown) and not isinstance(gpus, Unknown) and not isinstance(rails, Unknown)
    by_address = {f.address: f for f in host.pci}
    nics = [(d.name, d.pci_address) for d in rails if d.pci_address in by_address]
    vm = virtual_machine(host, rails)
    findings = []
    for index, gpu in enumerate(sorted(gpus, key=lambda g: g.address)):
        subject = f"gpu{index}"
        numa = gpu.numa_node if gpu.numa_node is not None else -1
        if not nics:
            findings.append(GPU_NIC.compare(subject, expectation, "none",
                                            f"nearest RDMA NIC of GPU {gpu.address} (NUMA node {numa})"))
            continue
        ranked = sorted(((LEVELS.index(path_between(gpu.address, addr, by_address)[0]), name, addr)
                         for name, addr in nics if addr is not None))
        rank, name, address = ranked[0]
        level = LEVELS[rank]
        finding = GPU_NIC.compare(subject, expectation, level,
                                  f"nearest RDMA NIC of GPU {gpu.address} (NUMA node {numa}): {name} ({address})")
        nic_numa = by_address[address].numa_node if address else None
        finding.message += f", NIC on NUMA node {nic_numa if nic_numa is not None else -1}"
        if vm is not None and finding.status is not Status.PASS and level not in ("PIX", "PXB"):
            finding = GPU_NIC.finding(
                subject, Status.SKIP, expectation.severity,
                f"{finding.message}: not judged in a virtual machine ({vm}), whose hypervisor flattens the PCIe "
                "topology; the physical GPU-NIC distance is the provider's (ask for the instance's topology)",
                observed=level, expected=expectation.expected, reason=expectation.reason)
        findings.append(finding)
    return findings
