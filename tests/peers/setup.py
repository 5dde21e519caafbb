"""Install what the test suite's real peers need: `python -m tests.peers.setup` (README's test command).

One path for contributors and CI alike (`.ci/run` runs the README's command verbatim):

* Redfish peers from PyPI, each in its own virtualenv under the peer cache (`peers_dir()`), so
  their dependencies (Flask, mitmproxy's pinned stack) never enter the project's venv:
  `sushy/bin/sushy-static`, `mitm/bin/mitmdump`, `emulator/bin/sushy-emulator` (the emulator
  runs on Debian's `python3-libvirt` binding, for /usr/bin/python3).
* Debian packages for the system peers: OpenIPMI's `ipmi_sim`/`sdrcomp` and `ipmitool`,
  `prometheus`/`promtool`, `chromium`, `systemd-analyze`, `ip` (iproute2), `python3-libvirt`,
  installed with apt-get when running as root. Not root: nothing is installed, the missing
  packages and the one command that installs them are printed, and the exit code is 1.

What is already there is reused: a venv whose console script exists is left alone and a tool on
PATH is not reinstalled, so a second run adds no install time (well under a second).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.peers.locations import peers_dir

SUSHY_SPEC = os.environ.get("SUSHY_TOOLS_SPEC", "sushy-tools==2.2.0")
MITM_SPEC = os.environ.get("MITMPROXY_SPEC", "mitmproxy==11.0.2")  # the last release for Python 3.11
SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter Debian's python3-libvirt is built for


@dataclass(frozen=True)
class SystemTool:
    command: str  # what the tests run (looked up on PATH)
    package: str  # the Debian package that provides it
    needed_by: str


SYSTEM_TOOLS = (
    SystemTool("ipmi_sim", "openipmi", "tests/integration/test_ipmi.py (OpenIPMI BMC simulator)"),
    SystemTool("sdrcomp", "openipmi", "tests/integration/test_ipmi.py (SDR compiler)"),
    SystemTool("ipmitool", "ipmitool", "poking the simulator by hand"),
    SystemTool("promtool", "prometheus", "tests/integration/test_monitoring_rules.py (alert rule tests)"),
    SystemTool("prometheus", "prometheus", "tests/integration/test_monitoring.py, tests/integration/test_daemon.py (real scrapes)"),
    SystemTool("prometheus-alertmanager", "prometheus-alertmanager", "tests/integration/test_alerting.py (inhibition, grouping)"),
    SystemTool("amtool", "prometheus-alertmanager", "tests/integration/test_alerting.py (alertmanager.yml check)"),
    SystemTool("chromium", "chromium", "tests/unit/apps/test_fleet.py (opens the HTML report headless)"),
    SystemTool("systemd-analyze", "systemd", "tests/integration/test_systemd_units.py (verify, security)"),
    SystemTool("ip", "iproute2", "tests/integration/test_remediate_netns.py (network namespaces)"),
    SystemTool("slurmctld", "slurmctld", "tests/integration/test_scheduler_slurm.py (a one-node Slurm cluster)"),
    SystemTool("slurmd", "slurmd", "tests/integration/test_scheduler_slurm.py (runs HealthCheckProgram)"),
    SystemTool("scontrol", "slurm-client", "tests/integration/test_scheduler_slurm.py (drain, resume)"),
    SystemTool("sinfo", "slurm-client", "tests/integration/test_scheduler_slurm.py (reasons, the breaker's count)"),
    SystemTool("munged", "munge", "tests/integration/test_scheduler_slurm.py (Slurm's authentication)"),
)


def log(message: str) -> None:
    print(f"peers-setup: {message}", flush=True)


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, check=True, env={**os.environ, **(env or {})})


# --- Debian packages -------------------------------------------------------------------------------


def has_libvirt_binding() -> bool:
    if not Path(SYSTEM_PYTHON).is_file():
        return False
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import libvirt, ensurepip"], capture_output=True, check=False)
    return probe.returncode == 0


def missing_packages() -> dict[str, list[str]]:
    """Debian package -> what needs it, for every system peer not present now."""
    missing: dict[str, list[str]] = {}
    for tool in SYSTEM_TOOLS:
        if shutil.which(tool.command) is None:
            missing.setdefault(tool.package, []).append(f"{tool.command}: {tool.needed_by}")
    if not has_libvirt_binding():
        for package in ("python3-libvirt", "python3-venv"):
            missing.setdefault(package, []).append("sushy-emulator (libvirt binding for /usr/bin/python3)")
    return missing


def install_packages(packages: list[str]) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    started = time.monotonic()
    # A fresh machine's package lists may be empty or stale: update once, then install.
    run(["apt-get", "update", "-qq"], env)
    run(apt, env)
    log(f"installed {' '.join(packages)} in {time.monotonic() - started:.1f} s")


def ensure_system_packages() -> list[str]:
    """Install missing Debian packages when root; return the problems left (empty when all is there)."""
    missing = missing_packages()
    if not missing:
        log("system peers present (" + ", ".join(t.command for t in SYSTEM_TOOLS) + ", libvirt)")
        return []
    for package, needs in sorted(missing.items()):
        log(f"missing Debian package {package}: " + "; ".join(needs))
    if shutil.which("apt-get") is None:
        return [f"no apt-get on this machine: install the equivalents of {' '.join(sorted(missing))} by hand"]
    if os.geteuid() != 0:
        command = "sudo apt-get install --no-install-recommends " + " ".join(sorted(missing))
        return [f"not root, so nothing was installed; run: {command}"]
    install_packages(sorted(missing))
    still = missing_packages()
    return [f"{p} installed but still missing: {'; '.join(n)}" for p, n in sorted(still.items())]


# --- Redfish peers (PyPI, one venv each) -------------------------------------------------------------


def ensure_venv(name: str, script: str, spec: str, python: str = sys.executable,
                system_site_packages: bool = False) -> None:
    venv = peers_dir() / name
    target = venv / "bin" / script
    if target.is_file() and os.access(target, os.X_OK):
        log(f"{name}: {target} present")
        return
    started = time.monotonic()
    if not (venv / "bin" / "python").is_file():
        argv = [python, "-m", "venv", *(["--system-site-packages"] if system_site_packages else []), str(venv)]
        run(argv)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", spec],
        {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
    if not target.is_file():
        raise SystemExit(f"peers-setup: {spec} did not install {script} into {venv}")
    log(f"{name}: installed {spec} in {time.monotonic() - started:.1f} s")


def ensure_redfish_peers() -> list[str]:
    peers_dir().mkdir(parents=True, exist_ok=True)
    ensure_venv("sushy", "sushy-static", SUSHY_SPEC)
    ensure_venv("mitm", "mitmdump", MITM_SPEC)
    if not has_libvirt_binding():
        return ["sushy-emulator needs Debian's python3-libvirt for /usr/bin/python3 (see above)"]
    ensure_venv("emulator", "sushy-emulator", SUSHY_SPEC, python=SYSTEM_PYTHON, system_site_packages=True)
    probe = [str(peers_dir() / "emulator" / "bin" / "python"), "-c",
             "import libvirt; libvirt.open('test:///default').close()"]
    run(probe)
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.peers.setup", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    started = time.monotonic()
    log(f"peer cache {peers_dir()} (override with NODEWARDEN_PEERS_DIR)")
    problems = ensure_system_packages()
    problems += ensure_redfish_peers()
    took = time.monotonic() - started
    if problems:
        for problem in problems:
            print(f"peers-setup: {problem}", file=sys.stderr)
        print("peers-setup: the tests that need these peers will fail and say so", file=sys.stderr)
        return 1
    log(f"ready in {took:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
