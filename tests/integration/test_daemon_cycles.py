"""The daemon over time (issue 14, production bugs): every poller runs several cycles and the node
stays judged as a one-shot audit judges it; the first evaluation never waits for the BMC.

Real processes throughout: `nodewarden daemon` started by tests/daemon_peer.py, a live sushy-static
BMC or the simulated node's recorded Redfish tree, a silent listener as a BMC that never answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_peer import DaemonProcess, running_daemon
from tests.peers.redfish import mockup, silent_listener, sushy_static

REPO = Path(__file__).resolve().parents[2]
SENSOR_FAMILIES = ("nodewarden_psu_health{", "nodewarden_fan_health{", "nodewarden_bmc_temperature_celsius{")
SENSOR_INTERVAL = "daemon:\n  intervals: {bmc_sensors: 2, bmc_inventory: 3600}\n"


def config(tmp: Path, text: str) -> Path:
    path = tmp / "config.yaml"
    path.write_text(text)
    return path


def series(body: str, prefix: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith(prefix)}


def sensor_series(body: str) -> dict[str, float]:
    return {k: v for family in SENSOR_FAMILIES for k, v in series(body, family).items()}


def scrapes_over_sensor_polls(daemon: DaemonProcess, polls: int, timeout_s: float = 30.0) -> Iterator[str]:
    """Scrape until Redfish's last-success stamp has moved `polls` times (one move per sensor poll)."""
    stamps: set[float] = set()
    deadline = time.monotonic() + timeout_s
    while len(stamps) <= polls:
        assert time.monotonic() < deadline, f"only {len(stamps)} Redfish polls seen in {timeout_s} s"
        status, body = daemon.scrape()
        assert status == 200
        stamp = daemon.value('nodewarden_source_last_success_timestamp_seconds{source="redfish"}', body)
        if stamp:
            stamps.add(stamp)
        yield body
        time.sleep(0.4)


def assert_sensors_survive_polls(daemon: DaemonProcess) -> None:
    # The first publish does not wait for the BMC: start judging once its first read has returned.
    daemon.wait_for(lambda: daemon.value('nodewarden_source_pending{source="redfish"}') == 0, timeout=30,
                    what="the BMC's first read")
    first: dict[str, float] | None = None
    for body in scrapes_over_sensor_polls(daemon, polls=5):
        assert daemon.value('nodewarden_source_up{source="redfish"}', body) == 1, [
            e for e in daemon.log_events() if e.get("source") == "redfish"]
        current = sensor_series(body)
        first = first or current
        assert current == first  # PSU, fan and temperature series stay, with their values
    assert first and all(any(k.startswith(f) for k in first) for f in SENSOR_FAMILIES[:2])
    assert all("health=" not in k for k in first)  # one series per PSU and fan, the health in its value


def test_sensor_polls_refresh_a_recorded_bmc(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted",
                        "--config", str(config(tmp_path, SENSOR_INTERVAL))) as daemon:
        assert_sensors_survive_polls(daemon)
        assert not [e for e in daemon.log_events() if e.get("event") == "source_changed" and not e.get("up")]


def test_sensor_polls_refresh_a_live_bmc(tmp_path: Path) -> None:
    password = tmp_path / "bmc-password"
    password.write_text("p\n")
    password.chmod(0o600)
    with sushy_static(mockup("hpe-dl380a-gen11")) as bmc, running_daemon(
            tmp_path, "--simulate", "hgx-h100-healthy", "--config", str(config(tmp_path, SENSOR_INTERVAL)),
            "--bmc", bmc.url, "--bmc-user", "u", "--bmc-password-file", str(password)) as daemon:
        assert_sensors_survive_polls(daemon)


STATUS_OF_CODE = {2: "fixed", 3: "warn", 4: "unknown", 5: "fail"}  # docs/metrics.md


def daemon_findings(body: str) -> set[tuple[str, str, str]]:
    """(check, subject, status) of every finding that does not pass, and (check, "*", status: count) of all."""
    found = set()
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == "nodewarden_check_status":
                found.add((s.labels["check"], s.labels["subject"], STATUS_OF_CODE[int(s.value)]))
            elif s.name == "nodewarden_checks":
                found.add((s.labels["check"], "*", f"{s.labels['status']}: {int(s.value)}"))
    return found


def audit_findings(*args: str) -> set[tuple[str, str, str]]:
    """The one-shot audit's findings as its textfile output names them (the same labels as /metrics)."""
    result = subprocess.run([sys.executable, "-m", "agent", "audit", *args, "--format", "prom"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode in (0, 1), result.stderr
    return daemon_findings(result.stdout)


def test_many_cycles_of_every_poller_judge_as_a_one_shot_audit(tmp_path: Path) -> None:
    fast = config(tmp_path, "daemon:\n  intervals: {host: 1, nvml: 1, bmc_sensors: 1, bmc_inventory: 2}\n")
    expected = audit_findings("--simulate", "hgx-h100-drifted", "--config", str(fast))
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(fast)) as daemon:
        bodies = list(scrapes_over_sensor_polls(daemon, polls=6))
    # A recorded node does not change: every evaluation over six cycles equals the one-shot audit.
    later = [daemon_findings(body) for body in bodies[len(bodies) // 2:]]
    for found in later:
        assert found == expected, (sorted(found - expected), sorted(expected - found))


def test_first_publish_does_not_wait_for_a_bmc_that_never_answers(tmp_path: Path) -> None:
    slow = config(tmp_path, "daemon:\n  timeouts: {bmc_sensors: 60, bmc_inventory: 60}\n")
    with silent_listener() as (host, port), running_daemon(
            tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(slow),
            "--bmc", f"http://{host}:{port}", ready=False) as daemon:
        started = time.monotonic()

        def published() -> str | None:
            status, body = daemon.scrape(timeout=1)
            return body if status == 200 and "nodewarden_checks{" in body else None

        body = daemon.wait_for(published, timeout=10, what="findings on /metrics")
        took = time.monotonic() - started
        assert took < 2.0, took
        assert daemon.value('nodewarden_source_pending{source="redfish"}', body) == 1
        assert daemon.value('nodewarden_source_up{source="redfish"}', body) == 0
        assert daemon.value('nodewarden_source_pending{source="nvml"}', body) == 0
        found = daemon_findings(body)
        assert ("bmc.psu", "bmc", "unknown") in found  # its checks wait: "not read yet"
        assert ("bmc.reachable", "redfish", "unknown") in found  # pending is not a failure (yet)
        assert {f for f in found if f[0] == "host.sysctl" and f[2] == "unknown"} == set()  # every key read
        assert ("gpu.ecc.mode", "gpu3", "fail") in found or any(f[0].startswith("gpu.") and f[2] == "fail"
                                                                  for f in found)
        ready = [e for e in daemon.log_events() if e.get("event") == "ready"]
        assert ready and ready[0]["pending"] == ["bmc_inventory", "bmc_sensors"]


FRESHNESS = ("nodewarden_source_last_success_timestamp_seconds", "nodewarden_audit_timestamp_seconds",
             "process_", "python_")


def body_without_freshness(body: str) -> str:
    return "\n".join(line for line in body.splitlines()
                     if not any(name in line for name in FRESHNESS))


def test_unchanged_facts_are_not_rejudged_or_rerendered(tmp_path: Path) -> None:
    # A recorded node gives the same facts every poll: the exposition stays byte-identical (nothing
    # re-judged, re-rendered or re-gzipped) while the per-scrape timestamps say the facts are fresh.
    fast = config(tmp_path, "daemon:\n  intervals: {host: 1, nvml: 1, bmc_sensors: 1, bmc_inventory: 1}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(fast)) as daemon:
        daemon.wait_for(lambda: daemon.value('nodewarden_source_pending{source="redfish"}') == 0, what="BMC read")
        time.sleep(1.5)
        first = daemon.scrape()[1]
        time.sleep(3.5)  # three more polls of every source
        later = daemon.scrape()[1]
    assert body_without_freshness(first) == body_without_freshness(later)
    stamp = 'nodewarden_source_last_success_timestamp_seconds{source="nvml"}'
    assert (daemon.value(stamp, later) or 0) > (daemon.value(stamp, first) or 0)  # yet the polls happened
    audited = "nodewarden_audit_timestamp_seconds"
    assert (daemon.value(audited, later) or 0) > (daemon.value(audited, first) or 0)
