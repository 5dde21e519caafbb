"""Remediation through the real NVML ABI (issue 23, item 7).

The mock implements nvmlDeviceSetPersistenceMode and answers NVML_ERROR_NOT_SUPPORTED to the ECC,
power-limit, compute-mode and application-clock setters, as many real boards and drivers do. Each
command is its own process: the mock starts from its config every time, as a driver would after the
changes were undone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_mock.conftest import device, mock_config, nodewarden

pytestmark = pytest.mark.nvml_mock


def drifted(doc: dict[str, Any]) -> None:
    defaults = doc["device_defaults"]
    defaults["persistence_mode"] = "disabled"  # a device entry's persistence_mode is not read by the mock
    defaults["compute_mode"] = "exclusive_process"
    defaults["clocks"]["graphics_app"] = 1410  # application clocks off their defaults
    device(doc, 6)["ecc"] = dict(defaults["ecc"], mode_current="disabled", mode_pending="disabled")
    device(doc, 2)["power"] = dict(defaults["power"], enforced_limit_mw=500_000)


def run(config: Path, state: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = nodewarden(config, *args, "--format", "json", "--state-dir", str(state))
    assert done.stdout.strip(), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def journal(state: Path, run_id: str) -> list[dict[str, Any]]:
    [entries] = list(state.rglob(f"{run_id}*/entries.jsonl")) or list((state / "runs" / run_id).glob("*.jsonl"))
    return [json.loads(line) for line in entries.read_text().splitlines() if line]


def test_persistence_mode_apply_verify_rollback(tmp_path: Path) -> None:
    config = mock_config(tmp_path, "h100", drifted)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _, result = run(config, state, "remediate", "--apply", "--only", "gpu.persistence_mode")
    actions = result["actions"]
    assert [(a["id"], a["status"], a["verified"], a["before"], a["observed_after"]) for a in actions] == [
        (f"gpu_persistence:gpu{i}", "applied", True, "disabled", "enabled") for i in range(8)]
    entries = journal(state, result["run_id"])
    befores = [e for e in entries if e["phase"] == "before"]
    assert [(s["path"], s["value"], s["restore_args"]) for e in befores for s in e["states"]] == [
        (f"nvml:gpu{i}:nvmlDeviceSetPersistenceMode", 0, [0]) for i in range(8)]
    assert [e["verified"] for e in entries if e["phase"] == "done"] == [True] * 8
    code, rolled = run(config, state, "rollback", "--last")
    assert code == 0, rolled
    assert rolled["restored"] == [f"nvml:gpu{i}:nvmlDeviceSetPersistenceMode" for i in reversed(range(8))]


def test_setters_the_driver_does_not_support_change_nothing_and_rollback_still_works(tmp_path: Path) -> None:
    config = mock_config(tmp_path, "h100", drifted)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _, result = run(config, state, "remediate", "--apply", "--allow", "disruptive", "--allow", "reboot",
                    "--only", "gpu.*")
    by_status: dict[str, set[str]] = {}
    for action in result["actions"]:
        by_status.setdefault(action["status"], set()).add(action["id"].split(":")[0])
    assert by_status == {"applied": {"gpu_persistence"},
                         "refused": {"gpu_ecc", "gpu_power_limit", "gpu_compute_mode", "gpu_app_clocks"}}
    for action in result["actions"]:
        if action["status"] == "refused":
            assert "not supported by this GPU/driver: nothing was changed" in action["reason"], action
            assert action["applied"] is False and "rollback" not in action["reason"]
    entries = journal(state, result["run_id"])
    not_applied = {e["action"] for e in entries if e["phase"] == "not_applied"}
    assert not_applied == {a["id"] for a in result["actions"] if a["status"] == "refused"}
    assert not [e for e in entries if e["phase"] == "failed"]
    code, rolled = run(config, state, "rollback", "--last")
    assert code == 0, rolled  # the refused setters are not called again: rollback restores what changed
    assert sorted(rolled["restored"]) == sorted(f"nvml:gpu{i}:nvmlDeviceSetPersistenceMode" for i in range(8))
