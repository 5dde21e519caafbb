"""The ledger file: SQLite in the state folder, opened only when it is provably ours (issue 33.1).

How it is opened, and why:
* The file is created by agent.io.fsutil (O_CREAT|O_EXCL|O_NOFOLLOW, 0600, in a trusted folder)
  before sqlite3 opens it: sqlite3 itself would follow a planted symlink and create with the umask.
  That is the one write not made by the safe writer's replace (a database is updated in place);
  docs/decisions.md records the exception.
* An existing file is judged before SQLite parses a byte of it: a regular file (never a link), owned
  by root, the running user or the folder's owner (systemd's DynamicUser), writable by nobody else,
  no larger than the cap, with SQLite's header and our application_id. Then `quick_check`, the
  schema version, and the exact set of objects we create (a planted trigger or view is not ours).
  `trusted_schema=OFF` so nothing in a schema can call a function with side effects.
* A file that fails: a corrupt, foreign-format, oversized or linked one is moved aside
  (`ledger.db.refused`, one kept) and a new ledger started, with a note saying why; one owned by
  someone else is left alone and the ledger is not used. Never trusted, never fatal to an audit.
* WAL with a busy timeout: the daemon, health-check, accept and remediate write from separate
  processes; readers take a read-only handle (`mode=ro`), as gpud does.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from agent.core.counters import COUNTERS, MAX_VALUE, Sample
from agent.core.errors import EXIT_CANNOT_RUN, NodewardenError
from agent.core.history import KINDS, MAX_DETAIL, MAX_TEXT, GpuRef, Incident, cut
from agent.io.fsutil import create_private_file
from agent.state.layout import LEDGER_FILE

REFUSED_SUFFIX = ".refused"
APPLICATION_ID = 0x4E574C47  # "NWLG": a SQLite file that is not a nodewarden ledger is not read as one
SCHEMA_VERSION = 1
DEFAULT_MAX_BYTES = 64 << 20  # 30 days at 10 incidents an hour is ~3 MB; far above is not ours or a flood
DEFAULT_MAX_AGE_S = 30 * 86400.0
BUSY_TIMEOUT_MS = 2000  # a writer holds the lock for milliseconds; a stuck one must not hold an audit
MAX_ROWS_READ = 200_000  # a window read is bounded whatever the file holds

_SCHEMA = (
    """CREATE TABLE incidents (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        recorded REAL NOT NULL,
        boot_id TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL,
        kind TEXT NOT NULL,
        code TEXT NOT NULL DEFAULT '',
        subcode TEXT NOT NULL DEFAULT '',
        gpu_index INTEGER,
        gpu_uuid TEXT NOT NULL DEFAULT '',
        gpu_serial TEXT NOT NULL DEFAULT '',
        subject TEXT NOT NULL DEFAULT '',
        severity TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '',
        digest TEXT NOT NULL UNIQUE)""",
    "CREATE INDEX incidents_ts ON incidents (ts)",
    "CREATE INDEX incidents_kind ON incidents (kind, code, ts)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # Incidents recorded per kind since the ledger began, and the newest one's time: what the
    # nodewarden_incidents_total counter shows (retention removes rows, never these counts).
    "CREATE TABLE totals (kind TEXT PRIMARY KEY, count INTEGER NOT NULL, last_ts REAL NOT NULL)",
    # A GPU's monotonic counters, one sample per board, counter and UTC day (the day's last reading):
    # what rates are computed from (agent.core.counters).
    """CREATE TABLE counters (
        key TEXT NOT NULL, counter TEXT NOT NULL, day TEXT NOT NULL, ts REAL NOT NULL, value INTEGER NOT NULL,
        boot_id TEXT NOT NULL DEFAULT '', PRIMARY KEY (key, counter, day))""",
)
# Every object a ledger of ours holds (sqlite_autoindex_* come with UNIQUE and PRIMARY KEY TEXT).
_OBJECTS = {("table", "incidents"), ("index", "incidents_ts"), ("index", "incidents_kind"), ("table", "meta"),
            ("table", "totals"), ("index", "sqlite_autoindex_incidents_1"), ("index", "sqlite_autoindex_meta_1"),
            ("index", "sqlite_autoindex_totals_1"), ("table", "counters"), ("index", "sqlite_autoindex_counters_1")}
_COLUMNS = ("ts", "recorded", "boot_id", "source", "kind", "code", "subcode", "gpu_index", "gpu_uuid",
            "gpu_serial", "subject", "severity", "detail", "digest")

# Built from the constant column names above; every value is a bound parameter.
_INSERT = f"INSERT OR IGNORE INTO incidents ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"  # noqa: S608
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM incidents WHERE ts >= ?"  # noqa: S608


class LedgerError(NodewardenError):
    """The ledger cannot be used (refused, unreadable, locked too long): the audit goes on without it."""

    exit_code = EXIT_CANNOT_RUN  # for `nodewarden ledger`: the node's history could not be read


class NotOurs(Exception):
    """The file is not a ledger we can trust: moved aside and rebuilt (a writer) or not read (a reader)."""


def _check_file(fd: int, folder_owner: int, max_bytes: int) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotOurs("not a regular file")
    if st.st_uid not in (0, os.geteuid(), folder_owner):
        raise LedgerError(f"owned by uid {st.st_uid}, not by root, us or the state folder's owner: not used")
    if st.st_mode & 0o022:
        raise LedgerError(f"writable by others (mode {stat.S_IMODE(st.st_mode):04o}): not used")
    if st.st_size > max_bytes:
        raise NotOurs(f"{st.st_size} bytes, over the {max_bytes}-byte cap")
    if st.st_size == 0:
        return  # made by us a moment ago (or a crash before the first page): SQLite starts it
    header = os.pread(fd, 100, 0)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise NotOurs("not an SQLite file")
    if int.from_bytes(header[68:72], "big") != APPLICATION_ID:
        raise NotOurs("an SQLite file, but not a nodewarden ledger (application_id)")


def _open_checked(path: Path, max_bytes: int) -> None:
    """Judge the file at `path` without following a link (raises NotOurs / LedgerError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symlink in its place
            raise NotOurs("a symbolic link") from None
        raise
    try:
        _check_file(fd, os.stat(path.parent).st_uid, max_bytes)
    finally:
        os.close(fd)


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    mode = "ro" if readonly else "rw"
    conn = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                           check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA cell_size_check = ON")
    return conn


def _validate(conn: sqlite3.Connection) -> int:
    """The schema version of an opened file of ours (raises NotOurs)."""
    try:
        check = conn.execute("PRAGMA quick_check(1)").fetchone()
        if not check or check[0] != "ok":
            raise NotOurs(f"damaged ({check[0] if check else 'no answer'})")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = {(t, n) for t, n in conn.execute("SELECT type, name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        raise NotOurs(f"damaged ({exc})") from None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise NotOurs(f"schema version {version}, newer than this nodewarden's {SCHEMA_VERSION}")
    if version == 0 and not objects:
        return 0  # empty: created below
    if objects != _OBJECTS:
        raise NotOurs("holds objects a nodewarden ledger does not: " + ", ".join(
            sorted(f"{t} {n}" for t, n in objects ^ _OBJECTS)[:4]))
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(incidents)"))
    if columns[1:] != _COLUMNS:
        raise NotOurs("its incidents table is not ours")
    return version


def _create(conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    with _transaction(conn):
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('created', ?)", (str(time.time()),))
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


# Migrations from each older schema version to the next, by number; none yet (version 1 is the first).
MIGRATIONS: dict[int, tuple[str, ...]] = {}


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    while version < SCHEMA_VERSION:
        with _transaction(conn):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _move_aside(path: Path) -> None:
    """The refused file (and its -wal/-shm) out of the way; one refused copy kept for a postmortem."""
    for suffix in ("", "-wal", "-shm"):
        old = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            # a rename moves a link, never its target
            os.replace(old, path.with_name(path.name + REFUSED_SUFFIX + suffix))


class Ledger:
    """An open ledger. Thread-safe (the daemon records from its evaluation thread and serves reads)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, readonly: bool, note: str = "",
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes  # the cap an open refuses above: a write never lets the file reach it
        self.readonly = readonly
        self.note = note  # what happened on opening: "" or why the old file was set aside
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> Ledger:
        """The ledger at `path` (in a folder the caller got from agent.state.layout, already trusted).

        A writer creates it when missing and rebuilds one that is not ours; a reader raises
        FileNotFoundError when there is none and LedgerError when it is not ours."""
        note = ""
        try:
            _open_checked(path, max_bytes)
        except FileNotFoundError:
            if readonly:
                raise
            create_private_file(path)
        except NotOurs as exc:
            if readonly:
                raise LedgerError(f"the ledger {path} is not usable: {exc}") from None
            note = f"the ledger was set aside as {path.name}{REFUSED_SUFFIX} and started again: {exc}"
            _move_aside(path)
            create_private_file(path)
        try:
            conn = _connect(path, readonly=readonly)
        except sqlite3.Error as exc:
            raise LedgerError(f"the ledger {path} cannot be opened: {exc}") from None
        try:
            version = _validate(conn)
        except NotOurs as exc:
            conn.close()
            if readonly:
                raise LedgerError(f"the ledger {path} is not usable: {exc}") from None
            _move_aside(path)
            create_private_file(path)
            ledger = cls.open(path, readonly=False, max_bytes=max_bytes)
            ledger.note = f"the ledger was set aside as {path.name}{REFUSED_SUFFIX} and started again: {exc}"
            return ledger
        if not readonly:
            try:
                if version == 0:  # before WAL and the first table, or SQLite ignores it
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                if version == 0:
                    _create(conn)
                elif version < SCHEMA_VERSION:
                    _migrate(conn, version)
            except sqlite3.Error as exc:
                conn.close()
                raise LedgerError(f"the ledger {path} cannot be written: {exc}") from None
        elif version == 0:
            conn.close()
            raise LedgerError(f"the ledger {path} is empty")
        return cls(path, conn, readonly=readonly, note=note, max_bytes=max_bytes)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- writing ---------------------------------------------------------------------------------

    def record(self, incidents: Iterable[Incident], *, now: float | None = None) -> list[Incident]:
        """Store the incidents not already stored (by digest); returns the new ones, in order."""
        recorded = time.time() if now is None else now
        rows = [_row(i, recorded) for i in incidents if i.kind in KINDS and i.digest]
        if not rows:
            return []
        new: list[Incident] = []
        with self._lock, _locked(self), _transaction(self._conn):
            for row, incident in rows:
                cursor = self._conn.execute(_INSERT, row)
                if cursor.rowcount == 1:
                    new.append(incident)
                    self._conn.execute(
                        "INSERT INTO totals (kind, count, last_ts) VALUES (?, 1, ?) ON CONFLICT (kind) DO UPDATE "
                        "SET count = count + 1, last_ts = MAX(last_ts, excluded.last_ts)", (incident.kind, row[0]))
        with self._lock, _locked(self):
            full = self._size() > self.max_bytes * 3 // 4
        if full:  # a storm between hourly prunes: our own file must never grow to the cap an open refuses
            self.prune(now=recorded, max_bytes=self.max_bytes)
        return new

    def prune(self, *, now: float | None = None, max_age_s: float = DEFAULT_MAX_AGE_S,
              max_bytes: int = DEFAULT_MAX_BYTES) -> int:
        """Retention: rows older than `max_age_s` go, then the oldest until the file fits `max_bytes`
        (three quarters of it, so pruning is not done at every insert); space given back. Rows of
        kind `rule` and `clear` older than the age are kept while they are a sticky rule's state."""
        cutoff = (time.time() if now is None else now) - max_age_s
        removed = 0
        with self._lock, _locked(self):
            with _transaction(self._conn):
                removed += self._conn.execute(
                    "DELETE FROM incidents WHERE ts < ? AND kind NOT IN ('rule', 'clear')", (cutoff,)).rowcount
                self._conn.execute("DELETE FROM counters WHERE ts < ?", (cutoff - 2 * 86400,))
            while self._size() > max_bytes * 3 // 4:
                with _transaction(self._conn):
                    gone = self._conn.execute(
                        "DELETE FROM incidents WHERE id IN (SELECT id FROM incidents ORDER BY ts LIMIT "
                        "(SELECT MAX(1, COUNT(*) / 10) FROM incidents))").rowcount
                removed += gone
                if not gone:
                    break
            with _transaction(self._conn):
                self._conn.execute("INSERT INTO meta (key, value) VALUES ('pruned', ?) ON CONFLICT (key) DO UPDATE "
                                   "SET value = excluded.value", (str(time.time() if now is None else now),))
            # each step of the pragma frees one page, and execute() steps once: executescript runs it
            # to the end; the checkpoint then lets the main file shrink
            self._conn.executescript("PRAGMA incremental_vacuum")
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return removed

    def _size(self) -> int:
        pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
        size = self._conn.execute("PRAGMA page_size").fetchone()[0]
        free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * size)

    # --- reading ---------------------------------------------------------------------------------

    def window(self, since: float, until: float | None = None, *, kinds: Iterable[str] = ()) -> tuple[Incident, ...]:
        """The incidents from `since` to `until`, oldest first; rows that are not well-formed are
        skipped (the file passed our checks, but its values are still read as hostile)."""
        query = _SELECT
        args: list[object] = [since]
        if until is not None:
            query += " AND ts <= ?"
            args.append(until)
        wanted = tuple(k for k in kinds if k in KINDS)
        if wanted:
            query += f" AND kind IN ({', '.join('?' * len(wanted))})"
            args.extend(wanted)
        query += f" ORDER BY ts, id LIMIT {MAX_ROWS_READ}"
        with self._lock, _locked(self):
            rows = self._conn.execute(query, args).fetchall()
        return tuple(i for i in (_incident(r) for r in rows) if i is not None)

    def after(self, last_id: int, *, limit: int = MAX_ROWS_READ) -> tuple[list[Incident], int]:
        """The incidents recorded after row `last_id` (by anyone), in the order recorded, and the newest
        row's id: a long-running reader keeps its window and reads only what is new."""
        with self._lock, _locked(self):
            rows = self._conn.execute(f"SELECT id, {', '.join(_COLUMNS)} FROM incidents WHERE id > ? "  # noqa: S608
                                      "ORDER BY id LIMIT ?", (last_id, limit)).fetchall()
        top = max((r[0] for r in rows if isinstance(r[0], int)), default=last_id)
        return [i for i in (_incident(r[1:]) for r in rows) if i is not None], top

    def count(self) -> int:
        with self._lock, _locked(self):
            return int(self._conn.execute("SELECT COUNT(*) FROM incidents").fetchone()[0])

    def last_pruned(self) -> float:
        """When retention last ran on this file (0: never); a value that is no time is never."""
        with self._lock, _locked(self):
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'pruned'").fetchone()
        try:
            return float(row[0]) if row and isinstance(row[0], str) and len(row[0]) < 32 else 0.0
        except ValueError:
            return 0.0

    def backup(self, out: Path) -> None:
        """A consistent copy (SQLite's online backup: a writer may go on) into `out`, a new owner-only file."""
        create_private_file(out)
        try:
            dest = sqlite3.connect(out)
            try:
                with self._lock, _locked(self):
                    self._conn.backup(dest)
            finally:
                dest.close()
        except BaseException:
            out.unlink(missing_ok=True)
            raise

    def record_samples(self, samples: Iterable[Sample]) -> int:
        """Counter samples in: the newest reading of each board, counter and UTC day is kept."""
        rows = [(cut(s.key), s.counter, time.strftime("%Y-%m-%d", time.gmtime(s.ts)), float(s.ts), int(s.value),
                 cut(s.boot_id)) for s in samples if s.counter in COUNTERS and 0 <= s.value < MAX_VALUE]
        if not rows:
            return 0
        with self._lock, _locked(self), _transaction(self._conn):
            self._conn.executemany(
                "INSERT INTO counters (key, counter, day, ts, value, boot_id) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key, counter, day) DO UPDATE SET ts = excluded.ts, value = excluded.value, "
                "boot_id = excluded.boot_id WHERE excluded.ts >= counters.ts", rows)
        return len(rows)

    def samples(self, since: float, until: float | None = None) -> tuple[Sample, ...]:
        """Counter samples from `since` (and the day before it, the base of a rate); hostile rows skipped."""
        with self._lock, _locked(self):
            rows = self._conn.execute(
                "SELECT ts, key, counter, value, boot_id FROM counters WHERE ts >= ? AND ts <= ? ORDER BY ts LIMIT ?",
                (since - 2 * 86400, until if until is not None else 1e18, MAX_ROWS_READ)).fetchall()
        return tuple(Sample(float(ts), str(key), str(counter), value, str(boot))
                     for ts, key, counter, value, boot in rows
                     if isinstance(ts, float | int) and not isinstance(ts, bool) and isinstance(key, str)
                     and isinstance(boot, str) and counter in COUNTERS and isinstance(value, int)
                     and not isinstance(value, bool) and 0 <= value < MAX_VALUE and len(key) <= MAX_TEXT)

    def totals(self) -> dict[str, tuple[int, float]]:
        """kind -> (incidents recorded since the ledger began, the newest one's time); hostile rows skipped."""
        with self._lock, _locked(self):
            rows = self._conn.execute("SELECT kind, count, last_ts FROM totals LIMIT 64").fetchall()
        return {kind: (count, float(last)) for kind, count, last in rows
                if kind in KINDS and isinstance(count, int) and not isinstance(count, bool) and count >= 0
                and isinstance(last, float | int) and not isinstance(last, bool)}


@contextlib.contextmanager
def _locked(ledger: Ledger) -> Iterator[None]:
    """sqlite3 errors as LedgerError: a locked or damaged ledger costs the history, never the audit."""
    try:
        yield
    except sqlite3.Error as exc:
        raise LedgerError(f"the ledger {ledger.path}: {exc}") from None


def _row(incident: Incident, recorded: float) -> tuple[tuple[object, ...], Incident]:
    g = incident.gpu
    clean = incident._replace(subject=cut(incident.subject), detail=cut(incident.detail, MAX_DETAIL),
                              code=cut(incident.code),
                              subcode=cut(incident.subcode), gpu=GpuRef(g.index, cut(g.uuid), cut(g.serial)))
    return ((float(clean.ts), recorded, cut(clean.boot_id), cut(clean.source), clean.kind, clean.code,
             clean.subcode, g.index, clean.gpu.uuid, clean.gpu.serial, clean.subject, cut(clean.severity),
             clean.detail, clean.digest), clean)


def _incident(row: tuple[object, ...]) -> Incident | None:
    (ts, _recorded, boot_id, source, kind, code, subcode, index, uuid, serial, subject, severity, detail,
     digest) = row
    texts = (boot_id, source, kind, code, subcode, uuid, serial, subject, severity, detail, digest)
    if not isinstance(ts, float | int) or isinstance(ts, bool) or not all(isinstance(t, str) for t in texts):
        return None
    if kind not in KINDS or (index is not None and not (isinstance(index, int) and 0 <= index < 4096)):
        return None
    return Incident(ts=float(ts), kind=str(kind), source=cut(str(source)), code=cut(str(code)),
                    subcode=cut(str(subcode)), gpu=GpuRef(index, cut(str(uuid)), cut(str(serial))),
                    subject=cut(str(subject)), severity=cut(str(severity)), boot_id=cut(str(boot_id)),
                    detail=cut(str(detail), MAX_DETAIL), digest=str(digest)[:64])


def ledger_path(folder: Path) -> Path:
    return folder / LEDGER_FILE
