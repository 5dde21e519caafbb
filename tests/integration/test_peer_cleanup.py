"""Issue 26.11: every peer a test starts is stopped when the test run ends, also on failure and Ctrl-C.

A small pytest session runs in a subprocess (its own session, as a terminal's job is): it starts
the shared `ipmi_sim` fixture and a peer with a child of its own (tests/peers/processes.py), then
waits. The session is interrupted (SIGINT, as Ctrl-C), terminated (SIGTERM, as `timeout` does),
hung up (SIGHUP, a closed terminal) or killed (SIGKILL); afterwards no process it started may be
running. After SIGKILL nothing runs in pytest any more: the kernel's parent-death signal stops the
peers it started directly (a peer's own children are the peer's to stop).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.peers import processes

INNER = '''
import os
import subprocess
import time
from pathlib import Path

from tests.peers import processes
from tests.peers.ipmi_sim import ipmi_sim_fixture  # noqa: F401  (session scope, as the suite uses it)


def test_holds_peers(ipmi_sim, tmp_path):
    out = Path(os.environ["PEER_PIDS"])
    shell = processes.spawn(["sh", "-c", "sleep 300 & echo $! > " + str(tmp_path / "child") + "; wait"])
    for _ in range(200):
        if (tmp_path / "child").is_file() and (tmp_path / "child").read_text().strip():
            break
        time.sleep(0.02)
    child = (tmp_path / "child").read_text().strip()
    out.write_text(f"{ipmi_sim.process.pid} {shell.pid} {child}\\n")
    # Short sleeps, never one long one: CPython runs a Python signal handler in the main thread between
    # bytecodes, so a signal that lands after its check and before a sleep's system call starts waits
    # for that call to end (issue 36.4: one run in ~50 under load stalled for the whole sleep).
    for _ in range(3000):
        time.sleep(0.1)
'''


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_no_peer_outlives_an_interrupted_run(tmp_path: Path, signum: int) -> None:
    test_file = tmp_path / "inner" / "test_inner_peers.py"
    test_file.parent.mkdir()
    test_file.write_text(INNER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PEER_PIDS": str(pids_file), "PYTHONPATH": str(REPO)}
    log = (tmp_path / "inner.log").open("wb")
    inner = subprocess.Popen(  # its own session, as a terminal's job
        [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(REPO), "--basetemp", str(tmp_path / "basetemp")],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (pids_file.is_file() and pids_file.read_text().endswith("\n")):
            assert inner.poll() is None, (tmp_path / "inner.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the inner session did not start its peers"
            time.sleep(0.05)
        sim, shell, child = (int(pid) for pid in pids_file.read_text().split())
        started = [sim, shell, child]
        assert all(alive(pid) for pid in started) and "ipmi_sim" in command(sim)
        # To pytest alone, as `kill PID` or a CI runner does; Ctrl-C reaches the terminal's foreground
        # group, which (peers run in sessions of their own) is pytest alone too.
        os.kill(inner.pid, signum)
        inner.wait(timeout=60)
        expected_gone = [sim, shell] if signum == signal.SIGKILL else started
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in expected_gone) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = {pid: command(pid) for pid in expected_gone if alive(pid)}
        assert not orphans, f"still running after {signal.Signals(signum).name} to the test run: {orphans}"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        log.close()
        for pid in started:  # clean up after a failure: only the processes this test's run started
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_stop_takes_the_peers_own_children(tmp_path: Path) -> None:
    marker = tmp_path / "child"
    shell = processes.spawn(["sh", "-c", f"sleep 300 & echo $! > {marker}; wait"])
    try:
        deadline = time.monotonic() + 10
        while not (marker.is_file() and marker.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = int(marker.read_text())
        assert alive(child) and shell in processes.live()
        processes.stop(shell)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child) and shell.returncode is not None and shell not in processes.live()
    finally:
        processes.stop(shell)


def test_a_forked_worker_never_stops_its_parents_peers() -> None:
    """multiprocessing forks inherit the table and the SIGTERM handler: stop_all there must do nothing."""
    peer = processes.spawn(["sleep", "300"])
    try:
        child = os.fork()
        if child == 0:  # the worker: what a SIGTERM to it would run
            try:
                processes.stop_all()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        assert alive(peer.pid) and peer in processes.live()
    finally:
        processes.stop(peer)
    assert not alive(peer.pid)
