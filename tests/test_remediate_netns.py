"""Live remediation of a real kernel: net.ipv4 sysctls inside a network namespace we create.

Never touches the host's own settings: the kernel write lands in a private
network namespace and the persistence file on a tmpfs in a private mount
namespace (`unshare --user --map-root-user` makes this work without root).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_live_sysctl_apply_verify_rollback_in_netns(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nw-live.yaml").write_text(
        "name: nw-live\ndescription: netns test\nextends: base\nexpect:\n  sysctl:\n"
        "    net.ipv4.tcp_mtu_probing:\n      equals: 1\n      severity: warning\n"
        "      reason: RoCE/TCP paths with PMTU black holes need probing\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"profile_dirs: [{profiles}]\n")
    host_value = Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text()
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "--mount", "--",
         sys.executable, str(REPO / "tests" / "netns_remediate_driver.py"),
         str(config), str(tmp_path / "state")],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["before"] == "0"  # a fresh namespace starts at the kernel default
    assert seen["apply_rc"] == 0, seen["apply_stderr"]
    (action,) = seen["apply"]["actions"]
    assert (action["id"], action["status"], action["verified"]) == ("sysctl:net.ipv4.tcp_mtu_probing", "applied", True)
    assert seen["after"] == "1"
    assert seen["conf"].splitlines()[1:] == ["net.ipv4.tcp_mtu_probing = 1"]
    assert seen["again"]["changed"] is False and seen["again"]["actions"] == []
    assert seen["rollback_rc"] == 0, seen["rollback_stderr"]
    assert seen["restored"] == "0" and seen["conf_after_rollback"] is False
    assert Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text() == host_value  # the host never changed
