"""Host parsers for PCI functions (/sys/bus/pci/devices) and network interfaces (/sys/class/net, bonds,
RDMA devices), on small fake roots with real symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.core.facts import PciFunction
from agent.core.model import Unknown
from agent.sources.fsroot import LiveFs
from agent.sources.host import read_interfaces, read_pci, read_pci_function
from tests.factories import Content, make_root

# ---------------------------------------------------------------------------------------------
# PCI
# ---------------------------------------------------------------------------------------------

PCI = "sys/bus/pci/devices"
GPU = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"


def pci_root(tmp_path: Path, functions: dict[str, dict[str, Content]],
             driver_links: dict[str, str] | None = None) -> LiveFs:
    """Each function's files under sys/devices/<path>, linked from sys/bus/pci/devices."""
    files: dict[str, Content] = {}
    links: dict[str, str] = {}
    for dev_path, attrs in functions.items():
        address = dev_path.rsplit("/", 1)[1]
        links[f"{PCI}/{address}"] = "../../../" + dev_path.removeprefix("sys/")
        for name, content in attrs.items():
            files[f"{dev_path}/{name}"] = content
    for dev_path, driver in (driver_links or {}).items():
        links[f"{dev_path}/driver"] = f"../../../bus/pci/drivers/{driver}"
    return make_root(tmp_path, files, links)


def test_pci_function_from_uevent_with_details(tmp_path: Path) -> None:
    """A GPU: ids from uevent (hex, upper case), NUMA node and link from their files."""
    fs = pci_root(tmp_path, {GPU: {
        "uevent": "DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\n"
                  "PCI_SLOT_NAME=0000:18:00.0\nMODALIAS=pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n",
        "numa_node": "1\n",
        "current_link_speed": "32.0 GT/s PCIe\n",
        "current_link_width": "16\n",
        "max_link_speed": "32.0 GT/s PCIe\n",
        "max_link_width": "16\n",
        "vendor": "0xffff\n",  # must not be read: uevent wins
    }})
    assert read_pci_function(fs, "0000:18:00.0") == PciFunction(
        address="0000:18:00.0", vendor=0x10DE, device=0x2330, class_code=0x030200,
        subsystem_vendor=0x10DE, subsystem_device=0x16C1, numa_node=1,
        current_link_speed="32.0 GT/s PCIe", current_link_width=16,
        max_link_speed="32.0 GT/s PCIe", max_link_width=16, driver="nvidia", parent="0000:17:00.0",
    )


def test_pci_function_fallback_to_attribute_files(tmp_path: Path) -> None:
    """Without uevent: vendor/device/class files, subsystem files and the driver link."""
    dev = "sys/devices/pci0000:00/0000:00:06.0"
    fs = pci_root(tmp_path, {dev: {
        "vendor": "0x15b3\n", "device": "0x101b\n", "class": "0x020700\n",
        "subsystem_vendor": "0x15b3\n", "subsystem_device": "0x0007\n", "numa_node": "-1\n",
        "current_link_width": "16\n",
    }}, {dev: "mlx5_core"})
    function = read_pci_function(fs, "0000:00:06.0")
    assert function == PciFunction(
        address="0000:00:06.0", vendor=0x15B3, device=0x101B, class_code=0x020700,
        subsystem_vendor=0x15B3, subsystem_device=0x0007, numa_node=None,  # -1: firmware did not say
        current_link_width=16, driver="mlx5_core", parent=None,  # pci0000:00 is a root bus
    )
    assert isinstance(function, PciFunction) and function.is_network and not function.is_nvidia_gpu


def test_pci_function_uevent_without_ids_falls_back(tmp_path: Path) -> None:
    dev = "sys/devices/pci0000:00/0000:00:07.0"
    fs = pci_root(tmp_path, {dev: {"uevent": "DRIVER=nvme\n", "vendor": "0x144d\n", "device": "0xa80a\n",
                                   "class": "0x010802\n", "numa_node": "0\n"}})
    function = read_pci_function(fs, "0000:00:07.0")
    assert isinstance(function, PciFunction)
    assert (function.pci_id, function.class_code, function.numa_node) == ("144d:a80a", 0x010802, 0)
    assert function.driver is None  # no driver link in the fallback path


def test_pci_function_missing_ids_is_unknown(tmp_path: Path) -> None:
    dev = "sys/devices/pci0000:00/0000:00:08.0"
    fs = pci_root(tmp_path, {dev: {"vendor": "0x8086\n", "class": "0x060000\n"}})
    assert read_pci_function(fs, "0000:00:08.0") == Unknown(f"/{PCI}/0000:00:08.0/device is absent")


@pytest.mark.parametrize(("pci_id", "pci_class", "detailed"), [
    ("10DE:2330", "30200", True),  # GPU (3D controller)
    ("10DE:22A3", "68000", True),  # NVSwitch (other bridge)
    ("15B3:1021", "20700", True),  # ConnectX InfiniBand
    ("144D:A80A", "10802", True),  # NVMe
    ("8086:1533", "20000", True),  # any Ethernet NIC
    ("15B3:A2DC", "108000", True),  # BlueField function of another class: Mellanox vendor
    ("8086:09A2", "88000", False),  # chipset: system peripheral
    ("8086:352A", "60400", False),  # PCI bridge
])
def test_details_only_for_gpus_nics_nvswitch_nvme(tmp_path: Path, pci_id: str, pci_class: str,
                                                  detailed: bool) -> None:
    """~400 chipset functions skip numa/link reads: their numa_node stays None even if the file says 0."""
    dev = "sys/devices/pci0000:00/0000:00:09.0"
    fs = pci_root(tmp_path, {dev: {"uevent": f"PCI_CLASS={pci_class}\nPCI_ID={pci_id}\n",
                                   "numa_node": "0\n", "current_link_width": "8\n"}})
    function = read_pci_function(fs, "0000:00:09.0")
    assert isinstance(function, PciFunction)
    assert function.pci_id == pci_id.lower()
    assert function.numa_node == (0 if detailed else None)
    assert function.current_link_width == (8 if detailed else None)


def test_read_pci_skips_unexpected_names(tmp_path: Path) -> None:
    fs = pci_root(tmp_path, {
        "sys/devices/pci0000:00/0000:00:03.0": {"uevent": "PCI_CLASS=20000\nPCI_ID=8086:1533\n"},
        "sys/devices/pci0000:00/0000:00:04.0": {},  # unreadable: left out, not fatal
    })
    os.symlink("/etc", Path(str(fs.root)) / PCI / "..evil")
    (Path(str(fs.root)) / PCI / "0000:00:0Z.0").mkdir()
    functions = read_pci(fs)
    assert not isinstance(functions, Unknown)
    assert [f.address for f in functions] == ["0000:00:03.0"]


def test_read_pci_without_sysfs(tmp_path: Path) -> None:
    assert read_pci(make_root(tmp_path, {})) == Unknown(f"/{PCI} is absent")


# ---------------------------------------------------------------------------------------------
# network interfaces
# ---------------------------------------------------------------------------------------------

NIC = "sys/devices/pci0000:00/0000:00:03.0"
HCA = "sys/devices/pci0000:00/0000:00:05.0"


def net_root(tmp_path: Path, extra: dict[str, Content] | None = None,
             extra_links: dict[str, str] | None = None) -> LiveFs:
    files: dict[str, Content] = {
        f"{NIC}/net/eth0/mtu": "9000\n", f"{NIC}/net/eth0/operstate": "up\n", f"{NIC}/net/eth0/type": "1\n",
        f"{NIC}/net/eth1/mtu": "9000\n", f"{NIC}/net/eth1/operstate": "down\n",
        f"{NIC}/net/eth1/speed": "-1\n",
        f"{HCA}/net/ib0/mtu": "4092\n", f"{HCA}/net/ib0/operstate": "up\n", f"{HCA}/net/ib0/type": "32\n",
        f"{HCA}/net/ib0/speed": "400000\n",
        f"{HCA}/infiniband/mlx5_0/ports/1/link_layer": "InfiniBand\n",
        "sys/devices/virtual/net/bond0/mtu": "9000\n", "sys/devices/virtual/net/bond0/operstate": "up\n",
        "sys/devices/virtual/net/bond0/bonding/mode": "802.3ad 4\n",
        "sys/devices/virtual/net/this-is-far-too-long/mtu": "1500\n",
        **(extra or {}),
    }
    links = {
        "sys/class/net/eth0": "../../devices/pci0000:00/0000:00:03.0/net/eth0",
        "sys/class/net/eth1": "../../devices/pci0000:00/0000:00:03.0/net/eth1",
        "sys/class/net/ib0": "../../devices/pci0000:00/0000:00:05.0/net/ib0",
        "sys/class/net/bond0": "../../devices/virtual/net/bond0",
        "sys/class/net/this-is-far-too-long": "../../devices/virtual/net/this-is-far-too-long",
        f"{NIC}/net/eth0/device": "../../../0000:00:03.0",
        f"{NIC}/net/eth1/device": "../../../0000:00:03.0",
        f"{NIC}/driver": "../../../bus/pci/drivers/ice",
        f"{NIC}/net/eth0/master": "../../../../virtual/net/bond0",
        f"{HCA}/net/ib0/device": "../../../0000:00:05.0",
        f"{HCA}/driver": "../../../bus/pci/drivers/mlx5_core",
        "sys/class/infiniband/mlx5_0": "../../devices/pci0000:00/0000:00:05.0/infiniband/mlx5_0",
        f"{HCA}/infiniband/mlx5_0/device": "../../../0000:00:05.0",
        **(extra_links or {}),
    }
    return make_root(tmp_path, files, links)


def test_read_interfaces(tmp_path: Path) -> None:
    """PCI address and driver through links, bonds, RDMA mapping, speed rules, odd names skipped."""
    interfaces = read_interfaces(net_root(tmp_path))
    assert not isinstance(interfaces, Unknown)
    by_name = {i.name: i for i in interfaces}
    assert sorted(by_name) == ["bond0", "eth0", "eth1", "ib0"]  # the 20-char name is skipped

    eth0 = by_name["eth0"]
    assert (eth0.mtu, eth0.operstate, eth0.arp_type) == (9000, "up", 1)
    assert eth0.speed_mbps is None  # no speed file
    assert (eth0.pci_address, eth0.driver, eth0.bond_master) == ("0000:00:03.0", "ice", "bond0")
    assert (eth0.is_bond, eth0.rdma_device, eth0.is_virtual) == (False, None, False)

    assert by_name["eth1"].speed_mbps is None  # -1: link down
    assert by_name["eth1"].bond_master is None

    ib0 = by_name["ib0"]
    assert (ib0.speed_mbps, ib0.arp_type, ib0.driver) == (400000, 32, "mlx5_core")
    assert (ib0.rdma_device, ib0.link_layer) == ("mlx5_0", "InfiniBand")

    bond0 = by_name["bond0"]
    assert (bond0.is_bond, bond0.is_virtual, bond0.pci_address, bond0.driver) == (True, True, None, None)
    assert bond0.arp_type is None


def test_read_interfaces_skips_the_bonding_masters_file(tmp_path: Path) -> None:
    """With the bonding module loaded, /sys/class/net/bonding_masters is a plain file, not an interface."""
    interfaces = read_interfaces(net_root(tmp_path, {"sys/class/net/bonding_masters": "bond0\n"}))
    assert not isinstance(interfaces, Unknown)
    assert sorted(i.name for i in interfaces) == ["bond0", "eth0", "eth1", "ib0"]


def test_rdma_ports_without_link_layer_and_without_ib_class(tmp_path: Path) -> None:
    fs = net_root(tmp_path)
    os.remove(Path(str(fs.root)) / HCA / "infiniband/mlx5_0/ports/1/link_layer")
    interfaces = read_interfaces(fs)
    assert not isinstance(interfaces, Unknown)
    ib0 = next(i for i in interfaces if i.name == "ib0")
    assert (ib0.rdma_device, ib0.link_layer) == ("mlx5_0", None)

    os.remove(Path(str(fs.root)) / "sys/class/infiniband/mlx5_0")
    interfaces = read_interfaces(fs)
    assert not isinstance(interfaces, Unknown)
    assert all(i.rdma_device is None for i in interfaces)


def test_read_interfaces_without_sysfs(tmp_path: Path) -> None:
    assert read_interfaces(make_root(tmp_path, {})) == Unknown("/sys/class/net is absent")
