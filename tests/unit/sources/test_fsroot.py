"""File-system roots: SnapshotFs link resolution and LiveFs on a fake root (capture/replay: test_fsroot_capture)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from agent.core.errors import SnapshotError
from agent.core.model import Unknown
from agent.sources.fsroot import LiveFs, read_text
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.host import read_interfaces
from tests.factories import write_tree

Content = str | bytes

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def make_snapshot(tmp_path: Path, files: dict[str, Content], links: dict[str, str] | None = None,
                  errors: dict[str, str] | None = None) -> Path:
    """A snapshot directory in the recorded layout: fs/, fs_links.json, fs_errors.json."""
    snap = tmp_path / "snap"
    (snap / "fs").mkdir(parents=True)
    write_tree(snap / "fs", files)
    if links is not None:
        (snap / SnapshotFs.LINKS_FILE).write_text(json.dumps(links), encoding="utf-8")
    if errors is not None:
        (snap / SnapshotFs.ERRORS_FILE).write_text(json.dumps(errors), encoding="utf-8")
    return snap


def make_live_root(base: Path, files: dict[str, Content], links: dict[str, str]) -> Path:
    """A fake root with real files and real symlinks ({link path: target})."""
    base.mkdir(parents=True, exist_ok=True)
    write_tree(base, files)
    for rel, target in links.items():
        link = base / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    return base


# ---------------------------------------------------------------------------------------------
# SnapshotFs: link resolution
# ---------------------------------------------------------------------------------------------

ETH0_DEV = "sys/devices/pci0000:00/0000:00:03.0"
ETH0_NET = f"{ETH0_DEV}/net/eth0"
SYSFS_LINKS = {
    "sys/class/net/eth0": "../../devices/pci0000:00/0000:00:03.0/net/eth0",
    f"{ETH0_NET}/device": "../../../0000:00:03.0",
    f"{ETH0_DEV}/driver": "../../../bus/pci/drivers/mlx5_core",
    "sys/bus/pci/devices/0000:00:03.0": "../../../devices/pci0000:00/0000:00:03.0",
}


def sysfs_snapshot(tmp_path: Path, errors: dict[str, str] | None = None) -> SnapshotFs:
    files: dict[str, Content] = {
        f"{ETH0_NET}/mtu": "9000\n",
        f"{ETH0_NET}/operstate": "up\n",
        f"{ETH0_DEV}/uevent": "DRIVER=mlx5_core\nPCI_ID=15B3:101D\n",
        f"{ETH0_DEV}/numa_node": "1\n",
        "sys/class/net/.keep": "",
        "sys/class/net/bonding_masters": "\n",
    }
    return SnapshotFs(make_snapshot(tmp_path, files, SYSFS_LINKS, errors))


def test_link_in_the_middle_of_a_path(tmp_path: Path) -> None:
    """/sys/class/net/eth0/mtu is read through the eth0 link to the device directory."""
    fs = sysfs_snapshot(tmp_path)
    assert fs.read_bytes("/sys/class/net/eth0/mtu") == b"9000\n"
    assert read_text(fs, "/sys/bus/pci/devices/0000:00:03.0/numa_node") == "1\n"


def test_two_links_in_one_path(tmp_path: Path) -> None:
    """class/net/eth0 -> .../net/eth0, then its `device` link -> the PCI function."""
    fs = sysfs_snapshot(tmp_path)
    assert fs.read_bytes("/sys/class/net/eth0/device/numa_node") == b"1\n"
    assert fs.read_bytes("/sys/class/net/eth0/device/uevent").startswith(b"DRIVER=mlx5_core")


def test_absolute_link_target_resolves_inside_the_snapshot(tmp_path: Path) -> None:
    """An absolute target starts again at the snapshot's root, not the host's."""
    snap = make_snapshot(
        tmp_path,
        {"sys/devices/virtual/dmi/id/sys_vendor": "Supermicro\n"},
        {"sys/class/dmi/id": "/sys/devices/virtual/dmi/id"},
    )
    assert SnapshotFs(snap).read_bytes("/sys/class/dmi/id/sys_vendor") == b"Supermicro\n"


def test_link_to_a_link_and_to_a_file(tmp_path: Path) -> None:
    """Chains resolve fully; a link may name a file, not only a directory."""
    snap = make_snapshot(
        tmp_path,
        {"data/real.txt": "payload"},
        {"a/first": "../b/second", "b/second": "/data", "c/file": "../data/real.txt"},
    )
    fs = SnapshotFs(snap)
    assert fs.read_bytes("/a/first/real.txt") == b"payload"
    assert fs.read_bytes("/c/file") == b"payload"


def test_dotdot_is_clamped_at_the_snapshot_root(tmp_path: Path) -> None:
    """No path or link target can climb out of fs/ (a snapshot is untrusted input)."""
    (tmp_path / "outside.txt").write_text("host secret")  # sibling of snap/
    snap = make_snapshot(
        tmp_path,
        {"etc/hostname": "inside\n"},
        {"sys/escape": "../../../../../../../etc", "sys/up": "../../../outside.txt"},
    )
    fs = SnapshotFs(snap)
    assert fs.read_bytes("/../../../etc/hostname") == b"inside\n"
    assert fs.read_bytes("/sys/escape/hostname") == b"inside\n"
    assert fs.read_bytes("/proc/../../etc/hostname") == b"inside\n"
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("/sys/up")  # clamped to fs/outside.txt, which does not exist
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("/../outside.txt")


def test_dotdot_after_a_link_is_physical(tmp_path: Path) -> None:
    """As in the kernel, `..` after a link goes to the parent of the link's target."""
    fs = sysfs_snapshot(tmp_path)
    assert fs.read_bytes("/sys/class/net/eth0/../../numa_node") == b"1\n"


@pytest.mark.parametrize("links", [
    {"a": "b", "b": "a"},
    {"a": "a"},
    {"a": "x/y", "x": "/a"},
])
def test_link_loop_raises_eloop(tmp_path: Path, links: dict[str, str]) -> None:
    """A cycle in fs_links.json ends with ELOOP instead of recursing forever."""
    fs = SnapshotFs(make_snapshot(tmp_path, {"real/": ""}, links))
    for path in ("/a", "/a/file"):
        with pytest.raises(OSError, match="Too many levels") as info:
            fs.read_bytes(path)
        assert info.value.errno == errno.ELOOP


def test_long_but_finite_link_chain_resolves(tmp_path: Path) -> None:
    """Thirty hops are fine: only a real loop hits the hop limit."""
    links = {f"l{i}": f"l{i + 1}" for i in range(30)}
    links["l30"] = "/target"
    fs = SnapshotFs(make_snapshot(tmp_path, {"target": "end"}, links))
    assert fs.read_bytes("/l0") == b"end"


def test_listdir_is_union_of_entries_and_link_names(tmp_path: Path) -> None:
    """Link names show up in listings; the `.keep` placeholder never does."""
    fs = sysfs_snapshot(tmp_path)
    assert fs.listdir("/sys/class/net") == ["bonding_masters", "eth0"]
    # Listing through a link shows the target's files plus the links stored under it.
    assert fs.listdir("/sys/class/net/eth0") == ["device", "mtu", "operstate"]
    assert fs.listdir("/sys/bus/pci/devices") == ["0000:00:03.0"]  # only links, no fs/ dir


def test_listdir_of_keep_only_and_missing_directories(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path, {"sys/class/infiniband/.keep": ""}, {})
    fs = SnapshotFs(snap)
    assert fs.listdir("/sys/class/infiniband") == []
    with pytest.raises(FileNotFoundError) as info:
        fs.listdir("/sys/class/nope")
    assert info.value.filename == "/sys/class/nope"


def test_readlink_of_a_link_reached_through_another_link(tmp_path: Path) -> None:
    """readlink returns the stored target text, resolving only the parent."""
    fs = sysfs_snapshot(tmp_path)
    assert fs.readlink("/sys/class/net/eth0") == "../../devices/pci0000:00/0000:00:03.0/net/eth0"
    assert fs.readlink("/sys/class/net/eth0/device") == "../../../0000:00:03.0"
    assert fs.readlink("/sys/class/net/eth0/device/driver") == "../../../bus/pci/drivers/mlx5_core"
    with pytest.raises(OSError) as info:
        fs.readlink("/sys/class/net/eth0/mtu")
    assert info.value.errno == errno.EINVAL


def test_is_dir_through_links(tmp_path: Path) -> None:
    fs = sysfs_snapshot(tmp_path)
    assert fs.is_dir("/sys/class/net/eth0")
    assert fs.is_dir("/sys/bus/pci/devices")  # holds only links
    assert not fs.is_dir("/sys/class/net/eth0/mtu")
    assert not fs.is_dir("/sys/class/net/eth9")


def test_recorded_errno_is_replayed(tmp_path: Path) -> None:
    """fs_errors.json turns a read into the errno seen live, under the path asked for."""
    fs = sysfs_snapshot(tmp_path, errors={
        f"{ETH0_NET}/speed": "EINVAL",
        f"{ETH0_DEV}/numa_node": "EACCES",
        "/sys/class/infiniband/": "EPERM",
        f"{ETH0_NET}/carrier": "ENOTANERRNO",
    })
    with pytest.raises(OSError) as info:
        fs.read_bytes("/sys/class/net/eth0/speed")
    assert (info.value.errno, info.value.filename) == (errno.EINVAL, "/sys/class/net/eth0/speed")
    with pytest.raises(PermissionError) as perm:
        fs.read_bytes("/sys/bus/pci/devices/0000:00:03.0/numa_node")  # the file exists in fs/
    assert perm.value.errno == errno.EACCES
    with pytest.raises(OSError) as listing:
        fs.listdir("/sys/class/infiniband")  # keys are stored without slashes
    assert listing.value.errno == errno.EPERM
    with pytest.raises(OSError) as odd:
        fs.read_bytes("/sys/class/net/eth0/carrier")
    assert odd.value.errno == errno.EIO  # an unknown errno name degrades to EIO


@pytest.mark.parametrize("text", ["{not json", "[]", '{"a": 1}', '{"a": ["b"]}'])
@pytest.mark.parametrize("name", [SnapshotFs.LINKS_FILE, SnapshotFs.ERRORS_FILE])
def test_malformed_map_file_is_a_snapshot_error_naming_it(tmp_path: Path, name: str, text: str) -> None:
    snap = make_snapshot(tmp_path, {"x": ""})
    (snap / name).write_text(text, encoding="utf-8")
    with pytest.raises(SnapshotError) as info:
        SnapshotFs(snap)
    assert info.value.path == str(snap / name)
    assert name in str(info.value)


def test_snapshot_without_fs_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no fs/ directory"):
        SnapshotFs(tmp_path)


def test_snapshot_read_limit_and_relative_path(tmp_path: Path) -> None:
    fs = SnapshotFs(make_snapshot(tmp_path, {"big": b"x" * 200_000}))
    assert len(fs.read_bytes("/big")) == 200_000
    assert fs.read_bytes("/big", limit=70_000) == b"x" * 70_000
    with pytest.raises(ValueError, match="not an absolute path"):
        fs.read_bytes("big")


def test_interfaces_on_a_looping_link_do_not_crash_the_reader(tmp_path: Path) -> None:
    """host.py promises never to raise for bad data; a looping interface link is bad data.

    LiveFs.is_dir (os.path.isdir) answers False on ELOOP; SnapshotFs.is_dir must not raise either.
    """
    live_root = make_live_root(tmp_path / "root", {}, {"sys/class/net/eth0": "eth0"})
    snapshot = make_snapshot(tmp_path, {"sys/class/net/.keep": ""}, {"sys/class/net/eth0": "eth0"})
    for fs in (LiveFs(str(live_root)), SnapshotFs(snapshot)):
        interfaces = read_interfaces(fs)
        assert not isinstance(interfaces, Unknown)
        assert [i.name for i in interfaces] == ["eth0"]
        assert isinstance(interfaces[0].mtu, Unknown)
        assert interfaces[0].is_bond is False


# ---------------------------------------------------------------------------------------------
# LiveFs with a non-"/" root
# ---------------------------------------------------------------------------------------------


def test_livefs_on_a_fake_root(tmp_path: Path) -> None:
    """Reads, listings, links and realpath all stay relative to the given root."""
    root = make_live_root(tmp_path / "root", {f"{ETH0_NET}/mtu": "1500\n", "proc/cmdline": "ro\n"},
                          {"sys/class/net/eth0": "../../devices/pci0000:00/0000:00:03.0/net/eth0",
                           f"{ETH0_NET}/device": "../../../0000:00:03.0"})
    fs = LiveFs(str(root))
    assert fs.description == f"live:{root}"
    assert fs.read_bytes("/sys/class/net/eth0/mtu") == b"1500\n"
    assert fs.read_bytes("/proc/cmdline", limit=1) == b"r"
    assert fs.listdir("/sys/class/net/eth0") == ["device", "mtu"]
    assert fs.readlink("/sys/class/net/eth0/device") == "../../../0000:00:03.0"
    assert fs.realpath("/sys/class/net/eth0") == f"/{ETH0_NET}"
    assert fs.realpath("/sys/class/net/eth0/device") == f"/{ETH0_DEV}"
    assert fs.realpath("/") == "/"
    assert fs.is_dir("/sys/class/net/eth0")
    assert not fs.is_dir("/proc/cmdline")
    with pytest.raises(ValueError, match="not an absolute path"):
        fs.read_bytes("proc/cmdline")
    with pytest.raises(ValueError, match="not an absolute path"):
        fs.read_bytes("/proc/cmd\x00line")


def test_livefs_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    """A FIFO with no writer reads as empty instead of hanging the audit."""
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "fifo")
    assert LiveFs(str(root)).read_bytes("/fifo") == b""
