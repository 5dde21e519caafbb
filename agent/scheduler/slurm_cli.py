"""scontrol and sinfo, bounded: found without PATH, run with a timeout and a size cap, parsed defensively.

They run as root, so they are trusted input (agent.trusted_exec): owned by root or us, writable by
nobody else, in folders nobody else can write; one that is not is refused by name, with the reason.
Every call gets what is left of the run's one deadline (agent.scheduler.settings.Deadline), at most
slurm_timeout_s; an `scontrol update` never starts with less than MIN_UPDATE_S (or 1.5 x the slowest
call so far) left, so the deadline cannot cut a drain or a resume in half.

slurmd runs HealthCheckProgram with almost no environment (SLURMD_NODENAME and PWD: no PATH, no
SLURM_CONF), so the tools are looked up in the configured folder or the usual ones, and SLURM_CONF
comes from the config when it names one. Every call: argv only (no shell), its own process group
killed at the timeout, at most MAX_OUTPUT bytes read, a failure reported as SlurmError.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agent.scheduler.settings import MIN_UPDATE_S, SLURM_BIN_DIRS, Deadline, HealthSettings
from agent.trusted_exec import UntrustedProgram, find_program

MAX_OUTPUT = 1 << 20  # sinfo of a 10k-node partition is ~500 kB
MAX_LINES = 100_000
MAX_REASON = 512
_STATE_TOKEN = re.compile(r"(?:^|\s)State=([A-Z_+*~#!%$@^-]{1,200})(?=\s|$)")
_PARTITIONS_TOKEN = re.compile(r"(?:^|\s)Partitions=([A-Za-z0-9._,-]{0,4000})(?=\s|$)")


class SlurmError(Exception):
    """A Slurm call that failed, timed out or answered what cannot be parsed."""


@dataclass(frozen=True)
class NodeState:
    name: str
    flags: frozenset[str]  # State=IDLE+DRAIN -> {"IDLE", "DRAIN"}
    reason: str  # "" when none
    partitions: tuple[str, ...]

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags


class Slurm:
    def __init__(self, settings: HealthSettings, deadline: Deadline | None = None) -> None:
        self.timeout_s = settings.slurm_timeout_s
        self.deadline = deadline
        self.slowest_s = 0.0  # the slowest answer so far: how long an update may take to finish
        folders = [settings.slurm_bin_dir] if settings.slurm_bin_dir else list(SLURM_BIN_DIRS)
        self.scontrol, self.sinfo = (_find(name, folders) for name in ("scontrol", "sinfo"))
        # Only what the tools need: slurmd's own environment is near empty anyway.
        self.env = {"PATH": "/usr/sbin:/usr/bin:/bin", "LC_ALL": "C"}
        conf = settings.slurm_conf or (Path(os.environ["SLURM_CONF"]) if os.environ.get("SLURM_CONF") else None)
        if conf is not None:
            self.env["SLURM_CONF"] = str(conf)

    def call(self, argv: list[str]) -> str:
        timeout = self.timeout_s
        what = f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''}"
        if self.deadline is not None:
            left = self.deadline.left()
            need = max(MIN_UPDATE_S, 1.5 * self.slowest_s) if argv[1:2] == ["update"] else 0.05
            if left < need:
                raise SlurmError(f"{what}: not started: {max(left, 0):.1f} s left of the {self.deadline.total_s:g} s "
                                 f"deadline, {need:.1f} s needed")
            timeout = min(timeout, left)
        started = time.monotonic()
        try:
            return run_bounded(argv, self.env, timeout)
        except SlurmError as exc:
            if self.deadline is not None and self.deadline.left() <= 0:
                raise SlurmError(f"{exc} (the {self.deadline.total_s:g} s deadline hit)") from None
            raise
        finally:
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)

    def node(self, name: str) -> NodeState:
        """The node's state flags and partitions (scontrol) and its reason (sinfo, whole and last)."""
        shown = self.call([self.scontrol, "show", "node", "-o", name])
        lines = [line for line in shown.splitlines() if line.startswith(f"NodeName={name} ")]
        if len(lines) != 1:
            raise SlurmError(f"scontrol show node {name}: no such node")
        state = _STATE_TOKEN.search(lines[0])
        if state is None:
            raise SlurmError(f"scontrol show node {name}: no State")
        parts = _PARTITIONS_TOKEN.search(lines[0])
        partitions = tuple(p for p in (parts.group(1).split(",") if parts else []) if p[:1].isalnum())[:64]
        reason_lines = self.call([self.sinfo, "-h", "-N", "-n", name, "-o", "%N|%E"]).splitlines()
        reasons = {line.partition("|")[2] for line in reason_lines[:64] if line.partition("|")[0] == name}
        reason = next(iter(reasons), "none")
        flags = frozenset(f.rstrip("*~#!%$@^-") for f in state.group(1).split("+"))
        return NodeState(name, flags, "" if reason == "none" else reason[:MAX_REASON], partitions)

    def partition_reasons(self, partition: str) -> dict[str, str]:
        """Each node of `partition` and its reason ("" when none)."""
        out = self.call([self.sinfo, "-h", "-N", "-p", partition, "-o", "%N|%E"])
        nodes: dict[str, str] = {}
        for line in out.splitlines()[:MAX_LINES]:
            name, bar, reason = line.partition("|")
            if not bar or not name:
                continue
            nodes[name[:256]] = "" if reason == "none" else reason[:MAX_REASON]
        return nodes

    def update(self, name: str, state: str, reason: str | None = None) -> list[str]:
        argv = self.update_argv(name, state, reason)
        self.call(argv)
        return argv

    def update_argv(self, name: str, state: str, reason: str | None = None) -> list[str]:
        return [self.scontrol, "update", f"NodeName={name}", f"State={state}",
                *([f"Reason={reason}"] if reason is not None else [])]


def _find(name: str, folders: list[Path]) -> str:
    """The first folders/name, if root may run it (agent.trusted_exec): a planted one is refused, not skipped."""
    try:
        return find_program(name, folders, name)
    except UntrustedProgram as exc:
        raise SlurmError(f"{exc} (health_check.slurm_bin_dir)") from None


def run_bounded(argv: list[str], env: dict[str, str], timeout_s: float) -> str:
    """argv's stdout (at most MAX_OUTPUT bytes); SlurmError on a timeout, an exit other than 0, too much."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # argv, no shell
                                stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        raise SlurmError(f"{Path(argv[0]).name}: cannot run: {exc}") from None
    out, err = bytearray(), bytearray()
    failure = None
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                failure = f"timed out after {timeout_s:g} s"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk
                if len(out) > MAX_OUTPUT or len(err) > MAX_OUTPUT:
                    failure = f"answered more than {MAX_OUTPUT} bytes"
                    break
            if failure:
                break
    if failure:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        code = proc.wait(timeout=max(0.1, timeout_s - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        failure = failure or f"timed out after {timeout_s:g} s"
    proc.stdout.close()
    proc.stderr.close()
    name = Path(argv[0]).name
    if failure:
        raise SlurmError(f"{name} {argv[1] if len(argv) > 1 else ''}: {failure}")
    if code != 0:
        message = " ".join(err.decode("utf-8", "replace").split())[:300]
        raise SlurmError(f"{name} {argv[1] if len(argv) > 1 else ''}: exit {code}: {message}")
    return out.decode("utf-8", "replace")
