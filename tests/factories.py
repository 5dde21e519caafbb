"""Builders for hand-made facts and profiles, so check tests stay short."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.core.facts import (
    BmcFacts,
    CpuFacts,
    HostFacts,
    IdleState,
    NetInterface,
    NodeFacts,
    NvmlFacts,
    PciFunction,
    ProfileMatch,
)
from agent.core.model import Finding, SourceStatus, Unknown, Unsupported
from agent.io.yamlfile import LineMap
from agent.policy.profiles import Profile, ProfileFile, build
from agent.sources.fsroot import LiveFs


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


__all__ = ["IdleState", "NodeFacts", "ProfileMatch", "SourceStatus", "Unknown", "Unsupported", "exp", "gpu",
           "gpu_facts", "host", "iface", "nic", "node", "nvml_node", "profile"]


def gpu_facts(index: int = 0, **overrides: Any) -> Any:
    """A healthy idle H100 as NVML reports it; override what a test needs."""
    from agent.core.facts import GpuFacts

    bus = ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"][index % 8]
    values: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{index:08d}", "serial": f"16505230{index:05d}",
        "pci_bus_id": f"0000:{bus}:00.0", "pci_id": "10de:2330", "architecture": 9, "compute_capability": "9.0",
        "vbios": "96.00.74.00.01", "inforom_image": "G520.0200.00.05", "inforom_valid": "valid",
        "persistence_mode": "enabled", "compute_mode": "Default", "mig_mode": "disabled", "mig_pending": "disabled",
        "ecc_mode": "enabled", "ecc_pending": "enabled", "ecc_volatile_uncorrected": 0, "ecc_volatile_corrected": 0,
        "ecc_aggregate_uncorrected": 0, "ecc_aggregate_corrected": 0,
        "retired_sbe": Unsupported("not supported (NVML_FI_DEV_RETIRED_SBE)"),
        "retired_dbe": Unsupported("not supported (NVML_FI_DEV_RETIRED_DBE)"),
        "retired_pending": Unsupported("not supported (NVML_FI_DEV_RETIRED_PENDING)"),
        "remapped_correctable": 0, "remapped_uncorrectable": 0, "remap_pending": False, "remap_failure": False,
        "temperature_c": 34, "memory_temperature_c": 40, "shutdown_c": 92, "slowdown_c": 89, "gpu_max_c": 87,
        "memory_max_c": 95, "power_w": 71.2, "power_limit_w": 700.0, "default_limit_w": 700.0,
        "min_limit_w": 200.0, "max_limit_w": 700.0, "enforced_limit_w": 700.0, "clock_events": 0x1,
        "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16, "pcie_replays": 2,
        "nvlink_states": (1,) * 18, "nvlink_errors": {"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0},
        "fabric_state": "completed", "fabric_status": "success", "recovery_action": 0,
        "utilization_gpu_pct": 0, "utilization_memory_pct": 0, "sm_clock_mhz": 345, "memory_clock_mhz": 2619,
        "compute_processes": (),
    }
    values.update(overrides)
    return GpuFacts(index=index, **values)


def nvml_node(gpus: list[Any] | None = None, host_facts: HostFacts | None = None, **kw: Any) -> NodeFacts:
    """NodeFacts with NVML answering for `gpus` (8 healthy H100s by default)."""
    from agent.core.facts import NvmlFacts

    gpus = gpus if gpus is not None else [gpu_facts(i) for i in range(8)]
    nvml = NvmlFacts("550.90.07", "12.4", "12.550.90.07", len(gpus), tuple(gpus))
    sources = {"nvml": SourceStatus("nvml", ok=True), "kmsg": SourceStatus("kmsg", ok=True)}
    pci = tuple(gpu(g.pci_bus_id) for g in gpus if isinstance(g.pci_bus_id, str))
    h = host_facts or host(pci=pci, uptime_s=36000.0)
    return NodeFacts(host=h, kmsg=(), sources=sources, nvml=nvml, **kw)


def write_tree(base: Path, files: dict[str, str | bytes]) -> None:
    """Write {relative path: content}; a path ending in '/' makes an empty directory."""
    for rel, content in files.items():
        target = base / rel
        if rel.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


def hca(name: str, hca_type: str, fw: str, rate_gbps: int, link_layer: str = "InfiniBand", *,
        state: str = "ACTIVE", phys_state: str = "LinkUp", address: str | None = None,
        physfn: str | None = None) -> Any:
    """One single-port RDMA device as /sys/class/infiniband shows it (what `ibstat` prints, in sysfs terms:
    ibstat's "Rate: 400" is sysfs "400 Gb/sec (4X NDR)", "State: Active" is "ACTIVE")."""
    from agent.core.facts import RdmaDevice, RdmaPort

    speeds = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 800: "4X XDR", 40: "4X QDR"}
    port = RdmaPort(1, state=state, phys_state=phys_state, rate=f"{rate_gbps} Gb/sec ({speeds.get(rate_gbps, '4X')})",
                    link_layer=link_layer, counters={"link_downed": 0, "symbol_error": 0}, hw_counters={})
    extra = {"physfn": physfn} if physfn else {}
    return RdmaDevice(name, hca_type, "MT_0000000838", fw, address, (port,), **extra)


# --- Redfish trees edited for a test -------------------------------------------------------------------


def edit_resource(snap: Path, rel: str, **fields: Any) -> None:
    """Set `fields` on the resource `rel` (under the snapshot) as its index.json; created if absent.

    The file is replaced, never written in place: a snapshot may hard-link its files to fixtures/.
    """
    import json

    path = snap / rel / "index.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    doc.update(fields)
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")


def plant_firmware_inventory(snap: Path, images: dict[str, tuple[str, str]], processors: str,
                             name: str | None = None) -> None:
    """An UpdateService/FirmwareInventory of `images` (id -> (version, GPU id under `processors`)),
    each linked to its GPU by RelatedItem, as HGX baseboards publish them; `name`: every entry's
    Name (HGX BMCs say "Software Inventory"), else its id."""
    inventory = "redfish/v1/UpdateService/FirmwareInventory"
    edit_resource(snap, "redfish/v1/UpdateService", **{"@odata.id": "/redfish/v1/UpdateService",
                                                       "@odata.type": "#UpdateService.v1_11_0.UpdateService",
                                                       "FirmwareInventory": {"@odata.id": f"/{inventory}"}})
    edit_resource(snap, inventory, **{
        "@odata.id": f"/{inventory}", "@odata.type": "#SoftwareInventoryCollection.SoftwareInventoryCollection",
        "Members": [{"@odata.id": f"/{inventory}/{i}"} for i in images], "Members@odata.count": len(images)})
    for ident, (version, gpu) in images.items():
        edit_resource(snap, f"{inventory}/{ident}", **{
            "@odata.id": f"/{inventory}/{ident}", "Id": ident, "@odata.type": "#SoftwareInventory.v1_4_0.SoftwareInventory",
            "Name": name or ident, "Version": version, "RelatedItem": [{"@odata.id": f"/{processors}/{gpu}"}]})


# --- fake roots for the host parsers (tests/test_host_parsers*.py) --------------------------------------

Content = str | bytes


def make_root(tmp_path: Path, files: dict[str, Content], links: dict[str, str] | None = None) -> LiveFs:
    """A fake root: {relative path: content} ('/' at the end: empty dir) plus real symlinks."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    write_tree(root, files)
    for rel, dest in (links or {}).items():
        link = root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(dest, link)
    return LiveFs(str(root))


# --- BMC facts judged by the BMC checks (tests/test_bmc_evidence*.py) -----------------------------------

NOW = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.timezone.utc)


def node_of(bmc: BmcFacts | Unknown, status: SourceStatus | None = None, now: dt.datetime | None = NOW) -> NodeFacts:
    facts = nvml_node()
    facts.bmc = bmc
    facts.sources["redfish"] = status or SourceStatus("redfish", ok=True, detail={"requests": 1})
    facts.observed_at = now
    return facts


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def parse_resources(resources: dict[str, Any]) -> BmcFacts:
    from agent.sources.redfish import RecordedRedfish, Walk, parse_bmc

    walk = Walk(RecordedRedfish(Path("/nonexistent")))
    walk.resources = {"/redfish/v1": {"RedfishVersion": "1.15.0", "Vendor": "Test"}, **resources}
    return parse_bmc(walk)


# --- nvidia-smi dumps (fixtures/nvidia-smi, tests/test_import_nvidia_smi*.py) ---------------------------

NVIDIA_SMI_DUMPS = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


@functools.cache
def text_of(rel: str) -> str:
    return (NVIDIA_SMI_DUMPS / rel).read_text(encoding="utf-8")


def replay(document: dict[str, Any]) -> NvmlFacts:
    """Through a JSON round trip, exactly as the audit reads nvml.json."""
    from agent.sources.nvml import RecordedNvml, read_nvml

    facts, status = read_nvml(RecordedNvml(json.loads(json.dumps(document))), initialized=True)
    assert status.ok, status.error
    assert isinstance(facts, NvmlFacts)
    return facts
