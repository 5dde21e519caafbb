"""Which drain is nodewarden's: proven, never guessed from the text (issue 30.4).

A reason that merely starts with `nodewarden:` proves nothing: an admin may write `nodewarden: held
by admin - RMA 4711`, or edit our reason. So when this node's gate drains, it reads back from Slurm
what Slurm now shows (the reason, the user that set it, the time it was set) and keeps that as the
node's mark (STATE_DIR/scheduler/drain-NODE.json). A drain is ours only while Slurm still shows all
three byte-for-byte as marked; anything else (edited, re-set by someone, a newline in it, a lost
mark) is someone else's and is left exactly as it is: an operator resumes it.

The reason comes from sinfo's JSON (a structured field), never from split lines, so a reason with a
newline is one string that our reasons (one line of safe characters) never equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agent.apps.scheduler.slurm_cli import MAX_REASON, NodeState
from agent.apps.scheduler.state import MAX_SMALL_BYTES
from agent.core.errors import NodewardenError
from agent.io.fsutil import replace_file
from agent.io.jsonfile import JsonInputError, load_json_file
from agent.state.layout import scheduler_folder

PREFIX = "nodewarden:"
MAX_USER = 64


@dataclass(frozen=True)
class Mark:
    """What Slurm showed right after our drain: the reason, who set it, when (Slurm's epoch seconds)."""

    reason: str
    user: str
    at: int


def looks_ours(reason: str) -> bool:
    """A reason in our form: what the breaker counts on other nodes (it cannot see their marks; counting
    a look-alike only makes the breaker stricter). Not proof of ownership: see `proven`."""
    return reason.startswith(PREFIX) and reason.isprintable() and len(reason) <= MAX_REASON


def proven(state: NodeState, mark: Mark | None) -> bool:
    """Whether Slurm shows exactly the drain this node's gate made and marked."""
    return (mark is not None and looks_ours(state.reason) and state.reason_time > 0
            and (state.reason, state.reason_user, state.reason_time) == (mark.reason, mark.user, mark.at))


def _path(state_dir: Path, node: str, *, create: bool) -> Path:
    return scheduler_folder(state_dir, create=create) / f"drain-{node}.json"  # node names are validated: [A-Za-z0-9._-]


def recall_mark(state_dir: Path, node: str) -> Mark | None:
    """The node's mark, or None (none, unreadable, malformed: then no drain is ours, the safe direction)."""
    try:
        doc = load_json_file(_path(state_dir, node, create=False), max_bytes=MAX_SMALL_BYTES, what="drain mark")
    except (OSError, JsonInputError, NodewardenError):
        return None
    if not isinstance(doc, dict):
        return None
    reason, user, at = doc.get("reason"), doc.get("user"), doc.get("at")
    if not (isinstance(reason, str) and looks_ours(reason) and isinstance(user, str) and len(user) <= MAX_USER
            and isinstance(at, int) and not isinstance(at, bool) and 0 < at < 10**11):
        return None
    return Mark(reason, user, at)


def remember_mark(state_dir: Path, node: str, mark: Mark) -> None:
    replace_file(_path(state_dir, node, create=True),
                 json.dumps({"reason": mark.reason, "user": mark.user, "at": mark.at}) + "\n", 0o600)


def mark_of(state: NodeState) -> Mark:
    return Mark(state.reason, state.reason_user, state.reason_time)
