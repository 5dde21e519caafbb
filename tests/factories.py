"""Builders for hand-made facts and profiles, so check tests stay short."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.facts import CpuFacts, HostFacts, IdleState, NetInterface, NodeFacts, PciFunction, ProfileMatch
from agent.model import SourceStatus, Unknown
from agent.profiles import Profile, ProfileFile, build
from agent.yamlfile import LineMap


def gpu(address: str, numa: int | None = 0, device: int = 0x2330) -> PciFunction:
    return PciFunction(address=address, vendor=0x10DE, device=device, class_code=0x030200, numa_node=numa,
                       driver="nvidia")


def nic(address: str, numa: int | None = 0) -> PciFunction:
    return PciFunction(address=address, vendor=0x15B3, device=0x1021, class_code=0x020000, numa_node=numa,
                       driver="mlx5_core")


def iface(name: str, **kw: Any) -> NetInterface:
    defaults: dict[str, Any] = {"mtu": 9000, "operstate": "up", "arp_type": 1}
    defaults.update(kw)
    return NetInterface(name=name, **defaults)


def host(**overrides: Any) -> HostFacts:
    base = HostFacts(
        hostname="node1",
        kernel_release="5.15.0-119-generic",
        sysctl={"kernel.numa_balancing": "0", "vm.zone_reclaim_mode": "0", "net.core.rmem_max": "268435456"},
        thp_enabled="madvise",
        thp_defrag="madvise",
        numa_nodes=(0, 1),
        cmdline="BOOT_IMAGE=/vmlinuz ro iommu=pt quiet",
        dmi={"sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680"},
        secure_boot="disabled",
        nvidia_driver="550.90.07",
        pci=(gpu("0000:19:00.0", 0), gpu("0000:9b:00.0", 1), nic("0000:1a:00.0", 0), nic("0000:9c:00.0", 1)),
        modules={"nvidia": "Live", "nvidia_uvm": "Live", "nvidia_peermem": "Live"},
        interfaces=(
            iface("enp26s0np0", driver="mlx5_core", pci_address="0000:1a:00.0", rdma_device="mlx5_0",
                  link_layer="Ethernet"),
            iface("enp156s0np0", driver="mlx5_core", pci_address="0000:9c:00.0", rdma_device="mlx5_1",
                  link_layer="Ethernet"),
            iface("lo", mtu=65536, operstate="unknown", arp_type=772),
        ),
        cpu=CpuFacts(online=(0, 1, 2, 3), governors={"performance": (0, 1, 2, 3)}, scaling_driver="intel_pstate",
                     idle_driver="intel_idle",
                     idle_states=(IdleState(0, "POLL", 0, 0, 4), IdleState(1, "C1", 1, 0, 4),
                                  IdleState(2, "C6", 290, 4, 4))),
    )
    return replace(base, **overrides)


def node(h: HostFacts | None = None, **kw: Any) -> NodeFacts:
    return NodeFacts(host=h or host(), kmsg=(), **kw)


def profile(expect: dict[str, Any], name: str = "t") -> Profile:
    data = {"name": name, "description": "test profile", "expect": expect}
    return build([ProfileFile(name, Path(f"{name}.yaml"), data, LineMap())])


def exp(severity: str = "warning", **comparators: Any) -> dict[str, Any]:
    return {**comparators, "severity": severity, "reason": "test reason"}


__all__ = ["IdleState", "NodeFacts", "ProfileMatch", "SourceStatus", "Unknown", "exp", "gpu", "host", "iface",
           "nic", "node", "profile"]
