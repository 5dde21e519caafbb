"""Which host facts an imported snapshot actually holds (`meta.yaml` `host_parts`).

A snapshot made from a customer's files (`nodewarden snapshot import`) holds only the parts of
the host those files describe: an `lspci -vvv` gives PCI, a `dmidecode` gives DMI. The host
reader cannot tell "this file is absent on the node" from "nobody sent it", so the importer
records the parts it wrote and the engine marks every other part "not in this snapshot"
(`skip`), never absent (`fail`). Live reads and captures hold the whole host and record none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from agent.core.facts import CpuFacts, HostFacts
from agent.core.model import Unsupported
from agent.sources.host import CPU_DIR, THP_DIR

# part -> (fs path prefixes that provide it, HostFacts fields it fills)
HOST_PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pci": (("sys/bus/pci", "sys/devices/pci"), ("pci", "pcie_acs")),
    "dmi": (("sys/class/dmi/id", "sys/devices/virtual/dmi"), ("dmi",)),
    "cmdline": (("proc/cmdline",), ("cmdline",)),
    "modules": (("proc/modules",), ("modules",)),
    "driver": (("proc/driver/nvidia",), ("nvidia_driver",)),
    "uptime": (("proc/uptime",), ("uptime_s",)),
    "boot_id": (("proc/sys/kernel/random/boot_id",), ("boot_id",)),
    "sysctl": (("proc/sys/vm", "proc/sys/net", "proc/sys/kernel/numa_balancing"), ("sysctl",)),
    "thp": ((THP_DIR.lstrip("/"),), ("thp_enabled", "thp_defrag")),
    "net": (("sys/class/net",), ("interfaces",)),
    "rdma": (("sys/class/infiniband",), ("rdma",)),
    "numa": (("sys/devices/system/node",), ("numa_nodes",)),
    "secure_boot": (("sys/firmware/efi",), ("secure_boot",)),
    "iommu": (("sys/kernel/iommu_groups", "sys/class/iommu"), ("iommu",)),
    "identity": (("proc/sys/kernel/hostname", "proc/sys/kernel/osrelease"), ("hostname", "kernel_release")),
    "cpu": ((CPU_DIR.lstrip("/"),), ("cpu",)),
    # `lspci -nn` lists functions without their links; `-vvv` has LnkCap/LnkSta ("*/": a file name).
    "pci_links": (("*/current_link_speed",), ("pci_links",)),
    "swap": (("proc/swaps",), ("swap_total_kb",)),
    # Fabric Manager: whether it runs (its systemd cgroup) and its log, apart: a bug report holds the log only.
    "fabric_manager": (("sys/fs/cgroup",), ("fabric.manager",)),
    "fabric_log": (("var/log/fabricmanager.log",), ("fabric.log_errors",)),
}


def parts_of_path(path: str) -> list[str]:
    """The host parts one fs/ path (without the leading "/") provides (meta.yaml `evidence`: who gave each)."""
    return [part for part, (prefixes, _fields) in HOST_PARTS.items()
            if any(path.endswith(p[1:]) if p.startswith("*/") else path.startswith(p) for p in prefixes)]


def parts_of(paths: Iterable[str]) -> list[str]:
    """The host parts a set of fs/ paths (without the leading "/") provides."""
    found: set[str] = set()
    for path in paths:
        found.update(parts_of_path(path))
    return sorted(found)


def mask_missing_parts(host: HostFacts, parts: list[str]) -> HostFacts:
    """`host` with every field no recorded part provides set to Unsupported("not in this snapshot")."""
    reason = f"not in this snapshot (its inputs gave: {', '.join(parts) or 'no host files'})"
    gone = Unsupported(reason)
    changes: dict[str, Any] = {}
    fabric: dict[str, Any] = {}
    for part, (_prefixes, fields) in HOST_PARTS.items():
        if part in parts:
            continue
        for name in fields:
            if name == "sysctl":
                changes[name] = {key: gone for key in host.sysctl}
            elif name == "dmi":
                changes[name] = {}  # no DMI strings: matching and binding see none
            elif name == "cpu":
                changes[name] = CpuFacts(gone, gone, gone, gone, gone)
            elif name.startswith("fabric."):
                fabric[name.removeprefix("fabric.")] = gone
            else:
                changes[name] = gone
    if fabric:
        changes["fabric"] = host.fabric._replace(**fabric)
    return replace(host, **changes)
