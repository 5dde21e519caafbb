"""Issue 24.5: the daemon writes the state file health-check answers from (atomically, through
agent.fsutil), and exports what the last health-check decided."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.scheduler.state import write_decision
from tests.daemon_peer import running_daemon

NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))


def plain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NODEWARDEN, "health-check", "--state-dir", str(tmp_path / "state"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_daemon_writes_the_state_file_and_health_check_answers_from_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    state = tmp_path / "state" / "scheduler" / "daemon.json"
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(config)) as daemon:
        daemon.wait_for(state.exists, what="the state file")
        doc = json.loads(state.read_text())
        assert doc["verdict"] == "DRAIN" and doc["actions"][0]["checks"][0] == "gpu.lost"
        assert doc["gpus"]["gpu0"].startswith("GPU-")  # a per-device consumer gets the UUIDs
        assert doc["sources"]["nvml"]["last_read"] > 0 and time.time() - doc["confirmed_at"] < 60
        assert doc["fresh_for_s"] == 180  # 3 x the 60 s host poll
        assert os.stat(state).st_mode & 0o777 == 0o644
        assert os.stat(state.parent).st_mode & 0o777 == 0o700
        done = plain(tmp_path, "--simulate", "hgx-h100-drifted")
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.startswith("DRAIN (state file, ") and "gpu.lost gpu7" in done.stdout
        # A daemon replaying a recording never answers for this machine, nor for another recording.
        assert plain(tmp_path, "--simulate", "hgx-h100-healthy").stdout.startswith("OK (one-shot audit)")
        assert "(state file" not in plain(tmp_path, "--deadline", "0.001").stdout

        write_decision(tmp_path / "state", {"at": 1700000000.5, "action": "breaker", "node": "n1",
                                            "verdict": "DRAIN", "why": "circuit breaker open"})
        body = daemon.scrape()[1]
        assert daemon.value('nodewarden_health_check_action{action="breaker"}', body) == 1
        assert daemon.value('nodewarden_health_check_action{action="drain"}', body) == 0
        assert daemon.value("nodewarden_health_check_last_run_timestamp_seconds", body) == 1700000000.5
    done = plain(tmp_path, "--simulate", "hgx-h100-drifted", "--max-age", "0.001")  # the daemon's word is stale
    assert done.returncode == 3 and "state file stale" in done.stdout, done.stdout


def test_no_decision_no_health_check_series(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-healthy", "--config", str(config)) as daemon:
        body = daemon.scrape()[1]
        assert "nodewarden_health_check_action{" not in body
        assert "nodewarden_verdict" in body


def test_a_state_dir_it_may_not_trust_is_logged_once_and_never_stops_the_daemon(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from agent.config import Config
    from agent.engine import AuditRequest, run_audit
    from agent.scheduler.state import DaemonStateFile

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could swap the state file health-check acts on
    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))
    writer = DaemonStateFile(shared, {})
    for turn in range(3):
        writer.update(report, time.time() + turn, {})
    assert not (shared / "scheduler").exists()
    errors = [r for r in caplog.records if "could not write the health-check state file" in r.getMessage()]
    assert len(errors) == 1
