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

import json
import os
from pathlib import Path
from typing import Any

from agent.core.series import Recording, RecordingError, from_json
from agent.io.fsutil import replace_file, trusted_dir
from agent.io.jsonfile import JsonInputError, load_json_file

KEEP_RUNS = 20
MAX_RECORDING_BYTES = 32 << 20  # 8 GPUs x 9 series x 40k samples of short numbers: ~20 MB
MAX_DEPTH = 8  # a recording nests 5 deep
LAST_SCHEMA = "nodewarden.accept.last/v1"


class AcceptStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def folder(self, create: bool = True) -> Path:
        return trusted_dir(trusted_dir(self.state_dir, create=create) / "accept", create=create,
                           what="acceptance folder")

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
        path = self.folder() / "last.json"
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
