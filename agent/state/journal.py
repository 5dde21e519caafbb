"""Remediation journal under --state-dir (default /var/lib/nodewarden), and the per-target lock.

Layout: `journal/RUN_ID/` holding `run.json` (what, where, and when it
started) and `entries.jsonl`, appended and fsync'ed before each step. An action's before-state — the
exact bytes of every path it will touch, plus the parsed value for kernel
attributes — is durable before its first write, so a run killed at any
point can be rolled back to exactly the prior state.

The journal never lies: every append is written whole (a short write is an
error), fsynced and read back before the step it records may start; when it
cannot be (no space, I/O error) the torn bytes are cut off again and the step
is not taken (`JournalWriteError`, exit 1, nothing changed by it). So a torn
last line can only be an entry whose step never started, and rollback ignores
it; a complete before-state means "may have been applied" and is restored.

Root restores what a journal says, so the state dir is trusted only when
safe (`agent.io.fsutil.trusted_dir`: root's or ours, writable by nobody else, up
to /), and is never chmod'ed. The lock belongs to the *target*, not to the
state dir (`hold_lock`; agent.engine.remediate picks the path): two runs with
different --state-dir on one node must not interleave.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.core.errors import NodewardenError
from agent.io.fsutil import fsync_dir, open_dir_nofollow, open_lock_file, replace_file, trusted_dir, write_all
from agent.io.jsonfile import load_json_bytes, load_json_file
from agent.state.layout import JOURNAL_DIR

DEFAULT_STATE_DIR = Path("/var/lib/nodewarden")
_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")


class JournalError(NodewardenError):
    """A journal that is missing, unreadable, or locked by another run."""


class LockHeld(JournalError):
    exit_code = 3


class JournalWriteError(JournalError):
    """The journal could not take an entry (full, I/O error): the step it was for is not taken."""

    exit_code = 1


def new_run_id(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def _fsync_dir(path: Path) -> None:
    fsync_dir(str(path))


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@contextmanager
def hold_lock(path: Path, *, target: str, directory: bool = False) -> Iterator[None]:
    """flock `path` (a lock file, or with `directory` the folder itself) for one remediate or rollback.

    Opened with O_NOFOLLOW|O_CLOEXEC; a file lock records the holder's pid.
    """
    fd = open_dir_nofollow(path) if directory else open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "" if directory else os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise LockHeld(f"another nodewarden remediate or rollback is running on {target}"
                           + (f" (pid {holder})" if holder else "") + "; try again when it has finished",
                           path=str(path)) from None
        if not directory:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _recorded_at(run_id: str, meta: dict[str, Any]) -> dt.datetime:
    """When a run started, as its run.json recorded it (older journals: the time in the run id)."""
    text = meta.get("started_at")
    if isinstance(text, str):
        try:
            stamp = dt.datetime.fromisoformat(text)
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)
        except ValueError:
            pass
    return dt.datetime.strptime(run_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path / JOURNAL_DIR

    def ensure(self) -> None:
        """Check the state dir (and every parent) is safe; create it and journal/ (0700) if missing.

        The journal holds file contents from /etc: owner only. An existing folder is used as it
        is or refused (exit 2 naming it), never chmod'ed.
        """
        self.path = trusted_dir(self.path, create=True)
        self.journal = trusted_dir(self.path / JOURNAL_DIR, create=True)

    def _checked(self) -> bool:
        """Check an existing state dir before reading it; False when there is none."""
        try:
            self.path = trusted_dir(self.path)
            self.journal = trusted_dir(self.path / JOURNAL_DIR)
        except FileNotFoundError:
            return False
        return True

    def runs(self) -> list[str]:
        if not self._checked():
            return []
        return sorted(p.name for p in self.journal.iterdir() if _RUN_ID_RE.match(p.name))

    def open_run(self, run_id: str) -> RunJournal:
        if not _RUN_ID_RE.match(run_id):
            raise JournalError(f"not a run id: {run_id!r} (expected e.g. 20261129T180512Z-3f9a0c)")
        if not self._checked():
            raise JournalError(f"no remediation run {run_id} in {self.journal}")
        path = self.journal / run_id
        if not (path / "run.json").is_file():
            raise JournalError(f"no remediation run {run_id} in {self.journal}")
        trusted_dir(path, what="run journal")
        return RunJournal(path)

    def last_run(self, target: str) -> RunJournal:
        """The newest run that changed something on `target`, by the start time its run.json recorded.

        Not by the largest run id: ids of one second differ only in their random suffix.
        """
        candidates: list[tuple[dt.datetime, str, RunJournal]] = []
        for run_id in self.runs():
            run = RunJournal(self.journal / run_id)
            try:
                meta = run.meta()
                if meta.get("target") == target and run.before_states():
                    candidates.append((_recorded_at(run_id, meta), run_id, run))
            except (JournalError, ValueError):
                continue
        if not candidates:
            raise JournalError(f"no remediation run with changes on {target} in {self.journal}")
        newest = max(candidates, key=lambda c: (c[0], c[1]))[2]
        trusted_dir(newest.path, what="run journal")
        return newest

    def create_run(self, run_id: str, meta: dict[str, Any]) -> RunJournal:
        self.ensure()
        path = self.journal / run_id
        try:
            path.mkdir(mode=0o700)
            run = RunJournal(path)
            started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
            _write_json_durable(path / "run.json", {"run_id": run_id, "started_at": started, **meta})
            _fsync_dir(self.journal)
        except (OSError, NodewardenError) as exc:
            with contextlib.suppress(OSError):  # an empty run folder says nothing; drop it
                path.rmdir()
            raise JournalWriteError(f"cannot start a journal in {self.journal} ({exc}); nothing was changed",
                                    path=str(path)) from None
        return run


def _write_json_durable(path: Path, data: Any) -> None:
    replace_file(path, json.dumps(data, indent=1, sort_keys=True), 0o600)


class RunJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.run_id = path.name
        self.entries_path = path / "entries.jsonl"

    def meta(self) -> dict[str, Any]:
        try:
            data = load_json_file(self.path / "run.json", max_bytes=1 << 20, max_depth=8)
        except (OSError, ValueError) as exc:
            raise JournalError(f"unreadable run journal: {exc}", path=str(self.path)) from exc
        if not isinstance(data, dict):
            raise JournalError("run.json is not an object", path=str(self.path))
        return data

    def append(self, entry: dict[str, Any]) -> None:
        """Append one entry durably, or raise JournalWriteError having left the file as it was."""
        data = (json.dumps(entry, sort_keys=True) + "\n").encode()
        try:
            fd = os.open(self.entries_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as exc:
            raise JournalWriteError(f"cannot open the journal: {exc.strerror}", path=str(self.entries_path)) from None
        try:
            start = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fsync(fd)
                if os.pread(fd, len(data) + 1, start) != data:
                    raise OSError(errno.EIO, "the entry did not read back as written")
            except OSError as exc:
                with contextlib.suppress(OSError):  # no torn entry left behind, if the disk lets us
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                raise JournalWriteError(f"cannot write the journal ({exc.strerror or exc}); the step it was "
                                        "for was not taken", path=str(self.entries_path)) from None
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
                out.append(load_json_bytes(line, what=str(self.entries_path), max_bytes=64 << 20, max_depth=16))
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
        data = load_json_file(path, max_bytes=1 << 20, max_depth=8)
        return data if isinstance(data, dict) else {}

    def mark_rolled_back(self, restored: int) -> str | None:
        """Record the rollback; returns why it could not be recorded (the node is restored anyway,
        and a second rollback restores the same bytes again)."""
        try:
            _write_json_durable(self.path / "rolled_back.json", {
                "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "restored": restored})
        except (OSError, NodewardenError) as exc:
            return str(exc)
        return None
