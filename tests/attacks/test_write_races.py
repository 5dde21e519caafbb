"""Issue 21, 1, 2 and 11: root's writes where an unprivileged user steers the path, as real races.

A `nobody` process (tests.attacks.swapper) swaps a folder nodewarden writes into with a
symlink to a root-owned folder outside (the "victim") while nodewarden writes, many rounds;
the victim must never get a file. The refusal of a target or output parent another user can
write (defence in depth) is switched off in the race tests so that they test the descriptor
mechanism itself, and tested on its own through the CLI.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.attacks.swapper import Swapper, nobody
from tests.conftest import REPO, RunCli

RACE_S = 6.0
PAYLOAD = b"kernel.core_pattern = |/tmp/pwn %p\n"


@pytest.fixture
def arena() -> Iterator[Path]:
    """A folder `nobody` can reach (pytest's tmp_path is under a 0700 folder of root's)."""
    path = Path(tempfile.mkdtemp(prefix="nw-race-", dir="/tmp"))
    os.chmod(path, 0o755)  # noqa: S103 - traversable by nobody, as the attack needs
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _give_to_nobody(*folders: Path) -> None:
    uid, gid = nobody()
    for folder in folders:
        os.chown(folder, uid, gid)


def _no_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch off the ownership refusal, leaving only the descriptor mechanism under test."""
    for module, name in (("remediations.targets", "check_target_root"), ("remediations.targets", "_refuse_shared"),
                         ("agent.io.fsout", "check_folder")):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        monkeypatch.setattr(mod, name, lambda *_a, **_k: None, raising=False)


def _small_snapshot(root: Path) -> Path:
    snap = root / "snap"
    for rel in ("fs/etc/sysctl.d", "fs/proc/sys/kernel"):
        (snap / rel).mkdir(parents=True)
    (snap / "fs/proc/sys/kernel/core_pattern").write_text("core\n")
    (snap / "meta.yaml").write_text("hostname: race\ncaptured: [host]\n")
    return snap


def _victim(arena: Path) -> Path:
    victim = arena / "victim"  # root's, outside every folder nobody controls
    victim.mkdir(mode=0o755)
    return victim


def test_remediate_writes_never_follow_a_swapped_folder(arena: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 1: `nobody` exchanges fs/etc/sysctl.d with a link to a root folder while root writes the
    drop-in (apply) and removes it (rollback), thousands of times."""
    from remediations.targets import SnapshotTarget

    _no_refusal(monkeypatch)
    snap = _small_snapshot(arena)
    victim = _victim(arena)
    etc = snap / "fs/etc"
    os.symlink(victim, etc / "planted")
    uid, gid = nobody()
    os.lchown(etc / "planted", uid, gid)
    _give_to_nobody(snap, snap / "fs", etc, etc / "sysctl.d")
    target = SnapshotTarget(snap)
    writes = 0
    with Swapper("pair", RACE_S, etc / "sysctl.d", etc / "planted") as swapper:
        while swapper.running():
            for data in (PAYLOAD, None):  # apply, then rollback's removal
                try:
                    target.write_file("/etc/sysctl.d/99-nodewarden.conf", data, 0o644)
                    writes += 1
                except OSError:
                    pass  # a refused symlink: the action fails, which is fine
            assert os.listdir(victim) == [], "root wrote through the swapped folder"
    target.close()
    assert swapper.rounds > 1000 and writes > 100  # a race that really ran, both ways
    assert os.listdir(victim) == []


SECRET = b"root's secret\n"


def test_rollback_reads_never_follow_a_swapped_folder(arena: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 1, reads: what remediate records for rollback (a file's bytes, a Redfish settings object's)
    is read relative to the folder its writes use. `nobody` exchanges the folder with a link to a root
    folder holding a secret while root reads, thousands of times: the secret is never read."""
    from remediations.targets import SnapshotTarget

    _no_refusal(monkeypatch)
    snap = _small_snapshot(arena)
    settings = snap / "redfish/v1/Systems/1/Bios/Settings"
    settings.mkdir(parents=True)
    (settings / "index.json").write_bytes(b"{}\n")
    (snap / "fs/etc/sysctl.d/99-nodewarden.conf").write_bytes(b"ours\n")
    victim = _victim(arena)
    (victim / "99-nodewarden.conf").write_bytes(SECRET)
    (victim / "index.json").write_bytes(SECRET)
    uid, gid = nobody()
    _give_to_nobody(snap, snap / "fs", snap / "fs/etc", snap / "fs/etc/sysctl.d", settings.parent, settings)
    target = SnapshotTarget(snap)
    bmc = target.bmc()
    assert bmc is not None
    cases: list[tuple[Path, Callable[[], bytes | None]]] = [
        (snap / "fs/etc/sysctl.d", lambda: target.read("/etc/sysctl.d/99-nodewarden.conf")),
        (settings, lambda: bmc.raw("/redfish/v1/Systems/1/Bios/Settings")),
    ]
    for folder, read in cases:
        planted = folder.parent / "planted"
        os.symlink(victim, planted)
        os.lchown(planted, uid, gid)
        reads = 0
        with Swapper("pair", RACE_S / 2, folder, planted) as swapper:
            while swapper.running():
                with contextlib.suppress(OSError):  # a refused symlink: the action fails, which is fine
                    assert read() != SECRET, f"root read through the swapped {folder.name}"
                    reads += 1
        assert swapper.rounds > 1000 and reads > 100  # a race that really ran
    target.close()


def test_live_rollback_reads_follow_only_links_root_owns(tmp_path: Path) -> None:
    """Item 1, reads on the live root: a link `nobody` owns is not followed, on the way or as the file
    (rollback would record the secret and write it back); root's own, as distributions ship
    `/etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf`, still is."""
    from remediations.targets import LiveTarget

    root = tmp_path / "root"
    (root / "etc/sysctl.d").mkdir(parents=True)
    (root / "etc/sysctl.conf").write_bytes(b"vm.swappiness = 1\n")
    os.symlink("../sysctl.conf", root / "etc/sysctl.d/99-sysctl.conf")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "x.conf").write_bytes(SECRET)
    uid, gid = nobody()
    os.symlink(secret / "x.conf", root / "etc/sysctl.d/x.conf")
    os.symlink(secret, root / "etc/modprobe.d")
    for link in ("etc/sysctl.d/x.conf", "etc/modprobe.d"):
        os.lchown(root / link, uid, gid)
    target = LiveTarget(str(root))
    assert target.read("/etc/sysctl.d/99-sysctl.conf") == b"vm.swappiness = 1\n"
    for path in ("/etc/sysctl.d/x.conf", "/etc/modprobe.d/x.conf"):
        with pytest.raises(OSError, match="symlink"):
            target.read(path)
        with pytest.raises(OSError, match="symlink"):
            target.file_mode(path)


def test_remediate_refuses_a_snapshot_another_user_owns(run_cli: RunCli, drifted_copy: Path, tmp_path: Path,
                                                       empty_config: Path) -> None:
    """Item 1, defence in depth: a target root another user can change is refused before any write."""
    _give_to_nobody(drifted_copy)
    before = (drifted_copy / "fs/proc/sys/net/core/rmem_max").read_text()
    result = run_cli("remediate", "--snapshot", str(drifted_copy), "--state-dir", str(tmp_path / "state"),
                     "--config", str(empty_config), "--apply", "--only", "host.sysctl")
    assert result.code == 2, result.stdout + result.stderr
    assert str(drifted_copy) in result.stderr and "owned by uid" in result.stderr
    assert (drifted_copy / "fs/proc/sys/net/core/rmem_max").read_text() == before


def _race_output(arena: Path, prefix: str, make: Callable[[Path, int], object]) -> tuple[int, int]:
    """Run `make(round)` (a writer of a new output in arena/alice) while `nobody` swaps each new
    temporary folder starting with `prefix` for a link to the victim; (rounds made, swaps made)."""
    alice = arena / "alice"
    alice.mkdir(mode=0o755)
    _give_to_nobody(alice)
    victim = _victim(arena)
    rounds = 0
    with Swapper("prefix", RACE_S, alice, prefix, victim) as swapper:
        while swapper.running():
            with contextlib.suppress(Exception):  # refused or failed: what matters is where it wrote
                make(alice, rounds)
            rounds += 1
            assert os.listdir(victim) == [], f"root wrote into the victim in round {rounds}"
    return rounds, swapper.rounds


def test_capture_out_folder_cannot_be_swapped(arena: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: `snapshot capture --out alice/out` while `nobody` (owner of alice/) swaps the temporary folder."""
    from agent.sources.snapshot import copy_snapshot, open_snapshot

    _no_refusal(monkeypatch)
    source = open_snapshot(_small_snapshot(arena))
    rounds, swaps = _race_output(arena, ".out", lambda alice, n: copy_snapshot(source, alice / f"out{n}"))
    assert rounds > 5 and swaps > 5


def test_archive_out_cannot_be_swapped(arena: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: `snapshot capture --out alice/x.tar.gz`: the work folder beside it is swapped."""
    from agent.sources.importers.archive import capture_archive
    from agent.sources.snapshot import copy_snapshot, open_snapshot

    _no_refusal(monkeypatch)
    source = open_snapshot(_small_snapshot(arena))
    rounds, swaps = _race_output(arena, ".x", lambda alice, n: capture_archive(
        alice / f"x{n}.tar.gz", lambda snap: copy_snapshot(source, snap)))
    assert rounds > 5 and swaps > 5


def test_import_out_folder_cannot_be_swapped(arena: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: `snapshot import --out` fills its folder through agent.io.fsutil's write_output_dir."""
    fsutil = importlib.import_module("agent.io.fsutil")
    fsout = importlib.import_module("agent.io.fsout") if (REPO / "agent/io/fsout.py").exists() else fsutil
    create_file = fsutil.create_file

    def fill(tmp: Path) -> None:
        for i in range(40):
            create_file(tmp, f"fs/etc/cron.d/job{i}", "* * * * * root /tmp/pwn\n")
            time.sleep(0.001)  # an import takes a while

    _no_refusal(monkeypatch)
    rounds, swaps = _race_output(arena, ".imp", lambda alice, n: fsout.write_output_dir(alice / f"imp{n}", fill))
    assert rounds > 5 and swaps > 5


def test_capture_refuses_an_out_parent_another_user_owns(run_cli: RunCli, arena: Path) -> None:
    """Item 2, defence in depth: the parent of --out owned by `nobody` is refused, naming it."""
    alice = arena / "alice"
    alice.mkdir(mode=0o755)
    _give_to_nobody(alice)
    for out in (alice / "out", alice / "out.tar.gz"):
        result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out))
        assert result.code == 2, result.stdout + result.stderr
        assert str(alice) in result.stderr and "owned by uid" in result.stderr
    assert os.listdir(alice) == []


_SLOW_CAPTURE = r"""
import sys, time
from pathlib import Path
from agent.sources.snapshot import copy_snapshot, open_snapshot
import agent.sources.snapshot as snapshot

real = snapshot._copy_inside
def slow(*args):
    real(*args)
    print("filling", flush=True)
    time.sleep(60)  # a capture that is still reading when it is killed
snapshot._copy_inside = slow
copy_snapshot(open_snapshot(Path(sys.argv[1])), Path(sys.argv[2]))
"""


def _start_capture(source: Path, out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CAPTURE, str(source), str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "filling\n", proc.stderr
    return proc


def _leftovers(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith(".out"))


def test_capture_killed_by_sigterm_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """Item 11: SIGTERM in the middle of a capture removes its temporary folder (SIGINT, a
    KeyboardInterrupt, unwinds the same way)."""
    source = _small_snapshot(tmp_path)
    parent = tmp_path / "outs"
    parent.mkdir()
    proc = _start_capture(source, parent / "out")
    assert _leftovers(parent)  # the capture is under way in its temporary folder
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert _leftovers(parent) == [] and not (parent / "out").exists()


def test_capture_after_a_sigkill_removes_the_dead_runs_folder(tmp_path: Path) -> None:
    """Item 11: SIGKILL leaves the folder; the next capture into that parent removes it (its PID is gone)."""
    source = _small_snapshot(tmp_path)
    parent = tmp_path / "outs"
    parent.mkdir()
    proc = _start_capture(source, parent / "out")
    proc.kill()
    proc.communicate(timeout=60)
    left = _leftovers(parent)
    assert left  # SIGKILL cannot be caught
    # The next run judges "made before I started" from 10 ms clock ticks: a kill and a restart
    # within them (this test, not an operator) must not look like one run.
    for name in left:
        os.utime(parent / name, (time.time() - 5, time.time() - 5), follow_symlinks=False)
    foreign = parent / ".out.someone-else"  # not ours by name: never touched
    foreign.mkdir()
    done = subprocess.run([sys.executable, "-m", "agent", "snapshot", "capture", "--snapshot", str(source),
                           "--out", str(parent / "out")], check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _leftovers(parent) == [".out.someone-else"] and (parent / "out/meta.yaml").is_file()


def _old_style(parent: Path, name: str, entries: tuple[str, ...], *, age_s: float = 7200, mode: int = 0o700) -> Path:
    """A private folder as nodewarden made it before issue 21 (tempfile.mkdtemp: `.NAME.` + 8 characters)."""
    folder = parent / name
    folder.mkdir()
    for entry in entries:
        (folder / entry).parent.mkdir(parents=True, exist_ok=True)
        (folder / entry).write_text("x\n")
    for sub in sorted({folder, *(p.parent for p in folder.rglob("*"))}, key=lambda p: -len(p.parts)):
        os.utime(sub, (time.time() - age_s, time.time() - age_s))
    os.chmod(folder, mode)
    return folder


def test_capture_removes_old_style_leftovers_that_are_surely_ours(run_cli: RunCli, tmp_path: Path) -> None:
    """Item 11, before PIDs were in the names: a killed capture's `.out.XXXXXXXX` (and an archive's
    `.x.tar.gz.XXXXXXXX`) older than an hour is removed by the next output into that folder, by
    descriptor; one that is recent, not ours, not 0700, a link, or holds anything else is left alone."""
    parent = tmp_path / "outs"
    parent.mkdir()
    snapshot = ("meta.yaml", "fs/etc/hostname", "fs_links.json")
    gone = [_old_style(parent, ".out.k3j9x_2a", snapshot),
            _old_style(parent, ".x.tar.gz.ab12cd34", ("x/meta.yaml", "x/fs/etc/hostname", "snapshot.tar.gz")),
            _old_style(parent, ".n2.empty0_0", ())]
    kept = [_old_style(parent, ".out.recent12", snapshot, age_s=0),
            _old_style(parent, ".out.notours1", (*snapshot, "secrets.txt")),
            _old_style(parent, ".out.mode0755", snapshot, mode=0o755),
            _old_style(parent, ".out.nobodys1", snapshot)]
    uid, gid = nobody()
    os.chown(kept[-1], uid, gid)
    victim = _old_style(tmp_path, "victim", snapshot)  # what a link in the folder points to: never entered
    link = parent / ".out.linked00"
    os.symlink(victim, link)
    os.utime(link, (time.time() - 7200, time.time() - 7200), follow_symlinks=False)
    result = run_cli("snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(parent / "out"))
    assert result.code == 0, result.stderr
    assert [p.name for p in gone if os.path.lexists(p)] == []
    assert all(p.is_dir() and (p / "meta.yaml").is_file() for p in kept)
    assert link.is_symlink() and (victim / "meta.yaml").is_file() and (victim / "fs/etc/hostname").is_file()
    assert (parent / "out/meta.yaml").is_file()
