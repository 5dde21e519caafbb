"""Issue 30.13: the suite's guard sees what the tests did, never what another process on the machine did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.policy.config import DEFAULT_STATE_DIR
from tests.conftest import PRIVATE_STATE
from tests.daemon_peer import changed_files, state_listing
from tests.private_state import is_private_mount


def machine_fd() -> int:
    """The machine's own folder, under the session's tmpfs (opened before the mount)."""
    session = PRIVATE_STATE[0]
    assert session is not None and session.machine_fd is not None
    return session.machine_fd


def test_as_root_the_session_has_its_own_state_folder() -> None:
    session = PRIVATE_STATE[0]
    assert session is not None
    assert session.active == (os.geteuid() == 0)  # root: always private; otherwise the folder is root's
    if session.active:
        assert is_private_mount(DEFAULT_STATE_DIR)


def test_what_a_test_writes_there_never_reaches_the_machine(tmp_path: Path) -> None:
    if not PRIVATE_STATE[0] or not PRIVATE_STATE[0].active:
        assert os.geteuid() != 0
        return  # not root: the machine's root-owned folder cannot be written by the tests at all
    marker = DEFAULT_STATE_DIR / "private-state-probe"
    code = "import sys; open(sys.argv[1], 'w').write('probe')"  # a child of the session, as a daemon is
    subprocess.run([sys.executable, "-c", code, str(marker)], check=True, timeout=30)
    try:
        assert marker.read_text() == "probe"
        assert marker.name not in os.listdir(machine_fd())
    finally:
        marker.unlink()


def test_a_write_by_another_process_on_the_machine_is_not_the_tests(tmp_path: Path) -> None:
    if not PRIVATE_STATE[0] or not PRIVATE_STATE[0].active:
        assert os.geteuid() != 0
        return
    before = state_listing()
    # the machine's own daemon on a shared host writes its state file into the machine's folder
    fd = os.open("private-state-machine-write", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=machine_fd())
    try:
        os.write(fd, b"{}")
        assert "private-state-machine-write" in os.listdir(machine_fd())
        assert not changed_files(before, state_listing())  # the guard's listing: the session's folder only
    finally:
        os.close(fd)
        os.unlink("private-state-machine-write", dir_fd=machine_fd())
