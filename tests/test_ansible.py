"""The Ansible module and playbooks, run by real ansible-playbook against localhost (connection local).

Every run targets a writable copy of a simulated node (`snapshot:`), so the
module's check mode, diff, idempotence and failure paths are exercised end to
end through the nodewarden CLI without touching this machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent
PLAYBOOK_DIR = REPO / "ansible"


@pytest.fixture
def node(drifted_copy: Path) -> Path:
    return drifted_copy

class Run(NamedTuple):
    rc: int
    stdout: str

    def recap(self) -> dict[str, int]:
        match = re.search(r"^localhost\s*:(.*)$", self.stdout, re.M)
        assert match, self.stdout
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}

    def task_output(self, name: str) -> str:
        """The default callback's lines for one task."""
        match = re.search(rf"^TASK \[{re.escape(name)}\].*?\n(.*?)(?=^TASK |^PLAY RECAP)", self.stdout, re.M | re.S)
        assert match, self.stdout
        return match.group(1)


def playbook(tmp_path: Path, path: Path, *args: str, extra: dict[str, Any] | None = None) -> Run:
    """Run ansible-playbook (default output callback) and return its exit code and output."""
    home = tmp_path / "ansible-home"
    env = {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
           "ANSIBLE_REMOTE_TEMP": str(home / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
           "ANSIBLE_LIBRARY": str(PLAYBOOK_DIR / "library"),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    variables = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "nodewarden_executable": str(BIN / "nodewarden"), **(extra or {})}
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(path), "-e", json.dumps(variables), *args],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path)
    return Run(proc.returncode, proc.stdout + proc.stderr)


def module_playbook(tmp_path: Path, **module_args: Any) -> Path:
    """A one-task playbook that also saves the registered result (even a failure) as JSON."""
    path = tmp_path / "site.yml"
    args = {"executable": "{{ nodewarden_executable }}", **module_args}
    save = {"ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(tmp_path / "result.json")},
            "check_mode": False, "changed_when": False}
    path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"block": [{"name": "nodewarden", "nodewarden": args, "register": "r"}],
         "always": [{"name": "save", **save}]}]}]))
    return path


def module_result(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "result.json").read_text())  # type: ignore[no-any-return]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_check_mode_predicts_with_diff_and_touches_nothing(node: Path, tmp_path: Path) -> None:
    before = tree_bytes(node)
    site = module_playbook(tmp_path, state="remediated", snapshot=str(node), state_dir=str(tmp_path / "st"))
    out = playbook(tmp_path, site, "--check", "--diff")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert result["changed"] is True and result["run_id"] is None
    by_status: dict[str, set[str]] = {}
    for action in result["actions"]:
        by_status.setdefault(action["status"], set()).add(action["id"])
    # reboot class needs allow: [reboot]; the ACS fix is disruptive and needs allow: [disruptive]
    assert by_status.pop("not_allowed") == {"bios_attribute:bios", "acs:0000:b9:02.0"}
    assert set(by_status) == {"planned"}
    assert "sysctl:net.core.rmem_max = \"4194304\"" in result["diff"]["before"]
    assert "sysctl:net.core.rmem_max = \"134217728\"" in result["diff"]["after"]
    assert tree_bytes(node) == before
    assert out.recap()["changed"] == 1
    assert '-sysctl:net.core.rmem_max = "4194304"' in out.task_output("nodewarden")  # --diff is shown


def test_apply_then_rerun_is_idempotent(node: Path, tmp_path: Path) -> None:
    site = module_playbook(tmp_path, state="remediated", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           only=["sysctl:*", "thp:*"])
    assert playbook(tmp_path, site, "--diff").rc == 0
    first = module_result(tmp_path)
    assert first["changed"] is True and first["run_id"]
    assert {(a["id"], a["status"], a["verified"]) for a in first["actions"]} == {
        ("sysctl:kernel.numa_balancing", "applied", True), ("sysctl:net.core.rmem_max", "applied", True),
        ("thp:enabled", "applied", True)}
    assert first["report"]["schema"] == "nodewarden.report/v1"
    failing = {(f["check"], f["subject"]) for f in first["report"]["findings"] if f["status"] == "fail"}
    assert ("host.sysctl", "net.core.rmem_max") not in failing and ("net.mtu", "enp156s0np0") in failing
    again = playbook(tmp_path, site)
    second = module_result(tmp_path)
    assert again.rc == 0 and again.recap()["changed"] == 0
    assert second["changed"] is False and second["actions"] == []


def test_audited_reports_without_changing(node: Path, tmp_path: Path) -> None:
    before = tree_bytes(node)
    out = playbook(tmp_path, module_playbook(tmp_path, state="audited", snapshot=str(node)))
    result = module_result(tmp_path)
    assert out.rc == 0 and result["changed"] is False
    assert result["summary"]["fail"] == sum(f["status"] == "fail" for f in result["report"]["findings"]) > 0
    assert tree_bytes(node) == before


def test_bad_input_fails_with_msg(tmp_path: Path) -> None:
    out = playbook(tmp_path, module_playbook(tmp_path, state="remediated", snapshot=str(tmp_path / "missing"),
                                             state_dir=str(tmp_path / "st")))
    result = module_result(tmp_path)
    assert out.rc != 0 and result["failed"] is True
    assert "snapshot directory does not exist" in result["msg"]


def test_refused_actions_warn_but_do_not_fail(node: Path, tmp_path: Path) -> None:
    cmdline = node / "fs/proc/cmdline"
    text = cmdline.read_text().strip()
    cmdline.unlink()
    cmdline.write_text(text + " transparent_hugepage=always\n")
    out = playbook(tmp_path, module_playbook(tmp_path, state="remediated", snapshot=str(node),
                                             state_dir=str(tmp_path / "st"), only=["thp:*"]))
    result = module_result(tmp_path)
    assert out.rc == 0 and result["changed"] is False
    assert result["refused"][0]["id"] == "thp:enabled"
    assert any("refused thp:enabled" in w for w in result["warnings"])


def test_fleet_audit_fetches_reports(node: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-audit.yml",
                   extra={"nodewarden_snapshot": str(node), "nodewarden_reports_dir": str(reports)})
    assert out.rc == 0, out.stdout
    report = json.loads((reports / "localhost.json").read_text())
    assert report["schema"] == "nodewarden.report/v1" and report["profile"] == "hgx-h100-sxm"
    page = (reports / "fleet.html").read_text()  # built once on the controller from the fetched reports
    assert "nodewarden fleet report" in page and 'id="node-gpu-h100-drifted-01"' in page


def test_fleet_remediate_collects_results_and_skips_reboot(node: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-remediate.yml",
                   extra={"nodewarden_snapshot": str(node), "nodewarden_results_dir": str(results),
                          "nodewarden_state_dir": str(tmp_path / "st")})
    assert out.rc == 0, out.stdout
    collected = json.loads((results / "localhost.json").read_text())
    assert collected["changed"] is True and collected["reboot_required"] is False
    statuses = {a["id"]: a["status"] for a in collected["actions"]}
    assert statuses.pop("bios_attribute:bios") == "not_allowed"  # reboot class is not in the default [safe]
    assert statuses.pop("acs:0000:b9:02.0") == "not_allowed"  # disruptive class neither
    assert set(statuses.values()) == {"applied"}
    assert "skipping: [localhost]" in out.task_output("Reboot where a staged change needs it and the host allows it")

    # Reboot class allowed on a host that may reboot: the BIOS change is staged and a reboot is due
    # (skipped here only because a snapshot is no machine to reboot).
    out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-remediate.yml",
                   extra={"nodewarden_snapshot": str(node), "nodewarden_results_dir": str(results),
                          "nodewarden_state_dir": str(tmp_path / "st"), "nodewarden_allow": ["safe", "reboot"],
                          "nodewarden_reboot_ok": True})
    assert out.rc == 0, out.stdout
    collected = json.loads((results / "localhost.json").read_text())
    assert collected["reboot_required"] is True
    assert sorted((a["id"], a["status"]) for a in collected["actions"]) == [
        ("acs:0000:b9:02.0", "not_allowed"), ("bios_attribute:bios", "applied")]  # disruptive not allowed


def test_module_documentation_is_valid(tmp_path: Path) -> None:
    env = {**os.environ, "ANSIBLE_HOME": str(tmp_path / "home")}
    proc = subprocess.run([str(BIN / "ansible-doc"), "-M", str(PLAYBOOK_DIR / "library"), "--json", "nodewarden"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["nodewarden"]
    assert set(doc["doc"]["options"]) == {"state", "allow", "only", "profile", "reboot_ok", "snapshot", "config",
                                          "state_dir", "executable"}
    assert {"changed", "reboot_required", "run_id", "actions", "report"} <= set(doc["return"])
    assert "nodewarden:" in doc["examples"]
