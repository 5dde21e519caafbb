"""The health-check state file under the shipped unit's sandbox (issue 30.10, and 30.12's reader rule).

systemd/nodewarden.service runs the daemon as a dynamic user under ProtectSystem=strict with
`StateDirectory=nodewarden/daemon`. CI has no systemd as PID 1, so the sandbox is rebuilt as far as
it can be: the folders laid out as systemd lays them out for a dynamic user (root's 0700 private/, the
daemon's folder owned by the uid, a root-owned symlink from the state dir), a mount namespace
(`unshare -m`) in which all of it is read-only except the daemon's folder (ProtectSystem=strict plus
the StateDirectory= bind), and the daemon's own writer run as an unprivileged uid (`setpriv`) in the
dynamic range. Root's reader then answers from what that uid wrote, and refuses every other shape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.apps.scheduler.state import read_decision, read_state, write_decision

REPO = Path(__file__).resolve().parents[2]
DYNAMIC_UID = 61234  # systemd's dynamic users are 61184-65519
OTHER_UID = 61235

# The unit's sandbox as systemd builds it (ProtectSystem=strict; StateDirectory= with DynamicUser=yes:
# the 0700 private/ overmounted by a 0755 tmpfs holding only the unit's own folders, bound writable),
# then the daemon's writer as the dynamic user. Values come as arguments, never inside the script.
# The code and its libraries are bound in first: a checkout below root's 0700 folder (CI's fresh clone)
# is as unreadable to a dynamic user as it would be under systemd, where the package lives in /usr.
SANDBOX = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && mount --bind "$2" "$1/hold" && '
           'mount --bind "$7" "$1/code" && mount --bind "$8" "$1/site" && '
           'mount -t tmpfs -o mode=0755 tmpfs "$1/private" && mkdir -p "$2" && mount --bind "$1/hold" "$2" && '
           'mount -o remount,bind,rw "$2" && mount -o remount,ro "$1/private" && '
           'PYTHONPATH="$1/code:$1/site" exec setpriv --reuid "$3" --regid "$3" --clear-groups "$4" -c "$5" "$6"')
WRITER = """
import json, sys, time
from pathlib import Path
from agent.policy.config import Config
from agent.engine.audit import AuditRequest, run_audit
from agent.apps.scheduler.state import DaemonStateFile, read_decision
from agent.state.layout import scheduler_folder as folder
state = Path(sys.argv[1])
DaemonStateFile(state, {"host": 60.0, "nvml": 15.0}).update(
    run_audit(AuditRequest(config=Config(), simulate="hgx-h100-healthy")), time.time(), {})
try:  # where the daemon wrote before StateDirectory=: read-only in the sandbox
    (folder(state, create=True) / "probe").write_text("x")
    old = "writable"
except OSError as exc:
    old = exc.strerror
print(json.dumps({"old_place": old, "decision": read_decision(state)}))
"""


def layout(top: Path, *, nodewarden_owner: int = 0, daemon_mode: int = 0o755) -> tuple[Path, Path]:
    """systemd's layout for StateDirectory=nodewarden/daemon with DynamicUser=yes, below `top` (= /var/lib)."""
    state = top / "nodewarden"
    state.mkdir(0o755)
    (top / "hold").mkdir(0o700)  # where the sandbox keeps the real folder while private/ is covered
    (top / "private").mkdir(0o700)
    for mount_point in ("code", "site"):  # where the sandbox binds the checkout and its libraries
        (top / mount_point).mkdir(0o755, exist_ok=True)
    (top / "private" / "nodewarden").mkdir(0o755)
    os.chown(top / "private" / "nodewarden", nodewarden_owner, nodewarden_owner)
    real = top / "private" / "nodewarden" / "daemon"
    real.mkdir()
    os.chown(real, DYNAMIC_UID, DYNAMIC_UID)
    real.chmod(daemon_mode)
    (state / "daemon").symlink_to("../private/nodewarden/daemon")
    return state, real


@pytest.fixture
def top() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are root's 0700, which the dynamic user could not pass.
    made = Path(tempfile.mkdtemp(prefix="nodewarden-sandbox-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def plant(folder: Path, uid: int) -> Path:
    path = folder / "daemon.json"
    path.write_text(json.dumps({"schema": "nodewarden.health/v1", "verdict": "OK", "gpus": {}, "actions": [],
                                "confirmed_at": 1e9}))
    os.chown(path, uid, uid)
    path.chmod(0o644)
    return path


def test_the_daemon_writes_in_the_units_sandbox_and_root_answers_from_it(top: Path) -> None:
    state, real = layout(top)
    write_decision(state, {"at": 1234.0, "action": "none", "verdict": "OK", "node": "n1", "why": "healthy"})
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SANDBOX, "sandbox",
                           str(top), str(real), str(DYNAMIC_UID), os.path.realpath(sys.executable), WRITER,
                           str(state), str(REPO), sysconfig.get_paths()["purelib"]],
                          capture_output=True, text=True, timeout=120, cwd="/", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["old_place"] == "Read-only file system"  # the sandbox is real: scheduler/ cannot be written
    assert seen["decision"] == [1234.0, "none"]  # the daemon, as its dynamic user, exports root's decision
    written = real / "daemon.json"
    assert written.stat().st_uid == DYNAMIC_UID and written.stat().st_mode & 0o022 == 0
    reading = json.loads(written.read_text())["reading"]  # a simulated board is judged as what it is
    answer = read_state(state, 1e12, judged=reading)  # root's health-check
    assert answer is not None and answer.verdict == "OK" and answer.how == "state file", answer


def test_a_file_of_another_uid_in_the_daemons_folder_is_refused(top: Path) -> None:
    state, real = layout(top)
    plant(real, OTHER_UID)
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict is None
    assert f"owned by uid {OTHER_UID}, not by the folder's owner (uid {DYNAMIC_UID})" in answer.why
    os.chown(real / "daemon.json", DYNAMIC_UID, DYNAMIC_UID)
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict == "OK", answer  # the same file, the right owner


def test_a_daemon_folder_not_in_systemds_layout_is_refused(top: Path) -> None:
    # private/nodewarden owned by the uid: it could swap the folder root judges for another one.
    state, real = layout(top, nodewarden_owner=DYNAMIC_UID)
    plant(real, DYNAMIC_UID)
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict is None and "is owned by uid 61234" in answer.why, answer


def test_a_daemon_folder_others_can_write_is_refused(top: Path) -> None:
    state, real = layout(top, daemon_mode=0o777)
    plant(real, DYNAMIC_UID)
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict is None and "writable by others" in answer.why, answer


def test_a_group_writable_or_hard_linked_state_file_is_refused(top: Path) -> None:
    state, real = layout(top)
    path = plant(real, DYNAMIC_UID)
    path.chmod(0o664)
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict is None and "writable by others" in answer.why, answer
    path.chmod(0o644)
    os.link(path, real / "second")
    answer = read_state(state, 1e12)
    assert answer is not None and answer.verdict is None and "2 links" in answer.why, answer


def test_read_decision_follows_the_state_folders_trust_rule(top: Path) -> None:
    state = top / "nodewarden"
    state.mkdir(0o755)
    write_decision(state, {"at": 99.0, "action": "drain"})
    assert read_decision(state) == (99.0, "drain")
    os.chown(state / "scheduler", OTHER_UID, OTHER_UID)  # a folder another user could fill
    assert read_decision(state) is None


def test_the_scheduler_folder_is_readable_by_the_daemon_whatever_roots_umask(top: Path) -> None:
    state = top / "nodewarden"
    state.mkdir(0o755)
    old = os.umask(0o077)  # slurmd may start health-check with a strict umask
    try:
        write_decision(state, {"at": 1.0, "action": "none"})
    finally:
        os.umask(old)
    assert (state / "scheduler").stat().st_mode & 0o777 == 0o755
