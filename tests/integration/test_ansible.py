"""The playbooks (and the deprecated ansible/library module), run by real ansible-playbook against localhost.

Every run targets a writable copy of a simulated node (`snapshot:`), so check
mode, diff, idempotence and failure paths are exercised end to end through the
nodewarden CLI without touching this machine. The nodewarden.gpu collection's
modules have their own tests (tests/integration/test_ansible_collection.py); the helpers
here (`playbook`, `module_playbook`, `module_result`) serve both, and
tests/netns_remediate_driver.py.
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
COLLECTIONS = PLAYBOOK_DIR / "collections"  # ansible_collections/nodewarden/gpu lives here, next to the playbooks
# The old `state:` of the deprecated module -> the collection module that replaces it.
BY_STATE = {"remediated": "nodewarden.gpu.remediate", "audited": "nodewarden.gpu.audit_info"}


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


def ansible_env(tmp_path: Path, *, fresh: bool = False) -> dict[str, str]:
    """Ansible's environment: its home and temp folders in tmp_path, never ~/.ansible.

    `fresh` is a controller that knows nothing of this checkout: no ANSIBLE_LIBRARY, no ANSIBLE_COLLECTIONS_PATH
    (the playbooks in ansible/ must find the collection next to them by themselves)."""
    home = tmp_path / "ansible-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
                "ANSIBLE_REMOTE_TEMP": str(home / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    if not fresh:
        env.update({"ANSIBLE_LIBRARY": str(PLAYBOOK_DIR / "library"), "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)})
    return env


def playbook(tmp_path: Path, path: Path, *args: str, extra: dict[str, Any] | None = None,
             fresh: bool = False) -> Run:
    """Run ansible-playbook (default output callback) and return its exit code and output."""
    variables = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "nodewarden_executable": str(BIN / "nodewarden"), **(extra or {})}
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(path), "-e", json.dumps(variables), *args],
        capture_output=True, text=True, env=ansible_env(tmp_path, fresh=fresh), timeout=300, check=False,
        cwd=tmp_path)
    return Run(proc.returncode, proc.stdout + proc.stderr)


def module_playbook(tmp_path: Path, module: str | None = None, **module_args: Any) -> Path:
    """A one-task playbook that also saves the registered result (even a failure) as JSON.

    `module` is the module's name; without it, `state=` picks the collection module (remediated ->
    nodewarden.gpu.remediate, audited -> nodewarden.gpu.audit_info) and is dropped."""
    if module is None:
        module = BY_STATE[module_args.pop("state", "audited")]
    path = tmp_path / "site.yml"
    args = {"executable": "{{ nodewarden_executable }}", **module_args}
    save = {"ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(tmp_path / "result.json")},
            "check_mode": False, "changed_when": False}
    path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"block": [{"name": "nodewarden", module: args, "register": "r"}],
         "always": [{"name": "save", **save}]}]}]))
    return path


def module_result(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "result.json").read_text())  # type: ignore[no-any-return]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


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


def test_fleet_remediate_check_diff_on_a_fresh_controller(node: Path, tmp_path: Path) -> None:
    """--check --diff with no results folder yet and nothing configured: the folder is made, the prediction kept.

    Fails on the old playbook: its mkdir skipped in check mode and the copy (check_mode: false) then wrote into
    a folder that did not exist."""
    results = tmp_path / "controller" / "results"
    before = tree_bytes(node)
    out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-remediate.yml", "--check", "--diff", fresh=True,
                   extra={"nodewarden_snapshot": str(node), "nodewarden_results_dir": str(results),
                          "nodewarden_state_dir": str(tmp_path / "st")})
    assert out.rc == 0, out.stdout
    assert tree_bytes(node) == before and not (tmp_path / "st").exists()  # nothing acted, not even a journal
    collected = json.loads((results / "localhost.json").read_text())
    assert collected["changed"] is True and collected["mode"] == "plan" and collected["run_id"] is None
    assert {a["status"] for a in collected["actions"]} == {"planned", "not_allowed"}
    shown = out.task_output("Remediate the node")
    assert '-sysctl:net.core.rmem_max = "4194304"' in shown and '+sysctl:net.core.rmem_max = "134217728"' in shown
    assert "--- before" not in out.task_output("Collect the result on the controller")  # no diff of our own files
    assert oct(results.stat().st_mode & 0o777) == "0o750"


def test_fleet_audit_check_mode_on_a_fresh_controller(node: Path, tmp_path: Path) -> None:
    """The audit is read-only, so --check --diff audits and stores the reports like a normal run.

    Fails on the old playbook: in check mode it made no folder, stored no report and built no fleet page."""
    reports = tmp_path / "controller" / "reports"
    before = tree_bytes(node)
    out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-audit.yml", "--check", "--diff", fresh=True,
                   extra={"nodewarden_snapshot": str(node), "nodewarden_reports_dir": str(reports)})
    assert out.rc == 0, out.stdout
    assert tree_bytes(node) == before
    report = json.loads((reports / "localhost.json").read_text())
    assert report["schema"] == "nodewarden.report/v1" and report["summary"]["fail"] > 0
    assert "nodewarden fleet report" in (reports / "fleet.html").read_text()
    assert out.recap()["failed"] == 0


def test_playbooks_use_the_collection_by_fqcn() -> None:
    """No short module names left in the playbooks: they run where ansible/library is not on the path."""
    import yaml

    for name in ("fleet-audit.yml", "fleet-remediate.yml"):
        (play,) = yaml.safe_load((PLAYBOOK_DIR / name).read_text())
        modules = {key for task in play["tasks"] for key in task if "." in key}
        assert modules, name
        assert all(m.startswith(("ansible.builtin.", "nodewarden.gpu.")) for m in modules), modules
    assert "nodewarden.gpu.remediate" in (PLAYBOOK_DIR / "fleet-remediate.yml").read_text()
    assert "nodewarden.gpu.audit_info" in (PLAYBOOK_DIR / "fleet-audit.yml").read_text()


def test_deprecated_module_still_works_through_the_collection(node: Path, tmp_path: Path) -> None:
    """ansible/library/nodewarden.py is a thin wrapper now: same options and results, plus a deprecation."""
    before = tree_bytes(node)
    site = module_playbook(tmp_path, "nodewarden", state="remediated", snapshot=str(node),
                           state_dir=str(tmp_path / "st"), only=["sysctl:*"])
    out = playbook(tmp_path, site, "--check", "--diff")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert result["changed"] is True and result["run_id"] is None and tree_bytes(node) == before
    assert {a["id"] for a in result["actions"]} == {"sysctl:kernel.numa_balancing", "sysctl:net.core.rmem_max"}
    assert result["report"]["schema"] == "nodewarden.report/v1" and result["summary"]["fail"] > 0
    assert any("nodewarden.gpu.remediate" in d["msg"] for d in result["deprecations"])
    out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden", state="audited", snapshot=str(node)))
    assert out.rc == 0 and module_result(tmp_path)["changed"] is False

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


def test_ansible_lint_is_clean_and_results_stay_out_of_the_checkout(tmp_path: Path) -> None:
    """Issue 26.8: ansible-lint (production profile, offline) passes over ansible/; what the playbooks fetch by
    default (results/, reports/ next to them) is git-ignored."""
    proc = subprocess.run([sys.executable, "-m", "ansiblelint", "--nocolor"], cwd=REPO / "ansible",
                          env={**ansible_env(tmp_path), "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Passed: 0 failure(s), 0 warning(s)" in proc.stdout + proc.stderr
    for default in ("results/node.json", "reports/node.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"ansible/{default}"], cwd=REPO, timeout=60,
                                 check=False)
        assert ignored.returncode == 0, f"ansible/{default} would land in the checkout"
