"""A first run on a machine that is not a GPU node (issue 17): calm, and exit 0 unless something is wrong.

A laptop, a CPU node or a CI runner has no NVIDIA GPU on PCI and no NVIDIA driver: GPU-node tuning does
not apply there, so the audit picks `no-nvidia-gpu`, says so once, and fails nothing. A node with the
driver installed but no GPU on PCI (GPUs fallen off the bus) is a GPU node in trouble and keeps the
generic GPU profile. An unreadable kernel log is `unknown` with its fix, never a failure.
"""

from __future__ import annotations

from pathlib import Path

from agent.core.model import Severity, SourceStatus, Status
from checks.sources import SOURCE
from tests.conftest import RunCli
from tests.factories import host, node, profile, write_tree

# sysfs of one Intel host bridge and one Intel NIC: PCI was read and lists no NVIDIA function.
CPU_HOST_PCI = {
    "fs/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086\n",
    "fs/sys/bus/pci/devices/0000:00:00.0/device": "0x09a2\n",
    "fs/sys/bus/pci/devices/0000:00:00.0/class": "0x060000\n",
    "fs/sys/bus/pci/devices/0000:17:00.0/vendor": "0x8086\n",
    "fs/sys/bus/pci/devices/0000:17:00.0/device": "0x1593\n",
    "fs/sys/bus/pci/devices/0000:17:00.0/class": "0x020000\n",
}
# What the generic GPU profile would fail on such a host (the default socket buffers, THP always).
UNTUNED = {
    "fs/proc/sys/net/core/rmem_max": "212992\n",
    "fs/proc/sys/net/core/wmem_max": "212992\n",
    "fs/sys/kernel/mm/transparent_hugepage/enabled": "[always] madvise never\n",
    "fs/proc/sys/kernel/numa_balancing": "1\n",
}


def cpu_host_snapshot(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    snap = tmp_path / "cpu-host"
    write_tree(snap, {
        "meta.yaml": "hostname: laptop\ncaptured_at: '2026-12-01T10:00:00+00:00'\ncaptured: [host, kmsg]\n",
        "kmsg.txt": "6,1,0,-;Linux version 6.1.0 (gcc) #1 SMP\n",
        "fs/proc/sys/kernel/hostname": "laptop\n",
        **CPU_HOST_PCI, **UNTUNED, **(extra or {}),
    })
    return snap


def test_a_host_without_gpus_is_judged_by_nothing_gpu_specific(run_cli: RunCli, tmp_path: Path,
                                                              empty_config: Path) -> None:
    snap = cpu_host_snapshot(tmp_path)
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(empty_config), "--format", "json")
    report = result.json()
    assert result.code == 0, [f for f in report["findings"] if f["status"] == "fail"]
    assert report["profile"] == "no-nvidia-gpu"
    (match,) = [f for f in report["findings"] if f["check"] == "profile.match"]
    assert match["status"] == "skip" and "no NVIDIA GPU: GPU checks do not apply" in match["message"]
    assert {f["check"] for f in report["findings"]} <= {"profile.match", "source.available"}
    assert report["summary"]["fail"] == report["summary"]["warn"] == 0


def test_a_driver_without_gpus_on_pci_keeps_the_gpu_profile(run_cli: RunCli, tmp_path: Path,
                                                          empty_config: Path) -> None:
    snap = cpu_host_snapshot(tmp_path, {"fs/proc/driver/nvidia/version":
                                        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"})
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(empty_config), "--format", "json")
    report = result.json()
    assert report["profile"] == "generic-nvidia"
    assert result.code == 1  # the untuned host is judged as the GPU node it claims to be
    assert {("host.thp.enabled", "fail")} <= {(f["check"], f["status"]) for f in report["findings"]}


def test_an_unreadable_kernel_log_is_unknown_with_the_fix() -> None:
    sources = {"host": SourceStatus("host", ok=True),
               "kmsg": SourceStatus("kmsg", ok=False, error="/dev/kmsg is not readable (needs root or CAP_SYSLOG)")}
    (kmsg,) = [f for f in SOURCE.run(node(host(), sources=sources), profile({})) if f.subject == "kmsg"]
    assert kmsg.status is Status.UNKNOWN and kmsg.severity is Severity.WARNING
    assert "needs root or CAP_SYSLOG" in kmsg.message
