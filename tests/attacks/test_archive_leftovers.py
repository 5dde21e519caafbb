"""`audit --snapshot x.tar.gz` leaves nothing in $TMPDIR: not on SIGTERM, and what a SIGKILL left is
removed by the next run (issue 21 item 11, the archive part).

A child extracts a snapshot archive with TMPDIR pointed at the test's folder, says where, and waits;
the test signals it and looks at what is left.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_CHILD = """
import sys, time
from pathlib import Path
from agent.sources.importers.archive import extract_archive
print(extract_archive(Path(sys.argv[1])), flush=True)
time.sleep(60)
"""


def _archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in (("node/meta.yaml", b"hostname: n1\ncaptured: [host]\n"), ("node/fs/etc/hostname", b"n1\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _extracting(archive: Path, tmpdir: Path) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(archive)], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmpdir)})
    assert child.stdout is not None
    snapshot = Path(child.stdout.readline().strip())
    assert (snapshot / "meta.yaml").is_file()
    return child, snapshot.parent


def test_sigterm_removes_the_extracted_snapshot(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    child, work = _extracting(_archive(tmp_path / "x.tar.gz"), tmpdir)
    assert work.parent == tmpdir
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == 128 + signal.SIGTERM
    assert os.listdir(tmpdir) == []


def test_what_a_killed_run_left_is_removed_by_the_next_and_a_live_runs_is_kept(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    archive = _archive(tmp_path / "x.tar.gz")
    killed, left = _extracting(archive, tmpdir)
    killed.kill()
    killed.wait(timeout=20)
    assert left.is_dir()  # SIGKILL: no clean-up ran
    alive = tmpdir / f"nodewarden-snapshot-{os.getpid()}-live"  # this test's own pid: a run still going
    alive.mkdir()
    other = tmpdir / "nodewarden-snapshot-notapid"
    other.mkdir()
    second, mine = _extracting(archive, tmpdir)
    try:
        assert not left.exists()
        assert alive.is_dir()
        assert other.is_dir()
        assert mine.is_dir()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
    assert sorted(os.listdir(tmpdir)) == sorted([alive.name, other.name])
