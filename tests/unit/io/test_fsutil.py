"""The one writer for paths the user names (agent.io.fsutil.write_output), through the real CLI.

What it must never do as root: replace a device or FIFO with a regular file,
follow a symlink someone else planted, chmod a file by path (a process racing
in a folder it can write would swap in a symlink and root would chmod the
link's target), or create a folder the user mistyped. The race test runs a
real second process as `nobody` in a world-writable (non-sticky) textfile
folder, as node_exporter setups sometimes have.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.io import fsutil
from tests.conftest import REPO, RunCli

NOBODY = 65534
SIMULATED = ("--simulate", "hgx-h100-drifted")
NVSMI_DUMP = REPO / "fixtures" / "nvidia-smi" / "thamada-gls" / "A10.q.txt"


def need_root(why: str) -> None:
    assert os.geteuid() == 0, f"{why} needs root (CI runs as root)"


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder `nobody` can reach (pytest's tmp_path is root-only): /tmp/X (0755)."""
    base = Path(tempfile.mkdtemp(prefix="nw-fsutil-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- devices, FIFOs and stdout are written in place, never replaced ----

def test_audit_output_to_a_character_device_leaves_the_device(run_cli: RunCli, tmp_path: Path) -> None:
    need_root("mknod")
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the same device as /dev/null
    before = null.lstat()
    result = run_cli("audit", *SIMULATED, "--format", "json", "--output", str(null))
    assert result.code == 1, result.stderr  # the drifted node fails; the write itself succeeded
    after = null.lstat()
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left beside it


def test_audit_output_to_a_fifo_reaches_its_reader(run_cli: RunCli, tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    # The reader drains into a file: a report larger than two pipe buffers must not stall the writer.
    with (tmp_path / "received.json").open("wb") as sink:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=sink)
    try:
        result = run_cli("audit", *SIMULATED, "--format", "json", "--output", str(fifo))
        reader.wait(timeout=60)
        received = (tmp_path / "received.json").read_bytes()
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert result.code == 1, result.stderr
    assert json.loads(received)["schema"] == "nodewarden.report/v1"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_dash_and_dev_stdout_mean_stdout(run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("-", "/dev/stdout"):
        result = run_cli("audit", *SIMULATED, "--format", "json", "--output", name)
        assert result.code == 1 and json.loads(result.stdout)["schema"] == "nodewarden.report/v1", name
    assert list(tmp_path.iterdir()) == []  # no file called "-"
    assert os.path.islink("/dev/stdout")


# ---- a regular file: replaced atomically, keeping its mode and owner ----

def test_an_existing_file_keeps_its_mode_and_owner(run_cli: RunCli, tmp_path: Path) -> None:
    need_root("chown to another user")
    out = tmp_path / "nodewarden.prom"
    out.write_text("old\n")
    os.chown(out, NOBODY, NOBODY)
    out.chmod(0o640)
    inode = out.stat().st_ino
    assert run_cli("audit", *SIMULATED, "--format", "prom", "--output", str(out)).code == 1
    st = out.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, NOBODY, NOBODY)
    assert st.st_ino != inode  # replaced by rename, not rewritten in place
    assert out.read_text().startswith("# HELP nodewarden_")


def test_a_new_file_is_0644_whatever_the_umask(run_cli: RunCli, tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        assert run_cli("audit", *SIMULATED, "--format", "prom", "--output", str(tmp_path / "n.prom")).code == 1
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "n.prom").stat().st_mode) == 0o644  # node_exporter must read it


# ---- a folder the user did not make is an error, not a silent mkdir -p ----

@pytest.mark.parametrize("command", ["audit", "fleet", "baseline", "capture", "import"])
def test_a_missing_parent_folder_is_exit_2(run_cli: RunCli, tmp_path: Path, command: str) -> None:
    target = tmp_path / "no-such-folder" / "out"
    if command == "fleet":
        report = tmp_path / "node.json"
        report.write_text(run_cli("audit", *SIMULATED, "--format", "json").stdout)
        args: tuple[str, ...] = ("fleet", "report", str(report), "--format", "json", "--output", str(target))
    else:
        args = {"audit": ("audit", *SIMULATED, "--format", "json", "--output", str(target)),
                "baseline": ("baseline", "record", "--simulate", "hgx-h100-healthy", "--out", str(target)),
                "capture": ("snapshot", "capture", *SIMULATED, "--out", str(target)),
                "import": ("snapshot", "import-nvidia-smi", str(NVSMI_DUMP), "--out", str(target))}[command]
    result = run_cli(*args)
    assert result.code == 2, result.stderr
    assert "no-such-folder does not exist" in result.stderr and "Traceback" not in result.stderr
    assert not target.parent.exists()


# ---- symlinks ----

def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    out = tmp_path / "out.json"
    names = iter([".out.json.planted.tmp", ".out.json.fresh.tmp"])
    (tmp_path / ".out.json.planted.tmp").symlink_to(victim)
    monkeypatch.setattr(fsutil, "_temp_name", lambda name: next(names))
    fsutil.write_output(out, "report\n")
    assert out.read_text() == "report\n" and not out.is_symlink()
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert (tmp_path / ".out.json.planted.tmp").is_symlink()  # not ours: left alone


def test_a_symlink_planted_in_a_folder_others_can_write_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    folder = tmp_path / "textfile"
    folder.mkdir()
    folder.chmod(0o777)  # world-writable, not sticky
    (folder / "nodewarden.prom").symlink_to(victim)
    fsutil.write_output(folder / "nodewarden.prom", "metrics\n")
    assert victim.read_text() == "precious\n"
    assert not (folder / "nodewarden.prom").is_symlink()
    assert (folder / "nodewarden.prom").read_text() == "metrics\n"


def test_a_symlink_the_operator_made_in_a_safe_folder_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "report.json").write_text("old\n")
    (tmp_path / "latest.json").symlink_to("real/report.json")
    fsutil.write_output(tmp_path / "latest.json", "new\n")
    assert (tmp_path / "latest.json").is_symlink()  # the link stays
    assert (real / "report.json").read_text() == "new\n"


# ---- a real attacker: `nobody` racing in a world-writable textfile folder ----

def _race_as_nobody(folder: str, secret: str, seconds: float) -> None:
    """Child: swap every temporary file nodewarden makes for a symlink to `secret`, and chmod it."""
    try:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        deadline = time.monotonic() + seconds
        count = 0
        while time.monotonic() < deadline:
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if not name.startswith(".nodewarden.prom"):
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o666)  # noqa: S103 - the attack; root's file: EPERM
                link = os.path.join(folder, f"link-{count}")
                count += 1
                with contextlib.suppress(OSError):
                    os.symlink(secret, link)
                    os.rename(link, path)  # the folder is not sticky: allowed
    finally:
        os._exit(0)


def test_a_racing_user_cannot_make_roots_files_readable(tmp_path: Path, shared_folder: Path) -> None:
    need_root("running a second process as nobody")
    folder = shared_folder / "textfile"
    folder.mkdir()
    folder.chmod(0o777)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    payload = "# HELP nodewarden_x x\n" + "nodewarden_x 1\n" * 20000
    pid = os.fork()
    if pid == 0:
        _race_as_nobody(str(folder), str(secret), 60)
    swapped = written = 0
    try:
        time.sleep(0.2)
        for _ in range(150):
            try:
                fsutil.write_output(folder / "nodewarden.prom", payload)
                written += 1
            except fsutil.FileSafetyError as exc:
                assert "replaced by another process" in str(exc)
                swapped += 1
            st = secret.stat()
            assert stat.S_IMODE(st.st_mode) == 0o600 and secret.read_text() == "root only\n"
            out = (folder / "nodewarden.prom").lstat()
            if stat.S_ISREG(out.st_mode) and out.st_uid == 0:
                assert stat.S_IMODE(out.st_mode) == 0o644  # never the racer's 0666
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert written + swapped == 150


# ---- a reader that goes away ----

def test_a_closed_pipe_on_stdout_exits_quietly() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "agent", "audit", *SIMULATED, "--format", "json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -c1` once head has gone
    _, err = proc.communicate(timeout=120)
    assert err == b"", err.decode()
    assert proc.returncode == 141  # 128 + SIGPIPE, what a shell shows for a writer whose reader left


# --- create_file: every file of a snapshot being captured or imported -------------------------------


def test_create_file_writes_parts_and_folders_inside_its_root(tmp_path: Path) -> None:
    fsutil.create_file(tmp_path, "fs/sys/class/net/eth0/mtu", b"9000\n")
    fsutil.create_file(tmp_path, "kmsg.txt", iter([b"a\n", b"b\n"]))
    fsutil.create_file(tmp_path, "meta.yaml", "captured: [host]\n")
    assert (tmp_path / "fs/sys/class/net/eth0/mtu").read_bytes() == b"9000\n"
    assert (tmp_path / "kmsg.txt").read_bytes() == b"a\nb\n"
    assert stat.S_IMODE((tmp_path / "meta.yaml").stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("rel", ["../escape", "fs/../../escape", "/etc/passwd", "", "fs//x", "fs/./x", "a\x00b"])
def test_create_file_refuses_a_path_out_of_its_root(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "snap"
    root.mkdir()
    with pytest.raises(fsutil.FileSafetyError, match="not a plain relative path"):
        fsutil.create_file(root, rel, b"x")
    assert not (tmp_path / "escape").exists() and sorted(os.listdir(root)) == []


def test_create_file_never_writes_through_a_link_or_over_a_file(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep")
    root = tmp_path / "snap"
    root.mkdir()
    (root / "nvml.json").symlink_to(outside)
    (root / "meta.yaml").write_text("first")
    for name in ("nvml.json", "meta.yaml"):
        with pytest.raises(FileExistsError):
            fsutil.create_file(root, name, b"second")
    assert outside.read_text() == "keep" and (root / "meta.yaml").read_text() == "first"
