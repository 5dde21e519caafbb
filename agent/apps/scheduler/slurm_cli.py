"""scontrol and sinfo, bounded: found without PATH, run with a timeout and a size cap, parsed defensively.

They run as root, so they are trusted input (agent.io.trusted_exec): owned by root or us, writable by
nobody else, in folders nobody else can write; one that is not is refused by name, with the reason.
Every call gets what is left of the run's one deadline (agent.apps.scheduler.settings.Deadline), at most
slurm_timeout_s; an `scontrol update` never starts with less than MIN_UPDATE_S (or 1.5 x the slowest
call so far) left, so the deadline cannot cut a drain or a resume in half.

slurmd runs HealthCheckProgram with almost no environment (SLURMD_NODENAME and PWD: no PATH, no
SLURM_CONF), so the tools are looked up in the configured folder or the usual ones, and SLURM_CONF
comes from the config when it names one. Every call: argv only (no shell), its own process group
killed at the timeout, at most MAX_OUTPUT bytes read, a failure reported as SlurmError.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from agent.apps.scheduler.settings import MIN_UPDATE_S, SLURM_BIN_DIRS, Deadline, HealthSettings
from agent.io import programs
from agent.io.trusted_exec import UntrustedProgram, find_program

# sinfo --json answers for the whole cluster whatever -n/-p says (Slurm 22.05), ~1.3 kB a node: 10k
# nodes are ~13 MB
MAX_OUTPUT = 32 << 20
MAX_LINES = 100_000
MAX_REASON = 512
MAX_PARTITIONS = 64  # a node in more is one we cannot count the breaker for: never drained
MAX_NAME = 256
_STATE_TOKEN = re.compile(r"(?:^|\s)State=([A-Z_+*~#!%$@^-]{1,200})(?=\s|$)")


class SlurmError(Exception):
    """A Slurm call that failed, timed out or answered what cannot be parsed."""


@dataclass(frozen=True)
class NodeState:
    name: str
    flags: frozenset[str]  # State=IDLE+DRAIN -> {"IDLE", "DRAIN"}
    reason: str  # "" when none
    partitions: tuple[str, ...] | None  # None: Slurm's answer did not say them readably
    reason_user: str = ""  # who set the reason and when (Slurm's epoch seconds; 0: none), as Slurm reports
    reason_time: int = 0

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags


class Slurm:
    def __init__(self, settings: HealthSettings, deadline: Deadline | None = None) -> None:
        self.timeout_s = settings.slurm_timeout_s
        self.deadline = deadline
        self.slowest_s = 0.0  # the slowest answer so far: how long an update may take to finish
        self.seen: dict[str, NodeState] = {}  # the last view(): what the breaker counts, no second call
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
        """The node's state flags (scontrol) and its reason, who set it and when, and its partitions (the
        structured fields of one `sinfo --json`, whose whole view is kept in `seen` for the breaker)."""
        shown = self.call([self.scontrol, "show", "node", "-o", name])
        lines = [line for line in shown.splitlines() if line.startswith(f"NodeName={name} ")]
        if len(lines) != 1:
            raise SlurmError(f"scontrol show node {name}: no such node")
        state = _STATE_TOKEN.search(lines[0])
        if state is None:
            raise SlurmError(f"scontrol show node {name}: no State")
        flags = frozenset(f.rstrip("*~#!%$@^-") for f in state.group(1).split("+"))
        listed = self.view().get(name)
        if listed is None:
            raise SlurmError(f"sinfo --json: node {name} not listed")
        return NodeState(name, flags, listed.reason, listed.partitions, listed.reason_user, listed.reason_time)

    def view(self) -> dict[str, NodeState]:
        """Every node Slurm lists, from one bounded `sinfo --json` (also kept as `seen`)."""
        self.seen = parse_view(self.call([self.sinfo, "--json"]))
        return self.seen

    def update(self, name: str, state: str, reason: str | None = None) -> list[str]:
        argv = self.update_argv(name, state, reason)
        self.call(argv)
        return argv

    def update_argv(self, name: str, state: str, reason: str | None = None) -> list[str]:
        return [self.scontrol, "update", f"NodeName={name}", f"State={state}",
                *([f"Reason={reason}"] if reason is not None else [])]


def parse_view(text: str) -> dict[str, NodeState]:
    """sinfo --json's nodes, each field checked (hostile input). A node without a readable name, or
    twice, spoils the whole view (a count must not miss one); unreadable partitions are None and an
    unreadable reason one that is nobody's ("(unreadable)"): such a node is never ours to drain."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise SlurmError("sinfo --json: not JSON") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list) or len(nodes) > MAX_LINES:
        raise SlurmError("sinfo --json: no list of nodes")
    view: dict[str, NodeState] = {}
    for node in nodes:
        name = node.get("name") if isinstance(node, dict) else None
        if not (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable()
                and not any(c.isspace() for c in name)) or name in view:
            raise SlurmError(f"sinfo --json: a node named {str(name)[:40]!r}")
        assert isinstance(node, dict)
        base, extra = node.get("state"), node.get("state_flags")
        flags = {base.upper()} if isinstance(base, str) else set()
        flags |= {f.upper() for f in extra if isinstance(f, str)} if isinstance(extra, list) else set()
        reason, user, at = node.get("reason"), node.get("reason_set_by_user"), node.get("reason_changed_at")
        view[name] = NodeState(
            name, frozenset(flags),
            reason if isinstance(reason, str) and len(reason) <= MAX_REASON else "(unreadable)",
            _partitions(node.get("partitions")),
            user[:MAX_NAME] if isinstance(user, str) else "",
            at if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < 10**11 else 0)
    return view


def _partitions(value: object) -> tuple[str, ...] | None:
    """Every partition name as Slurm gives it (`gpu+h100`, `H100(A)`, `gpu#1` alike), or None when any is
    unreadable or there are too many: the breaker could not be counted for the node."""
    if not isinstance(value, list) or len(value) > MAX_PARTITIONS:
        return None
    names = [p for p in value if isinstance(p, str) and 0 < len(p) <= MAX_NAME and p.isprintable()]
    return tuple(dict.fromkeys(names)) if len(names) == len(value) else None


def _find(name: str, folders: list[Path]) -> str:
    """The first folders/name, if root may run it (agent.io.trusted_exec): a planted one is refused, not skipped."""
    try:
        return find_program(name, folders, name)
    except UntrustedProgram as exc:
        raise SlurmError(f"{exc} (health_check.slurm_bin_dir)") from None


def run_bounded(argv: list[str], env: dict[str, str], timeout_s: float) -> str:
    """argv's stdout (at most MAX_OUTPUT bytes); SlurmError on a timeout, an exit other than 0, too much."""
    ran = programs.run_bounded(argv, timeout_s=timeout_s, env=env, max_output=MAX_OUTPUT)
    name = Path(argv[0]).name
    if ran.code is None:
        raise SlurmError(f"{name}: {ran.failure}")
    conf = env.get("SLURM_CONF") or "the default slurm.conf (/etc/slurm/slurm.conf)"
    if ran.failure:
        raise SlurmError(f"{name} {argv[1] if len(argv) > 1 else ''}: {ran.failure} (slurm.conf: {conf})")
    if ran.code != 0:
        # scontrol's first line says it (a DNS lookup of the controller, a refused connection); what follows
        # repeats it per retry. Which slurm.conf it read is what to check next.
        lines = [" ".join(line.split()) for line in ran.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        first = lines[0][:200] if lines else "(nothing on stderr)"
        raise SlurmError(f"{name} {argv[1] if len(argv) > 1 else ''}: exit {ran.code}: {first} (slurm.conf: {conf})")
    return ran.stdout.decode("utf-8", "replace")
