"""Snapshots are untrusted input (issue 12.4): reading, copying and remediating one never leaves its folder.

Every test plants a real object (an OS symlink, a FIFO, a device, an oversized or
sparse file) in a writable copy of hgx-h100-drifted and drives the real CLI. The
copy hard-links its files (conftest `drifted_copy`): files are replaced by
unlink + create, never written in place.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.sources.fsroot_snapshot import SnapshotFs
from tests.conftest import RunCli

REPO = Path(__file__).resolve().parents[2]
MARKER = "NODEWARDEN-SECRET-7f3a9c"  # lives outside every snapshot; must never show up
ZONE = "fs/proc/sys/vm/zone_reclaim_mode"
DMI_PRODUCT = "fs/sys/devices/virtual/dmi/id/product_name"  # shown in the report's node.model
FM_LOG = "fs/var/log/fabricmanager.log"
FM_SECRET = f"[Nov 19 2026 09:00:00] [ERROR] [tid 1] detected NVSwitch fatal error 31337 on fid 0 {MARKER}\n"


def outside_secret(tmp_path: Path, name: str = "secret.txt", text: str = f"{MARKER}\n") -> Path:
    folder = tmp_path / "outside"
    folder.mkdir(exist_ok=True)
    secret = folder / name
    secret.write_text(text)
    return secret


def plant_link(path: Path, target: str | Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    os.symlink(target, path)


def audit(run_cli: RunCli, node: Path, config: Path, *only: str) -> tuple[int, str, dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(node), "--config", str(config), "--format", "json",
                     *[x for check in only for x in ("--only", check)])
    assert result.code in (0, 1), result.stderr
    return result.code, result.stdout, result.json()


def finding(report: dict[str, Any], check: str, subject: str) -> dict[str, Any]:
    return next(f for f in report["findings"] if (f["check"], f["subject"]) == (check, subject))


def cli_subprocess(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`nodewarden ARGS` in its own process: a hang is a timeout, not a hung test session."""
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


# --- reading: real OS symlinks, `..`, recorded links -------------------------------------------


def test_os_symlinks_to_outside_files_are_refused_and_named(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                            empty_config: Path) -> None:
    """Real links (absolute, to a file outside) for a sysctl, a DMI string and the FM log: never followed."""
    secret = outside_secret(tmp_path)
    fm_secret = outside_secret(tmp_path, "fm.log", FM_SECRET)
    plant_link(drifted_copy / ZONE, secret)
    plant_link(drifted_copy / DMI_PRODUCT, secret)
    plant_link(drifted_copy / FM_LOG, fm_secret)
    _code, stdout, report = audit(run_cli, drifted_copy, empty_config)
    assert MARKER not in stdout and "31337" not in stdout
    zone = finding(report, "host.sysctl", "vm.zone_reclaim_mode")
    assert zone["status"] == "unknown"
    assert "/proc/sys/vm/zone_reclaim_mode" in zone["message"] and "symlink" in zone["message"]
    assert report["node"]["model"] != "PowerEdge XE9680"  # the DMI string is unknown, not the secret
    fm = [f for f in report["findings"] if f["check"] == "fabric.manager" or "fabricmanager.log" in f["message"]]
    assert fm and not any("31337" in json.dumps(f) for f in fm)


def test_dotdot_os_symlinks_out_of_the_snapshot_are_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                            empty_config: Path) -> None:
    """A relative `..` link climbing out of fs/, and a folder on the way linking out: both refused."""
    outside_secret(tmp_path)  # tmp_path/outside/secret.txt; drifted_copy is tmp_path/node
    plant_link(drifted_copy / ZONE, "../../../../../outside/secret.txt")  # vm -> sys -> proc -> fs -> node -> tmp
    assert (drifted_copy / ZONE).read_text() == f"{MARKER}\n"  # the planted link really leads out
    thp = tmp_path / "outside" / "thp"
    shutil.copytree(drifted_copy / "fs/sys/kernel/mm/transparent_hugepage", thp)
    (thp / "enabled").unlink()
    (thp / "enabled").write_text(f"always [{MARKER}] never\n")
    plant_link(drifted_copy / "fs/sys/kernel/mm/transparent_hugepage", "../../../../outside/thp")
    _code, stdout, report = audit(run_cli, drifted_copy, empty_config, "host.sysctl", "host.thp.enabled")
    assert MARKER not in stdout
    zone = finding(report, "host.sysctl", "vm.zone_reclaim_mode")
    assert zone["status"] == "unknown" and "zone_reclaim_mode" in zone["message"]
    thp_finding = finding(report, "host.thp.enabled", "node")
    assert thp_finding["status"] == "unknown"
    assert "fs/sys/kernel/mm/transparent_hugepage is a symlink" in thp_finding["message"]


def test_recorded_links_pointing_outside_are_clamped_to_the_snapshot(run_cli: RunCli, drifted_copy: Path,
                                                                     tmp_path: Path, empty_config: Path) -> None:
    """fs_links.json entries to an absolute path and to `../../..` resolve inside fs/ (here: absent)."""
    secret = outside_secret(tmp_path)
    links_file = drifted_copy / "fs_links.json"
    links = json.loads(links_file.read_text())
    links["proc/sys/vm/zone_reclaim_mode"] = str(secret)
    links["sys/class/dmi/id"] = "../../../../../../../../../../" + str(secret.parent).lstrip("/")
    (drifted_copy / ZONE).unlink()
    links_file.unlink()
    links_file.write_text(json.dumps(links))
    _code, stdout, report = audit(run_cli, drifted_copy, empty_config, "host.sysctl")
    assert MARKER not in stdout
    zone = finding(report, "host.sysctl", "vm.zone_reclaim_mode")
    assert zone["status"] == "unknown" and "/proc/sys/vm/zone_reclaim_mode" in zone["message"]
    fs = SnapshotFs(drifted_copy)
    assert fs.resolve("/proc/sys/vm/zone_reclaim_mode") == str(secret).lstrip("/")  # under fs/, not the real one
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("/sys/class/dmi/id/secret.txt")


def test_a_symlinked_fs_folder_or_recorded_file_refuses_the_snapshot(run_cli: RunCli, drifted_copy: Path,
                                                                     tmp_path: Path, empty_config: Path) -> None:
    outside = tmp_path / "outside" / "fs"
    outside.mkdir(parents=True)
    shutil.rmtree(drifted_copy / "fs")
    os.symlink(outside, drifted_copy / "fs")
    result = run_cli("audit", "--snapshot", str(drifted_copy), "--config", str(empty_config), "--format", "json")
    assert result.code == 2 and f"{drifted_copy / 'fs'}" in result.stderr and "symlink" in result.stderr
    os.unlink(drifted_copy / "fs")
    (drifted_copy / "fs").mkdir()
    plant_link(drifted_copy / "kmsg.txt", outside_secret(tmp_path))
    result = run_cli("audit", "--snapshot", str(drifted_copy), "--config", str(empty_config), "--format", "json")
    assert result.code == 2 and "kmsg.txt" in result.stderr and "symlink" in result.stderr
    assert MARKER not in result.stdout + result.stderr


# --- reading: FIFOs, devices, sizes ------------------------------------------------------------


def test_fifo_in_fs_is_not_opened_and_the_audit_completes(drifted_copy: Path, empty_config: Path) -> None:
    (drifted_copy / ZONE).unlink()
    os.mkfifo(drifted_copy / ZONE)
    (drifted_copy / FM_LOG).unlink()
    os.mkfifo(drifted_copy / FM_LOG)
    done = cli_subprocess("audit", "--snapshot", str(drifted_copy), "--config", str(empty_config),
                          "--format", "json", timeout=60)  # today's code blocks in open() forever
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    zone = finding(report, "host.sysctl", "vm.zone_reclaim_mode")
    assert zone["status"] == "unknown"
    assert "fs/proc/sys/vm/zone_reclaim_mode is a FIFO" in zone["message"]
    assert any("fabricmanager.log" in f["message"] and "FIFO" in f["message"] for f in report["findings"])


def test_device_node_in_fs_is_not_opened(run_cli: RunCli, drifted_copy: Path, empty_config: Path) -> None:
    (drifted_copy / ZONE).unlink()
    # A /dev/zero of its own; creating device nodes needs root (CAP_MKNOD): CI runs as root, and
    # without it this test fails and says so rather than skipping the case.
    assert os.geteuid() == 0, "creating a device node needs root (CAP_MKNOD)"
    os.mknod(drifted_copy / ZONE, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    _code, _stdout, report = audit(run_cli, drifted_copy, empty_config, "host.sysctl")
    zone = finding(report, "host.sysctl", "vm.zone_reclaim_mode")
    assert zone["status"] == "unknown" and "is a character device, not a regular file (not opened)" in zone["message"]


def test_oversized_sysfs_value_is_unknown(run_cli: RunCli, drifted_copy: Path, empty_config: Path) -> None:
    """A 5 MiB value whose first line looks fine is not silently cut: it is refused, by name."""
    enabled = drifted_copy / "fs/sys/kernel/mm/transparent_hugepage/enabled"
    enabled.unlink()
    enabled.write_bytes(b"always [madvise] never\n" + b" " * (5 << 20))
    _code, _stdout, report = audit(run_cli, drifted_copy, empty_config, "host.thp.enabled")
    thp = finding(report, "host.thp.enabled", "node")
    assert thp["status"] == "unknown"
    assert "/sys/kernel/mm/transparent_hugepage/enabled" in thp["message"] and "exceeds 1 MiB" in thp["message"]


RSS_WRAPPER = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def test_huge_sparse_kernel_log_is_read_as_a_bounded_tail(drifted_copy: Path, empty_config: Path) -> None:
    """200 MiB of kmsg.txt (sparse), the real records at its end: the tail is read, memory stays bounded."""
    kmsg = drifted_copy / "kmsg.txt"
    records = kmsg.read_bytes()
    kmsg.unlink()
    with open(kmsg, "wb") as handle:
        handle.truncate(200 << 20)
        handle.seek(200 << 20)
        handle.write(b"\n" + records)
    assert kmsg.stat().st_size > 200 << 20
    args = ["-m", "agent", "audit", "--snapshot", str(drifted_copy), "--config", str(empty_config),
            "--format", "json", "--only", "gpu.xid"]
    done = subprocess.run([sys.executable, "-c", RSS_WRAPPER, sys.executable, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    run = json.loads(done.stdout)
    assert run["rc"] in (0, 1), run["stderr"]
    report = json.loads(run["stdout"])
    xid = finding(report, "gpu.xid", "gpu7")
    assert xid["status"] == "fail" and xid["observed"] == {"79": 1}  # the records at the tail were read
    assert run["maxrss_kib"] < 160 * 1024, run["maxrss_kib"]  # reading it whole takes over 400 MiB


# --- copying: `snapshot capture --snapshot` ----------------------------------------------------


def test_capture_copy_never_copies_a_file_from_outside(run_cli: RunCli, drifted_copy: Path, tmp_path: Path) -> None:
    secret = outside_secret(tmp_path)
    plant_link(drifted_copy / ZONE, secret)  # a link to a file outside
    plant_link(drifted_copy / "fs/proc/sys/kernel/leak", secret.parent)  # a link to a folder outside
    plant_link(drifted_copy / "fs/proc/sys/kernel/up", "../../../../../outside/secret.txt")  # climbs out
    os.mkfifo(drifted_copy / "fs/proc/sys/kernel/pipe")
    out = tmp_path / "copy"
    result = run_cli("snapshot", "capture", "--snapshot", str(drifted_copy), "--out", str(out))
    assert result.code == 0, result.stderr
    copied = [p for p in out.rglob("*")]
    assert not [p for p in copied if p.is_symlink()]
    assert not [p for p in copied if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert not (out / ZONE).exists() and not (out / "fs/proc/sys/kernel/pipe").exists()
    assert (out / "fs/proc/sys/vm/swappiness").is_file()  # everything else is there
    assert "not copied: fs/proc/sys/vm/zone_reclaim_mode (a symlink)" in result.stderr
    assert "fs/proc/sys/kernel/pipe (a FIFO)" in result.stderr


# --- writing: `remediate --snapshot --apply` ----------------------------------------------------


def _tree(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.read_bytes()) for p in folder.rglob("*") if p.is_file()}


def test_remediate_never_writes_through_a_symlinked_folder(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                           empty_config: Path) -> None:
    """fs/proc/sys/net/core links to a folder outside holding the drifted rmem_max: it stays untouched."""
    outside = tmp_path / "outside"
    shutil.copytree(drifted_copy / "fs/proc/sys/net/core", outside / "core")  # real copies, own inodes
    plant_link(drifted_copy / "fs/proc/sys/net/core", outside / "core")
    before = _tree(outside)
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--state-dir", str(tmp_path / "state"),
                     "--config", str(empty_config), "--format", "json", "--apply", "--only", "host.sysctl")
    assert _tree(outside) == before
    assert (outside / "core/rmem_max").read_text() == "4194304\n"
    assert "refused: fs/proc/sys/net/core is a symlink" in result.stdout + result.stderr


def test_remediate_refuses_a_symlinked_parent_of_a_new_file(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                            empty_config: Path) -> None:
    """fs/etc/sysctl.d links outside: the drop-in the sysctl action writes is not created there, the action fails."""
    outside = tmp_path / "outside-sysctl.d"
    outside.mkdir()
    (drifted_copy / "fs/etc").mkdir()
    os.symlink(outside, drifted_copy / "fs/etc/sysctl.d")
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--state-dir", str(tmp_path / "state"),
                     "--config", str(empty_config), "--format", "json", "--apply", "--only", "host.sysctl")
    assert list(outside.iterdir()) == []
    rmem = next(a for a in result.json()["actions"] if a["id"] == "sysctl:net.core.rmem_max")
    assert rmem["status"] == "failed"
    assert "cannot read the before-state" in rmem["reason"]
    assert "refused: fs/etc/sysctl.d is a symlink inside the snapshot" in rmem["reason"]
    assert (drifted_copy / "fs/proc/sys/net/core/rmem_max").read_text() == "4194304\n"  # nothing half-done


def test_remediate_plan_through_a_symlinked_etc_is_one_clear_error(run_cli: RunCli, drifted_copy: Path,
                                                                   tmp_path: Path, empty_config: Path) -> None:
    outside = tmp_path / "outside-etc"
    outside.mkdir()
    (outside / "sysctl.conf").write_text(f"# {MARKER}\n")
    os.symlink(outside, drifted_copy / "fs/etc")
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--state-dir", str(tmp_path / "state"),
                     "--config", str(empty_config), "--format", "json", "--apply", "--only", "host.sysctl")
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "/etc/sysctl.conf: refused: fs/etc is a symlink inside the snapshot" in result.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["sysctl.conf"] and MARKER not in result.stdout


def test_daemon_follower_reads_a_bounded_tail_and_refuses_a_symlinked_log(tmp_path: Path) -> None:
    """The daemon's follower of a recorded kmsg.txt: a huge log costs one tail, a symlink is not followed."""
    import time

    from agent.sources.kmsg import KMSG_TAIL_BYTES, KmsgFollower

    log = tmp_path / "kmsg.txt"
    with open(log, "wb") as handle:
        handle.truncate(64 << 20)  # sparse: no records, no newline
        handle.seek(64 << 20)
        handle.write(b"\n4,1,10,-;NVRM: Xid (PCI:0000:19:00): 48, late record\n")
    seen: list[str] = []
    follower = KmsgFollower(log, live=False, on_new=lambda batch: seen.extend(r.message for r in batch), poll_s=0.05)
    follower.start()
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        follower.stop()
    assert seen == ["NVRM: Xid (PCI:0000:19:00): 48, late record"] and KMSG_TAIL_BYTES <= 16 << 20
    secret = outside_secret(tmp_path)
    link = tmp_path / "linked-kmsg.txt"
    os.symlink(secret, link)
    follower = KmsgFollower(link, live=False, on_new=lambda batch: seen.extend(r.message for r in batch), poll_s=0.05)
    follower.start()
    try:
        deadline = time.monotonic() + 10
        while follower.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        follower.stop()
    assert follower.error is not None and "refused: a symlink" in follower.error
    assert not any(MARKER in message for message in seen)


def test_remediate_never_stages_bios_settings_through_a_symlinked_folder(run_cli: RunCli, drifted_copy: Path,
                                                                         tmp_path: Path, empty_config: Path) -> None:
    """The recorded BMC's Bios/Settings folder links outside: the PATCH must not land there."""
    settings = drifted_copy / "redfish/v1/Systems/System.Embedded.1/Bios/Settings"
    outside = tmp_path / "outside-settings"
    shutil.copytree(settings, outside)
    plant_link(settings, outside)
    before = _tree(outside)
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--state-dir", str(tmp_path / "state"),
                     "--config", str(empty_config), "--format", "json", "--only", "bios*", "--allow", "reboot",
                     "--apply")
    assert _tree(outside) == before
    assert "Bios/Settings is a symlink inside the snapshot" in result.stdout + result.stderr
