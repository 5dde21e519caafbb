"""The event-driven gate's whole loop on real peers (issue 30.11), for tests and benchmarks.

A `GatedNode` is one Slurm node of tests/peers/slurm.py's cluster (a spare NodeName: nothing runs
there but us) watched by a real `nodewarden daemon` over NVIDIA's mock NVML (its live overrides file
is where faults go in) and the trigger `nodewarden health-check --slurm --follow`, exactly as on a
node without systemd as PID 1. The daemon here judges this machine's host side too, which is no
GPU server: every area but the GPUs is waived (dated, with a reason, as a site would), so the
verdict is the mock GPUs'.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.daemon_peer import running_daemon
from tests.decisions import decisions
from tests.nvml_mock.conftest import mock_config, mock_env, write_config
from tests.peers.slurm import TOOLS, SlurmCluster

NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
NOT_GPUS = ("bios", "bmc", "crosscheck", "fabric", "firmware", "host", "ib", "net", "pcie", "topology", "baseline")


def waivers(path: Path) -> Path:
    until = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    path.write_text(json.dumps({"waivers": [
        {"check": f"{area}.*", "reason": "a lab host, not a GPU server: only the mock GPUs are judged",
         "expires": until} for area in NOT_GPUS]}) + "\n")
    return path


@dataclass
class GatedNode:
    name: str
    root: Path
    overrides: Path
    cluster: SlurmCluster
    follower: subprocess.Popen[bytes] | None
    seen: int = 0  # decisions before this many are an earlier injection's (`forget_trail`)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def daemon_verdict(self) -> str | None:
        try:
            doc = json.loads((self.state_dir / "scheduler" / "daemon.json").read_text())
        except (OSError, ValueError):
            return None
        verdict = doc.get("verdict") if isinstance(doc, dict) else None
        return verdict if isinstance(verdict, str) else None

    def slurm_flags(self) -> set[str]:
        shown = self.cluster.run(TOOLS["scontrol"], "show", "node", "-o", self.name)
        state = next((w.removeprefix("State=") for w in shown.split() if w.startswith("State=")), "")
        return set(state.rstrip("*").split("+"))

    def lose(self, gpu: int) -> None:
        write_config(self.overrides, {"devices": {str(gpu): {"failure": {"mode": "fallen_off_bus"}}}})

    def heal(self) -> None:
        write_config(self.overrides, {"all": {}})

    def periodic(self) -> subprocess.CompletedProcess[str]:
        """The health-check slurmd would run (HealthCheckProgram), on the daemon's state file."""
        return subprocess.run([NODEWARDEN, "health-check", "--slurm", "--node", self.name, "--state-dir",
                               str(self.state_dir)], env={"PWD": "/", "SLURM_CONF": str(self.cluster.conf)},
                              cwd="/", capture_output=True, text=True, timeout=60, check=False)

    def trail(self) -> list[dict[str, object]]:
        """health-check's decisions since the last `forget_trail`, from the node's ledger."""
        return decisions(self.state_dir)[self.seen:]

    def forget_trail(self) -> None:
        self.seen += len(self.trail())


def wait_until(ready: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.02) -> float:
    """Seconds until `ready`, polled every `every_s`; AssertionError after `timeout_s`."""
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)
    return time.monotonic() - started


@contextlib.contextmanager
def gated_node(cluster: SlurmCluster, name: str, root: Path, nvml_poll_s: float = 1.0) -> Iterator[GatedNode]:
    """The daemon (its verdict OK before anything follows it), then the trigger; both stopped at the end."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / "state").mkdir(mode=0o700, exist_ok=True)
    overrides = write_config(root / "overrides.yaml", {"all": {}})
    config = root / "config.yaml"
    config.write_text(json.dumps({"state_dir": str(root / "state"), "waivers_file": str(waivers(root / "w.yaml")),
                                  "daemon": {"intervals": {"nvml": nvml_poll_s, "host": 30}}}) + "\n")
    env = mock_env(mock_config(root), overrides=overrides)
    with running_daemon(root, "--config", str(config), "--log-format", "json", env=env):
        probe = GatedNode(name, root, overrides, cluster, None)
        wait_until(lambda: probe.daemon_verdict() == "OK", 30, f"{name}: the daemon's verdict OK")
        with (root / "follow.log").open("ab") as log:
            follower = subprocess.Popen(
                [NODEWARDEN, "health-check", "--slurm", "--follow", "--node", name, "--state-dir", str(root / "state")],
                env={"PATH": "/usr/sbin:/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)}, cwd="/",
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node = GatedNode(name, root, overrides, cluster, follower)
        try:
            wait_until(lambda: bool(node.trail()), 30, f"{name}: the follower's first run")
            yield node
        finally:
            follower.send_signal(signal.SIGTERM)
            try:
                follower.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(follower.pid, signal.SIGKILL)
                follower.wait()
