"""The acceptance state: STATE_DIR/accept/{runs/RUN_ID.json, baseline.json, last.json}, through agent.io.fsutil.

* runs/RUN_ID.json  each run's recording (nodewarden.accept/v1), the newest KEEP_RUNS kept;
* baseline.json     the recording drift is measured against: the first passing run, or the run
                    given `--new-baseline` (a passing one); its `run_id` is the baseline's id;
* last.json         what the scheduler's health-check reads, written at the end of every run:
                    {"passed", "finished_at", "baseline", "run", "drift", "interrupted"}; while a run
                    goes on, {"passed": false, "in_progress": true, "pid", ...} (a killed run leaves that).

Every file read back is bounded (agent.io.jsonfile) and checked (recording.from_json): the folder is
root's (fsutil.trusted_dir refuses one others can write) but its content is still not trusted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from agent.core.errors import NodewardenError
from agent.core.series import Recording, RecordingError, from_json
from agent.io.fsutil import replace_file, trusted_dir
from agent.io.jsonfile import JsonInputError, load_json_file
from agent.state.layout import ACCEPT_RESULT_FILE, accept_folder

KEEP_RUNS = 20
MAX_RESULT_BYTES = 4 << 20  # last.json carries the run's drift too
MAX_RECORDING_BYTES = 32 << 20  # 8 GPUs x 9 series x 40k samples of short numbers: ~20 MB
MAX_DEPTH = 8  # a recording nests 5 deep
LAST_SCHEMA = "nodewarden.accept.last/v1"


class AcceptStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def folder(self, create: bool = True) -> Path:
        return accept_folder(self.state_dir, create=create)

    def baseline(self) -> tuple[Recording | None, str | None]:
        """The stored baseline, or None and why it could not be used (None, None: none stored)."""
        try:
            path = self.folder(create=False) / "baseline.json"
            doc = load_json_file(path, max_bytes=MAX_RECORDING_BYTES, max_depth=MAX_DEPTH, what="acceptance baseline")
        except FileNotFoundError:
            return None, None
        except (OSError, JsonInputError) as exc:
            return None, f"acceptance baseline unreadable: {exc}"
        try:
            return from_json(doc), None
        except RecordingError as exc:
            return None, f"acceptance baseline ignored: {exc}"

    def save_run(self, recording: Recording) -> Path:
        runs = trusted_dir(self.folder() / "runs", create=True, what="acceptance runs folder")
        path = runs / f"{recording.run_id}.json"
        replace_file(path, _text(recording.to_json()), 0o644)
        self._prune(runs)
        return path

    def save_baseline(self, recording: Recording) -> None:
        replace_file(self.folder() / "baseline.json", _text(recording.to_json()), 0o644)

    def save_last(self, doc: dict[str, Any]) -> Path:
        path = self.folder() / ACCEPT_RESULT_FILE
        replace_file(path, _text({"schema": LAST_SCHEMA, **doc}), 0o644)
        return path

    def _prune(self, runs: Path) -> None:
        names = sorted(n for n in os.listdir(runs) if n.endswith(".json") and not n.startswith("."))
        for name in names[:-KEEP_RUNS]:
            try:
                os.unlink(runs / name)  # run ids sort by time: the oldest go
            except OSError:
                continue


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"


def _iso_time(value: object) -> float | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()


def accepted_since(state_dir: Path, since: float) -> tuple[bool, str]:
    """Whether `nodewarden accept` passed in a run that finished after `since` (Unix time), and why not.

    Read by the rule the store writes by (the acceptance folder checked like every folder of STATE_DIR):
    STATE_DIR/accept/last.json holds at least {"passed": bool, "finished_at": ISO 8601}.
    """
    try:
        path = accept_folder(state_dir, create=False) / ACCEPT_RESULT_FILE
        if os.stat(path, follow_symlinks=False).st_uid not in (0, os.geteuid()):
            return False, f"{path} is not root's"
        doc = load_json_file(path, max_bytes=MAX_RESULT_BYTES, what="acceptance result")
    except FileNotFoundError:
        return False, "no acceptance run yet (nodewarden accept)"
    except (OSError, JsonInputError, NodewardenError) as exc:
        return False, f"acceptance result unreadable: {exc}"
    if not isinstance(doc, dict) or not isinstance(doc.get("passed"), bool):
        return False, "acceptance result malformed"
    finished = _iso_time(doc.get("finished_at"))
    if finished is None:
        return False, "acceptance result has no finished_at"
    if not doc["passed"]:
        return False, "the last acceptance run failed"
    if finished < since:
        return False, "no acceptance run since the drain"
    return True, "a passing acceptance run since the drain"
