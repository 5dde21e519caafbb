"""`snapshot import` of trees that keep their links (issue 15): a sysfs capture (`tar czf ib.tgz /sys/class/infiniband
/sys/devices/...`) and a real sos report hold mostly symlinks. Links are never followed on this machine: each reaches
the importer as its target's text and becomes a recorded link (fs_links.json) that SnapshotFs resolves inside the
snapshot. The trees are synthetic, built here: an mlx5 node with two ConnectX-7 HCAs as the kernel lays them out."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.sources.fsroot_snapshot import SnapshotFs
from tests.conftest import REPO, RunCli

SECRET = "nodewarden-secret-6d1f0c2b9a"  # planted outside every input: must never reach a snapshot or a report
PCI = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0"
HCAS = {"mlx5_0": ("0000:1a:00.0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "a088:c203:0045:1e2a"),
        "mlx5_1": ("0000:1a:00.1", "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)", "a088:c203:0045:1e2b")}
COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards", "link_error_recovery")
SOS = REPO / "fixtures" / "sosreport" / "sosreport-gpu-node-07-2024-11-05-qxbzkta"


def _sysfs_tree(root: Path) -> Path:
    """/sys of two mlx5 HCAs as the kernel lays it out: class entries are links into the PCI devices' folders."""
    for name, (bdf, state, phys, rate, guid) in HCAS.items():
        dev = root / PCI / bdf
        hca = dev / "infiniband" / name
        port = hca / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        files = {hca / "hca_type": "MT4129", hca / "fw_ver": "28.39.1002", hca / "node_guid": guid,
                 hca / "board_id": "MT_0000000838", port / "state": state, port / "phys_state": phys,
                 port / "rate": rate, port / "link_layer": "InfiniBand", dev / "vendor": "0x15b3",
                 dev / "device": "0x1021", dev / "numa_node": "0"}
        files.update({port / "counters" / c: "0" for c in COUNTERS})
        for path, text in files.items():
            path.write_text(text + "\n")
        os.symlink(f"../../../{bdf}", hca / "device")
        os.symlink("../../../../../../bus/pci/drivers/mlx5_core", dev / "driver")
        (root / "sys/class/infiniband").mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../{PCI.removeprefix('sys/')}/{bdf}/infiniband/{name}", root / "sys/class/infiniband" / name)
    return root


def _members(root: Path) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
    """What GNU tar stores for `root`'s sys/: folders, links as links, each sysfs file declared 4096 bytes and padded
    with NULs (sysfs says 4096 for every attribute, tar pads what it read up to that)."""
    for path in sorted((root / "sys").rglob("*")):
        info = tarfile.TarInfo(path.relative_to(root).as_posix())
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield info, None
        elif stat.S_ISDIR(mode):
            info.type = tarfile.DIRTYPE
            yield info, None
        else:
            data = path.read_bytes().ljust(4096, b"\x00")
            info.size = len(data)
            yield info, data


def _tarball(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> tuple[dict[str, Any], str]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text()), result.stdout + result.stderr


def _audit(run_cli: RunCli, out: Path, config: Path, *extra: str) -> tuple[dict[str, Any], str]:
    result = run_cli("audit", "--snapshot", str(out), "--config", str(config), "--format", "json", *extra)
    assert result.code in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result.stdout + result.stderr


def _by_name(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"].split(":", 1)[-1]: e for e in meta["inputs"]}


def _never_leaked(out: Path, *texts: str) -> None:
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for text in texts:
        assert SECRET not in text


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "etc").mkdir(parents=True)
    secret = outside / "etc" / "passwd"
    secret.write_text(f"root:{SECRET}:0:0\n")
    return secret


# --- a sysfs capture ------------------------------------------------------------------------------


def test_a_sysfs_infiniband_tarball_with_its_links_is_judged_as_the_live_tree(run_cli: RunCli, tmp_path: Path,
                                                                              empty_config: Path) -> None:
    tree = _sysfs_tree(tmp_path / "node")
    archive = _tarball(tmp_path / "ib.tgz", list(_members(tree)))
    out = tmp_path / "snap"
    meta, shown = _import(run_cli, out, archive)
    inputs = _by_name(meta)
    assert not [e for e in meta["inputs"] if e.get("error")], meta["inputs"]
    link = inputs["sys/class/infiniband/mlx5_0"]
    assert link["kind"] == "sysfs-tree" and link["link"].endswith("/0000:1a:00.0/infiniband/mlx5_0")
    assert link["contributed"][0].startswith("/sys/class/infiniband/mlx5_0 -> ../../devices/pci0000:15/")
    state = inputs[f"{PCI}/0000:1a:00.1/infiniband/mlx5_1/ports/1/state"]
    assert state["kind"] == "sysfs-tree" and any("NUL byte(s)" in s for s in state["skipped"])
    assert meta["captured"] == ["host"] and {"rdma", "pci"} <= set(meta["host_parts"])
    links = json.loads((out / "fs_links.json").read_text())
    assert links["sys/class/infiniband/mlx5_1"] == f"../../{PCI.removeprefix('sys/')}/0000:1a:00.1/infiniband/mlx5_1"
    assert links[f"{PCI}/0000:1a:00.0/infiniband/mlx5_0/device"] == "../../../0000:1a:00.0"
    fs = SnapshotFs(out)
    assert fs.listdir("/sys/class/infiniband") == ["mlx5_0", "mlx5_1"]
    assert fs.read_bytes("/sys/class/infiniband/mlx5_1/ports/1/state") == b"1: DOWN\n"  # the padding dropped
    assert fs.read_bytes("/sys/class/infiniband/mlx5_0/device/vendor") == b"0x15b3\n"

    report, _text = _audit(run_cli, out, empty_config, "--profile", "gb200-nvl-tray")
    findings = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert findings[("ib.port.state", "mlx5_1/1")]["status"] == "fail"
    assert "1: DOWN" not in findings[("ib.port.state", "mlx5_1/1")]["message"]  # parsed, as the live reader does
    assert "DOWN/Disabled" in findings[("ib.port.state", "mlx5_1/1")]["message"]
    assert findings[("ib.port.state", "mlx5_0/1")]["status"] == "pass"
    assert findings[("ib.port.errors", "mlx5_0/1")]["status"] == "pass"
    assert findings[("ib.hca.count", "node")]["status"] == "fail"  # 2 of the tray's 4 rails: judged, not skipped
    assert "imported host into" in shown


def test_the_same_tree_as_a_folder_and_as_a_zip_gives_the_same_links(run_cli: RunCli, tmp_path: Path) -> None:
    tree = _sysfs_tree(tmp_path / "node")
    zipped = tmp_path / "ib.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for path in sorted((tree / "sys").rglob("*")):
            name = path.relative_to(tree).as_posix()
            if path.is_symlink():
                info = zipfile.ZipInfo(name)
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                archive.writestr(info, os.readlink(path))
            elif path.is_file():
                archive.writestr(name, path.read_bytes())
    expected = None
    for given in (tree, zipped):
        out = tmp_path / f"snap-{given.name}"
        meta, _shown = _import(run_cli, out, given)
        assert not [e for e in meta["inputs"] if e.get("error")], meta["inputs"]
        links = json.loads((out / "fs_links.json").read_text())
        assert SnapshotFs(out).read_bytes("/sys/class/infiniband/mlx5_0/ports/1/rate") == b"400 Gb/sec (4X NDR)\n"
        expected = expected or links
        assert links == expected and len(links) == 6


# --- hostile links -----------------------------------------------------------------------------------


def test_links_out_of_the_tree_are_recorded_clamped_or_refused_and_never_read(run_cli: RunCli, tmp_path: Path,
                                                                             empty_config: Path) -> None:
    secret = _secret(tmp_path)
    tree = _sysfs_tree(tmp_path / "node")
    counters = f"{PCI}/0000:1a:00.0/infiniband/mlx5_0/ports/1/counters"
    hostile = [_link("sys/class/infiniband/evil0", "/etc/passwd"),
               _link("sys/class/infiniband/evil1", "../../../../../../../../../../etc"),
               _link("sys/class/infiniband/evil2", str(secret)),
               _link(f"{counters}/port_rcv_data", "../" * 20 + str(secret).lstrip("/")),
               _link("sys/class/infiniband/evil3", "../x\x1b[31my"),
               _link("sys/class/net/../../../escape", "/etc/passwd")]
    archive = _tarball(tmp_path / "ib.tgz", [*_members(tree), *hostile])
    out = tmp_path / "snap"
    meta, shown = _import(run_cli, out, archive)
    inputs = _by_name(meta)
    for name in ("sys/class/infiniband/evil0", "sys/class/infiniband/evil1", "sys/class/infiniband/evil2"):
        assert inputs[name]["kind"] == "sysfs-tree" and "error" not in inputs[name]
        assert "read inside the snapshot" in inputs[name]["contributed"][0]
    assert "at /etc/passwd" in inputs["sys/class/infiniband/evil0"]["contributed"][0]
    assert "at /etc:" in inputs["sys/class/infiniband/evil1"]["contributed"][0]
    assert "control characters" in inputs["sys/class/infiniband/evil3"]["error"]
    assert "'..'" in inputs["sys/class/net/../../../escape"]["error"]
    links = json.loads((out / "fs_links.json").read_text())
    assert links["sys/class/infiniband/evil0"] == "/etc/passwd"  # as given: SnapshotFs resolves it inside fs/
    assert "sys/class/infiniband/evil3" not in links
    fs = SnapshotFs(out)
    for path in ("/sys/class/infiniband/evil0", "/sys/class/infiniband/evil2", f"/{counters}/port_rcv_data"):
        with pytest.raises(FileNotFoundError):
            fs.read_bytes(path)
    report, text = _audit(run_cli, out, empty_config, "--profile", "gb200-nvl-tray")
    assert {f["subject"] for f in report["findings"] if f["check"] == "ib.port.state"} >= {"mlx5_0/1", "mlx5_1/1"}
    _never_leaked(out, shown, text)
    assert not (tmp_path / "escape").exists()


def test_a_folder_with_real_os_symlinks_to_outside_files_never_follows_them(run_cli: RunCli, tmp_path: Path,
                                                                            empty_config: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _secret(tmp_path)
    tree = _sysfs_tree(tmp_path / "node")
    hca = tree / PCI / "0000:1a:00.0/infiniband/mlx5_0"
    os.symlink(secret, hca / "ports/1/counters/port_rcv_data")  # a counter the reader reads: absolute, outside
    os.symlink("../../../../../../../../../../../../" + str(secret).lstrip("/"), hca / "board_id_copy")
    (hca / "fw_ver").unlink()
    os.symlink(secret, hca / "fw_ver")  # a value the audit prints
    os.symlink(secret.parent, tree / "sys/class/leak")  # a folder outside
    opened: list[str] = []
    real_open = os.open

    def watch(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watch)
    out = tmp_path / "snap"
    meta, shown = _import(run_cli, out, tree)
    monkeypatch.undo()
    assert not [p for p in opened if Path(p).is_symlink() or p.startswith(str(secret.parent))]
    inputs = {e["name"].removeprefix(f"{tree}/"): e for e in meta["inputs"]}
    fw_ver = inputs[f"{PCI}/0000:1a:00.0/infiniband/mlx5_0/fw_ver"]
    assert fw_ver["kind"] == "sysfs-tree" and fw_ver["link"] == str(secret) and "error" not in fw_ver
    links = json.loads((out / "fs_links.json").read_text())
    assert links["sys/class/leak"] == str(secret.parent)
    assert SnapshotFs(out).read_bytes("/sys/class/infiniband/mlx5_1/fw_ver") == b"28.39.1002\n"
    report, text = _audit(run_cli, out, empty_config, "--profile", "gb200-nvl-tray")
    assert {(f["subject"], f["status"]) for f in report["findings"] if f["check"] == "ib.port.state"} == {
        ("mlx5_0/1", "pass"), ("mlx5_1/1", "fail")}
    _never_leaked(out, shown, text)


def test_a_hard_link_member_is_refused_by_name(run_cli: RunCli, tmp_path: Path) -> None:
    tree = _sysfs_tree(tmp_path / "node")
    hard = tarfile.TarInfo(f"{PCI}/0000:1a:00.0/infiniband/mlx5_0/serial")
    hard.type, hard.linkname = tarfile.LNKTYPE, "etc/shadow"
    device = tarfile.TarInfo("sys/class/infiniband/uverbs0")
    device.type = tarfile.CHRTYPE
    meta, _shown = _import(run_cli, tmp_path / "snap", _tarball(tmp_path / "ib.tgz", [*_members(tree), (hard, None),
                                                                                      (device, None)]))
    inputs = _by_name(meta)
    assert "hard link" in inputs[hard.name]["error"] and "etc/shadow" in inputs[hard.name]["error"]
    assert "device" in inputs["sys/class/infiniband/uverbs0"]["error"]
    assert not (tmp_path / "snap/fs" / hard.name).exists()


def test_a_link_loop_neither_hangs_the_import_nor_the_audit(run_cli: RunCli, tmp_path: Path,
                                                            empty_config: Path) -> None:
    tree = _sysfs_tree(tmp_path / "node")
    loops = [_link("sys/class/infiniband/mlx5_8", "mlx5_9"), _link("sys/class/infiniband/mlx5_9", "mlx5_8"),
             _link("sys/class/infiniband/mlx5_7", "."), _link("sys/class/infiniband/mlx5_6", "mlx5_6/ports"),
             _link(f"{PCI}/0000:1a:00.0/infiniband/mlx5_0/ports/1/counters/loop", "../../1/counters/loop")]
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("a link loop hung"))
    signal.alarm(120)
    try:
        meta, _shown = _import(run_cli, tmp_path / "snap", _tarball(tmp_path / "ib.tgz", [*_members(tree), *loops]))
        report, _text = _audit(run_cli, tmp_path / "snap", empty_config, "--profile", "gb200-nvl-tray")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    inputs = _by_name(meta)
    assert any("link loop" in s for s in inputs["sys/class/infiniband/mlx5_8"]["skipped"])
    states = {f["subject"]: f["status"] for f in report["findings"] if f["check"] == "ib.port.state"}
    assert states["mlx5_0/1"] == "pass" and states["mlx5_1/1"] == "fail"


# --- a real sos report ---------------------------------------------------------------------------------


def test_a_sos_tarball_with_its_links_imports_without_link_errors(run_cli: RunCli, tmp_path: Path,
                                                                   empty_config: Path) -> None:
    """sos keeps /sys/class/net/<if> as a link and copies the device's folder; at the top, shortcuts to its
    commands (lsmod, uname, hostname, ...). The sysfs values win over those `ip -d address` printed."""
    secret = _secret(tmp_path)
    sos = Path(shutil.copytree(SOS, tmp_path / SOS.name))
    net = sos / "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/net/ens1f0np0"
    net.mkdir(parents=True)
    for name, value in (("mtu", "4200"), ("operstate", "up"), ("type", "1"), ("speed", "200000")):
        (net / name).write_text(value + "\n")
    (sos / "sys/class/net").mkdir(parents=True)
    os.symlink("../../devices/pci0000:16/0000:16:02.0/0000:17:00.0/net/ens1f0np0", sos / "sys/class/net/ens1f0np0")
    os.symlink("../../devices/virtual/net/lo", sos / "sys/class/net/lo")
    for name, target in (("lsmod", "sos_commands/kernel/lsmod"), ("uname", "sos_commands/kernel/uname_-a"),
                         ("hostname", "sos_commands/host/hostname"), ("date", "sos_commands/date/date_--utc"),
                         ("free", "sos_commands/memory/free")):
        os.symlink(target, sos / name)
    os.symlink("/usr/share/zoneinfo/UTC", sos / "etc/localtime")
    os.symlink(str(secret), sos / "etc/sysctl.d/98-leak.conf")
    archive = tmp_path / f"{SOS.name}.tar.xz"
    with tarfile.open(archive, "w:xz") as packed:
        packed.add(sos, arcname=SOS.name)  # links as links, as sos's own tarball holds them
    out = tmp_path / "snap"
    meta, shown = _import(run_cli, out, archive)
    assert not [e for e in meta["inputs"] if e.get("error")], [e for e in meta["inputs"] if e.get("error")]
    inputs = {e["name"].split(f"{SOS.name}/", 1)[-1]: e for e in meta["inputs"]}
    assert inputs["lsmod"]["kind"] == "sosreport"
    assert inputs["lsmod"]["skipped"] == ["/lsmod: sos's shortcut to /sos_commands/kernel/lsmod: read there"]
    assert "not used" in inputs["free"]["skipped"][0] and "not used" in inputs["etc/localtime"]["skipped"][0]
    assert inputs["sys/class/net/ens1f0np0"]["contributed"][0].startswith("/sys/class/net/ens1f0np0 -> ../../dev")
    assert "net" in meta["host_parts"]
    fs = SnapshotFs(out)
    assert fs.read_bytes("/sys/class/net/ens1f0np0/mtu") == b"4200\n"  # sysfs wins over ip -d address's 9000
    assert fs.read_bytes("/sys/class/net/ens1f0np0/speed") == b"200000\n"
    assert "ens1f0np0" in fs.listdir("/sys/class/net")
    assert any("already given by" in s for s in inputs["sos_commands/networking/ip_-d_address"]["skipped"])
    assert "nvidia 54677504 182" in (out / "fs/proc/modules").read_text()
    report, text = _audit(run_cli, out, empty_config)
    assert report["node"]["hostname"] == "gpu-node-07"
    _never_leaked(out, shown, text)
