"""The remediation state dir, lock and journal are trusted only when safe (sshd's StrictModes rule).

Root restores whatever a journal says, so a journal someone else could write
is a way to make root write anything: the state dir and every parent must be
root's or ours and writable by nobody else, an existing folder is never
chmod'ed, rollback restores only paths an actuator declares, and the lock
belongs to the target, so two runs with different --state-dir cannot
interleave on one node. Everything runs the real CLI on writable snapshot copies.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.engine.remediate import target_lock
from agent.io import fsutil
from agent.state.journal import LockHeld, StateDir, b64
from remediations.targets import LiveTarget
from tests.conftest import REPO, RunCli

NOBODY = 65534
RMEM = "fs/proc/sys/net/core/rmem_max"


def need_root(why: str) -> None:
    assert os.geteuid() == 0, f"{why} needs root (CI runs as root)"


def apply(run_cli: RunCli, node: Path, state: Path, config: Path, *args: str) -> Any:
    return run_cli("remediate", "--snapshot", str(node), "--state-dir", str(state), "--config", str(config),
                   "--format", "json", "--apply", *args)


def assert_refused(result: Any, node: Path, named: Path, *words: str) -> None:
    assert result.code == 2, result.stderr
    assert str(named) in result.stderr and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr
    assert (node / RMEM).read_text() == "4194304\n"  # nothing was applied


# ---- which folders are trusted ----

def test_a_group_writable_state_dir_is_refused_and_left_as_it_is(run_cli: RunCli, drifted_copy: Path,
                                                                 tmp_path: Path, empty_config: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o770)
    assert_refused(apply(run_cli, drifted_copy, state, empty_config), drifted_copy, state,
                   "unsafe state directory", "writable by its group")
    assert stat.S_IMODE(state.stat().st_mode) == 0o770  # never chmod'ed
    assert list(state.iterdir()) == []


def test_a_parent_others_can_write_is_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                              empty_config: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable without the sticky bit: anyone can swap state/ for their own
    result = apply(run_cli, drifted_copy, shared / "state", empty_config)
    assert_refused(result, drifted_copy, shared, "writable by group and others")
    assert not (shared / "state").exists()


def test_a_sticky_folder_is_fine_above_the_state_dir_but_never_as_it(run_cli: RunCli, drifted_copy: Path,
                                                                      tmp_path: Path, empty_config: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp
    assert_refused(apply(run_cli, drifted_copy, sticky, empty_config), drifted_copy, sticky,
                   "sticky folders are acceptable only above it")
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1777
    result = apply(run_cli, drifted_copy, sticky / "state", empty_config)
    assert result.code == 0, result.stderr
    assert stat.S_IMODE((sticky / "state").stat().st_mode) == 0o700  # created owner-only


def test_a_state_dir_owned_by_another_user_is_refused(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                      empty_config: Path) -> None:
    need_root("chown to another user")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    assert_refused(apply(run_cli, drifted_copy, state, empty_config), drifted_copy, state, "owned by uid 65534")
    assert state.stat().st_uid == NOBODY


def test_a_symlink_another_user_planted_in_a_sticky_folder_is_refused(run_cli: RunCli, drifted_copy: Path,
                                                                      tmp_path: Path, empty_config: Path) -> None:
    need_root("chown to another user")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    (sticky / "state").symlink_to(theirs)
    os.lchown(sticky / "state", NOBODY, NOBODY)
    result = apply(run_cli, drifted_copy, sticky / "state", empty_config)
    assert_refused(result, drifted_copy, sticky / "state", "symlink", "owned by uid 65534")
    assert list(theirs.iterdir()) == []


def test_an_existing_safe_state_dir_keeps_its_mode(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                   empty_config: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o750)  # the operator's choice: safe (nobody else can write), so used as it is
    result = apply(run_cli, drifted_copy, state, empty_config)
    assert result.code == 0, result.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o750
    assert stat.S_IMODE((state / "journal").stat().st_mode) == 0o700


def test_a_state_dir_that_is_a_device_is_exit_2(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                empty_config: Path) -> None:
    need_root("mknod")
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert_refused(apply(run_cli, drifted_copy, device, empty_config), drifted_copy, device, "is a device")
    assert stat.S_ISCHR(device.lstat().st_mode)


def test_a_missing_parent_of_the_state_dir_is_exit_2(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                     empty_config: Path) -> None:
    state = tmp_path / "typo" / "state"
    assert_refused(apply(run_cli, drifted_copy, state, empty_config), drifted_copy, state, "does not exist")
    assert not (tmp_path / "typo").exists()


# ---- the lock belongs to the target ----

def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_two_applies_with_different_state_dirs_on_one_snapshot_do_not_interleave(
        run_cli: RunCli, drifted_copy: Path, tmp_path: Path, empty_config: Path) -> None:
    env = {**os.environ, "NODEWARDEN_FAILPOINTS": "after-journal:stop"}  # holds the run mid-way, lock taken
    first = subprocess.Popen([sys.executable, "-m", "agent", "remediate", "--snapshot", str(drifted_copy),
                              "--state-dir", str(tmp_path / "state-a"), "--config", str(empty_config), "--apply",
                              "--format", "json"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _stopped(first.pid):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never reached its failpoint"
            time.sleep(0.05)
        second = apply(run_cli, drifted_copy, tmp_path / "state-b", empty_config)
        assert second.code == 3, second.stderr
        assert f"another nodewarden remediate or rollback is running on snapshot:{drifted_copy}" in second.stderr
        assert StateDir(tmp_path / "state-b").runs() == []
    finally:
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err.decode()
    assert json.loads(out)["changed"] is True
    again = apply(run_cli, drifted_copy, tmp_path / "state-b", empty_config)
    assert again.code == 0 and again.json()["changed"] is False  # the lock went with its holder


def test_a_symlink_at_a_lock_is_not_followed(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                             empty_config: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with pytest.raises(fsutil.FileSafetyError, match="cannot open the lock"):
        (tmp_path / "lock").symlink_to(victim)
        fsutil.open_lock_file(tmp_path / "lock")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "lock").symlink_to(victim)  # where the lock used to live: now nothing opens it
    assert apply(run_cli, drifted_copy, state, empty_config).code == 0
    assert victim.read_text() == "precious\n"


def test_the_live_nodes_lock_is_in_run(tmp_path: Path) -> None:
    need_root("the live node's lock in /run/nodewarden")
    with target_lock(LiveTarget("/")):
        lock = Path("/run/nodewarden/remediate.lock")
        assert stat.S_ISREG(lock.lstat().st_mode) and lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(LockHeld, match=r"running on live \(pid \d+\)"), target_lock(LiveTarget("/")):
            pass


# ---- rollback restores only what an actuator could have written ----

def _plant(state: Path, node: Path, run_id: str, states: list[dict[str, Any]], action: str = "sysctl:x") -> None:
    journal = StateDir(state).create_run(run_id, {"target": f"snapshot:{node.resolve()}", "profile": "x",
                                                  "actions": [action]})
    journal.append({"phase": "before", "action": action, "states": states})


def test_rollback_refuses_a_journal_naming_a_path_no_actuator_writes(run_cli: RunCli, drifted_copy: Path,
                                                                      tmp_path: Path) -> None:
    shadow = drifted_copy / "fs/etc/shadow"
    shadow.parent.mkdir(parents=True, exist_ok=True)
    shadow.write_text("root:$6$salt$hash:19000:0:99999:7:::\n")
    numa = drifted_copy / "fs/proc/sys/kernel/numa_balancing"
    before = (shadow.read_bytes(), numa.read_bytes())
    state = tmp_path / "state"
    _plant(state, drifted_copy, "20260101T000000Z-abcdef", [
        {"kind": "attr", "path": "/proc/sys/kernel/numa_balancing", "raw": b64(b"0\n"), "value": "0"},
        {"kind": "file", "path": "/etc/shadow", "content": b64(b"root::0:0:99999:7:::\n"), "mode": 0o644,
         "created_dirs": []}])
    for args in (("20260101T000000Z-abcdef",), ("--last",)):
        result = run_cli("rollback", *args, "--snapshot", str(drifted_copy), "--state-dir", str(state))
        assert result.code == 2, result.stderr
        assert "/etc/shadow is not a path actuator sysctl writes" in result.stderr
        assert "nothing was restored" in result.stderr
    assert (shadow.read_bytes(), numa.read_bytes()) == before  # not even the legitimate entry
    assert StateDir(state).open_run("20260101T000000Z-abcdef").rolled_back() is None


@pytest.mark.parametrize(("action", "entry", "problem"), [
    ("evil:x", {"kind": "attr", "path": "/proc/sys/kernel/numa_balancing", "raw": b64(b"0\n"), "value": "0"},
     "not a path actuator evil writes"),
    ("sysctl:x", {"kind": "attr", "path": "/proc/sys/../../etc/shadow", "raw": b64(b"x"), "value": "x"},
     "not a path actuator sysctl writes"),
    ("sysctl:x", {"kind": "file", "path": "/etc/sysctl.d/90-nodewarden.conf", "content": None, "mode": 420,
                  "created_dirs": ["/etc/cron.d"]}, "created folders outside its own path"),
    ("gpu_persistence:gpu0", {"kind": "nvml", "path": "nvml:gpu0:nvmlDeviceSetPersistenceMode", "index": 1,
                              "setter": "nvmlDeviceSetPersistenceMode", "value": 1}, "GPU index or setter"),
])
def test_rollback_refuses_entries_an_actuator_could_not_have_made(run_cli: RunCli, drifted_copy: Path,
                                                                  tmp_path: Path, action: str,
                                                                  entry: dict[str, Any], problem: str) -> None:
    state = tmp_path / "state"
    _plant(state, drifted_copy, "20260101T000000Z-abcdef", [entry], action=action)
    result = run_cli("rollback", "20260101T000000Z-abcdef", "--snapshot", str(drifted_copy), "--state-dir",
                     str(state))
    assert result.code == 2 and problem in result.stderr, result.stderr


def test_last_is_the_newest_run_by_recorded_time(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                 empty_config: Path) -> None:
    state = tmp_path / "state"
    first = apply(run_cli, drifted_copy, state, empty_config, "--only", "thp:*").json()
    second = apply(run_cli, drifted_copy, state, empty_config, "--only", "sysctl:*").json()
    assert first["run_id"] and second["run_id"]
    # Two runs in one second differ only in their random suffix: the older one may sort last.
    journal = state / "journal"
    (journal / first["run_id"]).rename(journal / "20300101T000000Z-ffffff")
    (journal / second["run_id"]).rename(journal / "20300101T000000Z-000000")
    result = run_cli("rollback", "--last", "--snapshot", str(drifted_copy), "--state-dir", str(state),
                     "--format", "json")
    assert result.code == 0, result.stderr
    rolled = result.json()
    assert rolled["run_id"] == "20300101T000000Z-000000"
    assert rolled["restored"] and all(p.startswith("/proc/sys/") or "sysctl" in p for p in rolled["restored"])
    assert (drifted_copy / RMEM).read_text() == "4194304\n"  # the sysctl run was undone, the THP run kept
    assert "[always]" not in (drifted_copy / "fs/sys/kernel/mm/transparent_hugepage/enabled").read_text()
