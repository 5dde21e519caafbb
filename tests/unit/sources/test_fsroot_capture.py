"""RecordingFs and capture_live: the snapshot must replay exactly what was read."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path

import pytest

from agent.core.errors import SnapshotError
from agent.core.model import Unknown
from agent.sources.fsroot import MAX_FILE_BYTES, LiveFs
from agent.sources.fsroot_recording import RecordingFs
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.host import read_host_facts, read_interfaces, read_secure_boot
from agent.sources.snapshot import CAPTURE_SYSCTLS, capture_live
from tests.unit.sources.test_fsroot import ETH0_DEV, ETH0_NET, Content, make_live_root


def temp_leftovers(out: Path) -> list[str]:
    """Temporary capture folders (.NAME.xxxx) left beside `out`."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0344c8c3"
GPU_DEV = "sys/devices/pci0000:00/0000:00:04.0/0000:05:00.0"
IB_DEV = "sys/devices/pci0000:00/0000:00:06.0"
SYSCTL_KEYS = ["net.ipv4.conf.eth0/100.rp_filter", "vm.swappiness", "net.ipv4.tcp_rmem"]

FAKE_FILES: dict[str, Content] = {
    "proc/sys/kernel/hostname": "gpu-node-01\n",
    "proc/sys/kernel/osrelease": "6.8.0-45-generic\n",
    "proc/sys/kernel/numa_balancing": "0\n",
    "proc/sys/kernel/unread_by_anyone": "42\n",
    "proc/sys/vm/zone_reclaim_mode": "0\n",
    "proc/sys/vm/swappiness": "10\n",
    "proc/sys/net/ipv4/tcp_rmem": "4096\t87380\t6291456\n",
    "proc/sys/net/ipv4/conf/eth0.100/rp_filter": "2\n",
    "proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt\n",
    "proc/modules": "nvidia 56823808 120 nvidia_uvm, Live 0xffffffffc0a00000 (POE)\n",
    "proc/driver/nvidia/version":
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\n",
    "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
    "sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise [madvise] never\n",
    "sys/devices/system/node/online": "0-1\n",
    "sys/devices/virtual/dmi/id/sys_vendor": "Supermicro\n",
    "sys/devices/virtual/dmi/id/product_name": "SYS-821GE-TNHR\n",
    "sys/devices/virtual/dmi/id/bios_version": "2.1\n",
    SECURE_BOOT: b"\x06\x00\x00\x00\x01",
    # eth0: a NIC on the root bus, uevent ids
    f"{ETH0_DEV}/uevent": "DRIVER=mlx5_core\nPCI_CLASS=20000\nPCI_ID=15B3:101D\nPCI_SUBSYS_ID=15B3:0016\n",
    f"{ETH0_DEV}/numa_node": "-1\n",
    f"{ETH0_DEV}/current_link_speed": "16.0 GT/s PCIe\n",
    f"{ETH0_DEV}/current_link_width": "16\n",
    f"{ETH0_NET}/mtu": "9000\n",
    f"{ETH0_NET}/operstate": "up\n",
    f"{ETH0_NET}/type": "1\n",
    f"{ETH0_NET}/speed": "200000\n",
    # a GPU behind a bridge, and the bridge (a chipset function)
    "sys/devices/pci0000:00/0000:00:04.0/uevent": "DRIVER=pcieport\nPCI_CLASS=60400\nPCI_ID=8086:352A\n",
    "sys/devices/pci0000:00/0000:00:04.0/numa_node": "0\n",
    f"{GPU_DEV}/uevent": "DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\n",
    f"{GPU_DEV}/numa_node": "1\n",
    f"{GPU_DEV}/max_link_speed": "32.0 GT/s PCIe\n",
    f"{GPU_DEV}/max_link_width": "16\n",
    # an InfiniBand HCA without uevent (attribute-file fallback) and its RDMA device
    f"{IB_DEV}/vendor": "0x15b3\n",
    f"{IB_DEV}/device": "0x101b\n",
    f"{IB_DEV}/class": "0x020700\n",
    f"{IB_DEV}/subsystem_vendor": "0x15b3\n",
    f"{IB_DEV}/subsystem_device": "0x0007\n",
    f"{IB_DEV}/numa_node": "0\n",
    f"{IB_DEV}/net/ib0/mtu": "4092\n",
    f"{IB_DEV}/net/ib0/operstate": "down\n",
    f"{IB_DEV}/net/ib0/type": "32\n",
    f"{IB_DEV}/infiniband/mlx5_0/ports/1/link_layer": "InfiniBand\n",
    "sys/devices/virtual/net/lo/mtu": "65536\n",
    "sys/devices/virtual/net/lo/operstate": "unknown\n",
    "sys/devices/virtual/net/lo/type": "772\n",
    # CPUs
    "sys/devices/system/cpu/online": "0-1\n",
    "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance\n",
    "sys/devices/system/cpu/cpu0/cpufreq/scaling_driver": "intel_pstate\n",
    "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "powersave\n",
    "sys/devices/system/cpu/cpuidle/current_driver": "intel_idle\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state0/name": "POLL\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state0/latency": "0\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state0/disable": "0\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state1/name": "C6\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state1/latency": "170\n",
    "sys/devices/system/cpu/cpu0/cpuidle/state1/disable": "1\n",
    "sys/devices/system/cpu/cpu1/cpuidle/state1/disable": "0\n",
}
FAKE_LINKS = {
    "sys/class/dmi/id": "../../devices/virtual/dmi/id",
    "sys/class/net/eth0": "../../devices/pci0000:00/0000:00:03.0/net/eth0",
    "sys/class/net/ib0": "../../devices/pci0000:00/0000:00:06.0/net/ib0",
    "sys/class/net/lo": "../../devices/virtual/net/lo",
    f"{ETH0_NET}/device": "../../../0000:00:03.0",
    f"{IB_DEV}/net/ib0/device": "../../../0000:00:06.0",
    f"{IB_DEV}/driver": "../../../bus/pci/drivers/mlx5_core",
    "sys/class/infiniband/mlx5_0": "../../devices/pci0000:00/0000:00:06.0/infiniband/mlx5_0",
    f"{IB_DEV}/infiniband/mlx5_0/device": "../../../0000:00:06.0",
    "sys/bus/pci/devices/0000:00:03.0": "../../../devices/pci0000:00/0000:00:03.0",
    "sys/bus/pci/devices/0000:00:04.0": "../../../devices/pci0000:00/0000:00:04.0",
    "sys/bus/pci/devices/0000:05:00.0": "../../../devices/pci0000:00/0000:00:04.0/0000:05:00.0",
    "sys/bus/pci/devices/0000:00:06.0": "../../../devices/pci0000:00/0000:00:06.0",
}
KMSG_LINES = ["6,1,100,-;Linux version 6.8.0", "4,2,200,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module"]


def fake_root(tmp_path: Path, extra_files: dict[str, Content] | None = None,
              extra_links: dict[str, str] | None = None) -> Path:
    return make_live_root(tmp_path / "root", {**FAKE_FILES, **(extra_files or {})},
                          {**FAKE_LINKS, **(extra_links or {})})


def kmsg_file(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("".join(line + "\n" for line in KMSG_LINES), encoding="utf-8")
    return path


def assert_same_facts(replayed: object, live: object) -> None:
    """Field by field, so a failure names the fact that did not survive the round trip."""
    assert dataclasses.is_dataclass(live)
    for field in dataclasses.fields(live):
        assert getattr(replayed, field.name) == getattr(live, field.name), field.name


class FailingLiveFs(LiveFs):
    """A live root where some reads fail with a chosen errno (we run as root: chmod won't do)."""

    def __init__(self, root: str, failures: dict[str, int]) -> None:
        super().__init__(root)
        self.failures = failures

    def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
        code = self.failures.get(path)
        if code is not None:
            raise OSError(code, os.strerror(code), path)
        return super().read_bytes(path, limit)


def test_capture_replays_exactly_what_was_read(tmp_path: Path) -> None:
    """read_host_facts over the snapshot equals read_host_facts over the live fake root."""
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    captured = capture_live(out, SYSCTL_KEYS, root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    assert captured == ["host", "kmsg"]

    keys = [*SYSCTL_KEYS, *CAPTURE_SYSCTLS]
    live = read_host_facts(LiveFs(str(root)), keys)
    replayed = read_host_facts(SnapshotFs(out), keys)
    assert_same_facts(replayed, live)

    # The fake root really was read (guards against two equally empty results).
    assert live.hostname == "gpu-node-01"
    assert live.sysctl["net.ipv4.conf.eth0/100.rp_filter"] == "2"
    assert live.sysctl["net.ipv4.tcp_rmem"] == "4096 87380 6291456"
    assert live.dmi["product_name"] == "SYS-821GE-TNHR"
    assert live.secure_boot == "enabled"
    assert live.nvidia_driver == "550.90.07"
    assert not isinstance(live.pci, Unknown)
    by_address = {f.address: f for f in live.pci}
    assert sorted(by_address) == ["0000:00:03.0", "0000:00:04.0", "0000:00:06.0", "0000:05:00.0"]
    assert by_address["0000:05:00.0"].parent == "0000:00:04.0"
    assert by_address["0000:05:00.0"].numa_node == 1
    assert by_address["0000:00:06.0"].driver == "mlx5_core"
    assert not isinstance(live.interfaces, Unknown)
    ifaces = {i.name: i for i in live.interfaces}
    assert sorted(ifaces) == ["eth0", "ib0", "lo"]
    assert (ifaces["eth0"].pci_address, ifaces["eth0"].speed_mbps) == ("0000:00:03.0", 200000)
    assert (ifaces["ib0"].rdma_device, ifaces["ib0"].link_layer) == ("mlx5_0", "InfiniBand")
    assert live.cpu.governors == {"performance": (0,), "powersave": (1,)}

    # Only what was read is stored, as plain files: links live in fs_links.json.
    fs_dir = out / "fs"
    assert (fs_dir / "proc/sys/kernel/hostname").read_text() == "gpu-node-01\n"
    assert not (fs_dir / "proc/sys/kernel/unread_by_anyone").exists()
    assert (fs_dir / SECURE_BOOT).read_bytes() == b"\x06\x00\x00\x00\x01"
    assert [p for p in fs_dir.rglob("*") if p.is_symlink()] == []
    links = json.loads((out / "fs_links.json").read_text())
    for link in ("sys/class/net/eth0", "sys/class/dmi/id", "sys/bus/pci/devices/0000:05:00.0",
                 f"{ETH0_NET}/device", "sys/class/infiniband/mlx5_0", f"{IB_DEV}/driver"):
        assert links[link] == FAKE_LINKS[link], link
    assert not (out / "fs_errors.json").exists()  # absent files (ENOENT) are not errors
    assert temp_leftovers(out) == []


def test_capture_meta_and_kmsg(tmp_path: Path) -> None:
    """meta.yaml names the host and sources; kmsg.txt starts with the first kernel record."""
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    meta = (out / "meta.yaml").read_text()
    assert "hostname: gpu-node-01" in meta
    assert "- host" in meta and "- kmsg" in meta
    assert (out / "kmsg.txt").read_text().splitlines()[0] == KMSG_LINES[0]


def test_capture_keeps_every_record_of_a_regular_kmsg_file(tmp_path: Path) -> None:
    """kmsg_device exists so tests can pass a regular file; every record in it must be kept.

    /dev/kmsg returns one record per read(), but a regular file returns all lines at once.
    """
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    assert (out / "kmsg.txt").read_text().splitlines() == KMSG_LINES


def test_capture_without_kmsg_notes_why(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    captured = capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(tmp_path / "no-kmsg"))
    assert captured == ["host"]
    assert not (out / "kmsg.txt").exists()
    assert "kmsg not captured" in (out / "meta.yaml").read_text()


def test_capture_records_and_replays_errno(tmp_path: Path) -> None:
    """A read that failed live (EACCES, EINVAL) fails the same way on replay."""
    root = fake_root(tmp_path)
    live_fs = FailingLiveFs(str(root), {
        "/sys/class/dmi/id/product_name": errno.EACCES,
        "/sys/class/net/eth0/speed": errno.EINVAL,
    })
    out = tmp_path / "out"
    capture_live(out, [], root=live_fs, kmsg_device=str(kmsg_file(tmp_path)))
    errors = json.loads((out / "fs_errors.json").read_text())
    assert errors == {
        "sys/devices/virtual/dmi/id/product_name": "EACCES",
        f"{ETH0_NET}/speed": "EINVAL",
    }
    assert not (out / "fs/sys/devices/virtual/dmi/id/product_name").exists()

    live = read_host_facts(live_fs, CAPTURE_SYSCTLS)
    replayed = read_host_facts(SnapshotFs(out), CAPTURE_SYSCTLS)
    assert_same_facts(replayed, live)
    assert replayed.dmi["product_name"] == Unknown(
        "/sys/class/dmi/id/product_name is not readable by this user (needs root)")
    assert not isinstance(replayed.interfaces, Unknown)
    assert replayed.interfaces[0].name == "eth0"
    assert replayed.interfaces[0].speed_mbps is None


def test_capture_replays_efi_without_efivarfs(tmp_path: Path) -> None:
    """UEFI boot with efivarfs unmounted must not turn into 'unsupported' on replay.

    Live, read_secure_boot asks is_dir(/sys/firmware/efi) and is_dir(.../efivars); the
    recording must keep enough for the snapshot to give the same answers.
    """
    files = {k: v for k, v in FAKE_FILES.items() if k != SECURE_BOOT}
    root = make_live_root(tmp_path / "root", {**files, "sys/firmware/efi/runtime": "\n"}, FAKE_LINKS)
    out = tmp_path / "out"
    capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    live = read_secure_boot(LiveFs(str(root)))
    assert isinstance(live, Unknown) and "efivarfs" in live.reason
    assert read_secure_boot(SnapshotFs(out)) == live


def test_capture_replays_bond_interfaces(tmp_path: Path) -> None:
    """is_bond comes from is_dir(<iface>/bonding): a captured bond must still be a bond."""
    root = fake_root(
        tmp_path,
        extra_files={
            "sys/devices/virtual/net/bond0/mtu": "9000\n",
            "sys/devices/virtual/net/bond0/operstate": "up\n",
            "sys/devices/virtual/net/bond0/bonding/mode": "802.3ad 4\n",
        },
        extra_links={
            "sys/class/net/bond0": "../../devices/virtual/net/bond0",
            f"{ETH0_NET}/master": "../../../../virtual/net/bond0",
        },
    )
    out = tmp_path / "out"
    capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    live = read_interfaces(LiveFs(str(root)))
    assert not isinstance(live, Unknown)
    by_name = {i.name: i for i in live}
    assert by_name["bond0"].is_bond is True
    assert by_name["eth0"].bond_master == "bond0"
    assert read_interfaces(SnapshotFs(out)) == live


def test_capture_refuses_a_non_empty_output_dir(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep-me.txt").write_text("precious")
    with pytest.raises(SnapshotError, match="refusing to overwrite"):
        capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    assert [p.name for p in out.iterdir()] == ["keep-me.txt"]
    assert temp_leftovers(out) == []


def test_capture_into_an_existing_empty_dir(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg_file(tmp_path)))[0] == "host"
    assert (out / "meta.yaml").is_file()
    assert temp_leftovers(out) == []


def test_failed_capture_leaves_nothing_behind(tmp_path: Path) -> None:
    """An exception mid-capture removes the temporary folder and creates no output."""

    class Boom(LiveFs):
        def read_bytes(self, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
            if path == "/proc/modules":
                raise RuntimeError("disk on fire")
            return super().read_bytes(path, limit)

    root = fake_root(tmp_path)
    out = tmp_path / "nested" / "out"
    out.parent.mkdir()  # a missing folder is refused before anything is read (tests/unit/io/test_fsutil.py)
    with pytest.raises(RuntimeError, match="disk on fire"):
        capture_live(out, [], root=Boom(str(root)), kmsg_device=str(kmsg_file(tmp_path)))
    assert not out.exists()
    assert temp_leftovers(out) == []


def test_recording_fs_stores_canonical_paths(tmp_path: Path) -> None:
    """Files land at their link-resolved path; every link on the way is remembered."""
    root = fake_root(tmp_path)
    rec = RecordingFs(LiveFs(str(root)))
    assert rec.description == f"live:{root}"
    assert rec.read_bytes("/sys/class/net/eth0/device/numa_node") == b"-1\n"
    assert rec.files == {f"{ETH0_DEV}/numa_node": b"-1\n"}
    assert rec.links == {
        "sys/class/net/eth0": FAKE_LINKS["sys/class/net/eth0"],
        f"{ETH0_NET}/device": FAKE_LINKS[f"{ETH0_NET}/device"],
    }
    assert rec.listdir("/sys/class/infiniband/mlx5_0/ports") == ["1"]
    assert f"{IB_DEV}/infiniband/mlx5_0/ports/1" in rec.dirs
    with pytest.raises(FileNotFoundError):
        rec.read_bytes("/proc/absent")
    assert rec.errors == {}
