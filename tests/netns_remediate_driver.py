"""Runs inside `ip netns exec NS` (see test_remediate_netns.py): live remediation of a real kernel.

`ip netns exec` gives a private mount namespace with /sys showing only the
namespace's links; we put an overlay (upper layer on a tmpfs) over /etc so the
persistence files (/etc/sysctl.d, /etc/nodewarden) never reach the host. net.ipv4.* sysctls and the veth MTUs are per
namespace, so the live writes never reach the host either. Prints one JSON
object with what it observed at each step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PROBING = Path("/proc/sys/net/ipv4/tcp_mtu_probing")
MTU0, MTU1 = Path("/sys/class/net/nwv0/mtu"), Path("/sys/class/net/nwv1/mtu")
CONF = Path("/etc/sysctl.d/90-nodewarden.conf")
BOOT = Path("/etc/nodewarden/boot.conf")


def nodewarden(*args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, check=False)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = proc.stdout
    return proc.returncode, out, proc.stderr[-2000:]


def observe() -> dict[str, Any]:
    return {"probing": PROBING.read_text().strip(), "mtu0": MTU0.read_text().strip(),
            "mtu1": MTU1.read_text().strip(), "conf": CONF.read_text() if CONF.exists() else None,
            "boot": BOOT.read_text() if BOOT.exists() else None, "etc_nodewarden": BOOT.parent.exists()}


def overlay_etc(scratch: Path) -> None:
    scratch.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "nodewarden-test", str(scratch)], check=True)
    (scratch / "upper").mkdir()
    (scratch / "work").mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir=/etc,upperdir={scratch / 'upper'},workdir={scratch / 'work'}", "/etc"], check=True)


def ansible_main(config: str, state: str, playbook_path: Path, work: Path) -> None:
    """The Ansible module remediating the live namespace: check mode, apply, re-run, then CLI rollback."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.integration.test_ansible import module_result, playbook

    seen: dict[str, Any] = {"before": observe()}
    run = playbook(work, playbook_path, "--check", "--diff")
    seen["check"] = [run.rc, module_result(work), run.stdout[-3000:]]
    seen["after_check"] = observe()
    run = playbook(work, playbook_path, "--diff")
    seen["apply"] = [run.rc, module_result(work), run.stdout[-3000:]]
    seen["after"] = observe()
    run = playbook(work, playbook_path)
    seen["again"] = [run.rc, module_result(work), run.stdout[-3000:]]
    rc, _, err = nodewarden("rollback", "--last", "--config", config, "--state-dir", state)
    seen["rollback"] = [rc, err]
    seen["restored"] = observe()
    print(json.dumps(seen))


def main() -> None:
    config, state, scratch = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    overlay_etc(scratch)
    if len(sys.argv) > 4:  # --ansible PLAYBOOK WORKDIR
        ansible_main(config, state, Path(sys.argv[5]), Path(sys.argv[6]))
        return
    common = ["--config", config, "--profile", "nw-live", "--state-dir", state, "--format", "json"]
    fixable = ["--only", "sysctl:net.ipv4.*", "--only", "mtu:nwv0"]
    seen: dict[str, Any] = {"before": observe()}
    seen["plan"] = nodewarden("remediate", *common, *fixable)
    seen["apply"] = nodewarden("remediate", *common, *fixable, "--apply")
    seen["after"] = observe()
    seen["again"] = nodewarden("remediate", *common, *fixable, "--apply")
    seen["too_big"] = nodewarden("remediate", *common, "--only", "mtu:nwv1", "--apply")
    seen["after_too_big"] = observe()
    rc, _, err = nodewarden("rollback", "--last", "--config", config, "--state-dir", state)
    seen["rollback"] = [rc, err]
    seen["restored"] = observe()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
