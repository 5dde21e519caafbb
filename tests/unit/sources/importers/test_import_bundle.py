"""`snapshot import INPUT... --out DIR` (issue 15): real captures from fixtures/ (see each folder's SOURCES.md),
alone and together, into one snapshot that `audit --snapshot` runs on; hostile archives refused by name."""

from __future__ import annotations

import gzip
import io
import json
import posixpath
import tarfile
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
import yaml

from agent.sources.importers.bug_report import SEPARATOR
from agent.sources.importers.bundle import import_inputs
from agent.sources.importers.inputs import Budget
from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
XE9680 = F / "sources" / "gpud-dell-xe9680"
REAL = {
    "lspci": XE9680 / "lspci-vvv.txt",
    "dmidecode": XE9680 / "dmidecode.txt",
    "lspci-nn": F / "real" / "linux" / "gpud-misc" / "lspci.nn.a100.txt",
    "lspci-gb200": F / "real" / "linux" / "gpud-misc" / "lspci.gb200.txt",
    "nvidia-smi": F / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt",
    "nvidia-smi-xml": F / "nvidia-smi" / "telegraf" / "a100-sxm4-v12.xml",
    "dmesg-iso": F / "kmsg" / "dmesg.decode.iso.log.0",
    "dmesg-ctime": F / "kmsg" / "dmesg.ctime.boot.a10-535.129.03.log",
    "kmsg": F / "kmsg" / "kmsg.1.log",
    "journalctl": F / "kmsg" / "journalctl-short-iso.a800.log",
}
KINDS = {"lspci": "lspci", "dmidecode": "dmidecode", "lspci-nn": "lspci", "lspci-gb200": "lspci",
         "nvidia-smi": "nvidia-smi", "nvidia-smi-xml": "nvidia-smi", "dmesg-iso": "kernel-log",
         "dmesg-ctime": "kernel-log", "kmsg": "kernel-log", "journalctl": "kernel-log"}


def _meta(out: Path) -> dict:
    return yaml.safe_load((out / "meta.yaml").read_text())


def _audit(run_cli: RunCli, out: Path) -> dict:
    result = run_cli("audit", "--snapshot", str(out), "--format", "json")
    assert result.code in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_real_capture_imports_alone_and_audits(name: str, tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(REAL[name]), "--out", str(out))
    assert result.code == 0, result.stderr
    entry, = _meta(out)["inputs"]
    assert entry["kind"] == KINDS[name] and entry["contributed"] and "error" not in entry
    assert entry["sha256"] and entry["size"] == REAL[name].stat().st_size
    report = _audit(run_cli, out)
    assert report["node"]["snapshot"]["path"] == str(out)


def test_several_together_make_one_snapshot(tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "snap"
    names = ("lspci", "dmidecode", "nvidia-smi", "dmesg-iso")
    result = run_cli("snapshot", "import", *(str(REAL[n]) for n in names), "--out", str(out))
    assert result.code == 0, result.stderr
    meta = _meta(out)
    assert meta["captured"] == ["host", "kmsg", "nvml"]
    assert [e["kind"] for e in meta["inputs"]] == [KINDS[n] for n in names]
    dmi = out / "fs" / "sys" / "class" / "dmi" / "id"
    assert (dmi / "product_name").read_text() == "PowerEdge XE9680\n"
    links = json.loads((out / "fs_links.json").read_text())
    link = "sys/bus/pci/devices/0000:19:00.0"  # the H100 at 19:00.0, Gen5 x16 as lspci showed it
    gpu = out / "fs" / posixpath.normpath(posixpath.join(posixpath.dirname(link), links[link]))
    assert (gpu / "current_link_width").read_text() == "16\n" and (gpu / "vendor").read_text() == "0x10de\n"
    report = _audit(run_cli, out)
    assert report["node"]["model"] == "Dell Inc. PowerEdge XE9680"
    assert report["node"]["gpus"]["pci_count"] == 8
    assert report["sources"]["nvml"]["ok"] and report["sources"]["kmsg"]["ok"]
    assert any(f["check"] == "gpu.xid" and f["status"] != "pass" for f in report["findings"])


def test_lspci_facts_match_the_simulated_node() -> None:
    """The importer writes the very files build_nodes.py writes for the simulated XE9680 (same parser)."""
    from agent.sources.importers.base import Builder, Contribution
    from agent.sources.importers.lspci import LspciImporter

    builder = Builder()
    LspciImporter().contribute(REAL["lspci"].read_bytes(), builder)
    node = F / "nodes" / "hgx-h100-healthy" / "fs"
    checked = 0
    for rel, data in builder.fs.items():
        if rel.endswith(("/current_link_speed", "/max_link_width", "/numa_node", "/class")) and (node / rel).is_file():
            checked += 1
            assert (node / rel).read_bytes() == data, rel
    assert checked > 300
    assert Contribution  # the interface's result type is public


def test_as_forces_a_kind(tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", "--as", f"dmidecode={REAL['lspci']}", "--out", str(out))
    assert result.code == 2  # forced to the wrong kind: nothing to import, named
    assert "nothing to import" in result.stderr
    result = run_cli("snapshot", "import", str(REAL["kmsg"]), "--as", "no-such-kind=x", "--out", str(out))
    assert result.code == 2 and "unknown kind" in result.stderr


def test_alias_import_nvidia_smi_still_works(tmp_path: Path, run_cli: RunCli) -> None:
    result = run_cli("snapshot", "import-nvidia-smi", str(REAL["nvidia-smi"]), "--out", str(tmp_path / "s"))
    assert result.code == 0, result.stderr


# --- nvidia-bug-report.log.gz ---------------------------------------------------------------------------


def _section(header: str, body: str, *, file: bool = False) -> bytes:
    """One section as nvidia-bug-report.sh writes it (append / append_command), gzip'd on its own."""
    lines = [SEPARATOR, "", header]
    if file:
        lines.append(f"*** ls: -r--r--r-- 1 root root 0 2024-07-31 11:22:39.000000000 +0000 {header[4:]}")
        lines.append(body.rstrip("\n"))
    else:
        lines += ["", body.rstrip("\n")]
    return gzip.compress(("\n".join(lines) + "\n\n").encode())


def test_bug_report_round_trips(tmp_path: Path, run_cli: RunCli) -> None:
    prologue = (f"{SEPARATOR}\n\nStart of NVIDIA bug report log file.  Please include this file, along\n"
                "with a detailed description of your problem, when reporting a graphics\ndriver bug via the "
                "NVIDIA Linux forum (see devtalk.nvidia.com)\nor by sending email to 'linux-bugs@nvidia.com'.\n\n"
                "nvidia-bug-report.sh Version: 34097112\n\nDate: Wed Jul 31 11:22:39 UTC 2024\n\n")
    report = (gzip.compress(prologue.encode())
              + _section("*** /etc/issue", "Ubuntu 22.04.4 LTS \\n \\l\n", file=True)
              + _section("*** /proc/cmdline", "BOOT_IMAGE=/vmlinuz-5.15.0-119-generic ro iommu=pt\n", file=True)
              + _section("/usr/bin/lspci -nnDvvvxxxx", REAL["lspci"].read_text())
              + _section("/usr/sbin/dmidecode", REAL["dmidecode"].read_text())
              + _section("dmesg:", REAL["dmesg-iso"].read_text())
              + _section("/usr/bin/nvidia-smi --query", REAL["nvidia-smi"].read_text())
              + _section("xset -q:", "xset:  unable to open display \"\"\n"))
    path = tmp_path / "nvidia-bug-report.log.gz"
    path.write_bytes(report)
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(path), "--out", str(out))
    assert result.code == 0, result.stderr
    meta = _meta(out)
    assert meta["captured"] == ["host", "kmsg", "nvml"]
    inner = next(e for e in meta["inputs"] if e["kind"] == "nvidia-bug-report")
    assert any("section '/usr/bin/nvidia-smi --query'" in c for c in inner["contributed"])
    assert any("not used" in s and "/etc/issue" in s and "xset -q:" in s for s in inner["skipped"])
    assert (out / "fs" / "proc" / "cmdline").read_text().endswith("iommu=pt\n")
    assert (out / "kmsg.txt").read_text().splitlines()[0] == REAL["dmesg-iso"].read_text().splitlines()[0]
    assert json.loads((out / "nvml.json").read_text())["system"]["nvmlDeviceGetCount"] == 8
    _audit(run_cli, out)


# --- hostile and broken inputs ---------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def test_hostile_tar_members_refused_by_name(tmp_path: Path) -> None:
    link = tarfile.TarInfo("kmsg.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    dev = tarfile.TarInfo("dev/sda")
    dev.type = tarfile.BLKTYPE
    good = REAL["kmsg"].read_bytes()
    archive = _tar(tmp_path / "bundle.tar.gz", [_file("../../escape.txt", good), (link, None), (dev, None),
                                               _file("/abs/kmsg.log", good), _file("logs/kmsg.log", good)])
    out = tmp_path / "snap"
    summary = import_inputs([archive], out)
    errors = {e.name.split(":", 1)[1]: e.error for e in summary.entries if e.error}
    assert "'..'" in errors["../../escape.txt"] and "absolute" in errors["/abs/kmsg.log"]
    assert "symlink" in errors["kmsg.txt"] and "/etc/shadow" in errors["kmsg.txt"]
    assert "device" in errors["dev/sda"]
    assert summary.captured == ["kmsg"]
    assert not (tmp_path / "escape.txt").exists() and not (out / "kmsg.txt").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["inputs.jsonl", "kmsg.txt", "meta.yaml"]


def _zero_gzip(total: int) -> bytes:
    """`total` zero bytes as gzip, built from one full-flushed block repeated (so it costs no CPU)."""
    block = 16 << 20
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = comp.compress(bytes(block)) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(bytes(block)) + comp.flush(zlib.Z_FULL_FLUSH)
    return first + again * (total // block - 1) + comp.flush()


def test_ten_gigabyte_members_stop_at_the_cap_quickly(tmp_path: Path) -> None:
    big = tarfile.TarInfo("huge.log")
    big.size = 10 << 30
    header = big.tobuf(tarfile.GNU_FORMAT)
    (tmp_path / "sparse.tar.gz").write_bytes(gzip.compress(header + bytes(1 << 20)))  # honest header, cut short
    (tmp_path / "zeros.log.gz").write_bytes(_zero_gzip(10 << 30))
    text_bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    (tmp_path / "text.log.gz").write_bytes(text_bomb.compress(b"a" * (80 << 20)) + text_bomb.flush())
    good = tmp_path / "kmsg.log"
    good.write_bytes(REAL["kmsg"].read_bytes())
    tracemalloc.start()
    started = time.monotonic()
    summary = import_inputs([tmp_path / "sparse.tar.gz", tmp_path / "zeros.log.gz", tmp_path / "text.log.gz", good],
                            tmp_path / "snap", budget=Budget(member=64 << 20))
    elapsed = time.monotonic() - started
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    by_name = {e.name: e for e in summary.entries}
    assert "declares 10 GiB" in (by_name[f"{tmp_path}/sparse.tar.gz:huge.log"].error or "")
    assert "not read further" in (by_name[f"{tmp_path}/zeros.log.gz"].error or "")
    assert "more than 64 MiB" in (by_name[f"{tmp_path}/text.log.gz"].error or "")
    assert summary.captured == ["kmsg"]
    assert elapsed < 20 and peak < 200 << 20, (elapsed, peak)


def test_hundred_thousand_members_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for index in range(100_001):
            archive.writestr(f"f{index}", b"")
    good = tmp_path / "kmsg.log"
    good.write_bytes(REAL["kmsg"].read_bytes())
    started = time.monotonic()
    summary = import_inputs([path, good], tmp_path / "snap")
    assert time.monotonic() - started < 20
    archive_entry = summary.entries[0]
    assert archive_entry.name == str(path) and "100001 members" in (archive_entry.error or "")
    assert summary.captured == ["kmsg"]


def test_corrupt_gzip_next_to_a_good_file_writes_nothing(tmp_path: Path, run_cli: RunCli) -> None:
    # Issue 36.1: a truncated input is exit 2 with nothing written; left out, the rest imports.
    bad = tmp_path / "dmesg.log.gz"
    bad.write_bytes(gzip.compress(REAL["dmesg-iso"].read_bytes())[:3000])  # truncated
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(bad), str(REAL["nvidia-smi"]), "--out", str(out))
    assert result.code == 2, result.stderr
    assert f"nothing written: {bad}: corrupt or truncated gz archive" in result.stderr
    assert "at its end, byte 3000" in result.stderr and not out.exists()
    result = run_cli("snapshot", "import", str(REAL["nvidia-smi"]), "--out", str(out))
    assert result.code == 0, result.stderr
    assert _meta(out)["captured"] == ["nvml"]
    _audit(run_cli, out)


def test_nothing_importable_is_an_error(tmp_path: Path, run_cli: RunCli) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 10)
    result = run_cli("snapshot", "import", str(junk), "--out", str(tmp_path / "snap"))
    assert result.code == 2 and "nothing to import" in result.stderr
    assert not (tmp_path / "snap").exists()


def test_two_machines_files_are_no_lost_gpus_and_the_views_are_named_by_bus_id(tmp_path: Path,
                                                                                  run_cli: RunCli) -> None:
    """Issue 36.9: an A100 box's lspci with an H100 box's nvidia-smi used to be a critical "8 on PCI but NVML
    sees 8"; the views are not of the same GPUs, which is said with the bus ids of each, never failed."""
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(REAL["lspci-nn"]), str(REAL["nvidia-smi"]), "--out", str(out))
    assert result.code == 0, result.stderr
    findings = [f for f in _audit(run_cli, out)["findings"] if f["check"] == "gpu.count" and f["subject"] == "pci"]
    assert len(findings) == 1
    finding, = findings
    assert finding["status"] == "unknown" and finding["severity"] == "warning"
    assert "only in NVML: 0000:19:00.0" in finding["message"] and "only on PCI: 0001:00:00.0" in finding["message"]
