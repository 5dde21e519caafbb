"""Issue 13 rule 10: RDMA rails are a family of parts (ConnectX-6/7/8, their SR-IOV virtual functions,
BlueField's integrated ports), a cloud VM is judged by rail count, state and rate, and a VM's flattened
PCIe tree makes `topology.gpu_nic` a skip with the reason, not a fail.

`ibstat` text has no importer yet, so the facts are built (tests/factories.hca) from what the cited files
in the project's reference data show: names, CA type, firmware, state, rate, link layer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import PciFunction, RdmaDevice
from agent.core.model import Status, Unknown
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.fsroot import LiveFs
from agent.sources.rdma import read_rdma_devices
from checks._rails import hca_kind, virtual_machine
from checks.ib import FIRMWARE, HCA_COUNT, PORT_RATE, PORT_STATE
from checks.topology import GPU_NIC
from tests.factories import exp, hca, host, node, profile, write_tree


@pytest.fixture(scope="module")
def store() -> ProfileStore:
    return ProfileStore()


def shipped(store: ProfileStore, name: str) -> Profile:
    return store.profile(name)


def by_subject(findings: list[Any]) -> dict[str, Any]:
    return {f.subject: f for f in findings}


# shared/data/linux/gpud-ib/ibstat.47.0.a100.all.active.0.txt: a cloud A100 VM. Every CA is MT4126
# ("ConnectX Family mlx5Gen Virtual Function", 15b3:101e): mlx5_0 on firmware 22.35.2302 (a ConnectX-6 Dx
# VF, 200 Gb/s Ethernet frontend), mlx5_1..8 on 28.37.1014 (ConnectX-7 VFs, InfiniBand 200, Active/LinkUp).
A100_VM = (hca("mlx5_0", "MT4126", "22.35.2302", 200, "Ethernet"),
           *(hca(f"mlx5_{i}", "MT4126", "28.37.1014", 200) for i in range(1, 9)))


def test_cloud_vm_virtual_functions_are_judged_by_count_state_and_rate(store: ProfileStore) -> None:
    """Fails on the old code: rails were `hca_type in [MT4123]`, so the VM had 0 of 8 rails."""
    a100 = shipped(store, "dgx-a100")
    facts = node(host(rdma=A100_VM))
    (count,) = HCA_COUNT.run(facts, a100)
    assert count.status is Status.PASS and count.observed == 8, count.message
    assert "8 of them SR-IOV virtual functions" in count.message
    states = by_subject(PORT_STATE.run(facts, a100))
    assert set(states) == {f"mlx5_{i}/1" for i in range(1, 9)}  # the Ethernet frontend VF is not a rail
    assert {f.status for f in states.values()} == {Status.PASS}
    assert "MT4126 ConnectX-7 VF" in states["mlx5_1/1"].message
    assert {f.status for f in PORT_RATE.run(facts, a100)} == {Status.PASS}  # HDR 200 meets the A100 rail rate
    firmware = by_subject(FIRMWARE.run(facts, a100))
    # The A100 profile's minimum (20.39, ConnectX-6) is not a bound for ConnectX-7 firmware (28.x) ...
    assert firmware["mlx5_1"].status is Status.SKIP and "ConnectX-6 firmware (20.x)" in firmware["mlx5_1"].message
    # ... and one shared VF id over two silicons is not "two firmware versions of one HCA type".
    assert not any(f.status is Status.FAIL for f in firmware.values()), [f.message for f in firmware.values()]


def test_the_same_vm_on_an_h100_profile_fails_its_rate() -> None:
    """Judged by rate like a server: HDR 200 VFs on a 400 Gb/s rail profile fail ib.port.rate.
    Fails on the old code (MT4129 only: no rails, so no rate finding at all)."""
    h100 = ProfileStore().profile("hgx-h100-sxm")
    rates = PORT_RATE.run(node(host(rdma=A100_VM)), h100)
    assert len(rates) == 8 and {f.status for f in rates} == {Status.FAIL}


def test_connectx6_and_connectx8_rails_are_counted(store: ProfileStore) -> None:
    """Fails on the old code: hgx-b200 named MT4129 only (8 ConnectX-8 SuperNICs were 0 rails) and a
    profile naming the family `ConnectX-6` matched no hca_type."""
    cx8 = tuple(hca(f"mlx5_{i}", "MT4131", "40.44.1036", 800) for i in range(8))
    (count,) = HCA_COUNT.run(node(host(rdma=cx8)), shipped(store, "hgx-b200"))
    assert count.status is Status.PASS and count.observed == 8
    # DGX A100: 8 ConnectX-6 (MT4123) InfiniBand rails; the same chip's Ethernet storage ports are not rails.
    cx6 = (*(hca(f"mlx5_{i}", "MT4123", "20.39.2048", 200) for i in range(8)),
           hca("mlx5_8", "MT4123", "20.39.2048", 200, "Ethernet"), hca("mlx5_9", "MT4124", "20.39.2048", 200))
    (count,) = HCA_COUNT.run(node(host(rdma=cx6)), profile({"rdma": {"hca_types": ["ConnectX-6"],
                                                                     "link_layer": "InfiniBand",
                                                                     "count": exp(equals=9)}}))
    assert count.status is Status.PASS and count.observed == 9  # 8 PFs and the ConnectX-6 VF (MT4124)


# shared/data/linux/gpud-ib/ibstat.47.0.h100.all.active.2.txt: 8x ConnectX-7 (MT4129, 28.41.1000) InfiniBand
# 400 and one BlueField-3 (MT41692, 32.38.3056) `mlx5_bond_0`, 200 Gb/s Ethernet.
H100_BF3 = (*(hca(f"mlx5_{i}", "MT4129", "28.41.1000", 400) for i in (0, 1, 4, 5, 6, 7, 8, 9)),
            hca("mlx5_bond_0", "MT41692", "32.38.3056", 200, "Ethernet"))


def test_bluefield_integrated_ports_are_rails_where_the_profile_names_them(store: ProfileStore) -> None:
    """Fails on the old code: `BlueField-3` was no hca_type, so a Spectrum-X profile counted 0 rails."""
    (count,) = HCA_COUNT.run(node(host(rdma=H100_BF3)), shipped(store, "hgx-h100-sxm"))
    assert count.status is Status.PASS and count.observed == 8  # the frontend DPU is not a ConnectX-7 rail
    supernic = profile({"rdma": {"hca_types": ["ConnectX-7", "BlueField-3"], "count": exp(equals=9)}})
    (count,) = HCA_COUNT.run(node(host(rdma=H100_BF3)), supernic)
    assert count.status is Status.PASS and "mlx5_bond_0" in count.message
    assert hca_kind(H100_BF3[-1]).family == "BlueField-3"


def test_two_connectx7_ports_down_of_eight(store: ProfileStore) -> None:
    """shared/data/linux/gpud-ib/ibstat.47.0.h100.some.down.1.txt: mlx5_5 and mlx5_11 Down/Disabled at 40
    among 8 ConnectX-7 at 400 (RoCE), 4 ConnectX-6 Dx (MT4125, 100 Gb/s) beside them. A regression guard:
    the old code judged this the same (MT4129 is ConnectX-7's own id)."""
    down = {"mlx5_5", "mlx5_11"}
    rdma = (*(hca(f"mlx5_{i}", "MT4129", "28.39.1002", 40 if f"mlx5_{i}" in down else 400, "Ethernet",
                  state="DOWN" if f"mlx5_{i}" in down else "ACTIVE",
                  phys_state="Disabled" if f"mlx5_{i}" in down else "LinkUp") for i in (0, 3, 4, 5, 6, 9, 10, 11)),
            *(hca(f"mlx5_{i}", "MT4125", "22.39.1002", 100, "Ethernet") for i in (1, 2, 7, 8)))
    h100 = shipped(store, "hgx-h100-sxm")
    facts = node(host(rdma=rdma))
    (count,) = HCA_COUNT.run(facts, h100)
    assert count.status is Status.PASS and count.observed == 8
    failed = {f.subject for f in PORT_STATE.run(facts, h100) if f.status is Status.FAIL}
    assert failed == {"mlx5_5/1", "mlx5_11/1"}
    assert {f.subject for f in PORT_RATE.run(facts, h100) if f.status is Status.FAIL} == failed


def test_host_side_sriov_virtual_functions_are_not_extra_rails(store: ProfileStore) -> None:
    """A bare-metal node with SR-IOV on (VFs for containers) still has 8 rails, not 8 + 16."""
    pfs = [hca(f"mlx5_{i}", "MT4129", "28.39.1002", 400, address=f"0000:{0x1a + i:02x}:00.0") for i in range(8)]
    vfs = [hca(f"mlx5_{8 + i}", "MT4126", "28.39.1002", 400, address=f"0000:{0x1a + i // 2:02x}:00.{1 + i % 2}",
               physfn=f"0000:{0x1a + i // 2:02x}:00.0") for i in range(16)]
    (count,) = HCA_COUNT.run(node(host(rdma=(*pfs, *vfs))), shipped(store, "hgx-h100-sxm"))
    assert count.status is Status.PASS and count.observed == 8


def test_rdma_source_reads_the_physical_function_of_a_vf(tmp_path: Path) -> None:
    """Fails on the old code: RdmaDevice had no `physfn`."""
    pf, vf = "0000:1a:00.0", "0000:1a:00.2"
    base = f"sys/devices/pci0000:15/0000:15:01.0/{vf}"
    write_tree(tmp_path, {f"{base}/infiniband/mlx5_9/hca_type": "MT4126\n",
                          f"{base}/infiniband/mlx5_9/fw_ver": "28.39.1002\n", f"{base}/infiniband/mlx5_9/ports/": "",
                          f"sys/devices/pci0000:15/0000:15:01.0/{pf}/x": ""})
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    os.symlink(f"../../devices/pci0000:15/0000:15:01.0/{vf}/infiniband/mlx5_9", tmp_path / "sys/class/infiniband/mlx5_9")
    os.symlink(f"../../../{vf}", tmp_path / base / "infiniband/mlx5_9/device")
    os.symlink(f"../{pf}", tmp_path / base / "physfn")
    devices = read_rdma_devices(LiveFs(str(tmp_path)), counters=False)
    assert not isinstance(devices, Unknown)
    (device,) = devices
    assert (device.pci_address, device.physfn) == (vf, pf)


# --- topology inside a virtual machine -----------------------------------------------------------------

# shared/data/linux/gpud-misc/lspci.nn.a10.txt: a QEMU VM. QEMU PCIe root ports 00:02.0-02.7 [1b36:000c], one
# device on each of buses 01-07; the rail is "ConnectX Family mlx5Gen Virtual Function [15b3:101e]" at 05:00.0,
# the GPU "GA102GL [A10] [10de:2236]" at 06:00.0. (Which root port leads to which bus is not in lspci -nn; the
# usual QEMU layout, bus N behind 00:02.(N-1), is assumed.) The VF's firmware (a ConnectX-7's 28.x) is assumed.
ROOT_PORT = 0x060400


def qemu_vm_pci() -> tuple[PciFunction, ...]:
    ports = tuple(PciFunction(f"0000:00:02.{i}", 0x1B36, 0x000C, ROOT_PORT) for i in range(8))
    return (*ports,
            PciFunction("0000:05:00.0", 0x15B3, 0x101E, 0x020000, driver="mlx5_core", parent="0000:00:02.4"),
            PciFunction("0000:06:00.0", 0x10DE, 0x2236, 0x030200, driver="nvidia", parent="0000:00:02.5"))


def test_qemu_vm_with_flattened_topology_skips_gpu_nic(store: ProfileStore) -> None:
    """Fails on the old code: PHB against PIX/PXB was a fail (warning) inside the VM."""
    h100 = shipped(store, "hgx-h100-sxm")
    rail = hca("mlx5_0", "MT4126", "28.39.1002", 400, "Ethernet", address="0000:05:00.0")
    facts = node(host(pci=qemu_vm_pci(), rdma=(rail,), dmi={}))  # the evidence is lspci's alone
    (finding,) = GPU_NIC.run(facts, h100)
    assert finding.status is Status.SKIP and finding.observed == "PHB"
    assert "virtual machine (QEMU PCI function 1b36:000c" in finding.message
    assert "flattens the PCIe topology" in finding.message


def test_azure_vm_without_bridges_skips_gpu_nic(store: ProfileStore) -> None:
    """Hyper-V gives every passed-through device its own PCI domain, no bridges; the names and the HDR 200
    InfiniBand rail are those of shared/data/linux/azhpc-diagnostics/ibstatus.txt (`mlx5_ib0`, 4: ACTIVE,
    5: LinkUp, 200 Gb/sec (4X HDR); `mlx5_an0`, the 40 Gb/s Ethernet accelerated-networking VF, is no rail).
    ibstatus shows no CA type: MT4124 (ConnectX-6 VF) and MT4120 (ConnectX-5 VF) are assumed.
    Fails on the old code (NODE was a fail)."""
    pci = (PciFunction("0001:00:00.0", 0x10DE, 0x20B2, 0x030200, numa_node=0, driver="nvidia"),
           PciFunction("0101:00:00.0", 0x15B3, 0x101C, 0x020700, numa_node=0, driver="mlx5_core"),
           PciFunction("0102:00:00.0", 0x15B3, 0x1018, 0x020000, numa_node=0, driver="mlx5_core"))
    rdma = (hca("mlx5_ib0", "MT4124", "20.30.1004", 200, address="0101:00:00.0"),
            hca("mlx5_an0", "MT4120", "16.30.1004", 40, "Ethernet", address="0102:00:00.0"))
    dmi = {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}
    a100 = shipped(store, "dgx-a100")
    facts = node(host(pci=pci, rdma=rdma, dmi=dmi, numa_nodes=(0,)))
    (finding,) = GPU_NIC.run(facts, a100)
    assert finding.status is Status.SKIP and "DMI product_name 'Virtual Machine'" in finding.message
    states = by_subject(PORT_STATE.run(facts, a100))
    assert set(states) == {"mlx5_ib0/1"} and states["mlx5_ib0/1"].status is Status.PASS
    assert {f.status for f in PORT_RATE.run(facts, a100)} == {Status.PASS}


def test_bare_metal_phb_still_fails_and_vm_evidence_needs_evidence(store: ProfileStore) -> None:
    """The same PHB layout on a server (Intel root ports, Dell DMI, a ConnectX-7 PF) is a real finding."""
    pci = (PciFunction("0000:00:02.4", 0x8086, 0x347A, ROOT_PORT), PciFunction("0000:00:02.5", 0x8086, 0x347B, ROOT_PORT),
           PciFunction("0000:05:00.0", 0x15B3, 0x1021, 0x020000, driver="mlx5_core", parent="0000:00:02.4"),
           PciFunction("0000:06:00.0", 0x10DE, 0x2330, 0x030200, driver="nvidia", parent="0000:00:02.5"))
    rail = hca("mlx5_0", "MT4129", "28.39.1002", 400, address="0000:05:00.0")
    facts = node(host(pci=pci, rdma=(rail,)))
    assert virtual_machine(facts.host, [rail]) is None
    (finding,) = GPU_NIC.run(facts, shipped(store, "hgx-h100-sxm"))
    assert finding.status is Status.FAIL and finding.observed == "PHB"


def test_vm_evidence_from_passed_through_rails_alone() -> None:
    vf: RdmaDevice = hca("mlx5_1", "MT4126", "28.37.1014", 200)
    assert virtual_machine(host(), [vf]) == "rails mlx5_1 are virtual functions passed through"
    assert virtual_machine(host(), [vf._replace(physfn="0000:1a:00.0")]) is None
