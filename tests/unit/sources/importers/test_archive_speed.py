"""Issue 26.5: a .tar.gz snapshot audits and captures close to its folder's speed, with progress on a terminal.

The time went to thousands of small files created and removed again on disk (a journalled filesystem mounted
with `discard`), and to gzip level 9: the files are now unpacked and packed in memory (/dev/shm) where it is a
tmpfs with room and $TMPDIR is not set, and packed at gzip's default level; anything slower than two seconds
shows click's progress bar on a terminal.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sources.importers import archive
from tests.conftest import REPO, RunCli


def _on_tmpfs_with_room() -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        tmpfs = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts)
    if not tmpfs:
        return False
    info = os.statvfs("/dev/shm")
    return info.f_bavail * info.f_frsize > 2 * (2 << 30)


def test_archives_are_unpacked_in_memory_unless_tmpdir_says_otherwise(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.tar.gz"
    with tarfile.open(path, "w:gz") as out:
        for name, data in (("node/meta.yaml", b"hostname: n1\ncaptured: [host]\n"), ("node/fs/etc/hostname", b"n1\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    monkeypatch.delenv("TMPDIR", raising=False)
    expected = "/dev/shm" if _on_tmpfs_with_room() else None
    assert archive.scratch_dir() == expected
    snapshot = archive.extract_archive(path)
    assert str(snapshot.parent.parent) == (expected or "/tmp") and (snapshot / "meta.yaml").is_file()
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the operator's choice wins
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches $TMPDIR at its first use
    assert archive.scratch_dir() is None
    assert archive.extract_archive(path).parent.parent == tmp_path


def test_progress_shows_on_a_terminal_only_after_two_seconds(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    def slow(count: int, pause: float) -> Iterator[int]:
        for i in range(count):
            time.sleep(pause)
            yield i

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert archive.PROGRESS_AFTER_S == 2.0
    assert sum(archive.with_progress(slow(5, 0.01), "unpacking quick.tar.gz")) == 10
    assert "unpacking" not in capsys.readouterr().err  # quick: nothing drawn
    monkeypatch.setattr(archive, "PROGRESS_AFTER_S", 0.05)
    assert sum(archive.with_progress(slow(20, 0.01), "unpacking slow.tar.gz")) == 190
    err = capsys.readouterr().err
    assert "unpacking slow.tar.gz" in err and "  20" in err  # click's bar, with the count of files
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)  # not a terminal: never
    assert sum(archive.with_progress(slow(20, 0.01), "unpacking piped.tar.gz")) == 190
    assert "unpacking" not in capsys.readouterr().err


def test_a_captured_archive_is_packed_at_gzips_default_level_and_audits_as_its_folder(
        run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "captured.tar.gz"
    scratch = Path(archive.scratch_dir() or "/tmp")
    assert run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out)).code == 0
    assert not [n for n in os.listdir(scratch) if n.startswith(f"nodewarden-snapshot-{os.getpid()}-")
                and (scratch / n / "captured").exists()]  # the captured files are gone, the archive stays
    with open(out, "rb") as handle:
        assert handle.read(10)[8] == 0  # gzip's XFL: 0 is the default level, 2 was level 9 (tarfile's)
    folder = run_cli("audit", "--snapshot", str(REPO / "fixtures" / "nodes" / "hgx-h100-drifted"),
                     "--format", "json").json()
    packed = run_cli("audit", "--snapshot", str(out), "--format", "json").json()
    assert [(f["check"], f["subject"], f["status"]) for f in packed["findings"]] == [
        (f["check"], f["subject"], f["status"]) for f in folder["findings"]]
