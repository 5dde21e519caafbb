"""Issue 36.1: an archive that does not read to its end is refused, never audited or imported in part.

A capture cut short (a failed upload, a partial `scp`) used to be audited from what happened to unpack
(DRAIN from `unknown`s, "unknown model") and imported with exit 0. Every format nodewarden reads
(tar, tar.gz, tar.xz, tar.bz2, zip, and single gz/xz/bz2 files) is cut at many offsets here, through
the real CLI: `snapshot import` exits 2 naming the input and where it broke, and writes nothing;
`audit --snapshot` exits 2 and prints no report.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import shutil
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
MEMBERS = {  # real captures, as a support bundle holds them
    "bundle/lspci-vvv.txt": F / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt",
    "bundle/dmidecode.txt": F / "sources" / "gpud-dell-xe9680" / "dmidecode.txt",
    "bundle/nvidia-smi-q.txt": F / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt",
    "bundle/dmesg.log": F / "kmsg" / "dmesg.decode.iso.log.0",
}
GOOD = F / "kmsg" / "kmsg.1.log"  # a whole input beside the cut one


def _tar(files: dict[str, bytes], mode: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


FORMATS: dict[str, Callable[[dict[str, bytes]], bytes]] = {
    "tar": lambda files: _tar(files, "w"),
    "tar.gz": lambda files: _tar(files, "w:gz"),
    "tar.xz": lambda files: _tar(files, "w:xz"),
    "tar.bz2": lambda files: _tar(files, "w:bz2"),
    "zip": _zip,
    "gz": lambda files: gzip.compress(files["bundle/dmesg.log"]),
    "xz": lambda files: lzma.compress(files["bundle/dmesg.log"]),
    "bz2": lambda files: bz2.compress(files["bundle/dmesg.log"]),
}
# Kinds are read by content: a piece shorter than the longest magic (xz's 6 bytes; a plain tar's "ustar"
# ends at byte 262) is not an archive at all but a file of no kind, skipped as such.
MAGIC_BYTES = 6
TAR_MAGIC_BYTES = 262


def cuts(size: int, tar_blocks: bool) -> list[int]:
    """Offsets spread over the whole file; for a plain tar, also 512-byte boundaries (where tarfile stops quietly)."""
    offsets = {MAGIC_BYTES, 10, 100, 263, 511, 512, 1024, 4096, size - 1}
    offsets |= {size * part // 20 for part in range(1, 20)}
    if tar_blocks:
        offsets |= {(size * part // 7) // 512 * 512 for part in range(1, 7)}
    shortest = TAR_MAGIC_BYTES if tar_blocks else MAGIC_BYTES
    return sorted(o for o in offsets if shortest <= o < size)


def bundle_files() -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in MEMBERS.items()}


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_import_refuses_an_archive_cut_anywhere_and_writes_nothing(kind: str, tmp_path: Path,
                                                                   run_cli: RunCli) -> None:
    whole = FORMATS[kind](bundle_files())
    source = tmp_path / f"bundle.{kind}"
    source.write_bytes(whole)
    out = tmp_path / "whole"
    result = run_cli("snapshot", "import", str(source), "--out", str(out))
    assert result.code == 0, result.stderr  # the archive as it was made imports
    assert "kmsg" in yaml.safe_load((out / "meta.yaml").read_text())["captured"]
    offsets = cuts(len(whole), kind == "tar")
    assert len(offsets) >= 20
    for offset in offsets:
        cut = tmp_path / f"cut-{offset}.{kind}"
        cut.write_bytes(whole[:offset])
        out = tmp_path / f"snap-{offset}"
        result = run_cli("snapshot", "import", str(cut), str(GOOD), "--out", str(out))
        assert result.code == 2, (offset, result.stderr)
        assert f"nothing written: {cut}" in result.stderr, (offset, result.stderr)
        assert "byte " in result.stderr and "never imported in part" in result.stderr, (offset, result.stderr)
        assert not out.exists(), offset
        assert "Traceback" not in result.stderr


def test_a_tar_cut_at_a_block_boundary_names_the_member_it_reached(tmp_path: Path, run_cli: RunCli) -> None:
    files = bundle_files()
    whole = FORMATS["tar"](files)
    first = len(files["bundle/lspci-vvv.txt"])
    boundary = 512 + (first + 511) // 512 * 512  # just past the first member: tarfile alone ends quietly here
    cut = tmp_path / "bundle.tar"
    cut.write_bytes(whole[:boundary])
    with tarfile.open(cut) as plain:  # what the standard library makes of it: one member, no error
        assert [m.name for m in plain.getmembers()] == ["bundle/lspci-vvv.txt"]
    result = run_cli("snapshot", "import", str(cut), "--out", str(tmp_path / "snap"))
    assert result.code == 2
    assert "the tar data ends without its end-of-archive blocks" in result.stderr
    assert f"at its end, byte {boundary}" in result.stderr and "'bundle/lspci-vvv.txt'" in result.stderr


def _small_snapshot(tmp_path: Path) -> Path:
    """A real snapshot's BMC, GPU and kernel parts (its 40 MB fs/ left out, and off `captured`)."""
    snap = tmp_path / "node"
    source = F / "nodes" / "hgx-h100-healthy"
    shutil.copytree(source / "redfish", snap / "redfish")
    for name in ("nvml.json", "kmsg.txt", "baseline.json"):
        shutil.copy(source / name, snap / name)
    meta = yaml.safe_load((source / "meta.yaml").read_text())
    meta["captured"] = [part for part in meta["captured"] if part != "host"]
    (snap / "meta.yaml").write_text(yaml.safe_dump(meta))
    return snap


@pytest.mark.parametrize("mode", ["w:gz", "w"], ids=["tar.gz", "plain tar named .tar.gz"])
def test_audit_refuses_a_snapshot_archive_cut_anywhere(mode: str, tmp_path: Path, run_cli: RunCli) -> None:
    snap = _small_snapshot(tmp_path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:  # type: ignore[call-overload]
        archive.add(snap, arcname="node")
    whole = buffer.getvalue()
    path = tmp_path / "node.tar.gz"
    path.write_bytes(whole)
    result = run_cli("audit", "--snapshot", str(path), "--format", "json")
    assert result.code in (0, 1), result.stderr  # whole, it audits
    assert result.json()["findings"]  # judged: the BMC, GPU and kernel parts are there
    for offset in cuts(len(whole), mode == "w"):
        path.write_bytes(whole[:offset])
        result = run_cli("audit", "--snapshot", str(path), "--format", "json")
        assert result.code == 2, (offset, result.stderr[-500:])
        assert result.stdout == "", offset  # no report from half an archive
        assert f"{path}: " in result.stderr and ("refused" in result.stderr or "not a snapshot" in result.stderr)
        assert "Traceback" not in result.stderr
