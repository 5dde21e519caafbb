"""Figure 12: `snapshot import` of 50 MB and 500 MB inputs (peak RSS and wall time).

Target (issue #15): a 50 MB and a 500 MB input stream through `snapshot import` with peak RSS
under 150 MiB, the snapshot keeping a bounded tail of the kernel log, and `audit --snapshot` on it.

Method: inputs are generated in a temporary folder from real sections in fixtures/ (lspci,
dmidecode, `nvidia-smi -q`, /proc/cmdline; the kernel log is the messages of the real dmesg and
journal fixtures, repeated with timestamps moving forward so that no two lines are equal and the
importer's repeat filter cannot shrink it):

* `nvidia-bug-report.log.gz` of ~1 MB (the baseline), ~50 MB and ~500 MB uncompressed, sections
  gzip'd one by one as nvidia-bug-report.sh writes them, the dmesg section being almost all of it;
* `bundle.tar.gz` holding a ~500 MB `var/log/dmesg` and an `nvidia-smi -q` dump.

Each is imported by `nodewarden snapshot import INPUT --out DIR` as a whole process (a wrapper
whose only child is the import reads its `ru_maxrss`), interleaved run by run. Each snapshot is
then checked: kmsg.txt holds at most agent.importers.base.MAX_KMSG_LINES lines, they are the
*last* lines of the input, and `nodewarden audit --snapshot DIR --format json` exits 0 or 1.

Usage: python benchmarks/bench_import.py [--runs 1] [--sizes 1,50,500] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from _timing import REPO

sys.path.insert(0, str(REPO))

from agent.importers.base import MAX_KMSG_LINES
from agent.importers.bug_report import SEPARATOR

F = REPO / "fixtures"
LSPCI = F / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt"
DMIDECODE = F / "sources" / "gpud-dell-xe9680" / "dmidecode.txt"
NVSMI = F / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
KERNEL_LOGS = [F / "kmsg" / "dmesg.decode.iso.log.0", F / "kmsg" / "dmesg.ctime.boot.a10-535.129.03.log",
               F / "kmsg" / "pstore-dmesg.txt", F / "kmsg" / "memory-dmesg.decode.iso.log"]
WRAPPER = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
           "stderr=subprocess.PIPE); sys.stderr.buffer.write(r.stderr[-2000:]); "
           "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
TARGET_MIB = 150
_STAMP = re.compile(r"^(?:\S+\s*:\S+\s*: )?(?:\d{4}-\d\d-\d\dT[\d:,.+]+\s|\[[^]]*\]\s*|<\d+>\S*\s)*")


def _messages() -> list[str]:
    """The message part of every line of the real kernel logs (their own timestamps cut off)."""
    out = []
    for path in KERNEL_LOGS:
        for line in path.read_text("utf-8", "replace").splitlines():
            message = _STAMP.sub("", line).strip()
            if message and not message.startswith("--"):
                out.append(message)
    return out


def kernel_log(nbytes: int) -> Iterator[bytes]:
    """~`nbytes` of `dmesg --time-format iso --decode` lines in 1 MiB chunks, each line's time later than the last."""
    messages = _messages()
    start = dt.datetime(2025, 1, 21, 2, 21, 33, tzinfo=dt.timezone.utc)
    written, index = 0, 0
    while written < nbytes:
        lines = []
        size = 0
        while size < 1 << 20 and written + size < nbytes:
            stamp = (start + dt.timedelta(microseconds=index * 997)).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
            line = f"kern  :warn  : {stamp} {messages[index % len(messages)]}\n"
            lines.append(line)
            size += len(line)
            index += 1
        chunk = "".join(lines).encode()
        written += len(chunk)
        yield chunk


def _section(header: str, body: bytes, *, file: bool = False) -> bytes:
    head = [SEPARATOR, "", header]
    head += [f"*** ls: -r--r--r-- 1 root root 0 2024-07-31 11:22:39.000000000 +0000 {header[4:]}"] if file else [""]
    return ("\n".join(head) + "\n").encode() + body.rstrip(b"\n") + b"\n\n"


def bug_report(path: Path, nbytes: int) -> int:
    """An nvidia-bug-report.log.gz of ~`nbytes` uncompressed (one gzip member per section); its size."""
    prologue = (f"{SEPARATOR}\n\nStart of NVIDIA bug report log file.  Please include this file, along\n"
                "with a detailed description of your problem, when reporting a graphics\ndriver bug via the "
                "NVIDIA Linux forum (see devtalk.nvidia.com)\nor by sending email to 'linux-bugs@nvidia.com'.\n\n"
                "nvidia-bug-report.sh Version: 34097112\n\nDate: Wed Jul 31 11:22:39 UTC 2024\n\n").encode()
    small = [_section("*** /etc/issue", b"Ubuntu 22.04.4 LTS \\n \\l\n", file=True),
             _section("*** /proc/cmdline", b"BOOT_IMAGE=/vmlinuz-5.15.0-119-generic ro iommu=pt\n", file=True),
             _section("/usr/bin/lspci -nnDvvvxxxx", LSPCI.read_bytes()),
             _section("/usr/sbin/dmidecode", DMIDECODE.read_bytes())]
    tail = [_section("/usr/bin/nvidia-smi --query", NVSMI.read_bytes()),
            _section("xset -q:", b"xset:  unable to open display \"\"\n")]
    fixed = len(prologue) + sum(map(len, small + tail)) + 64
    total = 0
    with open(path, "wb") as out:
        for part in [prologue, *small]:
            out.write(gzip.compress(part, 1))
            total += len(part)
        comp = zlib.compressobj(1, zlib.DEFLATED, 31)  # the dmesg section: one gzip member, streamed
        for piece in [f"{SEPARATOR}\n\ndmesg:\n\n".encode(), *kernel_log(max(nbytes - fixed, 1 << 16)), b"\n"]:
            out.write(comp.compress(piece))
            total += len(piece)
        out.write(comp.flush())
        for part in tail:
            out.write(gzip.compress(part, 1))
            total += len(part)
    return total


def dmesg_tarball(path: Path, nbytes: int, folder: Path) -> int:
    """bundle.tar.gz: var/log/dmesg (~`nbytes`) and nvidia-smi-q.txt; the dmesg's size."""
    dmesg = folder / "dmesg.tmp"
    with open(dmesg, "wb") as out:
        for chunk in kernel_log(nbytes):
            out.write(chunk)
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        archive.add(dmesg, arcname="var/log/dmesg")
        archive.add(NVSMI, arcname="nvidia-smi-q.txt")
    size = dmesg.stat().st_size
    dmesg.unlink()
    return size


def last_input_line(path: Path) -> str:
    """The last kernel log line inside `path` (a .gz or a .tar.gz), read by streaming."""
    last = ""
    if tarfile.is_tarfile(path):
        with tarfile.open(path, "r|gz") as archive:
            for member in archive:
                source = archive.extractfile(member)
                if member.name.endswith("dmesg") and source is not None:
                    last = _last_kernel_line(source)
        return last
    with gzip.open(path, "rb") as source:
        return _last_kernel_line(source)


def _last_kernel_line(source: object) -> str:
    last = ""
    for raw in source:  # type: ignore[attr-defined]
        if raw.startswith(b"kern  :"):
            last = raw.decode().rstrip("\n")
    return last


def one_import(cli: str, path: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one `snapshot import` of `path`."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WRAPPER, cli, "snapshot", "import", str(path), "--out", str(out)],
                          capture_output=True, text=True, check=True, cwd="/")
    elapsed = time.monotonic() - start
    code, rss = done.stdout.split()
    if code != "0":
        raise SystemExit(f"import of {path.name} exited {code}: {done.stderr}")
    return elapsed, int(rss) / 1024


def check_snapshot(cli: str, path: Path, out: Path) -> str:
    lines = (out / "kmsg.txt").read_text().splitlines()
    assert len(lines) <= MAX_KMSG_LINES, len(lines)
    assert lines[-1] == last_input_line(path), (lines[-1], last_input_line(path))
    audit = subprocess.run([cli, "audit", "--snapshot", str(out), "--format", "json"], capture_output=True,
                           text=True, check=False, cwd="/")
    assert audit.returncode in (0, 1) and "Traceback" not in audit.stderr, audit.stderr[-2000:]
    report = json.loads(audit.stdout)
    return f"kmsg.txt {len(lines)} lines (the input's last), audit exit {audit.returncode}, " \
           f"{len(report.get('findings', report.get('results', [])))} findings"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--sizes", default="1,50,500", help="bug report sizes in MB (the first is the baseline)")
    parser.add_argument("--no-tarball", action="store_true")
    parser.add_argument("--keep", type=Path, help="generate the inputs here and keep them")
    parser.add_argument("--no-check", action="store_true", help="measure only (for code before issue 15)")
    args = parser.parse_args()
    cli = str(Path(sys.executable).with_name("nodewarden"))
    sizes = [int(s) for s in args.sizes.split(",")]
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-import-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        inputs: dict[str, Path] = {}
        described: dict[str, str] = {}
        for mb in sizes:
            path = folder / f"{mb}MB" / "nvidia-bug-report.log.gz"
            path.parent.mkdir(exist_ok=True)
            if not path.exists():
                bug_report(path, mb * 1_000_000)
            name = f"nvidia-bug-report.log.gz, {mb} MB"
            inputs[name] = path
            described[name] = f"{path.stat().st_size / 1e6:.1f} MB compressed"
        if not args.no_tarball:
            path = folder / "bundle.tar.gz"
            if not path.exists():
                dmesg_tarball(path, 500_000_000, folder)
            inputs["bundle.tar.gz: 500 MB dmesg + nvidia-smi -q"] = path
            described["bundle.tar.gz: 500 MB dmesg + nvidia-smi -q"] = f"{path.stat().st_size / 1e6:.1f} MB compressed"
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in inputs}
        checks: dict[str, str] = {}
        out = folder / "snap"
        for _ in range(args.runs):
            for name, path in inputs.items():  # interleaved
                results[name].append(one_import(cli, path, out))
                print(f"  {name}: {results[name][-1][0]:.1f} s, {results[name][-1][1]:.1f} MiB", file=sys.stderr)
                if not args.no_check:
                    checks[name] = check_snapshot(cli, path, out)
        baseline = next(iter(inputs))
        base_s = statistics.median(s for s, _ in results[baseline])
        base_rss = statistics.median(r for _, r in results[baseline])
        print(f"| input | size | median wall | ratio | median peak RSS | max peak RSS | ratio |  ({args.runs} runs)")
        print("|---|---|---|---|---|---|---|")
        for name in inputs:
            wall = statistics.median(s for s, _ in results[name])
            rss = statistics.median(r for _, r in results[name])
            top = max(r for _, r in results[name])
            print(f"| {name} | {described[name]} | {wall:.1f} s | {wall / base_s:.1f} | {rss:.1f} MiB | "
                  f"{top:.1f} MiB | {rss / base_rss:.2f} |")
        for name, text in checks.items():
            print(f"{name}: {text}")
        worst = max(r for samples in results.values() for _, r in samples)
        print(f"target: peak RSS < {TARGET_MIB} MiB (worst {worst:.1f})")
        return 0 if worst < TARGET_MIB else 1
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            shutil.rmtree(folder / "snap", ignore_errors=True)


if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    raise SystemExit(main())
