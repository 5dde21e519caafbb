"""Load runners: `none` (observe what already runs), `command` (any program) and `torch` (built-in burn).

A command runs in its own process group (so its children go with it), under a guard that stops the
group when accept ends in any way (agent.apps.accept.load_guard), its output goes to our stderr
(stdout is the report's) and the last lines are kept for the result. Stopping is SIGTERM to the
group, then SIGKILL after a grace period: a load that ignores SIGTERM never keeps the run waiting.
Nothing here touches a GPU setting.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from agent.io.programs import STDOUT, run_bounded, spawn, stop_group
from agent.io.trusted_exec import UntrustedProgram, resolve_command, trusted_program, trusted_source
from agent.io.trusted_input import check_folders

TAIL_LINES, TAIL_LINE_CHARS = 5, 300
GUARD = Path(__file__).resolve().with_name("load_guard.py")
GUARD_GRACE_S = 10.0  # SIGTERM to SIGKILL when accept is gone, as accept's own stop gives


class LoadError(Exception):
    """The load could not start; str() is the result's message ("load could not start: ...")."""


class LoadRunner:
    """`none`: nothing to start or stop."""

    kind = "none"

    def describe(self) -> str:
        return "none (observing the running workload)"

    def start(self) -> None:
        return None

    def ended(self) -> str | None:
        """Why the load is no longer running (None while it runs, or for `none`)."""
        return None

    def stop(self, grace_s: float = 10.0) -> str | None:
        """Stop it; what had to be done (None when nothing ran)."""
        return None


class CommandLoad(LoadRunner):
    kind = "command"

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        if not argv:
            raise LoadError("load could not start: --load command needs the command after --")
        self.argv = list(argv)
        self.env = env
        self.cwd: str | None = None  # the operator's command starts where accept was started
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None
        self._alive: int | None = None  # the write end of the guard's pipe, held while the load may run

    def describe(self) -> str:
        return " ".join(self.argv)[:300]

    def start(self) -> None:
        # accept runs as root: the program is trusted input (agent.io.trusted_exec), looked up in the
        # absolute folders of PATH only (an empty or relative entry would be the working folder)
        search = [d for d in (self.env or os.environ).get("PATH", os.defpath).split(os.pathsep) if d.startswith("/")]
        try:
            program = resolve_command(self.argv[0], search, "load command")
        except UntrustedProgram as exc:
            raise LoadError(f"load could not start: {exc}") from None
        self.start_checked(program)

    def start_checked(self, program: str) -> None:
        """Start `program` with argv[1:]: the program has passed agent.io.trusted_exec's rule.

        It runs under the guard (agent.apps.accept.load_guard), which leads the load's session and stops
        the whole group when accept ends, SIGKILL included; `self.proc` is the guard.
        """
        alive_read, self._alive = os.pipe()  # only accept holds the write end: its end is the guard's EOF
        guard = [sys.executable, "-I", str(GUARD), str(alive_read), f"{GUARD_GRACE_S:g}", "--", program,
                 *self.argv[1:]]
        try:
            self.proc = spawn(guard, stderr=STDOUT, env=self.env, pass_fds=(alive_read,),  # the operator's argv
                              cwd=self.cwd)
        except OSError as exc:
            os.close(self._alive)
            raise LoadError(f"load could not start: {self.argv[0]}: {exc.strerror or exc}") from None
        finally:
            os.close(alive_read)
        self.started = time.monotonic()
        self._reader = threading.Thread(target=self._pump, name="load-output", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        """Pass the load's output on to our stderr, keeping its last lines (bounded) for the result."""
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        for raw in iter(lambda: stdout.readline(4096), b""):  # bounded: a load may print without newlines
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.tail.append(line[-TAIL_LINE_CHARS:])  # the end of a long line says most
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"[load] {line}\n")

    def last_words(self) -> str:
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        return f": {self.tail[-1]}" if self.tail else ""

    def ended(self) -> str | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"the load {how} after {time.monotonic() - self.started:.1f} s{self.last_words()}"

    def stop(self, grace_s: float = 10.0) -> str | None:
        proc = self.proc
        if proc is None:
            return None
        how = stop_group(proc, grace_s)  # "already ended" still kills what it left in its group
        self._release_guard()
        return how

    def _release_guard(self) -> None:
        if self._alive is not None:
            with contextlib.suppress(OSError):
                os.close(self._alive)
            self._alive = None

class TorchLoad(CommandLoad):
    """A matrix-multiply burn on every GPU (agent.apps.accept.torch_burn) in a child process, so a CUDA
    hang or crash is the child's, and stopping it is the same as for any command.

    accept runs as root, so the child imports nothing from where accept was started: the
    interpreter runs isolated (`-I`: no working folder or script folder on sys.path, no PYTHON*
    variables, no user site), the burn is named by its absolute path, the working folder is `/`
    and the environment is rebuilt from nothing (CHILD_ENV). The interpreter is held to the rule
    for every program root runs (agent.io.trusted_exec), and so is the burn script's file.
    """

    kind = "torch"
    # rebuilt, not inherited: LD_PRELOAD, PYTHONPATH, PYTHONSTARTUP, CUDA_VISIBLE_DEVICES (acceptance
    # burns every GPU) and the rest of the caller's environment stay behind
    CHILD_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/",
                 "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"

    def __init__(self, seconds: float, python: str | None = None) -> None:
        self.python = python or sys.executable
        script = Path(__file__).resolve().with_name("torch_burn.py")
        super().__init__([self.python, "-I", str(script), "--seconds", f"{seconds:.0f}"], dict(self.CHILD_ENV))
        self.cwd = "/"

    def describe(self) -> str:
        return "torch (matrix-multiply burn per GPU)"

    def start(self) -> None:
        try:
            # a venv's python is a link whose place says which site-packages it sees: it is checked
            # (with the folder holding the link) and run by that name, not by the link's target
            trusted_program(self.python, "the Python interpreter for --load torch")
            check_folders(os.path.dirname(os.path.abspath(self.python)), "the Python interpreter for --load torch",
                          UntrustedProgram, self.python)
            trusted_source(self.argv[2], "the built-in burn")
        except UntrustedProgram as exc:
            raise LoadError(f"load could not start: {exc}") from None
        if not self._child_has_torch():
            raise LoadError("load could not start: PyTorch is not installed (pip install 'nodewarden[load]', "
                            "or use --load command -- CMD)")
        self.start_checked(self.python)

    def _child_has_torch(self) -> bool:
        """Whether the isolated child would import torch: asked of the child's own view, not ours
        (our sys.path may hold the folder accept was started from)."""
        return run_bounded([self.python, "-I", "-c", self.PROBE], env=dict(self.CHILD_ENV), timeout_s=60).ok


def make_runner(kind: str, argv: Sequence[str], seconds: float) -> LoadRunner:
    if kind == "torch":
        return TorchLoad(seconds)
    if kind == "command":
        return CommandLoad(argv)
    if argv:
        raise LoadError(f"load could not start: a command was given after -- but --load is {kind}")
    return LoadRunner()
