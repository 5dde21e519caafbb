"""The nodewarden.gpu collection (ansible/collections/ansible_collections/nodewarden/gpu) with real Ansible.

Modules by FQCN through real ansible-playbook on localhost: `nodewarden.gpu.remediate` and
`nodewarden.gpu.audit_info` against writable recorded nodes (`snapshot:`), a live kernel in a network
namespace, and a live Redfish BMC (sushy-emulator) for BIOS attributes; the documentation (ansible-doc)
against the argument specs; the action group for module_defaults; a Galaxy build. All of it fails on the
code before the collection existed (there was only ansible/library/nodewarden.py).
`ansible-test sanity` needs per-test virtualenvs from PyPI and is run by hand (see the collection's README).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.test_ansible import (
    BIN,
    COLLECTIONS,
    PLAYBOOK_DIR,
    ansible_env,
    module_playbook,
    module_result,
    playbook,
    tree_bytes,
)
from tests.integration.test_remediate_netns import PROFILE as NETNS_PROFILE
from tests.peers.redfish import EMULATOR_SYSTEM, sushy_emulator

COLLECTION = COLLECTIONS / "ansible_collections" / "nodewarden" / "gpu"
MODULES = ("audit_info", "remediate")
FRAMEWORK_CHECKS = {"profile.match", "source.available"}  # in every report, whatever --only says
SHARED_OPTIONS = {"profile", "snapshot", "config", "executable", "bmc_url", "ipmi_host", "bmc_user",
                  "bmc_password_file", "bmc_ca_file", "bmc_insecure"}


@pytest.fixture
def node(drifted_copy: Path) -> Path:
    return drifted_copy


def by_status(actions: list[dict[str, Any]]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for action in actions:
        seen.setdefault(action["status"], set()).add(action["id"])
    return seen


# --- remediate on a recorded node -------------------------------------------------------------------


def test_check_mode_plans_with_one_diff_per_action_and_touches_nothing(node: Path, tmp_path: Path) -> None:
    before = tree_bytes(node)
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"))
    out = playbook(tmp_path, site, "--check", "--diff")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert result["changed"] is True and result["run_id"] is None and result["mode"] == "plan"
    assert result["reboot_required"] is False and result["profile"] == "hgx-h100-sxm"
    statuses = by_status(result["actions"])
    # reboot class needs allow: [reboot]; the ACS fix is disruptive and needs allow: [disruptive]
    assert statuses.pop("not_allowed") == {"bios_attribute:bios", "acs:0000:b9:02.0"}
    assert set(statuses) == {"planned"}
    diffs = {d["after_header"]: d for d in result["diff"] if "after_header" in d}
    assert set(diffs) == statuses["planned"]  # one per planned action; those not allowed say so (below)
    assert diffs["sysctl:net.core.rmem_max"] == {
        "before_header": "sysctl:net.core.rmem_max (safe, net.core.rmem_max)",
        "after_header": "sysctl:net.core.rmem_max",
        "before": 'sysctl:net.core.rmem_max = "4194304"\n', "after": 'sysctl:net.core.rmem_max = "134217728"\n'}
    assert diffs["mtu:enp156s0np0"]["after"] == "mtu:enp156s0np0 = 9000\n"
    assert result["summary"]["fail"] > 0  # the audit after: in check mode, the node as it is
    assert tree_bytes(node) == before and not (tmp_path / "st").exists()
    assert out.recap()["changed"] == 1
    shown = out.task_output("nodewarden")
    assert "--- before: sysctl:net.core.rmem_max (safe, net.core.rmem_max)" in shown
    assert '-sysctl:net.core.rmem_max = "4194304"' in shown and '+sysctl:net.core.rmem_max = "134217728"' in shown


def test_check_diff_shows_what_allow_left_out_and_compares_like_with_like(node: Path, tmp_path: Path) -> None:
    """Issue 26.8: `--check --diff` names the actions `allow` filtered out; the governor diff is value against value."""
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           audit_after=False)
    out = playbook(tmp_path, site, "--check", "--diff")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert {a["id"] for a in result["not_allowed"]} == {"bios_attribute:bios", "acs:0000:b9:02.0"}
    shown = out.task_output("nodewarden")
    assert "not allowed: bios_attribute:bios (reboot, BIOS): class reboot not allowed (--allow reboot)" in shown
    assert 'would  bios_attribute:bios.ProcCStates = "Disabled"' in shown
    assert "not allowed: acs:0000:b9:02.0 (disruptive, 0000:b9:02.0): class disruptive not allowed" in shown
    (governor,) = [d for d in result["diff"] if d.get("after_header") == "cpu_governor:node"]
    assert governor["before"] == 'cpu_governor:node = "powersave"  # 0-223\n'
    assert governor["after"] == 'cpu_governor:node = "performance"\n'
    assert '-cpu_governor:node = "powersave"  # 0-223' in shown and '+cpu_governor:node = "performance"' in shown


def test_reboot_class_in_check_mode_predicts_reboot_required(node: Path, tmp_path: Path) -> None:
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           allow=["safe", "reboot"], reboot_ok=True, only=["bios*"], audit_after=False)
    before = tree_bytes(node)
    out = playbook(tmp_path, site, "--check", "--diff")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert result["changed"] is True and result["reboot_required"] is True and "summary" not in result
    (diff,) = result["diff"]
    assert diff["before"] == ('bios_attribute:bios.ProcCStates = "Enabled"\n'
                              'bios_attribute:bios.SysProfile = "PerfPerWattOptimizedOs"\n')
    assert diff["after"] == 'bios_attribute:bios.ProcCStates = "Disabled"\nbios_attribute:bios.SysProfile = "PerfOptimized"\n'
    assert tree_bytes(node) == before

    # Without reboot_ok the reboot class is dropped, with a warning.
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           allow=["safe", "reboot"], only=["bios*"], audit_after=False)
    assert playbook(tmp_path, site, "--check").rc == 0
    result = module_result(tmp_path)
    assert result["changed"] is False and result["reboot_required"] is False
    assert any("set reboot_ok: true" in w for w in result["warnings"])


def test_apply_then_rerun_is_idempotent(node: Path, tmp_path: Path) -> None:
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           only=["sysctl:*", "thp:*"])
    out = playbook(tmp_path, site, "--diff")
    assert out.rc == 0, out.stdout
    first = module_result(tmp_path)
    assert first["changed"] is True and first["run_id"] and first["mode"] == "apply"
    assert {(a["id"], a["status"], a["verified"]) for a in first["actions"]} == {
        ("sysctl:kernel.numa_balancing", "applied", True), ("sysctl:net.core.rmem_max", "applied", True),
        ("thp:enabled", "applied", True)}
    assert {d["after_header"] for d in first["diff"]} == {a["id"] for a in first["actions"]}
    assert {(f["check"], f["subject"], f["status"]) for f in first["findings"]} >= {
        ("host.sysctl", "net.core.rmem_max", "fixed")}
    assert (tmp_path / "st" / "journal" / first["run_id"] / "run.json").is_file()  # journaled: `nodewarden rollback RUN_ID` undoes it
    again = playbook(tmp_path, site, "--diff")
    second = module_result(tmp_path)
    assert again.rc == 0 and again.recap()["changed"] == 0
    assert second["changed"] is False and second["actions"] == [] and "diff" not in second
    assert second["summary"]["fail"] == first["summary"]["fail"]


def test_refused_actions_warn_but_do_not_fail(node: Path, tmp_path: Path) -> None:
    cmdline = node / "fs/proc/cmdline"
    text = cmdline.read_text().strip()
    cmdline.unlink()
    cmdline.write_text(text + " transparent_hugepage=always\n")
    out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node),
                                             state_dir=str(tmp_path / "st"), only=["thp:*"]))
    result = module_result(tmp_path)
    assert out.rc == 0 and result["changed"] is False
    assert result["refused"][0]["id"] == "thp:enabled"
    assert any("refused thp:enabled" in w for w in result["warnings"])


def test_bad_input_and_a_held_lock_fail_with_msg(node: Path, tmp_path: Path) -> None:
    out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(tmp_path / "missing"),
                                             state_dir=str(tmp_path / "st")))
    result = module_result(tmp_path)
    assert out.rc != 0 and result["failed"] is True and result["rc"] == 2
    assert "bad input (exit 2)" in result["msg"] and "snapshot directory does not exist" in result["msg"]

    descriptor = os.open(node, os.O_RDONLY)  # a snapshot's lock is the flock of its folder
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node),
                                                 state_dir=str(tmp_path / "st")))
    finally:
        os.close(descriptor)
    result = module_result(tmp_path)
    assert out.rc != 0 and result["rc"] == 3 and "could not run (exit 3)" in result["msg"], result


def test_values_are_never_read_as_options(node: Path, tmp_path: Path) -> None:
    """Each value is one `--option=value` word, unexpanded: a glob "--apply" in check mode is a glob, not --apply."""
    before = tree_bytes(node)
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           only=["--apply"], profile="--help$HOME")
    out = playbook(tmp_path, site, "--check")
    result = module_result(tmp_path)
    # bad input naming the profile as written: not the help text, and $HOME not expanded
    assert out.rc != 0 and "invalid profile name '--help$HOME'" in result["msg"], result
    site = module_playbook(tmp_path, "nodewarden.gpu.remediate", snapshot=str(node), state_dir=str(tmp_path / "st"),
                           only=["--apply"])
    out = playbook(tmp_path, site, "--check")
    result = module_result(tmp_path)
    assert out.rc == 0 and result["changed"] is False and result["actions"] == []
    assert tree_bytes(node) == before


# --- audit_info ---------------------------------------------------------------------------------------


def test_audit_info_reports_and_never_changes_in_or_out_of_check_mode(node: Path, tmp_path: Path) -> None:
    before = tree_bytes(node)
    for args in ((), ("--check", "--diff")):
        out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.audit_info", snapshot=str(node)), *args)
        result = module_result(tmp_path)
        assert out.rc == 0 and result["changed"] is False and out.recap()["changed"] == 0, out.stdout
        assert result["report"]["schema"] == "nodewarden.report/v1" and result["profile"] == "hgx-h100-sxm"
        assert result["summary"]["fail"] == sum(f["status"] == "fail" for f in result["report"]["findings"]) > 0
    assert tree_bytes(node) == before

    out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.audit_info", snapshot=str(node),
                                             only=["host.*"], skip=["host.thp.*"]))
    checks = {f["check"] for f in module_result(tmp_path)["report"]["findings"]} - FRAMEWORK_CHECKS
    assert out.rc == 0 and checks and all(c.startswith("host.") and not c.startswith("host.thp.") for c in checks)


def test_audit_info_simulate_without_executable_uses_path(tmp_path: Path) -> None:
    """No `executable`: /opt/nodewarden/bin/nodewarden when it exists, else PATH (here: the venv's bin)."""
    site = module_playbook(tmp_path, "nodewarden.gpu.audit_info", simulate="hgx-h100-drifted", only=["gpu.count"])
    site.write_text(site.read_text().replace('"executable": "{{ nodewarden_executable }}", ', ""))
    assert "executable" not in site.read_text()
    out = playbook(tmp_path, site)
    result = module_result(tmp_path)
    assert out.rc == 0, out.stdout
    assert {f["check"] for f in result["report"]["findings"]} - FRAMEWORK_CHECKS == {"gpu.count"}
    out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.audit_info", simulate="x", snapshot="/y"))
    assert out.rc != 0 and "mutually exclusive" in module_result(tmp_path)["msg"]


def test_module_defaults_group_covers_both_modules(node: Path, tmp_path: Path) -> None:
    """meta/runtime.yml's action group: one module_defaults block for executable, node and BMC options."""
    site = tmp_path / "site.yml"
    site.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "module_defaults": {
        "group/nodewarden.gpu.nodewarden": {"executable": "{{ nodewarden_executable }}", "snapshot": str(node)}},
        "tasks": [
            {"name": "audit", "nodewarden.gpu.audit_info": {"only": ["host.sysctl"]}, "register": "a"},
            {"name": "fix", "nodewarden.gpu.remediate": {"only": ["sysctl:*"], "state_dir": str(tmp_path / "st")},
             "register": "f"},
            {"ansible.builtin.copy": {"content": "{{ {'a': a.summary, 'f': f.actions} | to_json }}",
                                      "dest": str(tmp_path / "result.json")}, "check_mode": False}]}]))
    out = playbook(tmp_path, site, "--check")
    assert out.rc == 0, out.stdout
    result = module_result(tmp_path)
    assert result["a"]["fail"] >= 1
    assert {a["id"] for a in result["f"]} == {"sysctl:kernel.numa_balancing", "sysctl:net.core.rmem_max"}


# --- documentation, packaging -----------------------------------------------------------------------


CAPTURE_SPEC = """
import json, runpy, sys
sys.path.insert(0, sys.argv[1])
from ansible.module_utils import basic
seen = {}
class Stop(Exception):
    pass
def capture(self, argument_spec, **kwargs):
    seen.update(kwargs, argument_spec=argument_spec)
    raise Stop
basic.AnsibleModule.__init__ = capture
try:
    runpy.run_module("ansible_collections.nodewarden.gpu.plugins.modules." + sys.argv[2], run_name="__main__")
except Stop:
    pass
print(json.dumps(seen))
"""


def argument_spec(module: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CAPTURE_SPEC, str(COLLECTIONS), module],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def ansible_doc(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run([str(BIN / "ansible-doc"), *args], capture_output=True, text=True,
                          env=ansible_env(tmp_path), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_documentation_matches_the_argument_specs(tmp_path: Path) -> None:
    """What validate-modules checks, without its virtualenv: every option documented as the module takes it."""
    docs = json.loads(ansible_doc(tmp_path, "--json", *(f"nodewarden.gpu.{m}" for m in MODULES)))
    for name in MODULES:
        doc, spec = docs[f"nodewarden.gpu.{name}"], argument_spec(name)
        assert spec["supports_check_mode"] is True
        options, arguments = doc["doc"]["options"], spec["argument_spec"]
        assert set(options) == set(arguments) and set(options) >= SHARED_OPTIONS, name
        for option, arg in arguments.items():
            documented = options[option]
            assert documented["type"] == arg["type"], option
            assert documented.get("default") == arg.get("default"), option
            assert documented.get("choices") == arg.get("choices"), option
            assert documented.get("elements") == arg.get("elements"), option
        assert not any("password" in o and o != "bmc_password_file" for o in options)  # never the secret itself
        assert arguments["bmc_password_file"]["no_log"] is True
        assert doc["doc"]["attributes"]["check_mode"]["support"] == "full"
        assert doc["doc"]["attributes"]["platform"]["platforms"] == "posix"
        assert f"nodewarden.gpu.{name}:" in doc["examples"]
    remediate, audit = docs["nodewarden.gpu.remediate"], docs["nodewarden.gpu.audit_info"]
    assert remediate["doc"]["attributes"]["diff_mode"]["support"] == "full"
    assert audit["doc"]["attributes"]["diff_mode"]["support"] == "none"
    assert {"changed", "reboot_required", "run_id", "actions", "refused", "findings", "summary", "diff"} <= set(
        remediate["return"])
    assert {"report", "summary", "profile"} <= set(audit["return"])
    listed = ansible_doc(tmp_path, "-l", "nodewarden.gpu")
    assert re.search(r"^nodewarden\.gpu\.audit_info\s", listed, re.M)
    assert re.search(r"^nodewarden\.gpu\.remediate\s", listed, re.M)


def test_galaxy_build(tmp_path: Path) -> None:
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", str(COLLECTION),
                           "--output-path", str(tmp_path)], capture_output=True, text=True,
                          env=ansible_env(tmp_path), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "nodewarden-gpu-0.1.0.tar.gz") as archive:
        names = set(archive.getnames())
        manifest = json.load(archive.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert {"plugins/modules/audit_info.py", "plugins/modules/remediate.py", "plugins/module_utils/nodewarden.py",
            "plugins/doc_fragments/common.py", "meta/runtime.yml", "README.md"} <= names
    assert not any(n.startswith("tests/output") for n in names)
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["license"]) == ("nodewarden", "gpu", ["Apache-2.0"])


# --- a live kernel: a network namespace ------------------------------------------------------------------


def test_remediate_inside_a_network_namespace(tmp_path: Path) -> None:
    """nodewarden.gpu.remediate on a live kernel (a netns the test makes): check, apply, rerun, CLI rollback."""
    assert os.geteuid() == 0, "creating a network namespace with a veth pair needs root (CI runs as root)"
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nw-live.yaml").write_text(NETNS_PROFILE)
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\n")
    work = tmp_path / "ansible"
    work.mkdir()
    site = module_playbook(work, "nodewarden.gpu.remediate", config=str(config), profile="nw-live",
                           only=["sysctl:net.ipv4.*", "mtu:nwv0"], state_dir=str(tmp_path / "state"))
    name = f"nwcoll{os.getpid()}"
    host_probing = Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "nwv0", "type", "veth", "peer", "name", "nwv1"], check=True)
        proc = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, str(REPO / "tests" / "netns_remediate_driver.py"),
             str(config), str(tmp_path / "state"), str(tmp_path / "scratch"), "--ansible", str(site), str(work)],
            capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, Any] = json.loads(proc.stdout)
    rc, predicted, out = seen["check"]
    assert rc == 0, out
    assert predicted["mode"] == "plan" and predicted["run_id"] is None and seen["after_check"] == seen["before"]
    assert {(d["after_header"], d["before"], d["after"]) for d in predicted["diff"]} == {
        ("sysctl:net.ipv4.tcp_mtu_probing", 'sysctl:net.ipv4.tcp_mtu_probing = "0"\n',
         'sysctl:net.ipv4.tcp_mtu_probing = "1"\n'),
        ("mtu:nwv0", "mtu:nwv0 = 1500\n", "mtu:nwv0 = 9000\n")}
    rc, applied, out = seen["apply"]
    assert rc == 0, out
    assert applied["mode"] == "apply" and applied["changed"] is True and applied["reboot_required"] is False
    assert all(a["verified"] for a in applied["actions"]) and applied["run_id"]
    assert (seen["after"]["probing"], seen["after"]["mtu0"]) == ("1", "9000")
    assert seen["again"][1]["changed"] is False
    assert seen["rollback"][0] == 0, seen["rollback"][1]
    assert seen["restored"] == seen["before"]
    assert Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text() == host_probing


# --- a live BMC: BIOS attributes through Redfish -------------------------------------------------------------

USER, PASSWORD = "nwadmin", "s3cret-Ansible-pw"


def _bios(url: str, path: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}{path}", headers={  # noqa: S310 - http://127.0.0.1 only
        "Authorization": "Basic " + b64encode(f"{USER}:{PASSWORD}".encode()).decode()})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return dict(json.loads(response.read())["Attributes"])


def test_bios_fix_through_the_bmc_from_ansible(tmp_path: Path) -> None:
    """BMC options end to end: audit_info reads the BIOS, remediate plans then PATCHes it, the playbook too."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nw-emu.yaml").write_text(json.dumps({
        "name": "nw-emu", "description": "test", "extends": "base",
        "expect": {"bios": {"attributes": {"Sushy Emulator": {
            "ProcTurboMode": {"equals": "Disabled", "severity": "warning", "reason": "test"}}}}}}))
    password_file = tmp_path / "bmc-password"
    password_file.write_text(PASSWORD)
    password_file.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\n")
    state = tmp_path / "state"
    outputs: list[str] = []
    with sushy_emulator(USER, PASSWORD, workdir=tmp_path / "emu") as bmc:
        bmc_args = {"bmc_url": bmc.url, "bmc_user": USER, "bmc_password_file": str(password_file),
                    "config": str(config), "profile": "nw-emu"}
        out = playbook(tmp_path, module_playbook(tmp_path, "nodewarden.gpu.audit_info", only=["bios.*"], **bmc_args),
                       "-vvv")
        outputs.append(out.stdout)
        assert out.rc == 0, out.stdout
        findings = {f["subject"]: f["status"] for f in module_result(tmp_path)["report"]["findings"]
                    if f["check"] == "bios.attribute"}
        assert findings == {"ProcTurboMode": "fail"}

        site = module_playbook(tmp_path, "nodewarden.gpu.remediate", only=["bios*"], allow=["safe", "reboot"],
                               reboot_ok=True, state_dir=str(state), **bmc_args)
        out = playbook(tmp_path, site, "--check", "--diff", "-vvv")
        outputs.append(out.stdout)
        assert out.rc == 0, out.stdout
        predicted = module_result(tmp_path)
        assert predicted["changed"] is True and predicted["reboot_required"] is True and predicted["run_id"] is None
        assert [(d["before"], d["after"]) for d in predicted["diff"]] == [
            ('bios_attribute:bios.ProcTurboMode = "Enabled"\n', 'bios_attribute:bios.ProcTurboMode = "Disabled"\n')]
        assert _bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS/Settings")["ProcTurboMode"] == "Enabled"  # nothing sent

        out = playbook(tmp_path, site, "--diff", "-vvv")
        outputs.append(out.stdout)
        assert out.rc == 0, out.stdout
        applied = module_result(tmp_path)
        assert applied["changed"] is True and applied["reboot_required"] is True and applied["run_id"]
        assert [(a["id"], a["status"], a["verified"]) for a in applied["actions"]] == [
            ("bios_attribute:bios", "applied", True)]
        assert _bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS/Settings")["ProcTurboMode"] == "Disabled"
        out = playbook(tmp_path, site)
        assert out.rc == 0 and module_result(tmp_path)["changed"] is False

        # The playbook passes the BMC options from host variables; this live "node" is this machine, so the
        # reboot is disabled twice over (variable and tag) and only the BIOS is in scope.
        rolled = subprocess.run([str(BIN / "nodewarden"), "rollback", "--last", "--config", str(config),
                                 "--bmc", bmc.url, "--bmc-user", USER, "--bmc-password-file", str(password_file),
                                 "--state-dir", str(state)], capture_output=True, text=True, timeout=120, check=False)
        assert rolled.returncode == 0, rolled.stderr
        results = tmp_path / "results"
        extra = {"nodewarden_config": str(config), "nodewarden_profile": "nw-emu", "nodewarden_only": ["bios*"],
                 "nodewarden_allow": ["safe", "reboot"], "nodewarden_reboot_ok": True, "nodewarden_reboot": False,
                 "nodewarden_state_dir": str(state), "nodewarden_results_dir": str(results),
                 "nodewarden_bmc_url": bmc.url, "nodewarden_bmc_user": USER,
                 "nodewarden_bmc_password_file": str(password_file)}
        out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-remediate.yml", "--check", "--diff", "--skip-tags", "reboot",
                       "-vvv", extra=extra, fresh=True)
        outputs.append(out.stdout)
        assert out.rc == 0, out.stdout
        assert json.loads((results / "localhost.json").read_text())["reboot_required"] is True
        assert '+bios_attribute:bios.ProcTurboMode = "Disabled"' in out.task_output("Remediate the node")
        assert _bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS/Settings")["ProcTurboMode"] == "Enabled"
        out = playbook(tmp_path, PLAYBOOK_DIR / "fleet-remediate.yml", "--skip-tags", "reboot", extra=extra,
                       fresh=True)
        outputs.append(out.stdout)
        assert out.rc == 0, out.stdout
        collected = json.loads((results / "localhost.json").read_text())
        assert collected["mode"] == "apply" and collected["reboot_required"] is True
        assert _bios(bmc.url, f"{EMULATOR_SYSTEM}/BIOS/Settings")["ProcTurboMode"] == "Disabled"
        assert "Reboot where" not in out.stdout  # the reboot task never ran
    for text in outputs:
        assert PASSWORD not in text
        assert str(password_file) not in text  # no_log: the path is hidden too
