"""GPU actuators (NVML setters) on a recorded node: plan, apply, verify, rollback; the setter contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.engine.audit import AuditRequest
from agent.engine.remediate import RemediationRequest, _rollback, apply, plan
from agent.policy.config import Config
from agent.state.journal import StateDir
from remediations import ActionClass, Outcome
from remediations.targets import SnapshotTarget
from tests.conftest import RunCli
from tests.integration.test_contract_pynvml import SignatureSpy

GPU_ACTIONS = {f"gpu_persistence:gpu{i}" for i in range(7)} | {"gpu_power_limit:gpu2"}


@pytest.fixture
def node(drifted_copy: Path) -> Path:
    return drifted_copy

def remediate(run_cli: RunCli, node: Path, state: Path, config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("remediate", "--snapshot", str(node), "--state-dir", str(state), "--config", str(config),
                     "--format", "json", *(() if "--only" in args else ("--only", "gpu*")), *args)
    return result.code, result.json()


def test_gpu_plan_apply_verify_rollback(run_cli: RunCli, node: Path, tmp_path: Path, empty_config: Path) -> None:
    state = tmp_path / "state"
    original = (node / "nvml.json").read_bytes()
    code, planned = remediate(run_cli, node, state, empty_config)
    assert code == 0 and {a["id"] for a in planned["actions"]} == GPU_ACTIONS
    power = next(a for a in planned["actions"] if a["id"] == "gpu_power_limit:gpu2")
    assert (power["before"], power["after"], power["class"]) == (500.0, 700.0, "safe")
    assert (node / "nvml.json").read_bytes() == original

    code, applied = remediate(run_cli, node, state, empty_config, "--apply")
    assert code == 0 and all(a["status"] == "applied" and a["verified"] for a in applied["actions"])
    devices = json.loads((node / "nvml.json").read_text())["devices"]
    assert [d["nvmlDeviceGetPersistenceMode"] for d in devices[:7]] == [1] * 7
    assert devices[2]["nvmlDeviceGetPowerManagementLimit"] == devices[2]["nvmlDeviceGetEnforcedPowerLimit"] == 700000
    audit = run_cli("audit", "--snapshot", str(node), "--config", str(empty_config), "--format", "json",
                    "--only", "gpu.persistence_mode", "--only", "gpu.power.limit").json()
    assert {f["subject"] for f in audit["findings"] if f["status"] in ("fail", "warn")} == set()

    code, again = remediate(run_cli, node, state, empty_config, "--apply")
    assert code == 0 and again["changed"] is False
    rolled = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
    assert rolled.code == 0, rolled.stderr
    assert (node / "nvml.json").read_bytes() == original


def test_power_limit_outside_constraints_is_refused(run_cli: RunCli, node: Path, tmp_path: Path,
                                                   empty_config: Path) -> None:
    data = json.loads((node / "nvml.json").read_text())
    data["devices"][2]["nvmlDeviceGetPowerManagementLimitConstraints"] = [200000, 600000]
    (node / "nvml.json").unlink()  # shares an inode with the module's capture
    (node / "nvml.json").write_text(json.dumps(data, indent=2) + "\n")
    before = (node / "nvml.json").read_bytes()
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply",
                             "--only", "gpu_power_limit:*")
    assert code == 1
    (action,) = [a for a in result["actions"] if a["id"] == "gpu_power_limit:gpu2"]
    assert action["status"] == "refused"
    assert action["reason"] == "700 W is outside GPU 2's limits [200, 600] W"
    assert (node / "nvml.json").read_bytes() == before  # nothing partially applied


IDLE = {"nvmlDeviceGetComputeMode": 3, "nvmlDeviceGetComputeRunningProcesses": [],
        "nvmlDeviceGetGraphicsRunningProcesses": []}
# A benchmark left GPU 1 at 1755 MHz graphics (H100 SXM default 1980/2619 MHz).
CUSTOM_CLOCKS = {"nvmlDeviceGetApplicationsClock(0)": 1755}


class SpyTarget(SnapshotTarget):
    """A snapshot target whose NVML calls are bound to the real pynvml signatures first."""

    spy: SignatureSpy | None = None

    def nvml(self) -> Any:
        recorded = super().nvml()
        if self.spy is None or self.spy.recorded is not recorded:
            self.spy = SignatureSpy(recorded)
        return self.spy


class LiveStyleSpyTarget(SpyTarget):
    """Rolls back as on a real GPU: through the setters with the journaled arguments, not bytes."""

    live = True

    def nvml_raw(self) -> bytes | None:
        return None


def test_every_setter_call_binds_to_the_real_signature(node: Path, tmp_path: Path) -> None:
    """Every GPU actuator (all classes) applies and rolls back through calls that fit real pynvml."""
    _set_gpu1(node, **IDLE, nvmlDeviceGetEccMode=[0, 0], **CUSTOM_CLOCKS)
    original = json.loads((node / "nvml.json").read_text())["devices"]
    request = RemediationRequest(audit=AuditRequest(config=Config(), snapshot=node), apply=True, only=("gpu*",),
                                 state_dir=tmp_path / "state", allow=frozenset(ActionClass))
    target = LiveStyleSpyTarget(node)
    _, actions = plan(request, target)
    assert {"gpu_compute_mode:gpu1", "gpu_ecc:gpu1", "gpu_app_clocks:gpu1"} <= {a.id for a in actions}
    state = StateDir(tmp_path / "state")
    journal = state.create_run("20261129T000000Z-000000", {"target": target.description})
    apply(request, target, actions, journal)
    assert {a.outcome for a in actions} == {Outcome.APPLIED}
    assert target.spy is not None
    assert {"nvmlDeviceSetPersistenceMode", "nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetComputeMode",
            "nvmlDeviceSetEccMode", "nvmlDeviceSetApplicationsClocks", "nvmlDeviceGetApplicationsClock",
            "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPersistenceMode",
            "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetComputeRunningProcesses"} <= target.spy.called
    target.nvml_commit()
    assert json.loads((node / "nvml.json").read_text())["devices"] != original

    restored = _rollback(target, state, "20261129T000000Z-000000")
    target.nvml_commit()
    assert len(restored.restored) == len(actions)
    assert json.loads((node / "nvml.json").read_text())["devices"] == original


def _set_gpu1(node: Path, **entries: Any) -> None:
    """Set GPU 1's recorded answers; None removes one (the call is then not in the recording)."""
    data = json.loads((node / "nvml.json").read_text())
    device = data["devices"][1]
    device.update({key: value for key, value in entries.items() if value is not None})
    for key in (key for key, value in entries.items() if value is None):
        device.pop(key, None)
    (node / "nvml.json").unlink()  # shares an inode with the module's capture
    (node / "nvml.json").write_text(json.dumps(data, indent=2) + "\n")




def test_compute_mode_is_disruptive_and_needs_allow(run_cli: RunCli, node: Path, tmp_path: Path,
                                                   empty_config: Path) -> None:
    _set_gpu1(node, **IDLE)
    state = tmp_path / "state"
    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_compute_mode:*")
    (action,) = result["actions"]
    assert code == 0 and result["changed"] is False
    assert (action["status"], action["class"], action["before"], action["after"]) == (
        "not_allowed", "disruptive", "Exclusive_Process", "Default")
    assert "--allow disruptive" in action["reason"]
    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_compute_mode:*",
                             "--allow", "disruptive")
    (action,) = result["actions"]
    assert code == 0 and action["status"] == "applied" and action["verified"] is True
    assert json.loads((node / "nvml.json").read_text())["devices"][1]["nvmlDeviceGetComputeMode"] == 0


@pytest.mark.parametrize("processes,reason", [
    ({"nvmlDeviceGetComputeRunningProcesses": [{"pid": 4242, "usedGpuMemory": 1 << 30}]},
     "processes 4242 are running on it; drain the GPU first"),
    ({"nvmlDeviceGetComputeRunningProcesses": None}, "cannot list the processes on GPU 1"),
])
def test_compute_mode_is_refused_while_the_gpu_may_be_busy(run_cli: RunCli, node: Path, tmp_path: Path,
                                                          empty_config: Path, processes: dict[str, Any],
                                                          reason: str) -> None:
    entries = {**IDLE, **processes}  # a None list: not recorded, so maybe busy
    _set_gpu1(node, **entries)
    before = (node / "nvml.json").read_bytes()
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply",
                             "--only", "gpu_compute_mode:*", "--allow", "disruptive")
    (action,) = result["actions"]
    assert code == 1 and action["status"] == "refused" and reason in action["reason"]
    assert (node / "nvml.json").read_bytes() == before


def test_ecc_is_staged_as_a_reboot_class_change(run_cli: RunCli, node: Path, tmp_path: Path,
                                               empty_config: Path) -> None:
    _set_gpu1(node, nvmlDeviceGetEccMode=[0, 0])
    state = tmp_path / "state"
    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_ecc:*")
    (action,) = result["actions"]  # GPU 3's enable is already pending: nothing to stage there
    assert code == 0 and (action["id"], action["status"], action["class"]) == ("gpu_ecc:gpu1", "not_allowed", "reboot")
    assert result["reboot_required"] is False

    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_ecc:*",
                             "--allow", "reboot")
    (action,) = result["actions"]
    assert code == 0 and action["status"] == "applied" and action["verified"] is True
    assert action["observed_after"] == "enabled" and result["reboot_required"] is True
    assert result["findings"] == []  # staged, not fixed: the finding stays until the reboot
    assert json.loads((node / "nvml.json").read_text())["devices"][1]["nvmlDeviceGetEccMode"] == [0, 1]
    audit = run_cli("audit", "--snapshot", str(node), "--config", str(empty_config), "--format", "json",
                    "--only", "gpu.ecc.mode").json()
    gpu1 = next(f for f in audit["findings"] if f["subject"] == "gpu1")
    assert gpu1["status"] == "warn" and "reboot" in gpu1["message"]  # the check sees the staged enable

    code, again = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_ecc:*",
                            "--allow", "reboot")
    assert code == 0 and again["actions"] == [] and again["reboot_required"] is False


def test_app_clocks_reset_is_disruptive_verified_and_rolled_back(run_cli: RunCli, node: Path, tmp_path: Path,
                                                                 empty_config: Path) -> None:
    _set_gpu1(node, **IDLE, **CUSTOM_CLOCKS)
    state = tmp_path / "state"
    before = (node / "nvml.json").read_bytes()
    audit = run_cli("audit", "--snapshot", str(node), "--config", str(empty_config), "--format", "json",
                    "--only", "gpu.app_clocks").json()
    gpu1 = next(f for f in audit["findings"] if f["subject"] == "gpu1")
    assert gpu1["status"] == "fail" and "graphics 1755 MHz, memory 2619 MHz (default 1980/2619 MHz)" in gpu1["message"]

    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_app_clocks:*")
    (action,) = result["actions"]
    assert code == 0 and (action["status"], action["class"]) == ("not_allowed", "disruptive")
    code, result = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_app_clocks:*",
                             "--allow", "disruptive")
    (action,) = result["actions"]
    assert code == 0 and action["status"] == "applied" and action["verified"] is True
    assert (action["after"], action["observed_after"]) == ("default", "default")
    assert ("gpu.app_clocks", "gpu1", "fixed") in {(f["check"], f["subject"], f["status"]) for f in result["findings"]}
    device = json.loads((node / "nvml.json").read_text())["devices"][1]
    assert (device["nvmlDeviceGetApplicationsClock(0)"], device["nvmlDeviceGetApplicationsClock(2)"]) == (1980, 2619)

    code, again = remediate(run_cli, node, state, empty_config, "--apply", "--only", "gpu_app_clocks:*",
                            "--allow", "disruptive")
    assert code == 0 and again["actions"] == []
    assert run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state)).code == 0
    assert (node / "nvml.json").read_bytes() == before


def test_app_clocks_reset_is_refused_while_processes_run(run_cli: RunCli, node: Path, tmp_path: Path,
                                                         empty_config: Path) -> None:
    _set_gpu1(node, **{**IDLE, **CUSTOM_CLOCKS,
                       "nvmlDeviceGetComputeRunningProcesses": [{"pid": 777, "usedGpuMemory": 1 << 30}]})
    before = (node / "nvml.json").read_bytes()
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--apply",
                             "--only", "gpu_app_clocks:*", "--allow", "disruptive")
    (action,) = result["actions"]
    assert code == 1 and action["status"] == "refused"
    assert "processes 777 are running on it; drain the GPU first" in action["reason"]
    assert (node / "nvml.json").read_bytes() == before


@pytest.mark.parametrize("failpoint", ["before-journal@3", "after-journal@2", "after-journal@8"])
def test_crash_between_nvml_setters_then_rollback(node: Path, tmp_path: Path, empty_config: Path, run_cli: RunCli,
                                                  failpoint: str) -> None:
    """SIGKILL while GPU setters run: rollback puts nvml.json back byte for byte."""
    state = tmp_path / "state"
    before = (node / "nvml.json").read_bytes()
    crashed = subprocess.run(
        [sys.executable, "-m", "agent", "remediate", "--snapshot", str(node), "--state-dir", str(state),
         "--config", str(empty_config), "--apply", "--only", "gpu*"],
        env={**os.environ, "NODEWARDEN_FAILPOINTS": failpoint}, capture_output=True, text=True, timeout=120,
        check=False)
    assert crashed.returncode == -9, crashed.stderr
    assert (node / "nvml.json").read_bytes() != before  # earlier setters did change the recording
    result = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
    assert result.code == 0, result.stderr
    assert (node / "nvml.json").read_bytes() == before
