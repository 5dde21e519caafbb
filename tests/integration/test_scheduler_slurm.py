"""`nodewarden health-check --slurm` against a real one-node Slurm cluster (tests/peers/slurm.py).

The command runs as slurmd runs it: an environment with only SLURMD_NODENAME and PWD (no PATH, no
SLURM_CONF: the config names slurm.conf), and the drains are read back with sinfo.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.apps.scheduler.answer import Answer
from agent.apps.scheduler.settings import HealthSettings
from agent.apps.scheduler.slurm import Decision, act
from tests.decisions import decisions
from tests.peers.slurm import BURST_NODES, EXTRA_NODES, LONER, TOOLS, SlurmCluster, slurm_cluster  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
HEALTHY, LOST_GPU = "hgx-h100-healthy", "hgx-h100-drifted"
EXIT_OK, EXIT_BAD, EXIT_UNKNOWN = 0, 1, 3


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:  # noqa: F811
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def write_config(tmp_path: Path, cluster: SlurmCluster, **health: object) -> Path:
    config = tmp_path / "config.yaml"
    lines = [f"state_dir: {tmp_path / 'state'}", "health_check:", f"  slurm_conf: {cluster.conf}"]
    lines += [f"  {key}: {json.dumps(value)}" for key, value in health.items()]
    config.write_text("\n".join(lines) + "\n")
    return config


def health_check(cluster: SlurmCluster, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as slurmd runs it: no PATH, no SLURM_CONF."""
    return subprocess.run([NODEWARDEN, "health-check", "--slurm", "--config", str(config), *args],
                          env={"SLURMD_NODENAME": cluster.node, "PWD": "/"}, cwd="/", capture_output=True,
                          text=True, timeout=60, check=False)


def trail(tmp_path: Path) -> list[dict[str, object]]:
    return decisions(tmp_path / "state")


def test_lost_gpu_drains_and_healthy_resumes_after_hysteresis(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster)
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    assert done.returncode == EXIT_BAD, done.stdout + done.stderr
    state, reason = cluster.state()
    assert state == "drained" and reason.startswith("nodewarden: gpu.lost gpu7"), (state, reason)
    assert trail(tmp_path)[-1]["action"] == "drain"

    first = health_check(cluster, config, "--simulate", HEALTHY)  # 1 of 2: still drained
    assert first.returncode == EXIT_OK, first.stdout + first.stderr
    assert "healthy 1 of 2" in first.stdout
    assert cluster.state() == ("drained", reason)
    second = health_check(cluster, config, "--simulate", HEALTHY)
    assert second.returncode == EXIT_OK, second.stdout + second.stderr
    assert cluster.state()[1] == "", cluster.state()
    assert cluster.state()[0] in ("idle", "mixed")
    assert [e["action"] for e in trail(tmp_path)] == ["drain", "none", "resume"]
    # the ledger keeps the acts as drain and resume (history.node's node_churn counts them), the rest as decision
    shown = subprocess.run([NODEWARDEN, "ledger", "show", "--state-dir", str(tmp_path / "state"), "--since", "1d",
                            "--kind", "drain", "--kind", "resume", "--format", "json"],
                           capture_output=True, text=True, timeout=60, check=True)
    acts = json.loads(shown.stdout)["incidents"]
    assert [(i["kind"], i["source"], i["subject"]) for i in acts] == [
        ("drain", "health-check", cluster.node), ("resume", "health-check", cluster.node)]
    assert "gpu.lost gpu7" in acts[0]["detail"]


def test_an_admins_drain_survives_critical_and_healthy_checks(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster, resume_after=1)
    cluster.drain(cluster.node, "maint: PSU swap")
    for simulate in (LOST_GPU, HEALTHY, HEALTHY):
        done = health_check(cluster, config, "--simulate", simulate)
        assert "not nodewarden's: left alone" in done.stdout, done.stdout + done.stderr
        assert cluster.state() == ("drained", "maint: PSU swap")


def test_a_degraded_node_is_not_drained(cluster: SlurmCluster, tmp_path: Path) -> None:
    snapshot = tmp_path / "degraded"
    shutil.copytree(REPO / "fixtures" / "nodes" / HEALTHY, snapshot)
    (snapshot / "fs/proc/sys/vm/zone_reclaim_mode").write_text("1\n")  # tuning drift only
    done = health_check(cluster, write_config(tmp_path, cluster), "--snapshot", str(snapshot))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert done.stdout.startswith("DEGRADED")
    assert cluster.state() == ("idle", "")


def test_the_breaker_holds_when_the_partition_has_too_many_nodewarden_drains(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster, breaker_percent=25, breaker_min_nodes=1)  # 8 nodes: limit 2
    cluster.drain(EXTRA_NODES[0], "nodewarden: gpu.lost gpu1: elsewhere")
    cluster.drain(EXTRA_NODES[1], "nodewarden: gpu.lost gpu2: elsewhere")
    cluster.drain(EXTRA_NODES[2], "maint: not ours, not counted")
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    assert "circuit breaker open: partition gpu has 2 of 8 nodes" in done.stdout, done.stdout + done.stderr
    assert cluster.state() == ("idle", "")
    assert trail(tmp_path)[-1]["action"] == "breaker"
    decision = json.loads((tmp_path / "state/scheduler/decision.json").read_text())
    assert decision["action"] == "breaker"
    cluster.resume(EXTRA_NODES[1])  # one fewer: below the limit, the drain goes ahead
    health_check(cluster, config, "--simulate", LOST_GPU)
    assert cluster.state()[1].startswith("nodewarden:")


def test_a_reason_in_our_form_that_this_gate_did_not_write_is_left_alone(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.4: `nodewarden:` at the start proves nothing; it is never rewritten (nor resumed)."""
    config = write_config(tmp_path, cluster)
    cluster.drain(cluster.node, "nodewarden: gpu.xid gpu3: an older finding")
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    assert "is not nodewarden's: left alone" in done.stdout, done.stdout + done.stderr
    assert cluster.state() == ("drained", "nodewarden: gpu.xid gpu3: an older finding")


def test_a_stale_state_file_decides_nothing(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster)
    folder = tmp_path / "state" / "scheduler"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)

    named = ("--state-dir", str(tmp_path / "state"))  # a recording is answered from the daemon named here only

    def stale(simulate: str, verdict: str) -> None:  # a daemon replaying what the check replays, gone quiet
        path = (REPO / "fixtures" / "nodes" / simulate).resolve()
        (folder / "daemon.json").write_text(json.dumps({
            "schema": "nodewarden.health/v1", "verdict": verdict, "actions": [], "gpus": {},
            "reading": f"simulated:{path}", "confirmed_at": time.time() - 3600, "fresh_for_s": 180}))

    stale(LOST_GPU, "DRAIN")
    done = health_check(cluster, config, "--simulate", LOST_GPU, *named)
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert "state file stale" in done.stdout
    assert cluster.state() == ("idle", "")
    cluster.drain(cluster.node, "nodewarden: gpu.lost gpu7: ours")  # nor is our own drain resumed
    stale(HEALTHY, "OK")
    for _ in range(3):
        done = health_check(cluster, config, "--simulate", HEALTHY, *named)
        assert done.returncode == EXIT_UNKNOWN and "state file stale" in done.stdout
    assert cluster.state() == ("drained", "nodewarden: gpu.lost gpu7: ours")


def test_the_deadline_decides_nothing(cluster: SlurmCluster, tmp_path: Path) -> None:
    done = health_check(cluster, write_config(tmp_path, cluster), "--simulate", LOST_GPU, "--deadline", "0.001")
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert "deadline hit" in done.stdout
    assert cluster.state() == ("idle", "")
    assert trail(tmp_path)[-1]["action"] == "unknown"


def test_dry_run_prints_the_command_and_changes_nothing(cluster: SlurmCluster, tmp_path: Path) -> None:
    done = health_check(cluster, write_config(tmp_path, cluster), "--simulate", LOST_GPU, "--dry-run")
    assert f"would run: {TOOLS['scontrol']} update NodeName={cluster.node} State=DRAIN 'Reason=nodewarden: " \
           "gpu.lost gpu7" in done.stdout, done.stdout + done.stderr
    assert cluster.state() == ("idle", "")
    assert not (tmp_path / "state" / "ledger.db").exists() and trail(tmp_path) == []


def test_slurmd_runs_it_as_health_check_program(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster)
    lock = tmp_path / "hc.lock"  # held by each run slurmd starts, so the test can wait the last one out
    cluster.health_check.write_text(  # absolute paths: slurmd gives no PATH
        f"#!/bin/sh\nexec /usr/bin/flock {lock} {NODEWARDEN} health-check --slurm --config {config} "
        f"--simulate {LOST_GPU} >>{tmp_path / 'hc.log'} 2>&1\n")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not cluster.state()[1].startswith("nodewarden:"):
            time.sleep(0.2)
        log = (tmp_path / "hc.log").read_text() if (tmp_path / "hc.log").exists() else "(never ran)"
        assert cluster.state()[1].startswith("nodewarden: gpu.lost gpu7"), log
        while time.monotonic() < deadline and not trail(tmp_path):  # the ledger follows the scontrol call
            time.sleep(0.1)
        assert trail(tmp_path)[0]["node"] == cluster.node  # from SLURMD_NODENAME
    finally:
        cluster.health_check.write_text("#!/bin/sh\nexit 0\n")
        with lock.open("a") as held:  # a run already started finishes before the next test looks
            fcntl.flock(held, fcntl.LOCK_EX)


def test_require_accept_holds_the_resume_until_a_passing_run(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster, resume_after=1, require_accept=True)
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    drained = cluster.state()
    assert drained[1].startswith("nodewarden:"), done.stdout + done.stderr
    accept = tmp_path / "state" / "accept"
    accept.mkdir(mode=0o700)
    (accept / "last.json").write_text(json.dumps({"passed": True, "finished_at": "2020-01-01T00:00:00Z"}))
    done = health_check(cluster, config, "--simulate", HEALTHY)
    assert "resume waits for acceptance: no acceptance run since the drain" in done.stdout, done.stdout
    assert cluster.state() == drained
    (accept / "last.json").write_text(json.dumps({"passed": True, "finished_at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))}))
    done = health_check(cluster, config, "--simulate", HEALTHY)
    assert "resuming our drain" in done.stdout, done.stdout
    assert cluster.state()[1] == ""


def test_require_accept_counts_from_now_for_a_drain_it_did_not_see(cluster: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, cluster, resume_after=1, require_accept=True)
    cluster.drain(cluster.node, "nodewarden: gpu.lost gpu7: from another state dir")
    accept = tmp_path / "state" / "accept"
    accept.mkdir(parents=True, mode=0o700)
    (accept / "last.json").write_text(json.dumps({"passed": True, "finished_at": "2026-01-01T00:00:00Z"}))
    health_check(cluster, config, "--simulate", LOST_GPU)
    done = health_check(cluster, config, "--simulate", HEALTHY)
    # A drain this gate did not make and mark is not ours at all (issue 30.4): never resumed
    assert "is not nodewarden's: left alone" in done.stdout, done.stdout + done.stderr
    assert cluster.state() == ("drained", "nodewarden: gpu.lost gpu7: from another state dir")


def test_a_drain_whose_cause_goes_dark_is_never_resumed(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.3: drained for a failed PSU, then the BMC stops answering: bmc.psu turns unknown and the
    verdict falls to DEGRADED. That is no evidence the PSU is back: undecided, never resumed, logged."""
    config = write_config(tmp_path, cluster, resume_after=1)
    psu, dark, fixed = (tmp_path / name for name in ("psu", "dark", "fixed"))
    for folder in (psu, dark, fixed):
        shutil.copytree(REPO / "fixtures" / "nodes" / HEALTHY, folder)
    power = psu / "redfish/v1/Chassis/System.Embedded.1/Power/index.json"
    doc = json.loads(power.read_text())
    doc["PowerSupplies"][0]["Status"] = {"Health": "Critical", "State": "Enabled"}
    power.write_text(json.dumps(doc))
    shutil.rmtree(dark / "redfish")  # the BMC gone dark: every bmc.* check unknown
    done = health_check(cluster, config, "--snapshot", str(psu))
    assert done.returncode == EXIT_BAD, done.stdout + done.stderr
    drained = cluster.state()
    assert drained[0] == "drained" and drained[1].startswith("nodewarden: bmc.psu PS1 Status"), drained
    memory = json.loads((tmp_path / "state/scheduler" / f"slurm-{cluster.node}.json").read_text())
    assert memory["causes"] == [["bmc.psu", "PS1 Status"]]
    for _ in range(3):
        done = health_check(cluster, config, "--snapshot", str(dark))
        assert done.stdout.startswith("DEGRADED"), done.stdout + done.stderr
        assert "undecided: bmc.psu PS1 Status: absent" in done.stdout, done.stdout
        assert cluster.state() == drained
    assert [e["action"] for e in trail(tmp_path)] == ["drain", "none", "none", "none"]
    assert "undecided" in str(trail(tmp_path)[-1]["why"])
    done = health_check(cluster, config, "--snapshot", str(fixed))  # the PSU read back as pass: resumed
    assert "resuming our drain" in done.stdout, done.stdout + done.stderr
    assert cluster.state()[1] == ""


def slurm_bin(tmp_path: Path, scontrol: str, mode: int = 0o755) -> Path:
    """A folder with a wrapper scontrol (`scontrol`: shell lines before the real one runs) and sinfo."""
    folder = tmp_path / "bin"
    folder.mkdir()
    folder.chmod(mode)
    wrapper = folder / "scontrol"
    wrapper.write_text(f'#!/bin/sh\n{scontrol}\nexec {TOOLS["scontrol"]} "$@"\n')
    wrapper.chmod(0o755)
    (folder / "sinfo").symlink_to(TOOLS["sinfo"])
    return folder


def test_one_deadline_covers_every_slurm_call(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.5: a slurmctld that never answers in time: the run ends at its deadline (not the 10 s of
    each call), does nothing and exits Unknown."""
    folder = slurm_bin(tmp_path, "sleep 30")
    config = write_config(tmp_path, cluster, slurm_bin_dir=str(folder), deadline_s=5)
    started = time.monotonic()
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    took = time.monotonic() - started
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert "deadline hit" in done.stdout, done.stdout
    assert took < 5 + 2.0, took  # the deadline counts from the process start; a little for the exit
    assert cluster.state() == ("idle", "")
    assert trail(tmp_path)[-1]["action"] == "failed"


def test_no_update_starts_with_too_little_time_left(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.5: scontrol answers, but slowly (4 s): after the node is read, what is left of the 7 s is
    less than an update needs, so none starts: nothing drained, exit Unknown."""
    folder = slurm_bin(tmp_path, 'case "$1" in show) sleep 4;; esac')
    config = write_config(tmp_path, cluster, slurm_bin_dir=str(folder), deadline_s=7)
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert "deadline" in done.stdout, done.stdout
    assert cluster.state() == ("idle", "")


@pytest.mark.parametrize("planted", ["nobody's 0777 folder", "a 0777 folder", "nobody's file"])
def test_a_slurm_tool_others_could_change_is_refused(cluster: SlurmCluster, tmp_path: Path, planted: str) -> None:
    """Issue 30.6: scontrol runs as root; one that another user could have changed never runs."""
    nobody = pwd.getpwnam("nobody").pw_uid
    folder = slurm_bin(tmp_path, f"touch {tmp_path / 'ran'}", 0o755 if planted == "nobody's file" else 0o777)
    unsafe, why = folder, f"owned by uid {nobody}, not root or the user running nodewarden"
    if planted == "nobody's 0777 folder":
        os.chown(folder, nobody, -1)
    elif planted == "a 0777 folder":
        why = "writable by group and others (mode 0777)"
    else:
        os.chown(folder / "scontrol", nobody, -1)
        unsafe = folder / "scontrol"
    config = write_config(tmp_path, cluster, slurm_bin_dir=str(folder))
    done = health_check(cluster, config, "--simulate", LOST_GPU)
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert f"unsafe scontrol: {unsafe} is {why}" in done.stdout, done.stdout
    assert not (tmp_path / "ran").exists()
    assert cluster.state() == ("idle", "")


DRAIN_ANSWER = Answer("DRAIN", "state file", actions=[{
    "action": "drain", "drains": True, "severity": "critical", "checks": ["gpu.lost"], "subjects": ["gpu7"],
    "message": "GPU 7 has fallen off the bus"}])


def gate_settings(tmp_path: Path, cluster: SlurmCluster, **kwargs: object) -> HealthSettings:
    (tmp_path / "state").mkdir(mode=0o700, exist_ok=True)
    return HealthSettings(state_dir=tmp_path / "state", slurm_conf=cluster.conf, **kwargs)  # type: ignore[arg-type]


def scontrol_state(cluster: SlurmCluster, node: str) -> str:
    line = cluster.run(TOOLS["scontrol"], "show", "node", "-o", node)
    return next(token for token in line.split() if token.startswith("State="))


def test_the_breaker_holds_when_every_node_checks_at_once(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.1: 20 nodes of one partition with a DRAIN verdict, released at one instant (a barrier),
    limit 5: exactly 5 stay drained, the other 15 back off (`breaker`) to their state and reason before."""
    settings = gate_settings(tmp_path, cluster, breaker_percent=25, breaker_min_nodes=1)  # 20 nodes: limit 5
    for _ in range(3):
        before = cluster.states()
        barrier = threading.Barrier(len(BURST_NODES))
        decisions: dict[str, Decision] = {}

        def check(node: str, barrier: threading.Barrier, decisions: dict[str, Decision]) -> None:
            barrier.wait()
            decisions[node] = act(DRAIN_ANSWER, node, settings, dry_run=False)

        threads = [threading.Thread(target=check, args=(node, barrier, decisions)) for node in BURST_NODES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        after = cluster.states()
        drained = sorted(n for n in BURST_NODES if after[n][1].startswith("nodewarden:"))
        assert len(drained) == 5, (drained, {n: (d.action, d.why) for n, d in decisions.items()})
        assert sorted(n for n, d in decisions.items() if d.action == "drain") == drained
        backed_off = [n for n in BURST_NODES if n not in drained]
        assert {decisions[n].action for n in backed_off} == {"breaker"}, {n: decisions[n].why for n in backed_off}
        assert {n: after[n] for n in backed_off} == {n: before[n] for n in backed_off}  # state and reason
        cluster.reset()


def test_every_partition_name_is_read_and_counted_in_one_sinfo_call(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.2: partition names with + : @ / # % ~ ( ) are read (the old parser saw "no partition" and
    skipped the breaker); all partitions are counted from one sinfo call before the drain."""
    odd = "gpu#1%x+h:1@2/3~4(A)"
    cluster.run(TOOLS["scontrol"], "create", f"PartitionName={odd}",
                f"Nodes={cluster.node},{','.join(EXTRA_NODES[:3])}")
    try:
        log = tmp_path / "calls"
        folder = tmp_path / "bin"
        folder.mkdir()
        for tool in ("scontrol", "sinfo"):
            (folder / tool).write_text(f'#!/bin/sh\necho "{tool} $1" >>{log}\nexec {TOOLS[tool]} "$@"\n')
            (folder / tool).chmod(0o755)
        config = write_config(tmp_path, cluster, breaker_percent=25, breaker_min_nodes=1, slurm_bin_dir=str(folder))
        cluster.drain(EXTRA_NODES[0], "nodewarden: gpu.lost gpu1: elsewhere")  # gpu: 1 of 8 (limit 2); odd: 1 of 4
        done = health_check(cluster, config, "--simulate", LOST_GPU)
        assert f"circuit breaker open: partition {odd} has 1 of 4 nodes" in done.stdout, done.stdout + done.stderr
        assert cluster.state() == ("idle", "")
        cluster.resume(EXTRA_NODES[0])
        log.unlink()
        done = health_check(cluster, config, "--simulate", LOST_GPU)
        assert cluster.state()[1].startswith("nodewarden: gpu.lost gpu7"), done.stdout + done.stderr
        calls = log.read_text().splitlines()
        assert calls[:calls.index("scontrol update")].count("sinfo --json") == 1, calls
    finally:
        cluster.reset()
        cluster.run(TOOLS["scontrol"], "delete", f"PartitionName={odd}")


def test_a_node_in_no_partition_is_never_drained(cluster: SlurmCluster, tmp_path: Path) -> None:
    decision = act(DRAIN_ANSWER, LONER, gate_settings(tmp_path, cluster), dry_run=False)
    assert decision.action == "unknown" and "cannot decide" in decision.why, decision
    assert "DRAIN" not in scontrol_state(cluster, LONER)


def test_our_drain_edited_or_reset_by_someone_else_is_theirs(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Issue 30.4: ours only while Slurm shows the reason, user and time this gate recorded. An admin's
    edit (however it starts), the same text set again later, or a reason with a newline: left alone."""
    config = write_config(tmp_path, cluster)
    health_check(cluster, config, "--simulate", LOST_GPU)
    ours = cluster.state()
    assert ours[1].startswith("nodewarden: gpu.lost gpu7"), ours
    for theirs in ("nodewarden: held by admin - RMA 4711", ours[1], "nodewarden: gpu.lost gpu7: x\nsecond line"):
        time.sleep(1.1)  # the same text set again is another second's drain
        cluster.drain(cluster.node, theirs)
        for simulate in (LOST_GPU, HEALTHY, HEALTHY):
            done = health_check(cluster, config, "--simulate", simulate)
            assert "is not nodewarden's: left alone" in done.stdout, (theirs, done.stdout + done.stderr)
        shown = json.loads(cluster.run(TOOLS["sinfo"], "--json"))
        node = next(n for n in shown["nodes"] if n["name"] == cluster.node)
        assert (node["reason"], "DRAIN" in node["state_flags"]) == (theirs, True)
    mark = json.loads((tmp_path / "state/scheduler" / f"drain-{cluster.node}.json").read_text())
    assert mark["reason"] == ours[1] and mark["user"] == "root" and mark["at"] > 0  # what proved ours
