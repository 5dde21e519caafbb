"""A real one-node Slurm cluster on 127.0.0.1 (Debian's slurmctld, slurmd, slurm-client, munge).

The recipe of ../shared/peers/80-slurm.sh as a fixture: munged (as user munge, its own key and
socket), slurmctld and slurmd in the foreground, each in its own process group through
tests.peers.processes (stopped at the end, on failure and on signals too), everything under a temp
folder, on free ports. slurmd's NodeName is the short host name; EXTRA_NODES more NodeNames that
never start sit in the same partition, so the circuit breaker has a partition to count.
`HealthCheckProgram` is a script the test may rewrite (`cluster.health_check`).
"""

from __future__ import annotations

import contextlib
import ctypes  # noqa: F401 - loaded here: the child started as user munge cannot read the interpreter's tree
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.locations import SETUP_COMMAND
from tests.peers.processes import spawn, stop

EXTRA_NODES = tuple(f"spare{i}" for i in range(1, 8))  # 8 nodes in the partition with this host's
PARTITION = "gpu"
# The breaker under concurrency (issue 30.1): 20 more never-started nodes in one partition whose name
# has characters the old parser refused; LONER is in no partition at all.
BURST_NODES = tuple(f"burst{i:02d}" for i in range(1, 21))
BURST_PARTITION = "h100+gpu:a@b/c%d~e(F)"
LONER = "loner"
INSTALL_HINT = f"run `{SETUP_COMMAND}` (as root: apt-get install slurmctld slurmd slurm-client munge)"
TOOLS = {"slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd", "munged": "/usr/sbin/munged",
         "scontrol": "/usr/bin/scontrol", "sinfo": "/usr/bin/sinfo"}


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str  # this host's NodeName (short host name: how slurmd finds itself)
    health_check: Path  # HealthCheckProgram: a script tests may rewrite
    env: dict[str, str]

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *EXTRA_NODES, *BURST_NODES, LONER)

    def states(self) -> dict[str, tuple[str, str]]:
        """(sinfo's long state, reason) of every node, one call."""
        out = self.run(TOOLS["sinfo"], "-h", "-N", "-o", "%N|%T|%E").splitlines()
        seen: dict[str, tuple[str, str]] = {}
        for line in out:
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            seen[node] = (state.strip().rstrip("*"), "" if reason.strip() == "none" else reason.strip())
        return seen

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def state(self, node: str | None = None) -> tuple[str, str]:
        """(sinfo's long state, reason) of `node`."""
        out = self.run(TOOLS["sinfo"], "-h", "-N", "-n", node or self.node, "-o", "%T|%E").splitlines()
        state, _, reason = out[0].partition("|")
        reason = reason.strip()
        # `*`: not responding (the spares never answer; slurmd between pings); "none": no reason
        return state.strip().rstrip("*"), "" if reason == "none" else reason

    def drain(self, node: str, reason: str) -> None:
        self.run(TOOLS["scontrol"], "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self.run(TOOLS["scontrol"], "update", f"NodeName={node}", "State=RESUME", check=False)

    def reset(self) -> None:
        """Every node back to no drain and no reason (a test's own drains undone)."""
        for node, (_, reason) in self.states().items():
            if reason:
                self.resume(node)
        self.resume(LONER)  # in no partition: sinfo does not list it
        deadline = time.monotonic() + 10
        while self.state(self.node)[0] not in ("idle", "mixed", "allocated") and time.monotonic() < deadline:
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(root: Path, node: str, health_check: Path) -> str:
    ctld_port, d_port = _free_port(), _free_port()
    extra = "\n".join(f"NodeName={name} NodeAddr=127.0.{1 + i // 200}.{2 + i % 200} CPUs=1 State=UNKNOWN"
                      for i, name in enumerate((*EXTRA_NODES, *BURST_NODES, LONER)))
    return f"""ClusterName=lab
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/run/munge.socket
StateSaveLocation={root}/spool/ctld
SlurmdSpoolDir={root}/spool/d
SlurmctldPidFile={root}/run/ctld.pid
SlurmdPidFile={root}/run/d.pid
SlurmctldLogFile={root}/log/ctld.log
SlurmdLogFile={root}/log/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SelectType=select/cons_tres
HealthCheckProgram={health_check}
HealthCheckInterval=2
HealthCheckNodeState=ANY
SlurmdTimeout=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
{extra}
PartitionName={PARTITION} Nodes={node},{",".join(EXTRA_NODES)} Default=YES MaxTime=INFINITE State=UP
PartitionName={BURST_PARTITION} Nodes={",".join(BURST_NODES)} MaxTime=INFINITE State=UP
"""


def _wait(what: str, ready: Callable[[], bool], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise AssertionError(f"{what} did not come up in {timeout_s} s:\n{tail}")


class SlurmUnavailable(RuntimeError):
    """The Slurm peer cannot run here (its tools are missing, or not root)."""


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    try:
        with running_cluster() as cluster:
            yield cluster
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@contextlib.contextmanager
def running_cluster() -> Iterator[SlurmCluster]:
    """The cluster, for the tests' fixture and for benchmarks (benchmarks/bench_event_gate.py)."""
    missing = [name for name, path in TOOLS.items() if not os.access(path, os.X_OK)]
    if missing:
        raise SlurmUnavailable(f"{', '.join(missing)} not installed: {INSTALL_HINT}")
    if os.geteuid() != 0:
        raise SlurmUnavailable("the Slurm peer runs slurmd as root (HealthCheckProgram); run the tests as root")
    # Not under pytest's 0700 temp root: munged runs as user munge and must reach its own folder.
    root = Path(tempfile.mkdtemp(prefix="nodewarden-slurm-"))
    root.chmod(0o755)
    for sub in ("etc", "spool/ctld", "spool/d", "log", "run", "munge/run", "munge/log"):
        (root / sub).mkdir(parents=True)
    munge = pwd.getpwnam("munge")
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (root / "munge", root / "munge/run", root / "munge/log", key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    node = socket.gethostname().split(".")[0]
    health_check = root / "healthcheck.sh"
    health_check.write_text("#!/bin/sh\nexit 0\n")
    health_check.chmod(0o755)
    conf = root / "etc" / "slurm.conf"
    conf.write_text(_config(root, node, health_check))
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "SLURM_CONF": str(conf), "HOME": str(root)}
    procs = []
    try:
        with (root / "munge-stderr.log").open("wb") as munge_log:
            # munged refuses root: started as user munge directly (no runuser in between, so the
            # parent-death signal and the process group reach munged itself)
            procs.append(spawn([TOOLS["munged"], "-F", "-f",
                                f"--key-file={key}", f"--socket={root}/munge/run/munge.socket",
                                f"--pid-file={root}/munge/run/munged.pid",
                                f"--log-file={root}/munge/log/munged.log", f"--seed-file={root}/munge/seed"],
                               env=env, stdout=subprocess.DEVNULL, stderr=munge_log, user=munge.pw_uid,
                               group=munge.pw_gid, extra_groups=[]))
        _wait("munged", (root / "munge/run/munge.socket").exists, 10, root / "munge-stderr.log")
        procs.append(spawn([TOOLS["slurmctld"], "-D", "-i"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL))
        procs.append(spawn([TOOLS["slurmd"], "-D"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cluster = SlurmCluster(root, conf, node, health_check, env)

        def up() -> bool:
            try:
                return cluster.state()[0] in ("idle", "mixed", "allocated")
            except (AssertionError, IndexError, subprocess.TimeoutExpired):
                return False

        _wait("slurmctld/slurmd", up, 30, root / "log" / "ctld.log")
        yield cluster
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(root, ignore_errors=True)
