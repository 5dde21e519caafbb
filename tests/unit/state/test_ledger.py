"""agent.state.ledger (issue 33.1): SQLite in the state folder, opened only when provably ours.

Round trip and de-duplication; the file created owner-only by the safe writer; retention by age and
size; several processes writing at once; and every hostile ledger the issue names (corrupt pages,
wrong schema, someone else's SQLite, 2 GB, a symlink, another owner, a planted trigger, hostile values
in rows) refused or set aside and rebuilt with a note, never trusted and never fatal.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import time
from pathlib import Path

import pytest

from agent.core.history import GpuRef, Incident, digest
from agent.state.ledger import Ledger, LedgerError, ledger_file, open_ledger
from agent.state.ledger.store import APPLICATION_ID

NOW = 1_800_000_000.0


def _xid(n: int, *, ts: float = NOW, serial: str = "1650923000123", code: str = "79", boot: str = "b1") -> Incident:
    return Incident(ts=ts, kind="xid", source="kmsg", code=code, gpu=GpuRef(3, "GPU-5d1b", serial),
                    severity="critical", boot_id=boot, detail=f"NVRM: Xid (PCI:0000:19:00): {code}, line {n}",
                    digest=digest("xid", boot, n))


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return state


def test_incidents_round_trip_once_each_and_owner_only(folder: Path) -> None:
    with open_ledger(folder) as ledger:
        first = ledger.record([_xid(i, ts=NOW - i * 60) for i in range(5)], now=NOW)
        again = ledger.record([_xid(i, ts=NOW - i * 60) for i in range(5)], now=NOW)  # the same lines, re-read
        assert (len(first), again) == (5, [])
        got = ledger.window(NOW - 3600)
    assert [i.ts for i in got] == sorted(i.ts for i in got)
    assert {i.gpu for i in got} == {GpuRef(3, "GPU-5d1b", "1650923000123")}
    assert got[0].severity == "critical" and got[0].boot_id == "b1"
    path = ledger_file(folder, create=False)
    assert (os.stat(path).st_mode & 0o777) == 0o600
    with Ledger.open(path, readonly=True) as reader:
        assert reader.count() == 5


def test_a_reader_without_a_ledger_creates_nothing(folder: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_ledger(folder, readonly=True)
    assert os.listdir(folder) == []


def test_retention_by_age_keeps_sticky_memory_and_by_size(folder: Path) -> None:
    with open_ledger(folder) as ledger:
        old = [_xid(i, ts=NOW - 40 * 86400) for i in range(10)]
        memory = Incident(ts=NOW - 40 * 86400, kind="rule", source="ledger", code="node_churn", subject="|",
                          digest=digest("rule", 1))
        ledger.record([*old, memory, *(_xid(100 + i) for i in range(10))], now=NOW)
        assert ledger.prune(now=NOW) == 10
        assert {i.kind for i in ledger.window(0)} == {"rule", "xid"} and ledger.count() == 11
        # size: 20k incidents with long details, then a cap well under what they take
        ledger.record([_xid(1000 + i)._replace(detail="x" * 400) for i in range(20_000)], now=NOW)
        ledger.prune(now=NOW, max_bytes=2 << 20)
        remaining = ledger.count()
    assert 0 < remaining < 20_000
    assert os.path.getsize(ledger_file(folder, create=False)) <= 2 << 20


def _writer(folder: str, worker: int) -> None:
    with open_ledger(Path(folder)) as ledger:
        for n in range(50):
            ledger.record([_xid(worker * 1000 + n)], now=NOW)


def test_processes_writing_at_once_lose_nothing(folder: Path) -> None:
    with open_ledger(folder):
        pass
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(str(folder), w)) for w in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0] * 6
    with open_ledger(folder, readonly=True) as ledger:
        assert ledger.count() == 300


def _ours(folder: Path) -> Path:
    with open_ledger(folder) as ledger:
        ledger.record([_xid(i) for i in range(200)], now=NOW)
    path = ledger_file(folder, create=False)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _set_aside_and_rebuilt(folder: Path, why: str) -> None:
    with open_ledger(folder) as ledger:
        assert why in ledger.note and "ledger.db.refused" in ledger.note
        assert ledger.count() == 0
        assert ledger.record([_xid(1)], now=NOW)  # and it works
    assert (folder / "ledger.db.refused").exists() or (folder / "ledger.db.refused").is_symlink()


def test_corrupt_pages_are_set_aside(folder: Path) -> None:
    path = _ours(folder)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # scribble over every page but the header's
        f.seek(4096)
        f.write(os.urandom(size - 4096))
    with pytest.raises(LedgerError):
        open_ledger(folder, readonly=True)
    _set_aside_and_rebuilt(folder, "damaged")


@pytest.mark.parametrize(("make", "why"), [
    (lambda c: c.execute("CREATE TABLE incidents (x)"), "application_id"),
    (lambda c: (c.execute(f"PRAGMA application_id = {APPLICATION_ID}"), c.execute("CREATE TABLE incidents (x)")),
     "objects"),
    (lambda c: (c.execute(f"PRAGMA application_id = {APPLICATION_ID}"), c.execute("PRAGMA user_version = 99"),
                c.execute("CREATE TABLE t (x)")), "schema version 99"),
])
def test_someone_elses_sqlite_is_not_read_as_a_ledger(folder: Path, make: object, why: str) -> None:
    path = folder / "ledger.db"
    with sqlite3.connect(path) as conn:
        make(conn)  # type: ignore[operator]
    os.chmod(path, 0o600)
    with pytest.raises(LedgerError, match=why):
        open_ledger(folder, readonly=True)
    _set_aside_and_rebuilt(folder, why)


def test_a_planted_trigger_never_runs(folder: Path) -> None:
    path = _ours(folder)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE loot (x)")
        conn.execute("CREATE TRIGGER steal AFTER INSERT ON incidents BEGIN INSERT INTO loot VALUES (1); END")
    _set_aside_and_rebuilt(folder, "trigger steal")


def test_a_2_gb_file_is_not_opened(folder: Path) -> None:
    path = folder / "ledger.db"
    with open(path, "wb") as f:
        f.truncate(2 << 30)  # sparse: no disk used
    os.chmod(path, 0o600)
    _set_aside_and_rebuilt(folder, "over the")


def test_a_symlink_is_moved_aside_and_its_target_untouched(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0::/root:/bin/bash\n")
    os.symlink(target, folder / "ledger.db")
    _set_aside_and_rebuilt(folder, "symbolic link")
    assert target.read_text() == "root:x:0:0::/root:/bin/bash\n"
    assert (folder / "ledger.db.refused").is_symlink() and not (folder / "ledger.db").is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_another_users_ledger_is_left_alone_and_not_used(folder: Path) -> None:
    path = _ours(folder)
    before = path.read_bytes()
    os.chown(path, 65534, 65534)
    for readonly in (False, True):
        with pytest.raises(LedgerError, match="owned by uid 65534"):
            open_ledger(folder, readonly=readonly)
    assert path.read_bytes() == before and not (folder / "ledger.db.refused").exists()


def test_a_ledger_others_can_write_is_not_used(folder: Path) -> None:
    path = _ours(folder)
    os.chmod(path, 0o666)  # noqa: S103 - the hostile case under test
    with pytest.raises(LedgerError, match="writable by others"):
        open_ledger(folder)


def test_hostile_values_in_rows_are_skipped(folder: Path) -> None:
    path = _ours(folder)
    with sqlite3.connect(path) as conn:
        rows = [(b"blob", NOW, "b", "kmsg", "xid", "79", "", None, "", "", "", "", "", "d1"),
                (NOW, NOW, "b", "kmsg", "not-a-kind", "79", "", None, "", "", "", "", "", "d2"),
                (NOW, NOW, "b", "kmsg", "xid", "79", "", 10**9, "", "", "", "", "", "d3"),
                (NOW, NOW, b"\x00", "kmsg", "xid", "79", "", None, "", "", "", "", "", "d4"),
                (NOW, NOW, "b", "kmsg", "xid", "79", "", 2, "", "x" * 100_000, "", "", "", "d5")]
        conn.executemany("INSERT INTO incidents (ts, recorded, boot_id, source, kind, code, subcode, gpu_index, "
                         "gpu_uuid, gpu_serial, subject, severity, detail, digest) VALUES "
                         "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    with open_ledger(folder, readonly=True) as ledger:
        got = ledger.window(0)
    assert len(got) == 201  # 200 of ours and d5, cut
    assert max(len(i.gpu.serial) for i in got) <= 500


def test_a_locked_ledger_costs_the_history_not_the_caller(folder: Path) -> None:
    path = _ours(folder)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with open_ledger(folder) as ledger:
            started = time.monotonic()
            with pytest.raises(LedgerError):
                ledger.record([_xid(9999)], now=NOW)
            assert time.monotonic() - started < 10
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def test_a_capture_copies_the_ledger_consistently_while_it_is_written(folder: Path, tmp_path: Path) -> None:
    from agent.engine.history import copy_ledger

    _ours(folder)
    writer = multiprocessing.get_context("fork").Process(target=_writer, args=(str(folder), 7))
    writer.start()
    capture = tmp_path / "capture"
    capture.mkdir()
    assert copy_ledger(folder, capture / "ledger.db") == ""
    writer.join(30)
    assert writer.exitcode == 0
    mode = os.stat(capture / "ledger.db").st_mode & 0o777
    with Ledger.open(capture / "ledger.db", readonly=True) as copy:
        copied = copy.count()
        assert copy.totals()["xid"][0] == copied
    assert mode == 0o600 and 200 <= copied <= 250  # ours, and a whole state of the writer's: not a torn file
    empty = tmp_path / "none"
    empty.mkdir(mode=0o700)
    assert copy_ledger(empty, capture / "other.db") == "no ledger on this node yet"
    assert not (capture / "other.db").exists()


def test_a_storm_between_prunes_never_grows_the_file_to_the_cap_an_open_refuses(folder: Path) -> None:
    cap = 1 << 20
    with Ledger.open(ledger_file(folder, create=True), max_bytes=cap) as ledger:
        for batch in range(40):  # ~16,000 incidents of 400 characters: several times the cap
            ledger.record([_xid(batch * 400 + i)._replace(detail="x" * 400) for i in range(400)], now=NOW)
        kept = ledger.count()
    assert 0 < kept < 16_000
    path = ledger_file(folder, create=False)
    assert os.path.getsize(path) <= cap
    with Ledger.open(path, max_bytes=cap) as again:  # still ours: not set aside and rebuilt
        assert again.note == "" and again.count() == kept
