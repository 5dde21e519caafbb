"""Issue 24.5: the daemon writes the state file health-check answers from (atomically, through
agent.io.fsutil), and exports what the last health-check decided."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.apps.scheduler.state import REWRITE_EVERY_S, write_decision
from tests.daemon_peer import DaemonProcess, changed_files, running_daemon, state_listing

REPO = Path(__file__).resolve().parents[3]
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
        assert os.stat(state.parent).st_mode & 0o777 == 0o755  # root's, readable by the unit's user (30.10)
        done = plain(tmp_path, "--simulate", "hgx-h100-drifted")
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.startswith("DRAIN (state file, ") and "gpu.lost gpu7" in done.stdout
        # A daemon replaying a recording never answers for this machine, nor for another recording.
        other = plain(tmp_path, "--simulate", "hgx-h100-healthy").stdout
        assert other.startswith("OK (one-shot audit; ") and "not this node: ignored" in other, other  # said (36.6)
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
    from agent.apps.scheduler.state import DaemonStateFile
    from agent.engine.audit import AuditRequest, run_audit
    from agent.policy.config import Config

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


def events(daemon: DaemonProcess, event: str) -> list[dict[str, object]]:
    return [e for e in daemon.log_events() if e.get("event") == event]


def test_a_reload_moves_the_state_file_where_health_check_now_looks(tmp_path: Path) -> None:
    """Issue 24 item 5: after SIGHUP with a new state_dir (and poll intervals) the state file is written
    where health-check, reading the new config, looks; a failed reload keeps the old place."""
    old, new = tmp_path / "old-state", tmp_path / "new-state"
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {old}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(config),
                        "--log-format", "json") as daemon:
        daemon.wait_for((old / "scheduler" / "daemon.json").exists, what="the state file at the old place")
        config.write_text(f"state_dir: [{new}\n")  # a typo: the reload fails, the old place stays
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in events(daemon, "reload") if e.get("ok") is False], what="the failed reload")
        assert not events(daemon, "state_file") and not new.exists()

        config.write_text(f"state_dir: {new}\ndaemon:\n  intervals: {{host: 10, nvml: 10}}\n")
        daemon.proc.send_signal(signal.SIGHUP)
        moved = new / "scheduler" / "daemon.json"
        daemon.wait_for(moved.exists, what="the state file at the new state_dir")
        assert json.loads(moved.read_text())["fresh_for_s"] == 30  # 3 x the new 10 s polls
        said = events(daemon, "state_file")
        assert said and said[-1]["state_dir"] == str(new) and said[-1]["was"] == str(old), said
        assert (old / "scheduler" / "daemon.json").exists()  # left for whoever reads it: it goes stale
        stale_at = (old / "scheduler" / "daemon.json").stat().st_mtime_ns
        done = subprocess.run([NODEWARDEN, "health-check", "--config", str(config), "--state-dir", str(new),
                               "--simulate", "hgx-h100-drifted"], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 1 and done.stdout.startswith("DRAIN (state file, "), done.stdout + done.stderr
        write_decision(new, {"at": 1700000000.5, "action": "drain", "node": "n1", "verdict": "DRAIN", "why": "x"})
        assert daemon.value('nodewarden_health_check_action{action="drain"}') == 1  # the new folder's decision
        time.sleep(REWRITE_EVERY_S + 1)  # the old file is no longer refreshed
        assert (old / "scheduler" / "daemon.json").stat().st_mtime_ns == stale_at


def test_a_start_removes_the_temporary_state_files_a_killed_daemon_left(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "scheduler"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    killed = folder / ".daemon.json.0123456789ab.tmp"  # what replace_file leaves when SIGKILLed mid-write
    in_flight = folder / ".daemon.json.ba9876543210.tmp"  # another writer's, seconds old: not ours to take
    others = [folder / ".decision.json.0123456789ab.tmp", folder / "daemon.json.tmp", folder / "notes.txt"]
    for path in (killed, in_flight, *others):
        path.write_text("{}\n")
    an_hour_ago = time.time() - 3600
    for path in (killed, *others):
        os.utime(path, (an_hour_ago, an_hour_ago))
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-healthy", "--config", str(config)) as daemon:
        daemon.wait_for((folder / "daemon.json").exists, what="the state file")
    assert not killed.exists()
    assert in_flight.exists() and all(path.exists() for path in others)


def test_health_check_of_a_recording_never_answers_from_the_configured_daemons_state_file(tmp_path: Path) -> None:
    """A recording is never the node the configured daemon judges: a state file in the config's
    state_dir (stale, or fresh and saying OK) does not answer for --simulate/--snapshot."""
    state = tmp_path / "state"
    folder = state / "scheduler"
    folder.mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\n")
    recording = (REPO / "fixtures" / "nodes" / "hgx-h100-drifted").resolve()
    for confirmed_at in (time.time() - 3600, time.time()):  # a test daemon's left-over; a daemon's fresh word
        (folder / "daemon.json").write_text(json.dumps({
            "schema": "nodewarden.health/v1", "verdict": "OK", "actions": [], "gpus": {},
            "reading": f"simulated:{recording}", "confirmed_at": confirmed_at, "fresh_for_s": 180}))
        npd = subprocess.run([NODEWARDEN, "health-check", "--npd", "--config", str(config),
                              "--simulate", "hgx-h100-drifted"], capture_output=True, text=True, timeout=60,
                             check=False)
        assert npd.returncode == 1 and npd.stdout.startswith("DRAIN: gpu.lost gpu7"), npd.stdout + npd.stderr
    done = subprocess.run([NODEWARDEN, "health-check", "--config", str(config), "--simulate", "hgx-h100-drifted"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("DRAIN (one-shot audit of the recording, not the daemon's state file)")


def test_the_peers_guard_names_a_file_written_under_the_watched_folder(tmp_path: Path) -> None:
    before = state_listing(tmp_path)
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "daemon.json").write_text("{}\n")
    assert changed_files(before, state_listing(tmp_path)) == [str(tmp_path / "scheduler" / "daemon.json")]
    assert changed_files(state_listing(tmp_path), state_listing(tmp_path)) == []
