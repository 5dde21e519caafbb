"""Runs inside `unshare --user --map-root-user --net --mount` (see test_remediate_netns.py).

The private mount namespace gets a tmpfs over /etc/sysctl.d so the
persistence file never reaches the host; the private network namespace has
its own net.ipv4.* sysctls, so the live kernel write never reaches the host
either. Prints one JSON object with what it observed at each step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KEY_PATH = Path("/proc/sys/net/ipv4/tcp_mtu_probing")
CONF = Path("/etc/sysctl.d/90-nodewarden.conf")


def nodewarden(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, check=False)


def main() -> None:
    config, state = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "nodewarden-test", "/etc/sysctl.d"], check=True)
    seen: dict[str, object] = {"before": KEY_PATH.read_text().strip()}
    common = ["--config", config, "--profile", "nw-live", "--state-dir", state]
    applied = nodewarden("remediate", *common, "--apply", "--only", "sysctl:net.ipv4.*", "--format", "json")
    seen["apply_rc"], seen["apply"] = applied.returncode, json.loads(applied.stdout or "null")
    seen["apply_stderr"] = applied.stderr[-2000:]
    seen["after"] = KEY_PATH.read_text().strip()
    seen["conf"] = CONF.read_text() if CONF.exists() else None
    again = nodewarden("remediate", *common, "--apply", "--only", "sysctl:net.ipv4.*", "--format", "json")
    seen["again"] = json.loads(again.stdout or "null")
    rolled = nodewarden("rollback", "--last", "--config", config, "--state-dir", state)
    seen["rollback_rc"], seen["rollback_stderr"] = rolled.returncode, rolled.stderr[-2000:]
    seen["restored"] = KEY_PATH.read_text().strip()
    seen["conf_after_rollback"] = CONF.exists()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
