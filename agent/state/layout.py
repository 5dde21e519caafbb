"""The state folder's layout: every name in STATE_DIR and the one rule each is opened by (issue 32.1).

    STATE_DIR/                 root's, 0700 or stricter (agent.io.fsutil.trusted_dir, every parent checked)
      journal/RUN/             remediation runs: originals before any write (agent.state.journal)
      baseline.json            the node's performance baseline (agent.sources.baseline reads it)
      scheduler/               0755: the health-check's files; the daemon (a dynamic user) reads decision.json
        daemon.json            the daemon's verdict when it runs as root (no daemon/ below)
        decision.json          health-check's last decision
        slurm-NODE.json        what it drained a node for (agent.apps.scheduler.trail)
        drain-NODE.json        the proof that a drain is its own (agent.apps.scheduler.ownership)
        gate-NODE.lock         one gate at a time per node
      daemon/                  systemd's StateDirectory= for the daemon's own user (agent.state.daemon_dir)
        daemon.json, verdict.json
      accept/                  acceptance: last.json, baseline.json, runs/RUN.json (agent.state.acceptance)
      ledger.db (+ -wal, -shm) the node's history, in daemon/ when systemd made it, else here (agent.state.ledger)

Who reads a file by a rule of its own reads a file nobody checked: every module that opens something in
STATE_DIR asks here for the folder, by name.
"""

from __future__ import annotations

from pathlib import Path

from agent.io.fsutil import trusted_dir
from agent.state.daemon_dir import DAEMON_DIR, has_daemon_dir

JOURNAL_DIR = "journal"
SCHEDULER_DIR = "scheduler"
ACCEPT_DIR = "accept"
BASELINE_FILE = "baseline.json"
LEDGER_FILE = "ledger.db"  # SQLite (agent.state.ledger); named here so a node without one never loads sqlite3
ACCEPT_RESULT_FILE = "last.json"

__all__ = ["ACCEPT_DIR", "ACCEPT_RESULT_FILE", "BASELINE_FILE", "DAEMON_DIR", "JOURNAL_DIR", "LEDGER_FILE",
           "SCHEDULER_DIR",
           "accept_folder", "baseline_path", "daemon_folder", "ledger_folder", "scheduler_folder", "state_folder"]


def state_folder(state_dir: Path, *, create: bool) -> Path:
    """STATE_DIR itself, checked (and made 0700 when `create` and missing)."""
    return trusted_dir(state_dir, create=create)


def scheduler_folder(state_dir: Path, *, create: bool) -> Path:
    # 0755: under the shipped unit the daemon (a dynamic user) reads decision.json here (issue 30.10).
    return trusted_dir(state_folder(state_dir, create=create) / SCHEDULER_DIR, create=create,
                       what="scheduler state folder", mode=0o755)


def daemon_folder(state_dir: Path, *, create: bool) -> Path:
    """Where daemon.json lives: STATE_DIR/daemon when systemd's StateDirectory= made it, else scheduler/."""
    if has_daemon_dir(state_dir):
        return trusted_dir(state_dir / DAEMON_DIR, what="daemon state folder")
    return scheduler_folder(state_dir, create=create)


def ledger_folder(state_dir: Path, *, create: bool) -> Path:
    """Where ledger.db lives: the folder every writer can write. Under the shipped unit the daemon runs as
    systemd's DynamicUser and owns STATE_DIR/daemon; root's writers (health-check, accept, remediate) write
    its ledger there too (SQLite gives the journal files the database's owner when root writes)."""
    if has_daemon_dir(state_dir):
        return trusted_dir(state_dir / DAEMON_DIR, what="daemon state folder")
    return state_folder(state_dir, create=create)


def accept_folder(state_dir: Path, *, create: bool) -> Path:
    return trusted_dir(state_folder(state_dir, create=create) / ACCEPT_DIR, create=create, what="acceptance folder")


def baseline_path(state_dir: Path) -> Path:
    """The live node's baseline file (read through agent.io's bounded readers, as any input)."""
    return state_dir / BASELINE_FILE
