"""Issue 36.3: a daemon replaying a recorded node never writes the system state folder unless told to.

The README's `nodewarden daemon --simulate hgx-h100-drifted` used to write
/var/lib/nodewarden/scheduler/daemon.json, and `daemon` had no `--state-dir`. Now: `--state-dir DIR`
like every other command (kept over a SIGHUP reload, whatever the config says); without it, a
`--simulate` or `--snapshot` daemon whose config names the system folder writes into a private
temporary folder, removed at exit. A state file it wrote is never the host's answer to health-check.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from agent.apps.daemon.config import REPLAY_STATE_PREFIX, is_system_state_dir
from agent.apps.scheduler.state import read_state
from agent.policy.config import DEFAULT_STATE_DIR
from tests.daemon_peer import DaemonProcess, changed_files, running_daemon, state_listing


def _state_event(daemon: DaemonProcess) -> dict[str, object]:
    events = [e for e in daemon.log_events() if e.get("event") == "state_file_start"]
    assert events, "the daemon does not say where its state file is"
    return events[0]


def test_a_simulated_daemon_with_the_default_config_keeps_out_of_the_system_folder(tmp_path: Path) -> None:
    before = state_listing()
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", defaults=True) as daemon:
        where = Path(str(_state_event(daemon)["state_dir"]))
        assert where.name.startswith(REPLAY_STATE_PREFIX) and not is_system_state_dir(where)
        daemon.wait_for((where / "scheduler" / "daemon.json").is_file, what="state file")
        doc = json.loads((where / "scheduler" / "daemon.json").read_text())
        assert doc["reading"] != "live" and (where.stat().st_mode & 0o077) == 0
        daemon.stop(signal.SIGTERM)
    assert not changed_files(before, state_listing()), f"the simulated daemon wrote under {DEFAULT_STATE_DIR}"
    assert not where.exists()  # removed at exit


def test_daemon_state_dir_is_where_the_state_file_goes_and_a_reload_keeps_it(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    elsewhere = tmp_path / "from-config"
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {json.dumps(str(elsewhere))}\n")
    with running_daemon(tmp_path, "--simulate", "hgx-h100-drifted", "--config", str(config),
                        "--state-dir", str(chosen)) as daemon:
        assert Path(str(_state_event(daemon)["state_dir"])) == chosen
        state_file = chosen / "scheduler" / "daemon.json"
        daemon.wait_for(state_file.is_file, what="state file under --state-dir")
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: any(e.get("event") == "reload" and e.get("ok") for e in daemon.log_events()),
                        what="reload")
        seen = state_file.stat().st_mtime_ns
        daemon.wait_for(lambda: state_file.stat().st_mtime_ns != seen, timeout=30, what="a write after reload")
        assert not elsewhere.exists()  # the config's folder never replaced the command line's
        doc = json.loads(state_file.read_text())
    # health-check on the host (a live reading) never answers from a simulated daemon's state file
    assert read_state(chosen, 1e9, judged="live") is None
    answer = read_state(chosen, 1e9, judged=doc["reading"])
    assert answer is not None and answer.verdict is not None  # a health-check of the same recording does


def test_the_system_folder_is_known_by_what_it_is(tmp_path: Path) -> None:
    assert is_system_state_dir(DEFAULT_STATE_DIR)
    assert is_system_state_dir(Path("/var/lib/../lib/nodewarden/"))
    assert not is_system_state_dir(tmp_path) and not is_system_state_dir(DEFAULT_STATE_DIR / "scheduler")
    link = tmp_path / "link"
    link.symlink_to(DEFAULT_STATE_DIR)  # whether or not the folder exists yet
    assert is_system_state_dir(link)  # another spelling of the same folder is the same folder
