"""Issue 30.11, the whole loop on real peers: a GPU that falls off the bus (NVIDIA's mock NVML, its
live overrides file) is drained in Slurm (the real slurmctld) by the event gate the daemon's verdict
change starts (`health-check --slurm --follow`, the trigger without systemd), long before any
HealthCheckInterval; a healthy node beside it is never drained, the periodic check never resumes
while the fault is there, and resumes once each cause is back as pass. Latency is measured in
benchmarks/bench_event_gate.py, never here: the waits below are only upper bounds for a stuck loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.event_gate import gated_node, wait_until
from tests.peers.slurm import EXTRA_NODES, SlurmCluster, slurm_cluster  # noqa: F401

pytestmark = pytest.mark.nvml_mock


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:  # noqa: F811
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def test_a_gpu_off_the_bus_is_drained_by_the_event_gate_and_nothing_else_moves(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    faulty, healthy = EXTRA_NODES[2], EXTRA_NODES[3]
    with gated_node(cluster, faulty, tmp_path / "faulty") as node, gated_node(cluster, healthy, tmp_path / "ok") as ok:
        for gpu in (2, 6):
            node.lose(gpu)
            wait_until(lambda: "DRAIN" in node.slurm_flags(), 30, f"{faulty} drained for GPU {gpu}", every_s=0.1)
            wait_until(lambda: any(e["action"] == "drain" for e in node.trail()), 30, "the drain in the trail")
            drains = [e for e in node.trail() if e["action"] == "drain"]
            assert drains[-1]["trigger"] == "event" and f"gpu.lost gpu{gpu}" in str(drains[-1]["why"]), drains
            assert not any(e["trigger"] == "periodic" for e in node.trail()), "drained by the event gate alone"
            kept = node.periodic()  # the fault is still there: never a resume
            assert "already drained by nodewarden" in kept.stdout, kept.stdout + kept.stderr
            assert "DRAIN" in node.slurm_flags()
            node.heal()
            wait_until(lambda: node.daemon_verdict() == "OK", 30, "the daemon sees the GPU back")
            for _ in range(2):  # resume_after: 2 healthy periodic checks, each cause back as pass
                node.periodic()
            assert "DRAIN" not in node.slurm_flags(), node.trail()[-1]
            assert [e["action"] for e in node.trail() if e["trigger"] == "periodic"][-2:] == ["none", "resume"]
            node.forget_trail()
        assert "DRAIN" not in ok.slurm_flags()
        assert ok.trail() and all(e["action"] == "none" for e in ok.trail()), ok.trail()
