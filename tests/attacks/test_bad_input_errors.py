"""Bad input and a failing machine end in one clear line and exit 2 (input) or 1 (environment), never
exit 3 ("internal error") and never a hang (issue 21 item 10).

Each case runs the real `nodewarden` as a process: a Redfish id of 300 characters from a hostile BMC
(tests/peers/hostile_redfish.py), a full disk (a 1 MiB tmpfs), `--redact` over JSON nested 200,000
deep, and a FIFO named as an nvidia-smi dump.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.errors import SnapshotError
from tests.peers.hostile_redfish import hostile_bmc

REPO = Path(__file__).resolve().parents[2]


def nodewarden(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _snapshot(root: Path) -> Path:
    """A minimal recorded node: meta.yaml, fs/, a Redfish root."""
    (root / "fs").mkdir(parents=True)
    (root / "redfish" / "v1").mkdir(parents=True)
    (root / "meta.yaml").write_text('hostname: n1\ncaptured_at: "2026-01-01T00:00:00+00:00"\n'
                                    "captured: [host, redfish]\n")
    return root


def test_a_300_character_redfish_id_is_refused_and_the_capture_completes(tmp_path: Path) -> None:
    long_id = "/redfish/v1/Chassis/" + "A" * 300  # a file name longer than NAME_MAX once recorded
    chassis = {"@odata.id": "/redfish/v1/Chassis", "@odata.type": "#ChassisCollection.ChassisCollection",
               "Members": [{"@odata.id": long_id}], "Members@odata.count": 1}
    resources = {"/redfish/v1/Chassis": chassis,
                 long_id: {"@odata.id": long_id, "@odata.type": "#Chassis.v1_14_0.Chassis", "Id": "A" * 300}}
    password = tmp_path / "password"
    password.write_text("pw\n")
    password.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text("bmc:\n  deadline_s: 4\n  timeout_s: 2\n")
    out = tmp_path / "snap"
    with hostile_bmc("normal", resources=resources) as bmc:
        result = nodewarden("snapshot", "capture", "--config", str(config), "--bmc", bmc.url, "--bmc-user", "m",
                            "--bmc-password-file", str(password), "--out", str(out))
        asked = bmc.paths()
    assert result.returncode == 0, result.stderr[-2000:]
    assert "internal error" not in result.stderr
    assert (out / "redfish" / "v1" / "Chassis" / "index.json").is_file()
    assert os.listdir(out / "redfish" / "v1" / "Chassis") == ["index.json"]
    assert long_id not in asked  # refused before it was requested, as any unexpected path


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (the tests run as root), unmounted afterwards: smaller than even the compressed capture."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("name", ["snap", "snap.tar.gz"])
def test_a_full_disk_during_capture_is_exit_1_with_a_clear_message(full_disk: Path, name: str) -> None:
    result = nodewarden("snapshot", "capture", "--simulate", "hgx-h100-healthy", "--out", str(full_disk / name))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "No space left on device" in result.stderr
    assert "internal error" not in result.stderr
    assert os.listdir(full_disk) == []  # nothing published, nothing half-written left


def test_a_full_tmpdir_while_unpacking_a_snapshot_archive_is_exit_1(full_disk: Path, tmp_path: Path) -> None:
    archive = tmp_path / "node.tar.gz"
    made = nodewarden("snapshot", "capture", "--simulate", "hgx-h100-healthy", "--out", str(archive))
    assert made.returncode == 0, made.stderr[-2000:]
    result = subprocess.run([sys.executable, "-m", "agent", "audit", "--snapshot", str(archive), "--format", "json"],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "TMPDIR": str(full_disk)})
    assert result.returncode == 1, result.stderr[-2000:]
    assert "No space left on device" in result.stderr
    assert "internal error" not in result.stderr
    assert os.listdir(full_disk) == []  # the partial unpacking is removed at exit


def test_redact_over_json_nested_200000_deep_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "snap")
    (snap / "redfish" / "v1" / "index.json").write_text(
        '{"SerialNumber": "SN-SECRET-1", "Oem": ' + "[" * 200_000 + "]" * 200_000 + "}")
    out = tmp_path / "out.tar.gz"
    result = nodewarden("snapshot", "capture", "--snapshot", str(snap), "--out", str(out), "--redact", "serials")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "redfish/v1/index.json" in result.stderr
    assert "cannot redact" in result.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]


def test_redact_still_finds_serials_in_json_of_normal_depth(tmp_path: Path) -> None:
    """The iterative walk keeps what the recursive one found: a serial 50 levels down is replaced."""
    from agent.sources.importers.archive import redact_tree

    snap = _snapshot(tmp_path / "snap")
    body = '{"SerialNumber": "SN-TOP-0001", "a": ' + '{"b": ' * 50 + '{"SerialNumber": "SN-DEEP-0002"}' + "}" * 50 + "}"
    index = snap / "redfish" / "v1" / "index.json"
    index.write_text(body)
    (snap / "redfish" / "v1" / "deep.json").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(SnapshotError, match="nested deeper than 64"):
        redact_tree(snap, ("serials",))
    (snap / "redfish" / "v1" / "deep.json").unlink()
    redact_tree(snap, ("serials",))
    text = index.read_text()
    assert "SN-TOP-0001" not in text
    assert "SN-DEEP-0002" not in text


def test_import_nvidia_smi_of_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "dump.txt"
    os.mkfifo(fifo)  # no writer ever opens it: a blocking open for reading would wait for ever
    result = nodewarden("snapshot", "import-nvidia-smi", str(fifo), "--out", str(tmp_path / "out"), timeout=20)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "not a regular file" in result.stderr
    assert not (tmp_path / "out").exists()
