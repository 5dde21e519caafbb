"""Remediation journal and lock, under --state-dir (default /var/lib/nodewarden).

Layout: `lock` (flock: one remediate or rollback at a time) and
`journal/RUN_ID/` holding `run.json` (what and where) and `entries.jsonl`,
appended and fsync'ed before each step. An action's before-state — the
exact bytes of every path it will touch, plus the parsed value for kernel
attributes — is durable before its first write, so a run killed at any
point can be rolled back to exactly the prior state. A torn last line (a
crash inside the journal write itself) is ignored: nothing was applied yet.
"""

from __future__ import annotations

import base64
import datetime as dt
import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.errors import NodewardenError
from remediations._target import fsync_dir

DEFAULT_STATE_DIR = Path("/var/lib/nodewarden")
_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")


class JournalError(NodewardenError):
    """A journal that is missing, unreadable, or locked by another run."""


class LockHeld(JournalError):
    exit_code = 3


def new_run_id(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def _fsync_dir(path: Path) -> None:
    fsync_dir(str(path))


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path / "journal"

    def ensure(self) -> None:
        # The journal holds file contents from /etc: owner only.
        self.journal.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.path, 0o700)

    @contextmanager
    def lock(self) -> Iterator[None]:
        self.ensure()
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise LockHeld(f"another nodewarden remediate or rollback is running (pid {holder}); "
                               "try again when it has finished", path=str(self.path / "lock")) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def runs(self) -> list[str]:
        if not self.journal.is_dir():
            return []
        return sorted(p.name for p in self.journal.iterdir() if _RUN_ID_RE.match(p.name))

    def open_run(self, run_id: str) -> RunJournal:
        if not _RUN_ID_RE.match(run_id):
            raise JournalError(f"not a run id: {run_id!r} (expected e.g. 20261129T180512Z-3f9a0c)")
        path = self.journal / run_id
        if not (path / "run.json").is_file():
            raise JournalError(f"no remediation run {run_id} in {self.journal}")
        return RunJournal(path)

    def last_run(self, target: str) -> RunJournal:
        """The newest run that changed something on `target`."""
        for run_id in reversed(self.runs()):
            run = RunJournal(self.journal / run_id)
            try:
                meta = run.meta()
            except JournalError:
                continue
            if meta.get("target") == target and run.before_states():
                return run
        raise JournalError(f"no remediation run with changes on {target} in {self.journal}")

    def create_run(self, run_id: str, meta: dict[str, Any]) -> RunJournal:
        self.ensure()
        path = self.journal / run_id
        path.mkdir(mode=0o700)
        run = RunJournal(path)
        _write_json_durable(path / "run.json", {"run_id": run_id, **meta})
        _fsync_dir(self.journal)
        return run


def _write_json_durable(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class RunJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.run_id = path.name
        self.entries_path = path / "entries.jsonl"

    def meta(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / "run.json").read_text())
        except (OSError, ValueError) as exc:
            raise JournalError(f"unreadable run journal: {exc}", path=str(self.path)) from exc
        if not isinstance(data, dict):
            raise JournalError("run.json is not an object", path=str(self.path))
        return data

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True) + "\n"
        fd = os.open(self.entries_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        try:
            text = self.entries_path.read_text()
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                if number == len(lines):  # torn final line: its step never started
                    break
                raise JournalError("corrupt journal entry", path=str(self.entries_path), line=number) from None
        return out

    def before_states(self) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("phase") == "before"]

    def rolled_back(self) -> dict[str, Any] | None:
        path = self.path / "rolled_back.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}

    def mark_rolled_back(self, restored: int) -> None:
        _write_json_durable(self.path / "rolled_back.json", {
            "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "restored": restored})
