"""`snapshot import` streams large inputs (issue 15): bounded memory, the kernel log's last records, caps kept.

Files larger than inputs.STREAM_ABOVE reach their importer as a stream (`Entry.content`); kernel logs
and bug reports read it line by line (`contribute_lines`), other importers still get bytes.
benchmarks/bench_import.py measures whole processes at 50 and 500 MB.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core.errors import SnapshotError
from agent.sources.importers import bundle
from agent.sources.importers.base import MAX_KMSG_LINES, Builder, Contribution, run_importer
from agent.sources.importers.bug_report import SEPARATOR
from agent.sources.importers.bundle import import_inputs
from agent.sources.importers.inputs import Budget, Content
from agent.sources.importers.kernel_log import KernelLogImporter
from tests.conftest import REPO

NVSMI = REPO / "fixtures" / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"


def _dmesg(lines: int) -> bytes:
    """`dmesg` lines, every one different (the importer drops exact repeats)."""
    return "".join(f"[{i // 1000:6d}.{i % 1000:06d}] NVRM: Xid 13 n{i}\n" for i in range(lines)).encode()


def _bug_report(kernel_log: bytes) -> bytes:
    def section(header: str, body: bytes) -> bytes:
        return gzip.compress(f"{SEPARATOR}\n\n{header}\n\n".encode() + body + b"\n", 1)

    prologue = f"{SEPARATOR}\n\nStart of NVIDIA bug report log file.  Please include this file\n\n".encode()
    return (gzip.compress(prologue, 1) + section("dmesg:", kernel_log)
            + section("/usr/bin/nvidia-smi --query", NVSMI.read_bytes()))


def _meta(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((out / "meta.yaml").read_text())
    return loaded


def test_a_large_bug_report_is_imported_in_bounded_memory(tmp_path: Path) -> None:
    log = _dmesg(600_000)  # ~24 MB: the old importer held it ~4 times over (bytes, text, lines, sections)
    (tmp_path / "nvidia-bug-report.log.gz").write_bytes(_bug_report(log))
    last = log.decode().splitlines()[-1]
    del log
    tracemalloc.start()
    try:
        summary = import_inputs([tmp_path / "nvidia-bug-report.log.gz"], tmp_path / "snap")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.captured == ["kmsg", "nvml"]
    kept = (tmp_path / "snap" / "kmsg.txt").read_text().splitlines()
    assert len(kept) == MAX_KMSG_LINES and kept[-1] == last  # the newest records, not the oldest
    report = next(e for e in _meta(tmp_path / "snap")["inputs"] if e["kind"] == "nvidia-bug-report")
    assert any("400000 older record(s)" in s for s in report["skipped"])
    assert peak < 64 << 20, peak >> 20


@pytest.fixture
def small_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream every file larger than 64 KiB, so small inputs take the streamed path."""
    monkeypatch.setattr(bundle, "STREAM_ABOVE", 64 << 10)


def _import(paths: list[Path], out: Path, budget: Budget | None = None) -> dict[str, Any]:
    import_inputs(paths, out, budget=budget)
    return _meta(out)


def test_streamed_and_whole_give_the_same_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _dmesg(20_000)
    (tmp_path / "dmesg.log").write_bytes(log)
    (tmp_path / "nvidia-bug-report.log.gz").write_bytes(_bug_report(log[:400_000]))
    with tarfile.open(tmp_path / "bundle.tar.gz", "w:gz") as archive:
        info = tarfile.TarInfo("var/log/dmesg")
        info.size = len(log)
        archive.addfile(info, io.BytesIO(log))
    snapshots = {}
    for streamed in (False, True):
        monkeypatch.setattr(bundle, "STREAM_ABOVE", 64 << 10 if streamed else 1 << 30)
        for name in ("dmesg.log", "nvidia-bug-report.log.gz", "bundle.tar.gz"):
            out = tmp_path / f"{name}-{streamed}"
            meta = _import([tmp_path / name], out)
            snapshots[name, streamed] = ((out / "kmsg.txt").read_text(),
                                         [(e["name"], e["size"], e["sha256"], e["contributed"], e.get("skipped"))
                                          for e in meta["inputs"]])
    for name in ("dmesg.log", "nvidia-bug-report.log.gz", "bundle.tar.gz"):
        assert snapshots[name, True] == snapshots[name, False], name
    sizes = {e[0].rsplit(":", 1)[-1]: (e[1], e[2]) for e in snapshots["bundle.tar.gz", True][1]}
    assert sizes["var/log/dmesg"] == (len(log), hashlib.sha256(log).hexdigest())


def test_kernel_log_importer_reads_lines_when_streamed(tmp_path: Path, small_stream: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def whole(self: KernelLogImporter, data: bytes, builder: Builder) -> Contribution:
        raise AssertionError("a large kernel log must not be handed over whole")

    monkeypatch.setattr(KernelLogImporter, "contribute", whole)
    (tmp_path / "dmesg.log.gz").write_bytes(gzip.compress(_dmesg(20_000), 1))
    meta = _import([tmp_path / "dmesg.log.gz"], tmp_path / "snap")
    assert meta["captured"] == ["kmsg"]
    assert (tmp_path / "snap" / "kmsg.txt").read_text().count("\n") == 20_000


def test_an_importer_of_whole_inputs_still_gets_bytes() -> None:
    seen: list[type] = []

    class Whole:
        kind = "whole"

        def detect(self, head: bytes, name: str) -> bool:
            return True

        def contribute(self, data: bytes, builder: Builder) -> Contribution:
            seen.append(type(data))
            return Contribution(contributed=[f"{len(data)} bytes"])

    content = Content(b"abc" * 100, io.BytesIO(b"def" * 100), limit=1 << 20, what="x")
    result = run_importer(Whole(), content, Builder(), "x")
    assert seen == [bytes] and result.contributed == ["600 bytes"]
    assert content.finish() == hashlib.sha256(b"abc" * 100 + b"def" * 100).hexdigest()


def test_a_streamed_file_past_the_member_cap_is_refused(tmp_path: Path, small_stream: None) -> None:
    (tmp_path / "dmesg.log.gz").write_bytes(gzip.compress(_dmesg(100_000), 1))  # ~4 MB uncompressed
    (tmp_path / "nvidia-smi.txt").write_bytes(NVSMI.read_bytes())
    meta = _import([tmp_path / "dmesg.log.gz", tmp_path / "nvidia-smi.txt"], tmp_path / "snap",
                   budget=Budget(member=1 << 20))
    assert meta["captured"] == ["nvml"]  # nothing of the refused log
    archive = meta["inputs"][0]
    assert "more than 1 MiB" in archive["error"] and "not read further" in archive["error"]


def test_a_streamed_plain_file_past_the_total_cap_stops_the_rest(tmp_path: Path, small_stream: None) -> None:
    (tmp_path / "dmesg.log").write_bytes(_dmesg(100_000))
    (tmp_path / "nvidia-smi.txt").write_bytes(NVSMI.read_bytes())
    with pytest.raises(Exception, match="nothing to import"):
        import_inputs([tmp_path / "dmesg.log", tmp_path / "nvidia-smi.txt"], tmp_path / "snap",
                      budget=Budget(total=1 << 20))


def test_a_corrupt_streamed_gzip_is_an_error_of_the_archive(tmp_path: Path, small_stream: None) -> None:
    whole = gzip.compress(_dmesg(100_000), 1)
    (tmp_path / "dmesg.log.gz").write_bytes(whole[:len(whole) // 2])  # truncated
    (tmp_path / "nvidia-smi.txt").write_bytes(NVSMI.read_bytes())
    with pytest.raises(SnapshotError, match=r"nothing written: .*dmesg\.log\.gz: corrupt or truncated gz archive"):
        import_inputs([tmp_path / "dmesg.log.gz", tmp_path / "nvidia-smi.txt"], tmp_path / "snap")
    assert not (tmp_path / "snap").exists()  # issue 36.1: never imported in part


def test_section_reader_splits_as_split_sections() -> None:
    from agent.sources.importers.base import text_lines
    from agent.sources.importers.bug_report import SectionReader, split_sections

    atoms = [SEPARATOR, "\n", "\n", "\n", "*** /proc/cmdline", "*** ls: x", "dmesg:", " ", "abc", "\r\n", "\r"]
    rng = random.Random(15)  # noqa: S311  # test data, not secrets
    for _ in range(3000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 30)))
        reader = SectionReader(text_lines(io.BytesIO(text.encode())))
        got = [(header, "".join(reader.body())) for header in reader.sections()]
        assert got == split_sections(text.replace("\r\n", "\n")), repr(text)


def test_a_large_sos_report_is_imported_in_bounded_memory(tmp_path: Path) -> None:
    """A sos report is big because of files it does not use (logs, journals) and a long dmesg: the
    first are never read, the dmesg is held as its newest lines only (the old importer read each member
    whole, twice over for a moment, and held the dmesg whole until every input was read)."""
    import shutil

    tree = tmp_path / "sosreport-gpu-node-07-2024-11-05-qxbzkta"
    shutil.copytree(REPO / "fixtures" / "sosreport" / tree.name, tree)
    log = _dmesg(600_000)  # ~24 MB
    (tree / "sos_commands" / "kernel" / "dmesg").write_bytes(log)
    (tree / "var" / "log").mkdir(parents=True, exist_ok=True)
    (tree / "var" / "log" / "messages").write_bytes(b"Dec  1 10:00:00 node kernel: filler\n" * 700_000)  # ~25 MB
    archive = tmp_path / "sos.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(tree, arcname=tree.name)
    shutil.rmtree(tree)
    last = log.decode().splitlines()[-1]
    del log
    tracemalloc.start()
    try:
        summary = import_inputs([archive], tmp_path / "snap")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "kmsg" in summary.captured
    kept = (tmp_path / "snap" / "kmsg.txt").read_text().splitlines()
    assert len(kept) == MAX_KMSG_LINES and kept[-1] == last
    assert peak < 64 << 20, peak >> 20
