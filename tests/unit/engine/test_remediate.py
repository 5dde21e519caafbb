"""Remediation on a writable copy of a simulated node: plan, apply, verify, journal, rollback.

Every test works on `snapshot capture --simulate` copies, so every actuator
writes real files (the snapshot's fs/) without root; crash tests SIGKILL a
real `nodewarden remediate` process at named points.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.engine.remediate import target_lock
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.state.journal import LockHeld, StateDir
from remediations.sysctl import set_conf_key
from remediations.targets import SnapshotTarget
from tests.conftest import RunCli

HOST_ACTIONS = {"cpu_governor:node", "sysctl:kernel.numa_balancing", "sysctl:net.core.rmem_max", "thp:enabled",
                "mtu:enp156s0np0"}
GPU_ACTIONS = {f"gpu_persistence:gpu{i}" for i in range(7)} | {"gpu_power_limit:gpu2"}  # gpu7 fell off the bus
DRIFTED_ACTIONS = HOST_ACTIONS | GPU_ACTIONS
ACS_ACTION = "acs:0000:b9:02.0"  # disruptive: planned as not_allowed unless --allow disruptive
REMEDIABLE = ("host.sysctl", "host.numa.balancing", "host.thp.enabled", "host.thp.defrag", "host.cpu.governor",
              "net.mtu")


def tree_state(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root with its mode and bytes (None for directories)."""
    state: dict[str, tuple[int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            path = Path(dirpath, name)
            state[str(path.relative_to(root))] = (path.stat().st_mode, None)
        for name in filenames:
            path = Path(dirpath, name)
            state[str(path.relative_to(root))] = (path.stat().st_mode, path.read_bytes())
    return state


@pytest.fixture
def node(drifted_copy: Path) -> Path:
    return drifted_copy

def rewrite(path: Path, text: str) -> None:
    """Replace a file without touching the inode it may share with other copies."""
    path.unlink()
    path.write_text(text)


def remediate(run_cli: RunCli, node: Path, state: Path, config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("remediate", "--snapshot", str(node), "--state-dir", str(state), "--config", str(config),
                     "--format", "json", *args)
    return result.code, result.json()


def audit_fails(run_cli: RunCli, node: Path, config: Path) -> set[tuple[str, str]]:
    result = run_cli("audit", "--snapshot", str(node), "--config", str(config), "--format", "json",
                     *[x for c in REMEDIABLE for x in ("--only", c)])
    return {(f["check"], f["subject"]) for f in result.json()["findings"] if f["status"] in ("fail", "warn")}


def test_plan_lists_every_fix_and_writes_nothing(run_cli: RunCli, node: Path, tmp_path: Path,
                                                 empty_config: Path) -> None:
    before = tree_state(node)
    code, plan = remediate(run_cli, node, tmp_path / "state", empty_config)
    assert code == 0
    assert plan["mode"] == "plan" and plan["changed"] is True and plan["run_id"] is None
    statuses = {a["id"]: (a["status"], a["class"]) for a in plan["actions"]}
    assert statuses.pop("bios_attribute:bios") == ("not_allowed", "reboot")  # needs --allow reboot
    assert statuses.pop(ACS_ACTION) == ("not_allowed", "disruptive")  # needs --allow disruptive
    assert set(statuses) == DRIFTED_ACTIONS
    assert set(statuses.values()) == {("planned", "safe")}
    rmem = next(a for a in plan["actions"] if a["id"] == "sysctl:net.core.rmem_max")
    assert (rmem["before"], rmem["after"], rmem["finding"]) == ("4194304", "134217728", "host.sysctl")
    governor = next(a for a in plan["actions"] if a["id"] == "cpu_governor:node")
    assert governor["before"] == {"powersave": "0-223"}
    assert tree_state(node) == before
    assert not (tmp_path / "state").exists()  # planning takes no lock and writes no journal


def test_apply_fixes_verifies_and_is_idempotent(run_cli: RunCli, node: Path, tmp_path: Path,
                                                empty_config: Path) -> None:
    state = tmp_path / "state"
    assert audit_fails(run_cli, node, empty_config) == {
        ("host.cpu.governor", "node"), ("host.numa.balancing", "node"),
        ("host.sysctl", "net.core.rmem_max"), ("host.thp.enabled", "node"), ("net.mtu", "enp156s0np0")}
    code, result = remediate(run_cli, node, state, empty_config, "--apply")
    assert code == 0 and result["changed"] is True and result["reboot_required"] is False
    safe = [a for a in result["actions"] if a["class"] == "safe"]
    assert {a["id"] for a in result["actions"]} - {a["id"] for a in safe} == {"bios_attribute:bios", ACS_ACTION}
    assert all(a["status"] == "applied" and a["applied"] and a["verified"] for a in safe)
    assert {(f["check"], f["subject"], f["status"]) for f in result["findings"]} == {
        ("host.cpu.governor", "node", "fixed"), ("host.numa.balancing", "node", "fixed"),
        ("host.sysctl", "net.core.rmem_max", "fixed"), ("host.thp.enabled", "node", "fixed"),
        ("net.mtu", "enp156s0np0", "fixed"), ("gpu.power.limit", "gpu2", "fixed"),
        *{("gpu.persistence_mode", f"gpu{i}", "fixed") for i in range(7)}}
    fs = node / "fs"
    assert (fs / "proc/sys/net/core/rmem_max").read_text() == "134217728\n"
    assert (fs / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "always [madvise] never\n"
    recorded = SnapshotFs(node)  # cpufreq/ is a recorded link to cpufreq/policyN
    assert {recorded.read_bytes(f"/sys/devices/system/cpu/cpu{n}/cpufreq/scaling_governor")
            for n in range(224)} == {b"performance\n"}
    assert recorded.read_bytes("/sys/class/net/enp156s0np0/mtu") == b"9000\n"
    conf = (fs / "etc/sysctl.d/90-nodewarden.conf").read_text()
    assert conf.splitlines()[1:] == ["kernel.numa_balancing = 0", "net.core.rmem_max = 134217728"]
    boot = (fs / "etc/nodewarden/boot.conf").read_text().splitlines()
    assert sorted(line for line in boot if not line.startswith("#")) == [
        "cpu.governor = performance", "mtu.enp156s0np0 = 9000", "thp.enabled = madvise"]
    assert audit_fails(run_cli, node, empty_config) == set()

    after_first = tree_state(node)
    code, again = remediate(run_cli, node, state, empty_config, "--apply")
    assert code == 0 and again["changed"] is False and again["run_id"] is None
    assert sorted((a["id"], a["status"]) for a in again["actions"]) == [
        (ACS_ACTION, "not_allowed"), ("bios_attribute:bios", "not_allowed")]
    assert tree_state(node) == after_first
    assert len(StateDir(state).runs()) == 1


def test_rollback_restores_byte_identical_state(run_cli: RunCli, node: Path, tmp_path: Path,
                                                empty_config: Path) -> None:
    state = tmp_path / "state"
    original = tree_state(node)
    code, result = remediate(run_cli, node, state, empty_config, "--apply")
    assert code == 0 and tree_state(node) != original
    rolled = run_cli("rollback", result["run_id"], "--snapshot", str(node), "--state-dir", str(state),
                     "--format", "json")
    assert rolled.code == 0, rolled.stderr
    assert rolled.json()["run_id"] == result["run_id"] and rolled.json()["changed"] is True
    assert tree_state(node) == original  # incl. etc/sysctl.d and etc/nodewarden, which the run created
    again = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
    assert again.code == 0 and "already rolled back" in again.stdout
    assert tree_state(node) == original


@pytest.mark.parametrize("only,expected", [
    ("sysctl:*", {"sysctl:kernel.numa_balancing", "sysctl:net.core.rmem_max"}),
    ("host.thp.*", {"thp:enabled"}),
    ("net.*", {"mtu:enp156s0np0"}),
    ("nothing*", set()),
])
def test_only_selects_actions_by_id_or_check(run_cli: RunCli, node: Path, tmp_path: Path, empty_config: Path,
                                            only: str, expected: set[str]) -> None:
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply", "--only", only)
    assert code == 0 and {a["id"] for a in result["actions"]} == expected
    left = audit_fails(run_cli, node, empty_config)
    assert len(left) == 5 - len(expected)


def test_simulated_node_cannot_be_applied(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    result = run_cli("remediate", "--simulate", "hgx-h100-drifted", "--apply", "--state-dir", str(tmp_path),
                     "--config", str(empty_config))
    assert result.code == 2
    assert "snapshot capture --simulate hgx-h100-drifted --out DIR" in result.stderr


def test_rollback_of_another_target_is_refused(run_cli: RunCli, node: Path, tmp_path: Path,
                                              empty_config: Path) -> None:
    state = tmp_path / "state"
    _, result = remediate(run_cli, node, state, empty_config, "--apply")
    other = tmp_path / "other"
    shutil.copytree(node, other)
    wrong = run_cli("rollback", result["run_id"], "--snapshot", str(other), "--state-dir", str(state))
    assert wrong.code == 3 and "pass the same source options" in wrong.stderr
    none = run_cli("rollback", "--last", "--snapshot", str(other), "--state-dir", str(state))
    assert none.code == 2 and "no remediation run with changes" in none.stderr
    bad = run_cli("rollback", "../../etc", "--snapshot", str(other), "--state-dir", str(state))
    assert bad.code == 2 and "not a run id" in bad.stderr


def test_lock_contention_is_refused_cleanly(run_cli: RunCli, node: Path, tmp_path: Path,
                                           empty_config: Path) -> None:
    state = StateDir(tmp_path / "state")
    before = tree_state(node)
    with target_lock(SnapshotTarget(node)):  # the lock is the target's, whatever the state dir
        result = run_cli("remediate", "--snapshot", str(node), "--state-dir", str(state.path), "--apply",
                         "--config", str(empty_config))
        assert result.code == 3 and "another nodewarden remediate or rollback is running" in result.stderr
        with pytest.raises(LockHeld), target_lock(SnapshotTarget(node)):
            pass
    assert tree_state(node) == before
    code, _ = remediate(run_cli, node, state.path, empty_config, "--apply")
    assert code == 0  # the lock is released with its holder


# ---- refusals: impossible requests are explained and nothing is written ----

def _profile_dir(tmp_path: Path, sysctl: dict[str, dict[str, Any]]) -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir()
    expect = {"sysctl": {k: {"severity": "warning", "reason": "test", **v} for k, v in sysctl.items()}}
    (directory / "nw-test.yaml").write_text(json.dumps({
        "name": "nw-test", "description": "test", "extends": "hgx-h100-sxm", "expect": expect}))
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{directory}]\n")
    return config


def test_unknown_sysctl_and_range_are_refused(run_cli: RunCli, node: Path, tmp_path: Path) -> None:
    config = _profile_dir(tmp_path, {"net.core.no_such_knob": {"equals": 1},
                                     "vm.swappiness": {"range": [30, 40]}})
    before = tree_state(node)
    code, result = remediate(run_cli, node, tmp_path / "state", config, "--profile", "nw-test", "--apply",
                             "--only", "sysctl:net.core.no_such_knob", "--only", "sysctl:vm.swappiness")
    assert code == 1
    by_id = {a["id"]: a for a in result["actions"]}
    assert by_id["sysctl:net.core.no_such_knob"]["status"] == "refused"
    assert "no sysctl net.core.no_such_knob" in by_id["sysctl:net.core.no_such_knob"]["reason"]
    assert by_id["sysctl:vm.swappiness"]["status"] == "refused"
    assert "names no single value" in by_id["sysctl:vm.swappiness"]["reason"]
    assert result["changed"] is False and result["run_id"] is None
    assert tree_state(node) == before


def test_thp_on_kernel_cmdline_is_respected(run_cli: RunCli, node: Path, tmp_path: Path,
                                           empty_config: Path) -> None:
    cmdline = node / "fs/proc/cmdline"
    rewrite(cmdline, cmdline.read_text().strip() + " transparent_hugepage=always\n")
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply", "--only", "thp:*")
    assert code == 1
    (action,) = result["actions"]
    assert action["status"] == "refused" and "transparent_hugepage=always" in action["reason"]
    assert "never edits the bootloader" in action["reason"]
    assert "[always]" in (node / "fs/sys/kernel/mm/transparent_hugepage/enabled").read_text()


def test_governor_not_offered_is_refused(run_cli: RunCli, node: Path, tmp_path: Path,
                                        empty_config: Path) -> None:
    recorded = SnapshotFs(node)
    available = node / "fs" / recorded.resolve("/sys/devices/system/cpu/cpu7/cpufreq/scaling_available_governors")
    rewrite(available, "powersave\n")
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply", "--only", "cpu_*")
    assert code == 1
    (action,) = result["actions"]
    assert action["status"] == "refused" and "cpu7 offers governors powersave" in action["reason"]
    assert recorded.read_bytes("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") == b"powersave\n"


def test_later_sysctl_file_override_is_reported(run_cli: RunCli, node: Path, tmp_path: Path,
                                               empty_config: Path) -> None:
    (node / "fs/etc/sysctl.d").mkdir(parents=True)
    (node / "fs/etc/sysctl.d/99-local.conf").write_text("# site\nnet.core.rmem_max = 8388608\n")
    (node / "fs/etc/sysctl.d/10-early.conf").write_text("net.core.rmem_max = 1\n")
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--only", "sysctl:net.core.*")
    assert code == 0
    (action,) = result["actions"]
    assert action["notes"] == ["/etc/sysctl.d/99-local.conf sets net.core.rmem_max = 8388608 after "
                               "90-nodewarden.conf; the boot-time value will be 8388608"]


def test_conf_edit_keeps_other_lines() -> None:
    old = b"# ours\nvm.swappiness = 10\n# keep me\nkernel/numa_balancing=1\n"
    new = set_conf_key(old, "kernel.numa_balancing", "0")
    assert new == b"# ours\nvm.swappiness = 10\n# keep me\nkernel.numa_balancing = 0\n"
    assert set_conf_key(new, "net.core.rmem_max", "5").endswith(b"kernel.numa_balancing = 0\nnet.core.rmem_max = 5\n")
    assert set_conf_key(None, "a.b", "1").startswith(b"# Managed by nodewarden")


# ---- crash consistency: SIGKILL at each point, then rollback -> exact prior state ----

def _remediate_process(node: Path, state: Path, config: Path, failpoint: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NODEWARDEN_FAILPOINTS": failpoint}
    return subprocess.run(
        [sys.executable, "-m", "agent", "remediate", "--snapshot", str(node), "--state-dir", str(state),
         "--config", str(config), "--apply", "--format", "json"],
        env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("failpoint", [
    "before-journal",     # first action: nothing journaled, nothing written
    "before-journal@3",   # two actions done, third not journaled
    "after-journal",      # journaled, not yet written
    "after-journal@2",
    "mid-action",         # first write of a two-change action done, second not
    "mid-action@2",
])
def test_crash_then_rollback_restores_exact_state(node: Path, tmp_path: Path, empty_config: Path,
                                                  run_cli: RunCli, failpoint: str) -> None:
    state = tmp_path / "state"
    original = tree_state(node)
    crashed = _remediate_process(node, state, empty_config, failpoint)
    assert crashed.returncode == -9, crashed.stderr
    runs = StateDir(state).runs()
    assert len(runs) == 1
    journaled = StateDir(state).open_run(runs[0]).before_states()
    if not journaled:
        assert tree_state(node) == original  # crashed before anything could be written
        result = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
        assert result.code == 2 and "no remediation run with changes" in result.stderr
        return
    result = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
    assert result.code == 0, result.stderr
    assert tree_state(node) == original


def test_torn_journal_line_is_ignored(node: Path, tmp_path: Path, empty_config: Path, run_cli: RunCli) -> None:
    state = tmp_path / "state"
    original = tree_state(node)
    crashed = _remediate_process(node, state, empty_config, "mid-action@2")
    assert crashed.returncode == -9
    (run_id,) = StateDir(state).runs()
    with open(state / "journal" / run_id / "entries.jsonl", "a") as handle:
        handle.write('{"phase": "before", "action": "x", "sta')  # killed inside the journal write
    result = run_cli("rollback", run_id, "--snapshot", str(node), "--state-dir", str(state))
    assert result.code == 0, result.stderr
    assert tree_state(node) == original


def test_journal_and_state_dir_are_owner_only(run_cli: RunCli, node: Path, tmp_path: Path,
                                             empty_config: Path) -> None:
    state = tmp_path / "state"
    _, result = remediate(run_cli, node, state, empty_config, "--apply")
    run_dir = state / "journal" / result["run_id"]
    for path in (state, state / "journal", run_dir, run_dir / "run.json", run_dir / "entries.jsonl"):
        assert path.stat().st_mode & 0o077 == 0, path
