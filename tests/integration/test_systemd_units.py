"""The daemon and audit units: systemd accepts them, they stay hardened, and they match the agent.

Every check runs the real `systemd-analyze` (offline: no systemd as PID 1 needed). A machine
without it fails these tests instead of skipping them, so a CI image that lost systemd cannot
pass silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from itertools import pairwise
from pathlib import Path, PurePosixPath

import pytest

from agent.io.credentials import SYSTEMD_CREDENTIAL
from tests.conftest import REPO

UNIT_DIR = REPO / "systemd"
DAEMON = "nodewarden.service"
AUDIT = "nodewarden-audit.service"
TIMER = "nodewarden-audit.timer"
GATE, GATE_PATH = "nodewarden-gate.service", "nodewarden-gate.path"
MAX_EXPOSURE = 4.0
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"

Unit = dict[str, dict[str, list[str]]]  # section -> key -> every value, in file order


def parse_unit(text: str) -> Unit:
    """systemd's unit syntax, keeping repeated keys (DeviceAllow=, SystemCallFilter=) in order.

    configparser would keep only the last DeviceAllow=; an empty assignment (`Key=`) resets
    the list as it does in systemd.
    """
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"not a unit file line: {raw!r}"
        values = section.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()
    return unit


def load(name: str) -> Unit:
    return parse_unit((UNIT_DIR / name).read_text())


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= should be set exactly once, found {values}"
    return values[0]


def words(unit: Unit, section: str, key: str) -> list[str]:
    return " ".join(unit.get(section, {}).get(key, [])).split()


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is not installed: run `.venv/bin/python -m tests.peers.setup` (as root: "
                    "apt-get install systemd; it runs offline, no systemd as PID 1 is needed)", pytrace=False)
    # C locale and UTC: the output we parse must not depend on the machine's settings.
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False, env=env)


def usec(span: str) -> int:
    """A systemd time span ("60", "3min", "1h 30s") in microseconds, as systemd parses it."""
    proc = analyze("timespan", span)
    match = re.search(r"^\s*(?:μs|us): (\d+)$", proc.stdout, re.MULTILINE)
    assert proc.returncode == 0 and match, f"systemd-analyze timespan {span!r}: {proc.stderr or proc.stdout}"
    return int(match.group(1))


def installable_copy(tmp_path: Path, *names: str, text: dict[str, str] | None = None) -> list[Path]:
    """Copies of the units in one folder, with /opt/nodewarden/bin/nodewarden pointing at this venv's console
    script (`verify` fails when an Exec*= binary does not exist). `text` overrides a unit's content."""
    exe = shutil.which("nodewarden", path=str(Path(sys.executable).parent))
    assert exe is not None, "the nodewarden console script is not installed in this venv (pip install -e .)"
    out = []
    for name in names:
        content = (text or {}).get(name) or (UNIT_DIR / name).read_text()
        path = tmp_path / name
        path.write_text(content.replace("=/opt/nodewarden/bin/nodewarden ", f"={exe} "))
        out.append(path)
    return out


def exposure(unit_path: Path) -> float:
    proc = analyze("security", "--offline=yes", str(unit_path))
    match = re.search(rf"Overall exposure level for {re.escape(unit_path.name)}: (\d+\.\d+) ", proc.stdout)
    assert match, f"no 'Overall exposure level' line (rc {proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr}"
    return float(match.group(1))


# --- systemd accepts the units -------------------------------------------------------------------


@pytest.mark.parametrize("names", [(DAEMON,), (AUDIT,), (AUDIT, TIMER), (GATE,), (GATE, GATE_PATH)],
                         ids=["daemon", "audit", "timer", "gate", "gate-path"])
def test_unit_verifies_without_warnings(tmp_path: Path, names: tuple[str, ...]) -> None:
    # The timer is verified next to its service, which it names in Unit=.
    paths = installable_copy(tmp_path, *names)
    proc = analyze("verify", "--man=no", str(paths[-1]))
    # verify exits 0 on unknown keys and unparsable values and only warns: stderr must be empty.
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_verify_check_catches_a_typo(tmp_path: Path) -> None:
    # The check above relies on stderr: prove that a misspelt key actually shows up there.
    broken = (UNIT_DIR / DAEMON).read_text().replace("WatchdogSec=", "WatchdogSecs=")
    [path] = installable_copy(tmp_path, DAEMON, text={DAEMON: broken})
    proc = analyze("verify", "--man=no", str(path))
    assert "Unknown key" in proc.stderr and "'WatchdogSecs'" in proc.stderr, proc.stderr


# --- hardening score -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [DAEMON, AUDIT, GATE])
def test_exposure_score_is_low(tmp_path: Path, name: str) -> None:
    [path] = installable_copy(tmp_path, name)
    score = exposure(path)
    # Both score 1.8 with systemd 252; the budget is 4.0 ("OK" ends at 4.9 in systemd's scale).
    assert score <= MAX_EXPOSURE, f"{name} exposure {score} > {MAX_EXPOSURE}: a hardening line was lost"


HARDENING = re.compile(r"^(Protect|Private|Restrict|Capability|Ambient|SystemCall|Device|Memory|Lock|NoNew|UMask|"
                       r"DynamicUser|User|ReadWrite|Remove|Keyring)")


def test_exposure_check_fails_on_an_unhardened_unit(tmp_path: Path) -> None:
    lines = (UNIT_DIR / DAEMON).read_text().splitlines()
    stripped = "\n".join(line for line in lines if not HARDENING.match(line) and not line.startswith("#"))
    assert "Type=notify" in stripped and "ProtectSystem=" not in stripped and "DeviceAllow=" not in stripped
    [path] = installable_copy(tmp_path, DAEMON, text={DAEMON: stripped})
    score = exposure(path)
    assert score > MAX_EXPOSURE, f"the stripped unit still scores {score}: the score check could never fail"


# --- the daemon ----------------------------------------------------------------------------------


def test_daemon_is_a_notify_service_with_a_watchdog() -> None:
    unit = load(DAEMON)
    assert one(unit, "Service", "ExecStart") == "/opt/nodewarden/bin/nodewarden daemon --config /etc/nodewarden/config.yaml"
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    assert usec(one(unit, "Service", "WatchdogSec")) == 60_000_000
    assert one(unit, "Service", "Restart") == "on-failure"
    assert usec(one(unit, "Service", "RestartSec")) == 5_000_000
    # The daemon exits within 5 s of SIGTERM; systemd waits 10 s before SIGKILL.
    assert usec(one(unit, "Service", "TimeoutStopSec")) == 10_000_000
    assert one(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert "2" in words(unit, "Service", "RestartPreventExitStatus")  # a config error is not retried
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_daemon_can_read_kmsg_and_gpus_but_holds_no_other_capability() -> None:
    unit = load(DAEMON)
    assert words(unit, "Service", "CapabilityBoundingSet") == ["CAP_SYSLOG"]
    assert words(unit, "Service", "AmbientCapabilities") == ["CAP_SYSLOG"]
    # ProtectKernelLogs=yes would hide /dev/kmsg and drop CAP_SYSLOG: Xid detection would go blind.
    assert one(unit, "Service", "ProtectKernelLogs") == "no"
    assert one(unit, "Service", "DevicePolicy") == "closed"
    allowed = dict(value.split() for value in unit["Service"]["DeviceAllow"])
    assert allowed["/dev/kmsg"] == "r"
    assert allowed["char-nvidia-frontend"] == "rw"  # /dev/nvidiactl and /dev/nvidia0..N
    assert not any("ipmi" in device for device in allowed)  # IPMI goes over the LAN, not /dev/ipmi0


# --- both services -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [DAEMON, AUDIT])
def test_service_is_unprivileged_and_read_only(name: str) -> None:
    unit = load(name)
    service = unit["Service"]
    assert one(unit, "Service", "DynamicUser") == "yes"
    assert one(unit, "Service", "User") not in ("root", "0")
    for key, value in [("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
                       ("ProtectControlGroups", "yes"), ("NoNewPrivileges", "yes"), ("RestrictNamespaces", "yes"),
                       ("RestrictRealtime", "yes"), ("RestrictSUIDSGID", "yes"), ("LockPersonality", "yes"),
                       ("MemoryDenyWriteExecute", "yes"), ("SystemCallArchitectures", "native"), ("UMask", "0077")]:
        assert one(unit, "Service", key) == value, key
    assert service["SystemCallFilter"][0] == "@system-service"
    assert words(unit, "Service", "RestrictAddressFamilies") == ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]
    # /var/lib/nodewarden stays root's: a dynamic user owning it could plant journals for root's remediate.
    # The daemon gets one folder below it for daemon.json (issue 30.10), the audit none.
    assert words(unit, "Service", "StateDirectory") == (["nodewarden/daemon"] if name == DAEMON else [])
    # The monitor never writes the kernel's knobs: nothing under /sys or /proc is made writable.
    for key in ("ReadWritePaths", "BindPaths"):
        for path in words(unit, "Service", key):
            clean = PurePosixPath(path.lstrip("-+"))
            assert not clean.is_relative_to("/sys") and not clean.is_relative_to("/proc"), f"{key}={path}"
    if name == DAEMON:
        assert "ReadWritePaths" not in service  # CacheDirectory= only


@pytest.mark.parametrize("name", [DAEMON, AUDIT])
def test_service_passes_the_bmc_password_as_the_credential_the_agent_reads(name: str) -> None:
    unit = load(name)
    assert f"{SYSTEMD_CREDENTIAL}:/etc/nodewarden/bmc-password" in unit["Service"]["LoadCredential"]


def test_audit_has_the_same_hardening_as_the_daemon() -> None:
    def hardening(name: str) -> dict[str, list[str]]:
        return {k: v for k, v in load(name)["Service"].items() if HARDENING.match(k) and k != "ReadWritePaths"}

    daemon, audit = hardening(DAEMON), hardening(AUDIT)
    assert len(daemon) > 20
    assert daemon == audit, {k: (daemon.get(k), audit.get(k)) for k in daemon.keys() | audit.keys()
                             if daemon.get(k) != audit.get(k)}


# --- the audit and its timer ---------------------------------------------------------------------


def test_audit_writes_only_its_textfile_and_a_failing_node_is_not_a_failed_unit() -> None:
    unit = load(AUDIT)
    command = one(unit, "Service", "ExecStart").split()
    assert command[:2] == ["/opt/nodewarden/bin/nodewarden", "audit"]
    assert command[command.index("--format") + 1] == "prom"
    assert command[command.index("--config") + 1] == "/etc/nodewarden/config.yaml"
    output = PurePosixPath(command[command.index("--output") + 1])
    assert output == PurePosixPath(TEXTFILE_DIR) / "nodewarden.prom"
    # The agent writes a temporary file next to the report and renames it: the folder must be writable.
    assert words(unit, "Service", "ReadWritePaths") == [str(output.parent)]
    assert one(unit, "Service", "Type") == "oneshot"
    # Exit 1 = failing findings (the report was written); 2 and 3 must still fail the unit.
    statuses = words(unit, "Service", "SuccessExitStatus")
    assert "1" in statuses and "2" not in statuses and "3" not in statuses
    assert "Install" not in unit  # started by the timer only


def test_timer_runs_the_audit_every_15_minutes_and_catches_up() -> None:
    unit = load(TIMER)
    assert one(unit, "Timer", "Persistent") == "true"
    assert one(unit, "Timer", "Unit") == AUDIT
    assert one(unit, "Install", "WantedBy") == "timers.target"
    delay = usec(one(unit, "Timer", "RandomizedDelaySec"))
    assert 0 < delay < 15 * 60_000_000
    proc = analyze("calendar", "--iterations=3", one(unit, "Timer", "OnCalendar"))
    stamps = re.findall(r"(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", proc.stdout)
    assert proc.returncode == 0 and len(stamps) == 3, proc.stdout + proc.stderr
    times = [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S") for stamp in stamps]  # UTC: see analyze()
    assert {(later - earlier).total_seconds() for earlier, later in pairwise(times)} == {900.0}


# --- the event-driven gate (issue 30.11) -----------------------------------------------------------


def test_the_gate_path_watches_the_file_the_daemon_writes_on_a_verdict_change() -> None:
    from agent.apps.scheduler.state import VERDICT_FILE
    from agent.state.daemon_dir import DAEMON_DIR

    path, gate, daemon = load(GATE_PATH), load(GATE), load(DAEMON)
    state_directory = one(daemon, "Service", "StateDirectory")
    assert state_directory == f"nodewarden/{DAEMON_DIR}"
    assert one(path, "Path", "PathChanged") == f"/var/lib/{state_directory}/{VERDICT_FILE}"
    assert one(path, "Path", "Unit") == GATE
    assert one(gate, "Service", "Type") == "oneshot"
    argv = one(gate, "Service", "ExecStart").split()
    assert argv[:4] == ["/opt/nodewarden/bin/nodewarden", "health-check", "--slurm", "--event"], argv
    # Root, as slurmd's HealthCheckProgram: no User=, and no capability at all (scontrol needs none).
    assert "User" not in gate["Service"] and "DynamicUser" not in gate["Service"]
    assert gate["Service"].get("CapabilityBoundingSet") == []
    assert usec(one(gate, "Service", "TimeoutStartSec")) >= 55_000_000  # above the gate's own 50 s deadline
