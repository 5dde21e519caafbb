"""Host parsers (/proc, /sys) and the facts helpers, on small fake roots: the small parsers (bracketed
choices, CPU lists, sysctl keys), read_value and its errors, DMI, NUMA, Secure Boot, the NVIDIA driver
version, loaded modules and the CPU (governors, idle states).

PCI functions and network interfaces: tests/unit/sources/test_host_parsers_pci_net.py; the kernel log:
tests/unit/sources/test_host_parsers_kmsg.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.core.facts import CpuFacts, HostFacts, PciFunction, parse_kernel_cmdline
from agent.core.model import Unknown
from agent.sources.fsroot import MAX_FILE_BYTES, LiveFs, read_value
from agent.sources.host import (
    SECURE_BOOT_VAR,
    InvalidName,
    normalize_sysctl,
    parse_bracketed,
    parse_cpu_list,
    read_cpu,
    read_dmi,
    read_modules,
    read_numa_nodes,
    read_nvidia_driver,
    read_secure_boot,
    read_sysctls,
    sysctl_path,
)
from tests.factories import Content, make_root


class ErrnoFs(LiveFs):
    """LiveFs whose reads of chosen paths fail with a chosen errno (root bypasses chmod)."""

    def __init__(self, root: str, failures: dict[str, int]) -> None:
        super().__init__(root)
        self.failures = failures

    def read_bytes(self, path: str, limit: int | None = MAX_FILE_BYTES) -> bytes:
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
