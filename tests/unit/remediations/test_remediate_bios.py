"""BIOS attributes through Redfish `@Redfish.Settings`: staged (reboot class), verified, rolled back.

Recorded: a writable copy of hgx-h100-drifted, whose iDRAC-shaped Bios has a
settings object; a PATCH lands in its `redfish/` tree. Live: sushy-emulator
(libvirt's in-process test driver) takes real PATCHes over HTTP with basic auth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest

from agent.state.journal import StateDir
from tests.conftest import RunCli
from tests.peers.redfish import EMULATOR_SYSTEM, sushy_emulator
from tests.unit.engine.test_remediate import remediate, rewrite, tree_state

SYSTEM = "redfish/v1/Systems/System.Embedded.1"
BIOS_ACTION = "bios_attribute:bios"


@pytest.fixture
def node(drifted_copy: Path) -> Path:
    return drifted_copy


def bios_findings(run_cli: RunCli, node: Path, config: Path) -> dict[str, dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(node), "--config", str(config), "--format", "json",
                     "--only", "bios.attribute")
    return {f["subject"]: f for f in result.json()["findings"]}


def test_plan_is_one_reboot_action_for_every_differing_attribute(run_cli: RunCli, node: Path, tmp_path: Path,
                                                                  empty_config: Path) -> None:
    before = tree_state(node)
    code, plan = remediate(run_cli, node, tmp_path / "state", empty_config, "--only", "bios*")
    assert code == 0
    (action,) = plan["actions"]
    assert action["id"] == BIOS_ACTION and action["class"] == "reboot" and action["finding"] == "bios.attribute"
    assert action["before"] == {"ProcCStates": "Enabled", "SysProfile": "PerfPerWattOptimizedOs"}
    assert action["after"] == {"ProcCStates": "Disabled", "SysProfile": "PerfOptimized"}
    assert action["status"] == "not_allowed"  # reboot class needs --allow reboot
    code, plan = remediate(run_cli, node, tmp_path / "state", empty_config, "--only", "bios*", "--allow", "reboot")
    assert plan["actions"][0]["status"] == "planned" and plan["reboot_required"] is True
    assert "ApplyTime OnReset" in plan["actions"][0]["notes"][0]
    assert tree_state(node) == before


def test_apply_stages_verifies_is_idempotent_and_rolls_back(run_cli: RunCli, node: Path, tmp_path: Path,
                                                            empty_config: Path) -> None:
    state = tmp_path / "state"
    original = tree_state(node)
    settings = node / SYSTEM / "Bios/Settings/index.json"
    current = (node / SYSTEM / "Bios/index.json").read_bytes()

    code, result = remediate(run_cli, node, state, empty_config, "--only", "bios*", "--allow", "reboot", "--apply")
    assert code == 0, result
    (action,) = result["actions"]
    assert action["status"] == "applied" and action["verified"] is True
    assert action["observed_after"] == {"ProcCStates": "Disabled", "SysProfile": "PerfOptimized"}
    assert result["changed"] is True and result["reboot_required"] is True and result["run_id"]
    assert result["findings"] == []  # staged, not fixed: the finding stays until the reboot
    staged = json.loads(settings.read_text())
    assert staged["Attributes"] == {"ProcCStates": "Disabled", "SysProfile": "PerfOptimized"}
    assert staged["@Redfish.SettingsApplyTime"] == {"ApplyTime": "OnReset"}
    assert (node / SYSTEM / "Bios/index.json").read_bytes() == current  # the BIOS applies it, not the BMC

    findings = bios_findings(run_cli, node, empty_config)
    assert findings["SysProfile"]["status"] == "warn"
    assert "staged in the BMC: reboot to apply" in findings["SysProfile"]["message"]

    code, again = remediate(run_cli, node, state, empty_config, "--only", "bios*", "--allow", "reboot", "--apply")
    assert code == 0 and again["actions"] == [] and again["changed"] is False

    rolled = run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state))
    assert rolled.code == 0, rolled.stderr
    assert tree_state(node) == original


def test_staged_value_that_breaks_the_profile_is_reported(run_cli: RunCli, node: Path, empty_config: Path) -> None:
    settings = node / SYSTEM / "Bios/Settings/index.json"
    body = json.loads(settings.read_text())
    body["Attributes"] = {"ProcCStates": "Disabled", "SysProfile": "PerfPerWattOptimizedDapc"}
    rewrite(settings, json.dumps(body))
    findings = bios_findings(run_cli, node, empty_config)
    assert "staged in the BMC" in findings["ProcCStates"]["message"]
    assert findings["SysProfile"]["status"] == "fail"  # current and staged both wrong


def test_attribute_the_bios_lacks_is_refused_and_nothing_written(run_cli: RunCli, node: Path, tmp_path: Path) -> None:
    directory = tmp_path / "profiles"
    directory.mkdir()
    (directory / "nw-test.yaml").write_text(json.dumps({
        "name": "nw-test", "description": "test", "extends": "hgx-h100-sxm",
        "expect": {"bios": {"attributes": {"Dell": {"NoSuchKnob": {"equals": "On", "severity": "warning",
                                                                   "reason": "test"}}}}}}))
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{directory}]\n")
    before = tree_state(node)
    code, result = remediate(run_cli, node, tmp_path / "state", config, "--profile", "nw-test", "--only", "bios*",
                             "--allow", "reboot", "--apply")
    assert code == 1
    by_id = {a["id"]: a for a in result["actions"]}
    assert by_id["bios_attribute:NoSuchKnob"]["status"] == "refused"
    assert "has no attribute NoSuchKnob" in by_id["bios_attribute:NoSuchKnob"]["reason"]
    assert by_id[BIOS_ACTION]["status"] == "applied"  # the attributes the BIOS has are still staged
    run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(tmp_path / "state"))
    assert tree_state(node) == before


def test_bmc_without_settings_object_is_refused(run_cli: RunCli, node: Path, tmp_path: Path,
                                                empty_config: Path) -> None:
    bios = node / SYSTEM / "Bios/index.json"
    body = json.loads(bios.read_text())
    del body["@Redfish.Settings"]
    rewrite(bios, json.dumps(body))
    before = tree_state(node)
    code, result = remediate(run_cli, node, tmp_path / "state", empty_config, "--only", "bios*",
                             "--allow", "reboot", "--apply")
    assert code == 1
    (action,) = result["actions"]
    assert action["status"] == "refused" and "no @Redfish.Settings" in action["reason"]
    assert tree_state(node) == before


@pytest.mark.parametrize("failpoint", ["before-journal", "after-journal"])
def test_crash_around_the_patch_then_rollback(node: Path, tmp_path: Path, empty_config: Path, run_cli: RunCli,
                                             failpoint: str) -> None:
    state = tmp_path / "state"
    original = tree_state(node)
    crashed = subprocess.run(
        [sys.executable, "-m", "agent", "remediate", "--snapshot", str(node), "--state-dir", str(state),
         "--config", str(empty_config), "--apply", "--allow", "reboot", "--only", "bios*"],
        env={**os.environ, "NODEWARDEN_FAILPOINTS": failpoint}, capture_output=True, text=True, timeout=120,
        check=False)
    assert crashed.returncode == -9, crashed.stderr
    (run_id,) = StateDir(state).runs()
    journaled = StateDir(state).open_run(run_id).before_states()
    assert bool(journaled) == (failpoint == "after-journal")
    if journaled:
        assert run_cli("rollback", "--last", "--snapshot", str(node), "--state-dir", str(state)).code == 0
    assert tree_state(node) == original


# ---- live: a real Redfish service over HTTP ----

USER, PASSWORD = "nwadmin", "s3cret-Bios-pw"


def _get_bios(url: str, path: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}{path}", headers={  # noqa: S310 - http://127.0.0.1 only
        "Authorization": "Basic " + b64encode(f"{USER}:{PASSWORD}".encode()).decode()})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return dict(json.loads(response.read())["Attributes"])


def test_live_bmc_patch_verify_idempotent_rollback(run_cli: RunCli, tmp_path: Path) -> None:
    directory = tmp_path / "profiles"
    directory.mkdir()
    # Keyed by the Manufacturer the emulator reports: how a profile covers an OEM box.
    (directory / "nw-emu.yaml").write_text(json.dumps({
        "name": "nw-emu", "description": "test", "extends": "base",
        "expect": {"bios": {"attributes": {"Sushy Emulator": {
            "ProcTurboMode": {"equals": "Disabled", "severity": "warning", "reason": "test"},
            "BootMode": {"equals": "Uefi", "severity": "warning", "reason": "test"}}}}}}))
    password_file = tmp_path / "bmc-password"
    password_file.write_text(PASSWORD)
    password_file.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{directory}]\n")
    state = tmp_path / "state"
    with sushy_emulator(USER, PASSWORD, workdir=tmp_path / "emu") as bmc:
        args = ("--config", str(config), "--profile", "nw-emu", "--bmc", bmc.url, "--bmc-user", USER,
                "--bmc-password-file", str(password_file), "--state-dir", str(state), "--only", "bios*",
                "--allow", "reboot", "--format", "json")
        assert _get_bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS")["ProcTurboMode"] == "Enabled"
        plan = run_cli("remediate", *args)
        assert plan.code == 0, plan.stderr
        (action,) = plan.json()["actions"]
        assert (action["before"], action["after"]) == ({"ProcTurboMode": "Enabled"}, {"ProcTurboMode": "Disabled"})

        applied = run_cli("remediate", *args, "--apply")
        assert applied.code == 0, applied.stderr
        (action,) = applied.json()["actions"]
        assert action["status"] == "applied" and action["verified"] is True
        assert _get_bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS/Settings")["ProcTurboMode"] == "Disabled"
        assert PASSWORD not in applied.stdout + applied.stderr

        again = run_cli("remediate", *args, "--apply")
        assert again.code == 0 and again.json()["actions"] == []

        rolled = run_cli("rollback", "--last", "--config", str(config), "--bmc", bmc.url, "--bmc-user", USER,
                         "--bmc-password-file", str(password_file), "--state-dir", str(state))
        assert rolled.code == 0, rolled.stderr
        assert _get_bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS")["ProcTurboMode"] == "Enabled"
        journaled = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
        assert b"bios_attribute:bios" in journaled and PASSWORD.encode() not in journaled


def test_live_rollback_without_the_bmc_says_what_to_pass(run_cli: RunCli, tmp_path: Path) -> None:
    """A journal with a BIOS change cannot be restored without the BMC; it says so and keeps the journal."""
    state = tmp_path / "state"
    journal = StateDir(state).create_run("20260101T000000Z-abcdef", {"target": "live", "profile": "x",
                                                                     "actions": ["bios_attribute:bios"]})
    journal.append({"phase": "before", "action": "bios_attribute:bios", "states": [
        {"kind": "redfish", "path": "redfish:/redfish/v1/Systems/1/Bios/Settings",
         "settings_path": "/redfish/v1/Systems/1/Bios/Settings", "values": {"A": "x"}, "raw": None}]})
    result = run_cli("rollback", "--last", "--state-dir", str(state))
    assert result.code == 3
    assert "no BMC to write to (pass --bmc URL)" in result.stderr
    assert StateDir(state).open_run("20260101T000000Z-abcdef").rolled_back() is None
