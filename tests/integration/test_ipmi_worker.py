"""The IPMI reader process (agent/sources/ipmi_worker.py, run by agent/sources/ipmi_live.py).

A read that cannot finish is ended by killing the reader process: nothing of it stays behind (no
process, no thread), whatever the process does (hangs, ignores SIGTERM, crashes, writes garbage or
too much), and the password is neither on its command line nor in its environment. The daemon's
BMC poll, which calls the read again and again, is run against ipmi_sim and a BMC that never answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.apps.daemon.service import PollResult, SourcePoller
from agent.core.facts import BmcFacts
from agent.core.model import SourceStatus, Unknown
from agent.io.credentials import BmcOptions, Secret
from agent.sources import ipmi_live
from agent.sources.ipmi import read_ipmi_live
from agent.sources.node import NodeSource
from agent.sources.registry import BMC
from agent.sources.source import ReadOptions
from tests.peers.ipmi_sim import IpmiSim, ipmi_sim_fixture

__all__ = ["ipmi_sim_fixture"]

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Worker-Pa55-Quokka-31"  # distinctive: searched for in /proc and in every message
WORKER_PRELUDE = "import os, signal, sys, time\nfrom agent.sources import ipmi_worker as w\n"
DEADLINE_MARGIN_S = 2.0  # SIGTERM grace (0.5 s) plus a loaded machine


def worker_running(code: str) -> list[str]:
    """A reader-process command that runs `code` (`w` is agent.sources.ipmi_worker) before the worker's main."""
    return [sys.executable, "-c", WORKER_PRELUDE + code + "\nsys.exit(w.main())"]


def python(code: str) -> list[str]:
    """A reader-process command that is just this Python code (the request is on its stdin)."""
    return [sys.executable, "-c", WORKER_PRELUDE + code]


@pytest.fixture
def silent_bmc() -> Iterator[socket.socket]:
    """A UDP socket on 127.0.0.1 that takes every packet (the kernel queues them) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def received_something(sock: socket.socket) -> bool:
    sock.settimeout(0.1)
    try:
        return bool(sock.recv(4096))
    except OSError:
        return False


def is_reader(cmdline: list[str]) -> bool:
    """The reader process: nodewarden's IPMI worker, or a test's stand-in for it (`python()`)."""
    return "agent.sources.ipmi_worker" in cmdline or any(WORKER_PRELUDE in arg for arg in cmdline)


class WatchedRead:
    """read_ipmi_live in a thread, while this one watches the reader processes it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.result: tuple[Any, SourceStatus, dict[str, Any]] | None = None
        self.elapsed_s = 0.0
        self.seen: dict[int, psutil.Process] = {}
        self.described: dict[int, str] = {}  # what each process looked like, for a failure's message
        self._thread = threading.Thread(target=self._run, args=args, kwargs=kwargs, name="test-watched-read")

    def _run(self, *args: Any, **kwargs: Any) -> None:
        start = time.monotonic()
        self.result = read_ipmi_live(*args, **kwargs)
        self.elapsed_s = time.monotonic() - start

    def run(self, while_running: Callable[[psutil.Process], bool] | None = None) -> WatchedRead:
        """Start, call `while_running(worker)` until it returns True, wait for the end.

        Only processes started by this read count: peers other tests started (an ipmi_sim of a
        session fixture) are children of this process too, and are not readers.
        """
        me = psutil.Process()
        before = children()
        groups: dict[int, tuple[int, int, list[str]]] = {}
        self._thread.start()
        done = while_running is None
        while self._thread.is_alive():
            found: list[psutil.Process] = []
            with contextlib.suppress(psutil.Error, OSError):  # this process's children changed meanwhile
                found = me.children(recursive=True)
            for child in found:
                if child.pid in before:
                    continue
                # One child at a time: a zombie left by another test (its cmdline raises) or a child
                # that ended while being looked at must not hide the reader from this pass (CI once saw
                # no reader at all). Looked at again on every pass: a child seen between fork and
                # setsid/exec has its parent's group and command line for a moment.
                with contextlib.suppress(psutil.Error, OSError):
                    seen_as = (os.getpgid(child.pid), child.ppid(), child.cmdline())
                    # A process on its way out shows an empty command line: keep what it showed before.
                    if seen_as[2] or child.pid not in groups:
                        groups[child.pid] = seen_as
                    self.seen.setdefault(child.pid, child)
                    if not done and while_running is not None and child.ppid() == me.pid:
                        done = while_running(child)
            time.sleep(0.02)
        self._thread.join()
        # Readers run in their own process group (start_new_session): keep what is in the group of a
        # reader this read started, not what another test's leftover thread spawned meanwhile.
        # A reader that crashed at once may have been seen only while exiting (empty command line, in
        # its own group): it is one of ours too, since only readers are started in a group of their own.
        leaders = {pid for pid, (pgid, ppid, cmdline) in groups.items()
                   if pgid == pid and ppid == me.pid and (is_reader(cmdline) or not cmdline)}
        self.seen = {pid: proc for pid, proc in self.seen.items() if pid in groups and groups[pid][0] in leaders}
        self.described = {pid: f"pgid {g} ppid {pp} {' '.join(c)[:80]}" for pid, (g, pp, c) in groups.items()}
        return self

    @property
    def facts(self) -> Any:
        assert self.result is not None
        return self.result[0]

    @property
    def status(self) -> SourceStatus:
        assert self.result is not None
        return self.result[1]

    @property
    def raw(self) -> dict[str, Any]:
        assert self.result is not None
        return self.result[2]


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def assert_no_reader_left(children_before: set[int], settle_s: float = 5.0) -> None:
    """No IPMI reader outlives its poll. Judged on the readers, not on every child: a peer another fixture
    forks meanwhile is not ours to count (a run failed on a child that was no reader). A reader that is
    being reaped gets a moment."""
    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False  # gone while looked at

    deadline = time.monotonic() + settle_s
    while True:
        left = [p.pid for p in reader_processes() if p.pid not in children_before and running(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert left == [], left


def reader_processes() -> list[psutil.Process]:
    """This process's children that run the IPMI reader (simulators, also children, are not)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("ipmi_worker" in arg for arg in child.cmdline()):
                found.append(child)
    return found


def assert_nothing_left(seen: dict[int, psutil.Process], threads_before: set[threading.Thread]) -> None:
    assert seen, "no reader process was seen"
    assert not children() & set(seen)
    for pid in seen:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert extra == [], extra


# --- a BMC that never answers ----------------------------------------------------------------------


def test_a_bmc_that_never_answers_ends_at_the_deadline_and_leaves_nothing_behind(silent_bmc: socket.socket) -> None:
    threads_before = set(threading.enumerate())
    read = WatchedRead("127.0.0.1", port_of(silent_bmc), "admin", PASSWORD, 2.0).run()
    assert read.elapsed_s < 2.0 + DEADLINE_MARGIN_S, read.elapsed_s
    assert read.facts == Unknown("IPMI did not answer within 2 s (stuck in login)")
    assert not read.status.ok and read.status.error == read.facts.reason
    assert read.raw["error"] == read.facts.reason
    assert received_something(silent_bmc)  # the reader did talk to it: it was the deadline that ended it
    assert_nothing_left(read.seen, threads_before)


def test_a_reader_that_ignores_sigterm_is_killed_with_its_children() -> None:
    threads_before = set(threading.enumerate())
    stubborn = python("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "child = __import__('subprocess').Popen(['sleep', '60'])\n"
                      "time.sleep(60)\n")
    read = WatchedRead("127.0.0.1", 623, "admin", PASSWORD, 1.0, worker=stubborn).run(
        lambda worker: len(worker.children()) > 0)
    assert read.elapsed_s < 1.0 + DEADLINE_MARGIN_S, read.elapsed_s
    assert read.facts == Unknown("IPMI did not answer within 1 s (stuck in login)")
    # the reader and its `sleep`: one process group, killed as one
    assert len(read.seen) == 2, {pid: read.described.get(pid) for pid in read.seen}
    assert_nothing_left(read.seen, threads_before)


def test_the_reader_ends_itself_after_its_deadline_if_nobody_kills_it(silent_bmc: socket.socket) -> None:
    # the last guard, for a parent that died before it could kill the reader: SIGALRM's default action
    request = json.dumps({"host": "127.0.0.1", "port": port_of(silent_bmc), "user": "admin", "password": PASSWORD,
                          "deadline_s": 1})
    start = time.monotonic()
    done = subprocess.run(worker_running("w.ALARM_MARGIN_S = 0"), input=request.encode(), capture_output=True,
                          cwd=REPO, timeout=30, check=False)
    assert done.returncode == -14, done  # SIGALRM
    assert time.monotonic() - start < 1.0 + DEADLINE_MARGIN_S + 1.0
    assert json.loads(done.stdout.splitlines()[0]) == {"step": "login", "requests": 0}
    assert PASSWORD.encode() not in done.stdout + done.stderr


# --- a reader that fails -----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "expected"), [
    ("raise RuntimeError('boom in the reader')",
     "the IPMI reader process ended unexpectedly in login: exit status 1 (RuntimeError: boom in the reader)"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "the IPMI reader process ended unexpectedly in login: killed by SIGSEGV"),
    ("sys.exit(0)", "the IPMI reader process ended unexpectedly in login: exit status 0"),
    ("print(json.dumps({'step': 'Get Device ID', 'requests': 2}), flush=True); sys.exit(7)".replace(
        "json.", "__import__('json')."),
     "the IPMI reader process ended unexpectedly in Get Device ID: exit status 7"),
    ("sys.stderr.write('could not log in as admin:' + __import__('json').load(sys.stdin)['password']); sys.exit(4)",
     "the IPMI reader process ended unexpectedly in login: exit status 4 (could not log in as admin:***)"),
], ids=["exception", "signal", "silent exit", "exit after a step", "password in its last words"])
def test_a_reader_that_crashes_is_unknown_with_a_clear_message(code: str, expected: str) -> None:
    threads_before = set(threading.enumerate())
    read = WatchedRead("127.0.0.1", 623, "admin", PASSWORD, 10.0, worker=python(code)).run()
    assert read.facts == Unknown(expected)
    assert not read.status.ok and read.status.error == expected
    assert "Traceback" not in expected and PASSWORD not in json.dumps(read.raw) + repr(read.status)
    assert read.elapsed_s < 5.0  # it did not wait for the deadline
    assert_nothing_left(read.seen, threads_before)


@pytest.mark.parametrize(("code", "expected"), [
    ("print('hello, this is not JSON', flush=True); time.sleep(60)", "not JSON"),
    ("print('[1, 2]', flush=True); time.sleep(60)", "expected a JSON object a line, got list"),
    ("print('{\"surprise\": 1, \"requests\": 0}', flush=True); time.sleep(60)", "an unknown line"),
    ("print('{\"step\": \"login\"}', flush=True); time.sleep(60)", "without its `requests` count"),
    ("print('[' * 100 + ']' * 100, flush=True); time.sleep(60)", "nested deeper than"),
    ("\nwhile True:\n    sys.stdout.write('{\"step\": \"' + 'x' * 4000 + '\", \"requests\": 1}\\n')",
     "it wrote more than 65536 bytes"),
    ("sys.stdout.write('x' * 100000); sys.stdout.flush(); time.sleep(60)", "it wrote more than 65536 bytes"),
], ids=["garbage", "not an object", "unknown line", "no count", "deep", "endless lines", "one huge line"])
def test_garbage_or_oversized_output_is_refused_at_once(code: str, expected: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ipmi_live, "MAX_OUTPUT_BYTES", 65536)
    threads_before = set(threading.enumerate())
    # A moment before it answers: a reader refused within one look of the watcher (20 ms) was never seen
    # (a loaded CI machine), and the check that nothing is left behind had nothing to look at.
    read = WatchedRead("127.0.0.1", 623, "admin", PASSWORD, 10.0, worker=python("time.sleep(0.3)\n" + code)).run()
    assert isinstance(read.facts, Unknown), read.facts
    assert read.facts.reason.startswith("the IPMI reader process's answer was refused: "), read.facts
    assert expected in read.facts.reason, read.facts.reason
    assert read.raw == {"format": "nodewarden.ipmi/v1", "target": {"host": "127.0.0.1", "port": 623},
                        "requests": read.raw["requests"], "error": read.facts.reason}
    assert read.elapsed_s < 5.0  # refused as it came, not at the deadline
    assert_nothing_left(read.seen, threads_before)


def test_a_bad_request_is_refused_by_the_reader() -> None:
    done = subprocess.run([sys.executable, "-m", "agent.sources.ipmi_worker"], input=b"{}", capture_output=True,
                          cwd=REPO, timeout=30, check=False)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"error": "the IPMI reader process got no usable request on stdin",
                                       "requests": 0}


# --- secrets and start-up ----------------------------------------------------------------------------


def test_the_password_is_not_in_the_readers_command_line_or_environment(silent_bmc: socket.socket,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # even when the agent itself was handed the password in its environment
    monkeypatch.setenv("NODEWARDEN_BMC_PASSWORD", PASSWORD)
    monkeypatch.setenv("SOME_TOKEN", f"user:{PASSWORD}@bmc")
    looked: dict[str, bytes] = {}

    def look(worker: psutil.Process) -> bool:
        if not received_something(silent_bmc):  # wait until it is logging in: it has the password by then
            return False
        looked["cmdline"] = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        looked["environ"] = Path(f"/proc/{worker.pid}/environ").read_bytes()
        return True

    read = WatchedRead("127.0.0.1", port_of(silent_bmc), "admin", PASSWORD, 3.0).run(look)
    assert set(looked) == {"cmdline", "environ"}, "the reader was never seen logging in"
    assert looked["cmdline"].split(b"\0")[1:3] == [b"-m", b"agent.sources.ipmi_worker"]
    assert PASSWORD.encode() not in looked["cmdline"]
    assert PASSWORD.encode() not in looked["environ"]
    assert b"NODEWARDEN_BMC_PASSWORD" not in looked["environ"] and b"SOME_TOKEN" not in looked["environ"]
    assert isinstance(read.facts, Unknown) and "stuck in login" in read.facts.reason


def test_the_reader_imports_no_more_of_the_agent_than_it_needs() -> None:
    code = ("import json, sys\nimport agent.sources.ipmi_worker\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('agent', 'checks', 'remediations'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=REPO, timeout=30, check=True)
    assert json.loads(done.stdout) == ["agent", "agent.sources", "agent.sources.ipmi_const",
                                       "agent.sources.ipmi_worker"]
    # and the agent's side never imports pyghmi: a read's pyghmi lives and dies in its reader process
    code = ("import sys\nfrom agent.sources.ipmi import read_ipmi_live\n"
            "read_ipmi_live('127.0.0.1', 9, 'admin', 'pw', 0.5)\n"
            "print(sorted(m for m in sys.modules if m.startswith('pyghmi')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=REPO, timeout=30, check=True)
    assert done.stdout.strip() == b"[]"


# --- the daemon's BMC poll -------------------------------------------------------------------------


def poll_twice(options: BmcOptions, poll_timeout_s: float) -> list[PollResult]:
    """The daemon's BMC sensor poller (SourcePoller over the BMC source), run for two polls in a row."""
    node = NodeSource("live", None)
    stop = threading.Event()
    results: list[PollResult] = []

    def on_result(_name: str, result: PollResult) -> None:
        results.append(result)
        if len(results) >= 2:
            stop.set()

    poller = SourcePoller("bmc_sensors", lambda: BMC.read(node, ReadOptions(bmc=options, sensors_only=True)), ("ipmi",),
                          lambda: 0.0, lambda: poll_timeout_s, on_result, stop)
    poller.start()
    poller.thread.join(timeout=4 * poll_timeout_s)
    assert not poller.thread.is_alive(), "the poller did not finish two polls"
    return results


def test_the_daemons_ipmi_poll_twice_in_a_row_against_ipmi_sim(ipmi_sim: IpmiSim) -> None:
    threads_before, children_before = set(threading.enumerate()), children()
    options = BmcOptions(ipmi_host=ipmi_sim.host, ipmi_port=ipmi_sim.port, user=ipmi_sim.user,
                         password=Secret(ipmi_sim.password), deadline_s=15.0)
    results = poll_twice(options, poll_timeout_s=30.0)
    assert len(results) == 2
    for result in results:
        status = result.statuses["ipmi"]
        assert status.ok, status
        assert isinstance(result.value, BmcFacts) and result.value.protocol == "ipmi"
        assert isinstance(result.value.temperatures, tuple) and len(result.value.temperatures) == 3
    assert results[0].value == results[1].value or results[0].value._replace(requests=0) == results[1].value._replace(
        requests=0)
    assert_no_reader_left(children_before)
    assert [t for t in threading.enumerate() if t not in threads_before and t.is_alive()] == []


def test_the_daemons_ipmi_poll_of_a_hung_bmc_ends_at_the_deadline_each_time(silent_bmc: socket.socket) -> None:
    threads_before, children_before = set(threading.enumerate()), children()
    options = BmcOptions(ipmi_host="127.0.0.1", ipmi_port=port_of(silent_bmc), user="admin",
                         password=Secret(PASSWORD), deadline_s=1.0)
    start = time.monotonic()
    results = poll_twice(options, poll_timeout_s=10.0)
    assert time.monotonic() - start < 2 * (1.0 + DEADLINE_MARGIN_S)
    # each poll is the read's own deadline, never the poller's "timed out" nor "the previous read has not returned"
    assert [r.statuses["ipmi"].error for r in results] == ["IPMI did not answer within 1 s (stuck in login)"] * 2
    assert_no_reader_left(children_before)
    assert [t for t in threading.enumerate() if t not in threads_before and t.is_alive()] == []
