"""agent.io.programs: the one way nodewarden runs a program (argv only, own session, bounded)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent.io import programs
from agent.io.programs import run_bounded, spawn, stop_group


def py(code: str) -> list[str]:
    return [sys.executable, "-I", "-c", code]


def test_a_run_returns_its_status_and_both_streams() -> None:
    ran = run_bounded(py("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"), timeout_s=30)
    assert (ran.code, ran.stdout, ran.stderr, ran.failure, ran.ok) == (3, b"out\n", b"err\n", None, False)


def test_stdin_is_given_whole_even_beyond_a_pipe_buffer() -> None:
    data = os.urandom(300_000)  # more than a pipe holds: written while the output is read
    ran = run_bounded(py("import sys; d = sys.stdin.buffer.read(); sys.stdout.buffer.write(d)"),
                      timeout_s=30, input_bytes=data, max_output=1 << 20)
    assert ran.ok and ran.stdout == data


def test_a_program_that_stops_reading_its_stdin_is_no_error_of_ours() -> None:
    ran = run_bounded(py("import sys; sys.exit(5)"), timeout_s=30, input_bytes=b"x" * 1_000_000)
    assert ran.code == 5 and ran.failure is None


def test_the_time_bound_is_for_the_run_as_a_whole_and_kills_what_it_forked(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "while True:\n    print('.', flush=True); time.sleep(0.1)\n")  # keeps writing: never idle
    started = time.monotonic()
    ran = run_bounded(py(code), timeout_s=1.5)
    assert ran.failure == "timed out after 1.5 s" and ran.code is not None and ran.code < 0
    assert time.monotonic() - started < 5
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the program's own child outlived the run"
        time.sleep(0.05)


def test_too_much_output_ends_the_run() -> None:
    ran = run_bounded(py("import sys\nwhile True: sys.stdout.write('x' * 65536)"), timeout_s=30, max_output=100_000)
    assert ran.failure == "answered more than 100000 bytes" and not ran.ok
    assert len(ran.stdout) <= 100_000 + 65536


def test_keep_tail_keeps_the_last_words_and_lets_it_finish() -> None:
    ran = run_bounded(py("print('x' * 500000); print('the last line')"), timeout_s=30, max_output=64,
                      merge_stderr=True, keep_tail=True)
    assert ran.ok and len(ran.stdout) <= 64 and ran.stdout.endswith(b"the last line\n")


def test_a_program_that_cannot_start_is_a_failure_not_an_exception(tmp_path: Path) -> None:
    ran = run_bounded([str(tmp_path / "absent")], timeout_s=5)
    assert ran.code is None and ran.failure is not None and ran.failure.startswith("cannot run: ")


@pytest.mark.parametrize("argv", ["echo hi; rm -rf /", [], ["ok", 3]])
def test_a_shell_line_or_a_bad_argv_is_refused(argv: object) -> None:
    with pytest.raises(ValueError, match="never a shell line"):
        spawn(argv)  # type: ignore[arg-type]


def test_spawn_gives_a_session_of_its_own_and_stop_group_ends_a_program_that_ignores_sigterm() -> None:
    proc = spawn(py("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
                    "time.sleep(60)"), stderr=programs.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    started = time.monotonic()
    assert stop_group(proc, 0.3) == "did not stop within 0.3 s of SIGTERM: killed"
    assert proc.returncode == -9 and time.monotonic() - started < 5
    assert stop_group(proc, 0.3) == "already ended"
    proc.stdout.close()


def test_stop_group_is_gentle_first() -> None:
    proc = spawn(py("import time; time.sleep(60)"), stdout=programs.DEVNULL, stderr=programs.DEVNULL)
    time.sleep(0.2)
    assert stop_group(proc, 10) == "stopped with SIGTERM" and proc.returncode == -15
