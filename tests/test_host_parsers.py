"""Host parsers (/proc, /sys), kernel-log parsing and the facts helpers, on small fake roots."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from agent.facts import CpuFacts, HostFacts, KmsgRecord, PciFunction, parse_kernel_cmdline
from agent.model import Unknown
from agent.sources import kmsg
from agent.sources.fsroot import MAX_FILE_BYTES, LiveFs
from agent.sources.host import (
    SECURE_BOOT_VAR,
    InvalidName,
    normalize_sysctl,
    parse_bracketed,
    parse_cpu_list,
    read_cpu,
    read_dmi,
    read_interfaces,
    read_modules,
    read_numa_nodes,
    read_nvidia_driver,
    read_pci,
    read_pci_function,
    read_secure_boot,
    read_sysctls,
    read_value,
    sysctl_path,
)
from agent.sources.kmsg import parse_kmsg_line, parse_kmsg_text, read_recorded_kmsg
from tests.factories import write_tree

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


class ErrnoFs(LiveFs):
    """LiveFs whose reads of chosen paths fail with a chosen errno (root bypasses chmod)."""

    def __init__(self, root: str, failures: dict[str, int]) -> None:
        super().__init__(root)
        self.failures = failures

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        if path in self.failures:
            code = self.failures[path]
            raise OSError(code, os.strerror(code), path)
        return super().read_bytes(path, limit)


# ---------------------------------------------------------------------------------------------
# small parsers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "active"), [
    ("always [madvise] never", "madvise"),
    ("[always] madvise never\n", "always"),
    ("always defer defer+madvise [madvise] never", "madvise"),
])
def test_parse_bracketed(text: str, active: str) -> None:
    assert parse_bracketed(text) == active


def test_parse_bracketed_without_brackets_is_an_error() -> None:
    with pytest.raises(ValueError, match="always madvise never"):
        parse_bracketed("always madvise never")


@pytest.mark.parametrize(("text", "cpus"), [
    ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
    ("0\n", (0,)),
    ("0-1,", (0, 1)),
    ("", ()),
])
def test_parse_cpu_list(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


def test_parse_cpu_list_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_cpu_list("0-x")


@pytest.mark.parametrize(("key", "path"), [
    ("vm.swappiness", "/proc/sys/vm/swappiness"),
    ("net.ipv4.conf.eth0/100.rp_filter", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"),
    ("net.ipv4.conf.all.rp_filter", "/proc/sys/net/ipv4/conf/all/rp_filter"),
    ("fs.file-max", "/proc/sys/fs/file-max"),
])
def test_sysctl_path(key: str, path: str) -> None:
    assert sysctl_path(key) == path


@pytest.mark.parametrize("key", [
    "..", "a", "kernel..x", "kernel/../../etc", "kernel./", "kernel.//", "net.//.x",
    "kernel.x y", "kernel.x\x00", "kernel.\x00", ".kernel", "kernel.", "vm." + "x" * 260, "",
])
def test_sysctl_path_rejects_keys_that_could_escape(key: str) -> None:
    """A sysctl key from a profile must never become '..' or any odd path component."""
    with pytest.raises(InvalidName, match="not a sysctl key"):
        sysctl_path(key)


def test_normalize_sysctl_collapses_tabs_and_newlines() -> None:
    assert normalize_sysctl("4096\t87380\t6291456\n") == "4096 87380 6291456"
    assert normalize_sysctl(" 1 \n") == "1"


def test_read_sysctls(tmp_path: Path) -> None:
    """Values are read and normalised; a bad key is Unknown and never touches the disk."""
    fs = make_root(tmp_path, {
        "proc/sys/net/ipv4/tcp_rmem": "4096\t131072\t6291456\n",
        "proc/sys/net/ipv4/conf/eth0.100/rp_filter": "1\n",
    })
    values = read_sysctls(fs, ["net.ipv4.tcp_rmem", "net.ipv4.conf.eth0/100.rp_filter", "kernel/../../etc",
                               "vm.absent", "net.ipv4.tcp_rmem"])
    assert values["net.ipv4.tcp_rmem"] == "4096 131072 6291456"
    assert values["net.ipv4.conf.eth0/100.rp_filter"] == "1"
    assert values["vm.absent"] == Unknown("/proc/sys/vm/absent is absent")
    bad = values["kernel/../../etc"]
    assert isinstance(bad, Unknown) and "not a sysctl key" in bad.reason
    assert len(values) == 4


# ---------------------------------------------------------------------------------------------
# read_value and errors
# ---------------------------------------------------------------------------------------------


def test_read_value_non_utf8_is_unknown_naming_the_file(tmp_path: Path) -> None:
    fs = make_root(tmp_path, {"sys/class/dmi/id/board_name": b"X13\xff\xfeboard\n"})
    value = read_value(fs, "/sys/class/dmi/id/board_name")
    assert value == Unknown("/sys/class/dmi/id/board_name is not valid UTF-8 (byte 3)")


def test_read_value_errors_and_parse_failures(tmp_path: Path) -> None:
    fs = ErrnoFs(str(make_root(tmp_path, {"a": "12\n", "b": "twelve\n"}).root),
                 {"/denied": errno.EACCES, "/einval": errno.EINVAL})
    assert read_value(fs, "/a", int) == 12
    assert read_value(fs, "/b", int) == Unknown("/b: unexpected content 'twelve'")
    assert read_value(fs, "/missing") == Unknown("/missing is absent")
    assert read_value(fs, "/denied") == Unknown("/denied is not readable by this user (needs root)")
    assert read_value(fs, "/einval") == Unknown("/einval: Invalid argument")


def test_read_dmi_keeps_odd_bytes_visible(tmp_path: Path) -> None:
    fs = make_root(tmp_path, {"sys/class/dmi/id/sys_vendor": b"Vend\xf6r \n"})
    dmi = read_dmi(fs)
    assert dmi["sys_vendor"] == "Vend\\xf6r"
    assert dmi["product_name"] == Unknown("/sys/class/dmi/id/product_name is absent")


def test_read_numa_nodes(tmp_path: Path) -> None:
    assert read_numa_nodes(make_root(tmp_path, {})) == (0,)  # no NUMA support: one node
    fs = make_root(tmp_path, {"sys/devices/system/node/online": "0-1\n"})
    assert read_numa_nodes(fs) == (0, 1)


# ---------------------------------------------------------------------------------------------
# Secure Boot
# ---------------------------------------------------------------------------------------------

SB = SECURE_BOOT_VAR.lstrip("/")


@pytest.mark.parametrize(("data", "state"), [
    (b"\x06\x00\x00\x00\x01", "enabled"),
    (b"\x06\x00\x00\x00\x00", "disabled"),
    (b"\x07\x00\x00\x00\x01", "enabled"),
])
def test_secure_boot_from_efivar(tmp_path: Path, data: bytes, state: str) -> None:
    assert read_secure_boot(make_root(tmp_path, {SB: data})) == state


def test_secure_boot_without_efi_is_unsupported(tmp_path: Path) -> None:
    assert read_secure_boot(make_root(tmp_path, {"sys/firmware/acpi/": ""})) == "unsupported"


def test_secure_boot_efi_without_efivarfs(tmp_path: Path) -> None:
    value = read_secure_boot(make_root(tmp_path, {"sys/firmware/efi/runtime": "x"}))
    assert isinstance(value, Unknown)
    assert "efivarfs" in value.reason


def test_secure_boot_efivars_without_the_variable(tmp_path: Path) -> None:
    fs = make_root(tmp_path, {"sys/firmware/efi/efivars/Boot0000-8be4df61-93ca-11d2-aa0d-e98c0344c8c3": "x"})
    assert read_secure_boot(fs) == "unsupported"


def test_secure_boot_short_variable(tmp_path: Path) -> None:
    value = read_secure_boot(make_root(tmp_path, {SB: b"\x06\x00\x00"}))
    assert value == Unknown(f"{SECURE_BOOT_VAR}: 3 bytes, expected 5")


def test_secure_boot_unreadable_variable(tmp_path: Path) -> None:
    fs = ErrnoFs(str(make_root(tmp_path, {SB: b"\x06\x00\x00\x00\x01"}).root), {SECURE_BOOT_VAR: errno.EACCES})
    value = read_secure_boot(fs)
    assert isinstance(value, Unknown) and "needs root" in value.reason


# ---------------------------------------------------------------------------------------------
# NVIDIA driver and modules
# ---------------------------------------------------------------------------------------------

GCC_LINE = "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"


@pytest.mark.parametrize(("first_line", "version"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024", "550.90.07"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  "
     "(dvs-builder@U16-I3-B13-2-1)  Fri Aug 16 21:42:42 UTC 2024", "560.35.03"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  560.35.03  Release Build  "
     "(dvs-builder@U16-I3-B13-2-1)  Fri Aug 16 21:26:26 UTC 2024", "560.35.03"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.161.08  Tue Mar  5 22:30:33 UTC 2024", "535.161.08"),
])
def test_nvidia_driver_version_formats(tmp_path: Path, first_line: str, version: str) -> None:
    fs = make_root(tmp_path, {"proc/driver/nvidia/version": first_line + "\n" + GCC_LINE})
    assert read_nvidia_driver(fs) == version


def test_nvidia_driver_absent_means_module_not_loaded(tmp_path: Path) -> None:
    value = read_nvidia_driver(make_root(tmp_path, {}))
    assert isinstance(value, Unknown)
    assert value.reason.startswith("/proc/driver/nvidia/version is absent")
    assert "not loaded" in value.reason


def test_nvidia_driver_without_a_version(tmp_path: Path) -> None:
    fs = make_root(tmp_path, {"proc/driver/nvidia/version": "NVRM version: something else\n"})
    value = read_nvidia_driver(fs)
    assert isinstance(value, Unknown) and "no driver version" in value.reason


def test_nvidia_driver_empty_file_is_unknown(tmp_path: Path) -> None:
    """An empty version file is bad data: an Unknown, never an exception (IndexError)."""
    value = read_nvidia_driver(make_root(tmp_path, {"proc/driver/nvidia/version": ""}))
    assert isinstance(value, Unknown)
    assert "/proc/driver/nvidia/version" in value.reason


def test_read_modules(tmp_path: Path) -> None:
    fs = make_root(tmp_path, {"proc/modules": (
        "nvidia_uvm 4956160 4 - Live 0xffffffffc3a00000 (POE)\n"
        "nvidia 56823808 120 nvidia_uvm,nvidia_modeset, Live 0xffffffffc0a00000 (POE)\n"
        "ib_core 458752 8 rdma_ucm,ib_uverbs, Loading 0xffffffffc0700000\n"
        "short line\n"
    )})
    assert read_modules(fs) == {"nvidia_uvm": "Live", "nvidia": "Live", "ib_core": "Loading"}


def test_read_modules_absent(tmp_path: Path) -> None:
    value = read_modules(make_root(tmp_path, {}))
    assert isinstance(value, Unknown) and "without loadable modules" in value.reason


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


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------

CPU = "sys/devices/system/cpu"


def idle_files(states: dict[int, tuple[str, int]], disabled: dict[int, list[int]],
               cpus: range) -> dict[str, Content]:
    files: dict[str, Content] = {}
    for index, (name, latency) in states.items():
        files[f"{CPU}/cpu0/cpuidle/state{index}/name"] = name + "\n"
        files[f"{CPU}/cpu0/cpuidle/state{index}/latency"] = f"{latency}\n"
        for cpu in cpus:
            flag = "1" if cpu in disabled.get(index, []) else "0"
            files[f"{CPU}/cpu{cpu}/cpuidle/state{index}/disable"] = flag + "\n"
    return files


def test_read_cpu_governors_grouped_and_idle_states(tmp_path: Path) -> None:
    files: dict[str, Content] = {
        f"{CPU}/online": "0-3\n",
        f"{CPU}/cpu0/cpufreq/scaling_governor": "performance\n",
        f"{CPU}/cpu0/cpufreq/scaling_driver": "intel_pstate\n",
        f"{CPU}/cpu1/cpufreq/scaling_governor": "powersave\n",
        f"{CPU}/cpu2/cpufreq/scaling_governor": "performance\n",
        f"{CPU}/cpu3/cpufreq/": "",  # governor file missing on a later CPU
        f"{CPU}/cpuidle/current_driver": "intel_idle\n",
        f"{CPU}/cpu0/cpuidle/driver/": "",  # not a state directory
        **idle_files({0: ("POLL", 0), 1: ("C1", 2), 2: ("C1E", 10), 10: ("C6", 170)},
                     {10: [0, 1, 2, 3], 1: [2]}, range(4)),
    }
    cpu = read_cpu(make_root(tmp_path, files))
    assert cpu.online == (0, 1, 2, 3)
    assert cpu.governors == {
        "performance": (0, 2),
        "powersave": (1,),
        f"unknown (/{CPU}/cpu3/cpufreq/scaling_governor is absent)": (3,),
    }
    assert (cpu.scaling_driver, cpu.idle_driver) == ("intel_pstate", "intel_idle")
    assert not isinstance(cpu.idle_states, Unknown)
    # Counted deepest first until a state is enabled somewhere (C1E here);
    # shallower states are not counted (None). Numeric order: state10 after state2.
    assert [(s.index, s.name, s.latency_us, s.disabled_cpus, s.total_cpus) for s in cpu.idle_states] == [
        (0, "POLL", 0, None, 4), (1, "C1", 2, None, 4), (2, "C1E", 10, 0, 4), (10, "C6", 170, 4, 4),
    ]
    assert cpu.idle_states[3].enabled_anywhere is False
    assert cpu.idle_states[2].enabled_anywhere is True
    assert cpu.idle_states[1].enabled_anywhere is None


def test_read_cpu_without_cpufreq_or_cpuidle(tmp_path: Path) -> None:
    """A VM: no cpufreq, no cpuidle. Governors say why; nothing raises."""
    cpu = read_cpu(make_root(tmp_path, {f"{CPU}/online": "0-7\n"}))
    assert cpu.online == tuple(range(8))
    assert isinstance(cpu.governors, Unknown) and "cpufreq" in cpu.governors.reason
    assert cpu.governors.reason.startswith(f"/{CPU}/cpu0/cpufreq is absent")
    assert cpu.scaling_driver == Unknown(f"/{CPU}/cpu0/cpufreq/scaling_driver is absent")
    assert cpu.idle_states == Unknown(f"/{CPU}/cpu0/cpuidle is absent: no cpuidle driver")


def test_read_cpu_without_online_list(tmp_path: Path) -> None:
    cpu = read_cpu(make_root(tmp_path, {}))
    expected = Unknown(f"/{CPU}/online is absent")
    assert (cpu.online, cpu.governors, cpu.scaling_driver, cpu.idle_driver, cpu.idle_states) == (expected,) * 5


def test_idle_state_with_bad_latency_is_unknown(tmp_path: Path) -> None:
    files = {f"{CPU}/online": "0\n", **idle_files({0: ("POLL", 0)}, {}, range(1)),
             f"{CPU}/cpu0/cpuidle/state0/latency": "n/a\n"}
    cpu = read_cpu(make_root(tmp_path, files))
    assert cpu.idle_states == Unknown(f"/{CPU}/cpu0/cpuidle/state0/latency: unexpected content 'n/a'")


# ---------------------------------------------------------------------------------------------
# facts.py helpers
# ---------------------------------------------------------------------------------------------


def test_parse_kernel_cmdline() -> None:
    """Quotes keep spaces, bare flags map to None, the last duplicate wins, `--` ends the list."""
    cmdline = ('BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=1234-abcd ro quiet iommu=on '
               'dyndbg="file drm.c +p" "acpi_osi=Windows 2020" iommu=pt  intel_idle.max_cstate=1 '
               '-- single init_arg=1\n')
    assert parse_kernel_cmdline(cmdline) == {
        "BOOT_IMAGE": "/vmlinuz-6.8.0",
        "root": "UUID=1234-abcd",
        "ro": None,
        "quiet": None,
        "iommu": "pt",
        "dyndbg": "file drm.c +p",
        "acpi_osi": "Windows 2020",
        "intel_idle.max_cstate": "1",
    }
    assert parse_kernel_cmdline("") == {}
    assert parse_kernel_cmdline("a= b") == {"a": "", "b": None}


def test_host_facts_kernel_params_and_gpus() -> None:
    gpu = PciFunction("0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    vga = PciFunction("0000:19:00.0", 0x10DE, 0x1EB8, 0x030000)
    nvswitch = PciFunction("0000:05:00.0", 0x10DE, 0x22A3, 0x068000)
    other = PciFunction("0000:00:02.0", 0x1A03, 0x2000, 0x030000)
    facts = HostFacts(
        hostname="n", kernel_release="6.8", sysctl={}, thp_enabled="madvise", thp_defrag="madvise",
        numa_nodes=(0,), cmdline="ro iommu=pt", dmi={}, secure_boot="enabled", nvidia_driver="550.90.07",
        pci=(gpu, vga, nvswitch, other), modules={}, interfaces=(), cpu=CpuFacts(*[Unknown("n/a")] * 5),
    )
    assert facts.kernel_params == {"ro": None, "iommu": "pt"}
    assert facts.nvidia_gpus == (gpu, vga)
    assert nvswitch.is_nvswitch and not gpu.is_nvswitch
    facts.cmdline = Unknown("no cmdline")
    facts.pci = Unknown("no pci")
    assert facts.kernel_params == Unknown("no cmdline")
    assert facts.nvidia_gpus == Unknown("no pci")


# ---------------------------------------------------------------------------------------------
# kernel log
# ---------------------------------------------------------------------------------------------


def test_parse_kmsg_record_format() -> None:
    assert parse_kmsg_line("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == KmsgRecord(
        message="nvidia-nvswitch2: open (major=510)", priority=6, seq=3964, ts_usec=206764307)


@pytest.mark.parametrize(("prefix", "priority"), [(0, 0), (3, 3), (14, 6), (4, 4), (12, 4), (30, 6), (191, 7)])
def test_kmsg_priority_drops_the_facility_bits(prefix: int, priority: int) -> None:
    record = parse_kmsg_line(f"{prefix},1,2,c;msg; with semicolon")
    assert record == KmsgRecord("msg; with semicolon", priority, 1, 2)


@pytest.mark.parametrize(("line", "message", "ts_usec"), [
    ("[  12.345678] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
     "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.", 12_345_678),
    ("[    0.000000] Linux version 6.8.0", "Linux version 6.8.0", 0),
    ("[123456.5] short fraction", "short fraction", 123_456_500_000),
    ("[    1.000000]", "", 1_000_000),
])
def test_parse_dmesg_format(line: str, message: str, ts_usec: int) -> None:
    assert parse_kmsg_line(line) == KmsgRecord(message=message, ts_usec=ts_usec)


@pytest.mark.parametrize("line", [
    "2024-11-15T05:39:15,491363+00:00 nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
    "2024-11-15T05:39:15.491363+0000 nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
])
def test_parse_iso_format(line: str) -> None:
    assert parse_kmsg_line(line) == KmsgRecord(
        message="nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context", wall=line.split(" ", 1)[0])


def test_parse_decoded_iso_format_strips_facility_and_level() -> None:
    """`dmesg --decode --time-format=iso` (support bundles, gpud test data) prefixes 'kern  :warn  : '."""
    line = ("kern  :warn  : 2025-01-21T02:21:33,498559+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', "
            "name=<unknown>, Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address")
    record = parse_kmsg_line(line)
    assert record is not None
    assert record.message.startswith("NVRM: Xid (PCI:0000:38:00): 13, ")


@pytest.mark.parametrize("line", ["", "   ", " SUBSYSTEM=pci", " DEVICE=+pci:0000:18:00.0", "\t"])
def test_continuation_and_blank_lines_are_skipped(line: str) -> None:
    assert parse_kmsg_line(line) is None


def test_unknown_format_keeps_the_whole_line() -> None:
    assert parse_kmsg_line("NVRM: loading") == KmsgRecord(message="NVRM: loading")


def test_parse_kmsg_text_skips_continuations_and_respects_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ["6,1,10,-;first\n", " SUBSYSTEM=pci\n", "\n", "[ 1.0] second\n", "third\n", "fourth\n"]
    assert [r.message for r in parse_kmsg_text(lines)] == ["first", "second", "third", "fourth"]
    monkeypatch.setattr(kmsg, "MAX_RECORDS", 2)
    assert [r.message for r in parse_kmsg_text(lines)] == ["first", "second"]


def test_read_recorded_kmsg(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(b"6,1,10,-;caf\xe9\n4,2,20,-;NVRM: Xid 79\n")
    assert read_recorded_kmsg(path) == (KmsgRecord("caf\\xe9", 6, 1, 10), KmsgRecord("NVRM: Xid 79", 4, 2, 20))
    missing = read_recorded_kmsg(tmp_path / "absent.txt")
    assert isinstance(missing, Unknown) and "absent.txt" in missing.reason


KERNEL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"
_PREFIXES = (r"^\d+,\d+,\d+,", r"^\[\s*\d+\.\d+\]", r"^\d{4}-\d{2}-\d{2}T", r"^[a-z]+\s*:[a-z]+\s*: ")


@pytest.mark.parametrize("name", ["kmsg.1.log", "dmesg.0.log", "dmesg.decode.iso.log.0"])
def test_real_kernel_logs_parse_without_format_prefixes(name: str) -> None:
    """Real dumps (gpud test data, fixtures/kmsg): one record per line, prefix removed."""
    lines = (KERNEL_LOGS / name).read_text(encoding="utf-8").splitlines()
    expected = sum(1 for line in lines if line.strip() and not line.startswith(" "))
    records = parse_kmsg_text(lines)
    assert expected > 30
    assert len(records) == expected
    leftovers = [r.message for r in records if any(re.match(p, r.message) for p in _PREFIXES)]
    assert leftovers == []
    assert all(r.message.strip() for r in records)
