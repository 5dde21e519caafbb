"""Live remediation of a real kernel inside a network namespace the test creates.

net.ipv4 sysctls and MTUs of a veth pair change for real and are rolled
back; the host's own interfaces and settings are never touched (the
persistence file lands on a tmpfs in the namespace's private mount
namespace). Needs root, as creating a netns with a veth pair does; CI runs
as root.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

PROFILE = """\
name: nw-live
description: netns test profile
extends: base
expect:
  sysctl:
    net.ipv4.tcp_mtu_probing:
      equals: 1
      severity: warning
      reason: RoCE/TCP paths with PMTU black holes need probing
  network:
    mtu:
      jumbo:
        match: {names: [nwv0]}
        expect: {min: 9000, severity: warning, reason: jumbo frames on the data plane}
      impossible:
        match: {names: [nwv1]}
        expect: {equals: 70000, severity: warning, reason: above what veth supports}
"""


@pytest.fixture
def netns() -> Iterator[str]:
    assert os.geteuid() == 0, "creating a network namespace with a veth pair needs root (CI runs as root)"
    name = f"nwtest{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "nwv0", "type", "veth", "peer", "name", "nwv1"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_live_sysctl_and_mtu_apply_verify_rollback(netns: str, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nw-live.yaml").write_text(PROFILE)
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\n")
    host_probing = Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text()
    host_conf = Path("/etc/sysctl.d/90-nodewarden.conf").exists()
    host_etc_nodewarden = Path("/etc/nodewarden").exists()
    proc = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, str(REPO / "tests" / "netns_remediate_driver.py"),
         str(config), str(tmp_path / "state"), str(tmp_path / "scratch")],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, Any] = json.loads(proc.stdout)
    assert seen["before"] == {"probing": "0", "mtu0": "1500", "mtu1": "1500", "conf": None, "boot": None,
                              "etc_nodewarden": False}

    code, plan, err = seen["plan"]
    assert code == 0, err
    assert {(a["id"], a["status"], str(a["before"]), str(a["after"])) for a in plan["actions"]} == {
        ("sysctl:net.ipv4.tcp_mtu_probing", "planned", "0", "1"), ("mtu:nwv0", "planned", "1500", "9000")}

    code, applied, err = seen["apply"]
    assert code == 0, err
    assert all(a["status"] == "applied" and a["verified"] for a in applied["actions"])
    assert seen["after"]["probing"] == "1" and seen["after"]["mtu0"] == "9000"
    assert seen["after"]["conf"].splitlines()[1:] == ["net.ipv4.tcp_mtu_probing = 1"]
    assert seen["after"]["boot"].splitlines()[2:] == ["mtu.nwv0 = 9000"]
    assert seen["again"][1]["changed"] is False and seen["again"][1]["actions"] == []

    code, too_big, _ = seen["too_big"]
    assert code == 1
    (refused,) = too_big["actions"]
    assert refused["status"] == "refused" and "supports at most MTU 65535" in refused["reason"]
    assert seen["after_too_big"] == seen["after"]  # nothing partially applied

    assert seen["rollback"][0] == 0, seen["rollback"][1]
    assert seen["restored"] == seen["before"]
    # The host never saw any of it.
    assert Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text() == host_probing
    assert Path("/etc/sysctl.d/90-nodewarden.conf").exists() == host_conf
    assert Path("/etc/nodewarden").exists() == host_etc_nodewarden


def test_ansible_module_remediates_inside_the_namespace(netns: str, tmp_path: Path) -> None:
    """Real ansible-playbook, the nodewarden module, a live kernel (the namespace's), no snapshot."""
    from tests.integration.test_ansible import module_playbook

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nw-live.yaml").write_text(PROFILE)
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\n")
    work = tmp_path / "ansible"
    work.mkdir()
    site = module_playbook(work, state="remediated", config=str(config), profile="nw-live",
                           only=["sysctl:net.ipv4.*", "mtu:nwv0"], state_dir=str(tmp_path / "state"))
    host_probing = Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text()
    proc = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, str(REPO / "tests" / "netns_remediate_driver.py"),
         str(config), str(tmp_path / "state"), str(tmp_path / "scratch"), "--ansible", str(site), str(work)],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, Any] = json.loads(proc.stdout)
    assert (seen["before"]["probing"], seen["before"]["mtu0"]) == ("0", "1500")

    rc, predicted, out = seen["check"]
    assert rc == 0, out
    assert predicted["changed"] is True and predicted["run_id"] is None
    assert {a["id"] for a in predicted["actions"]} == {"sysctl:net.ipv4.tcp_mtu_probing", "mtu:nwv0"}
    assert seen["after_check"] == seen["before"]  # check mode acted on nothing
    assert re.search(r'^\+mtu:nwv0 = "?9000"?$', out, re.M), out  # --diff shows the change

    rc, applied, out = seen["apply"]
    assert rc == 0, out
    assert applied["changed"] is True and applied["reboot_required"] is False and applied["run_id"]
    assert (seen["after"]["probing"], seen["after"]["mtu0"]) == ("1", "9000")
    rc, again, out = seen["again"]
    assert rc == 0 and again["changed"] is False, out

    assert seen["rollback"][0] == 0, seen["rollback"][1]
    assert seen["restored"] == seen["before"]
    assert Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text() == host_probing
