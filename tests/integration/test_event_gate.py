"""Issue 30.11: the event-driven gate. The daemon says a verdict changed (verdict.json, only then);
a trigger (systemd's path unit, or `health-check --slurm --follow`) runs `health-check --slurm --event`,
which acts on the daemon's fresh word only and only drains, under the node's gate lock, against the
real slurmctld of tests/peers/slurm.py. The whole loop over NVIDIA's mock NVML is in
tests/nvml_mock/test_event_gate_mock.py, its latency in benchmarks/bench_event_gate.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent.apps.scheduler.answer import Answer
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm import act
from agent.apps.scheduler.state import VERDICT_FILE, DaemonStateFile
from agent.apps.scheduler.trigger import follow, stamp
from agent.engine.audit import AuditRequest, run_audit
from agent.policy.config import Config
from agent.report.model import Report
from tests.decisions import decisions
from tests.peers.slurm import EXTRA_NODES, SlurmCluster, slurm_cluster  # noqa: F401

NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
HEALTHY, LOST_GPU = "hgx-h100-healthy", "hgx-h100-drifted"
REPORTS: dict[str, Report] = {}


def report(name: str) -> Report:
    if name not in REPORTS:
        REPORTS[name] = run_audit(AuditRequest(config=Config(), simulate=name))
    return REPORTS[name]


def daemon_says(state: DaemonStateFile, name: str) -> None:
    """What the daemon writes after judging the simulated node `name`."""
    state.update(report(name), time.time(), {"nvml": time.time(), "host": time.time()})


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:  # noqa: F811
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def event_gate(cluster: SlurmCluster, tmp_path: Path, *args: str, event: bool = True) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nhealth_check:\n  slurm_conf: {cluster.conf}\n")
    return subprocess.run([NODEWARDEN, "health-check", "--slurm", *(["--event"] if event else []), "--config",
                           str(config), "--node", EXTRA_NODES[0], *args], env={"PWD": "/"}, cwd="/",
                          capture_output=True, text=True, timeout=60, check=False)


def trail(tmp_path: Path) -> list[dict[str, object]]:
    return decisions(tmp_path / "state")


def test_the_daemon_signals_a_verdict_change_only(tmp_path: Path) -> None:
    state = DaemonStateFile(tmp_path, {"nvml": 1.0, "host": 30.0})
    signal = tmp_path / "scheduler" / VERDICT_FILE
    daemon_says(state, HEALTHY)
    first = stamp(tmp_path)
    assert first is not None and json.loads(signal.read_text())["verdict"] == "OK"
    daemon_says(state, HEALTHY)  # a new evaluation, the same verdict: daemon.json rewritten, no signal
    assert stamp(tmp_path) == first
    daemon_says(state, LOST_GPU)
    assert stamp(tmp_path) != first and json.loads(signal.read_text())["verdict"] == "DRAIN"
    after = stamp(tmp_path)
    daemon_says(state, LOST_GPU)
    assert stamp(tmp_path) == after


def test_follow_runs_once_at_start_then_once_per_change_and_coalesces(tmp_path: Path) -> None:
    state = DaemonStateFile(tmp_path, {})
    stop = threading.Event()
    runs: list[int] = []

    def run(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        runs.append(len(runs))
        if len(runs) == 2:  # two more changes while this run goes: one more run, not two
            daemon_says(state, HEALTHY)
            daemon_says(state, LOST_GPU)
        return 0, "ran"

    follower = threading.Thread(target=follow, args=(tmp_path, ["gate"], stop),
                                kwargs={"timeout_s": 5.0, "poll_s": 0.02, "run": run})
    follower.start()
    try:
        time.sleep(0.3)
        assert runs == []  # no daemon yet: nothing to run
        daemon_says(state, LOST_GPU)  # the first verdict: one run
        time.sleep(0.3)
        assert runs == [0]  # and none more while nothing changes
        daemon_says(state, LOST_GPU)  # a new evaluation, the same verdict: no signal, no run
        time.sleep(0.3)
        assert runs == [0]
        daemon_says(state, HEALTHY)  # a change: one run, during which two more come: one more run
        time.sleep(0.5)
        assert runs == [0, 1, 2], runs
    finally:
        stop.set()
        follower.join(timeout=10)
    assert not follower.is_alive()
    stop.clear()

    def run_and_stop(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        stop.set()
        return 0, ""

    count = follow(tmp_path, ["gate"], stop, timeout_s=5.0, poll_s=0.02, run=run_and_stop)
    assert count == 1  # a follower started later catches up once on the file that is there


def test_the_event_gate_drains_on_the_daemons_word_and_never_resumes(cluster: SlurmCluster, tmp_path: Path) -> None:
    state = DaemonStateFile(tmp_path / "state", {"nvml": 1.0, "host": 30.0})
    (tmp_path / "state").mkdir(mode=0o700)
    node = EXTRA_NODES[0]
    daemon_says(state, LOST_GPU)
    done = event_gate(cluster, tmp_path, "--simulate", LOST_GPU, "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1, done.stdout + done.stderr
    drained, reason = cluster.state(node)
    assert drained == "drained" and reason.startswith("nodewarden: gpu.lost gpu7"), (drained, reason)
    assert trail(tmp_path)[-1]["trigger"] == "event" and trail(tmp_path)[-1]["action"] == "drain"
    daemon_says(state, HEALTHY)
    for _ in range(3):  # healthy, but the event gate only drains: resuming is the periodic check's
        done = event_gate(cluster, tmp_path, "--simulate", HEALTHY, "--state-dir", str(tmp_path / "state"))
        assert "the event gate only drains" in done.stdout, done.stdout + done.stderr
        assert cluster.state(node) == ("drained", reason)
    memory = json.loads((tmp_path / "state" / "scheduler" / f"slurm-{node}.json").read_text())
    assert memory["healthy"] == 0  # its runs are not healthy checks: the periodic one counts its own
    for _ in range(2):
        event_gate(cluster, tmp_path, "--simulate", HEALTHY, "--state-dir", str(tmp_path / "state"), event=False)
    assert cluster.state(node)[1] == ""


def test_the_event_gate_without_the_daemons_word_does_nothing(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    done = event_gate(cluster, tmp_path, "--simulate", LOST_GPU, "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 3 and "no daemon state file" in done.stdout, done.stdout + done.stderr
    done = event_gate(cluster, tmp_path, "--simulate", LOST_GPU)  # a recording, no daemon folder named
    assert done.returncode == 3 and "event gate acts on the daemon's word only" in done.stdout, done.stdout
    assert cluster.state(EXTRA_NODES[0]) == ("idle", "")


def test_the_periodic_and_the_event_gate_at_once_drain_once(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The node's gate lock: without it both read an idle node and both drain and mark it."""
    answer = Answer("DRAIN", "state file", actions=[{"action": "drain node", "drains": True, "severity": "critical",
                                                     "checks": ["gpu.lost"], "subjects": ["gpu7"], "gpus": [],
                                                     "message": "GPU 7 has fallen off the bus"}])
    settings = HealthSettings(state_dir=tmp_path, slurm_conf=cluster.conf)
    barrier = threading.Barrier(2)
    actions: list[str] = []

    def gate(drain_only: bool) -> None:
        barrier.wait()
        actions.append(act(answer, EXTRA_NODES[1], settings, dry_run=False, drain_only=drain_only).action)

    threads = [threading.Thread(target=gate, args=(flag,)) for flag in (False, True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(actions) == ["drain", "none"], actions
    assert cluster.state(EXTRA_NODES[1])[1].startswith("nodewarden: gpu.lost gpu7")


def test_follow_and_event_need_slurm() -> None:
    for flag in ("--event", "--follow"):
        done = subprocess.run([NODEWARDEN, "health-check", flag, "--simulate", HEALTHY], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 2 and "go with --slurm" in done.stderr, done.stderr


def test_a_state_file_of_another_reading_is_ignored_and_said(tmp_path: Path) -> None:
    """Issue 36.6: a daemon's state file of another node (here a simulated one) was ignored in silence."""
    state = DaemonStateFile(tmp_path / "state", {"nvml": 1.0, "host": 30.0})
    (tmp_path / "state").mkdir(mode=0o700)
    daemon_says(state, LOST_GPU)
    done = subprocess.run([NODEWARDEN, "health-check", "--simulate", HEALTHY, "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")
    first = done.stdout.splitlines()[0]
    assert done.returncode == 0 and first.startswith("OK (one-shot audit"), done.stdout + done.stderr
    assert "judged simulated" in first and LOST_GPU in first and "not this node: ignored" in first, first


def test_a_dry_run_writes_nothing_not_even_the_lock(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    done = event_gate(cluster, tmp_path, "--simulate", LOST_GPU, "--state-dir", str(tmp_path / "state"), "--dry-run",
                      event=False)
    assert "dry run: would run:" in done.stdout and "State=DRAIN" in done.stdout, done.stdout + done.stderr
    assert list((tmp_path / "state").iterdir()) == []
    assert "drain" not in cluster.state(EXTRA_NODES[0])[0] and cluster.state(EXTRA_NODES[0])[1] == ""
