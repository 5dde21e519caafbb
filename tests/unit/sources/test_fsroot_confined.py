"""SnapshotFs's two ways of staying inside fs/: one confined openat2 per file, or the O_NOFOLLOW
component walk (kernels without openat2). Both must read the same bytes and refuse the same
entries, and neither may open a FIFO, socket or device, nor follow a real symlink."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.sources import openat2
from agent.sources.fsroot import MAX_FILE_BYTES
from agent.sources.fsroot_snapshot import RefusedEntry, SnapshotFs
from tests.unit.sources.test_fsroot import SYSFS_LINKS, make_snapshot

SECRET = "not-for-the-auditor"


def root_has_openat2() -> bool:
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return openat2.available(root)
    finally:
        os.close(root)


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "walk":
        monkeypatch.setitem(openat2._state, "call", False)  # as on a kernel without openat2
    else:
        assert root_has_openat2(), "this kernel lacks openat2 (Linux 5.6+)"
    yield request.param


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name SnapshotFs hands to an open call, in either mode."""
    names: list[str] = []
    real_open, real_beneath = os.open, openat2.opener()  # None in the walk mode (fixture `mode` runs first)

    def spy_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        names.append(os.fsdecode(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def spy_beneath(dir_fd: int, path: str, flags: int) -> int:
        names.append("openat2:" + path)
        assert real_beneath is not None
        return real_beneath(dir_fd, path, flags)

    monkeypatch.setattr(os, "open", spy_open)
    if real_beneath is not None:
        monkeypatch.setattr(openat2, "opener", lambda: spy_beneath)
    return names


def snapshot(tmp_path: Path) -> Path:
    files = {
        "sys/devices/pci0000:00/0000:00:03.0/net/eth0/mtu": "9000\n",
        "sys/devices/pci0000:00/0000:00:03.0/uevent": "DRIVER=mlx5_core\nPCI_ID=15B3:101D\n",
        "sys/class/net/.keep": "",
        "proc/sys/vm/zone_reclaim_mode": "0\n",
        "proc/sys/vm/empty": "",
        "proc/sys/vm/exact": "x" * 65536,
    }
    return make_snapshot(tmp_path, files, SYSFS_LINKS)


def test_both_ways_read_the_same_tree(tmp_path: Path, mode: str) -> None:
    fs = SnapshotFs(snapshot(tmp_path))
    assert (fs._root_fd is not None) == (mode == "openat2")
    assert fs.read_bytes("/sys/class/net/eth0/mtu") == b"9000\n"  # through two recorded links
    assert fs.read_bytes("/sys/class/net/eth0/device/uevent").startswith(b"DRIVER=mlx5_core")
    assert fs.read_bytes("/proc/sys/vm/empty") == b""
    assert fs.read_bytes("/proc/sys/vm/exact") == b"x" * 65536
    assert fs.read_bytes("/proc/sys/vm/exact", 10) == b"x" * 10
    assert fs.listdir("/sys/class/net") == ["eth0"]
    assert fs.listdir("/sys/class/net/eth0") == ["device", "mtu"]  # a recorded link is listed too
    assert fs.is_dir("/sys/class/net/eth0") and not fs.is_dir("/proc/sys/vm/empty")
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("/proc/sys/vm/absent")


def test_the_fast_path_is_the_one_used_where_the_kernel_has_it(tmp_path: Path, mode: str,
                                                               opened: list[str]) -> None:
    fs = SnapshotFs(snapshot(tmp_path))
    opened.clear()
    fs.read_bytes("/proc/sys/vm/zone_reclaim_mode")
    if mode == "openat2":
        assert opened == ["openat2:proc/sys/vm/zone_reclaim_mode"]  # one call, whatever the depth
    else:
        assert "zone_reclaim_mode" in opened and not any(n.startswith("openat2:") for n in opened)


def test_a_whole_file_over_the_cap_is_refused(tmp_path: Path, mode: str) -> None:
    snap = snapshot(tmp_path)
    (snap / "fs/proc/sys/vm/big").write_bytes(b"1\n" + b"0" * MAX_FILE_BYTES)
    fs = SnapshotFs(snap)
    with pytest.raises(OSError) as caught:
        fs.read_bytes("/proc/sys/vm/big")
    assert caught.value.errno == errno.EFBIG
    assert fs.read_bytes("/proc/sys/vm/big", 2) == b"1\n"


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_real_symlink_is_refused_by_name_and_never_followed(tmp_path: Path, mode: str, where: str) -> None:
    outside = tmp_path / "outside"
    (outside / "vm").mkdir(parents=True)
    (outside / "vm" / "zone_reclaim_mode").write_text(SECRET)
    snap = snapshot(tmp_path)
    if where == "last":
        target = snap / "fs/proc/sys/vm/zone_reclaim_mode"
        target.unlink()
        target.symlink_to(outside / "vm" / "zone_reclaim_mode")
    else:
        folder = snap / "fs/proc/sys/vm"
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
        folder.symlink_to(outside / "vm")
    fs = SnapshotFs(snap)
    with pytest.raises(RefusedEntry) as caught:
        fs.read_bytes("/proc/sys/vm/zone_reclaim_mode")
    assert "symlink inside the snapshot" in str(caught.value)
    assert ("fs/proc/sys/vm/zone_reclaim_mode" if where == "last" else "fs/proc/sys/vm") in str(caught.value)
    if where == "middle":
        with pytest.raises(RefusedEntry):
            fs.listdir("/proc/sys/vm")
        assert not fs.is_dir("/proc/sys/vm")


def plant(snap: Path, kind: str) -> Path:
    entry = snap / "fs/proc/sys/vm/zone_reclaim_mode"
    entry.unlink()
    if kind == "FIFO":
        os.mkfifo(entry)
    else:  # a /dev/null of its own: creating device nodes needs root (CAP_MKNOD); CI runs as root
        assert os.geteuid() == 0, "creating a device node needs root (CAP_MKNOD)"
        os.mknod(entry, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return entry


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_fifos_and_devices_are_refused_without_being_opened(tmp_path: Path, mode: str, kind: str,
                                                            opened: list[str]) -> None:
    snap = snapshot(tmp_path)
    plant(snap, kind)
    fs = SnapshotFs(snap)
    opened.clear()
    with pytest.raises(RefusedEntry) as caught:
        fs.read_bytes("/proc/sys/vm/zone_reclaim_mode")
    assert f"is a {kind}, not a regular file (not opened)" in str(caught.value)
    assert not [n for n in opened if n.endswith("zone_reclaim_mode")], opened


def test_an_entry_swapped_after_its_check_is_refused_on_the_descriptor(tmp_path: Path, mode: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The type check before the open races with a swap; the check on the descriptor does not."""
    snap = snapshot(tmp_path)
    plant(snap, "FIFO")
    fs = SnapshotFs(snap)
    real_stat = os.stat

    def stale_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        result = real_stat(path, *args, **kwargs)
        if os.fsdecode(path).endswith("zone_reclaim_mode"):  # what the check saw before the swap
            return os.stat_result((stat.S_IFREG | 0o644, *tuple(result)[1:]))
        return result

    monkeypatch.setattr(os, "stat", stale_stat)
    with pytest.raises(RefusedEntry) as caught:
        fs.read_bytes("/proc/sys/vm/zone_reclaim_mode")
    assert "not a regular file" in str(caught.value)


def test_openat2_refuses_symlinks_and_steps_out(tmp_path: Path) -> None:
    (tmp_path / "inside").mkdir()
    (tmp_path / "secret").write_text(SECRET)
    (tmp_path / "inside" / "link").symlink_to(tmp_path / "secret")
    folder = os.open(tmp_path / "inside", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as link:
            openat2.open_beneath(folder, "link", os.O_RDONLY)
        with pytest.raises(OSError) as out:
            openat2.open_beneath(folder, "../secret", os.O_RDONLY)
        with pytest.raises(OSError) as absolute:
            openat2.open_beneath(folder, str(tmp_path / "secret"), os.O_RDONLY)
    finally:
        os.close(folder)
    assert link.value.errno == errno.ELOOP
    assert out.value.errno == errno.EXDEV and absolute.value.errno == errno.EXDEV


def test_without_openat2_the_call_says_enosys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(openat2._state, "call", False)
    assert not root_has_openat2()
    with pytest.raises(OSError) as caught:
        openat2.open_beneath(0, "x", os.O_RDONLY)
    assert caught.value.errno == errno.ENOSYS
