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
* with --sosreport / --only-sosreport: a sos report tarball (w:gz level 1) of the fixtures/sosreport tree plus
  ~150 MB of sos_commands/kernel/dmesg, ~200 MB of var/log/messages and a ~150 MB binary system.journal;
  after its import `audit --snapshot` is timed and its peak RSS read too.

Each is imported by `nodewarden snapshot import INPUT --out DIR` as a whole process (a wrapper
whose only child is the import reads its `ru_maxrss`), interleaved run by run. Each snapshot is
then checked: kmsg.txt holds at most agent.sources.importers.base.MAX_KMSG_LINES lines, they are the
*last* lines of the input, and `nodewarden audit --snapshot DIR --format json` exits 0 or 1.

Usage: python benchmarks/bench_import.py [--runs 1] [--sizes 1,50,500] [--sosreport | --only-sosreport] [--keep DIR]
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

from agent.sources.importers.base import MAX_KMSG_LINES
from agent.sources.importers.bug_report import SEPARATOR

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


SOS_TREE = F / "sosreport" / "sosreport-gpu-node-07-2024-11-05-qxbzkta"
SOS_PARTS = {"dmesg": 150_000_000, "messages": 200_000_000, "journal": 150_000_000}  # bytes added to the tree


def sos_dmesg(nbytes: int) -> Iterator[bytes]:
    """~`nbytes` of `dmesg` lines as sos writes them (`[seconds.micro] message`), each later than the last."""
    messages = _messages()
    written, index = 0, 0
    while written < nbytes:
        lines, size = [], 0
        while size < 1 << 20 and written + size < nbytes:
            micro = 13_000_000 + index * 997
            line = f"[{micro // 1_000_000:5d}.{micro % 1_000_000:06d}] {messages[index % len(messages)]}\n"
            lines.append(line)
            size += len(line)
            index += 1
        chunk = "".join(lines).encode()
        written += len(chunk)
        yield chunk


def sos_messages(nbytes: int) -> Iterator[bytes]:
    """~`nbytes` of /var/log/messages (syslog) lines: the kernel messages as `kernel:` lines, seconds advancing."""
    messages = _messages()
    start = dt.datetime(2024, 10, 1, 0, 0, 0)
    written, index = 0, 0
    while written < nbytes:
        lines, size = [], 0
        while size < 1 << 20 and written + size < nbytes:
            when = start + dt.timedelta(milliseconds=index * 37)
            stamp = f"{when:%b} {when.day:2d} {when:%H:%M:%S}"
            line = f"{stamp} gpu-node-07 kernel: [{index // 1000:6d}.{index % 1000:03d}000] " \
                   f"{messages[index % len(messages)]}\n"
            lines.append(line)
            size += len(line)
            index += 1
        chunk = "".join(lines).encode()
        written += len(chunk)
        yield chunk


def sos_tarball(path: Path, folder: Path) -> int:
    """sosreport-...tar.gz: the synthetic sos tree of fixtures/sosreport plus a ~150 MB sos_commands/kernel/dmesg,
    a ~200 MB var/log/messages and a ~150 MB var/log/journal/<id>/system.journal (random bytes); its size
    uncompressed (the files' total)."""
    tree = folder / SOS_TREE.name
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(SOS_TREE, tree)
    journal = tree / "var" / "log" / "journal" / "5b2e6c1d8f3a4e479c0b7d1a2f3e4b5c" / "system.journal"
    journal.parent.mkdir(parents=True)
    with open(tree / "sos_commands" / "kernel" / "dmesg", "ab") as out:
        for chunk in sos_dmesg(SOS_PARTS["dmesg"]):
            out.write(chunk)
    with open(tree / "var" / "log" / "messages", "ab") as out:
        for chunk in sos_messages(SOS_PARTS["messages"]):
            out.write(chunk)
    with open(journal, "wb") as out:
        out.write(b"LPKSHHRH")  # a journal file's signature, then noise
        for _ in range(SOS_PARTS["journal"] >> 20):
            out.write(os.urandom(1 << 20))
    total = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        archive.add(tree, arcname=tree.name)
    shutil.rmtree(tree)
    return total


def one_audit(cli: str, out: Path) -> tuple[float, float, int, dict]:
    """(seconds, peak RSS MiB, exit code, report) of `audit --snapshot out --format json`."""
    start = time.monotonic()
    report = out.with_name("audit.json")
    code = ("import resource, subprocess, sys; f = open(sys.argv[1], 'wb'); r = subprocess.run(sys.argv[2:], "
            "stdout=f, stderr=subprocess.PIPE); sys.stderr.buffer.write(r.stderr[-2000:]); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code, str(report), cli, "audit", "--snapshot", str(out),
                           "--format", "json"], capture_output=True, text=True, check=True, cwd="/")
    elapsed = time.monotonic() - start
    rc, rss = done.stdout.split()
    assert rc in ("0", "1") and "Traceback" not in done.stderr, done.stderr
    data = json.loads(report.read_text())
    report.unlink()
    return elapsed, int(rss) / 1024, int(rc), data


def check_sos_snapshot(cli: str, out: Path) -> str:
    lines = (out / "kmsg.txt").read_text().splitlines()
    assert len(lines) <= MAX_KMSG_LINES, len(lines)
    wall, rss, rc, report = one_audit(cli, out)
    return f"kmsg.txt {len(lines)} lines (last: {lines[-1][:60]!r}...), audit {wall:.1f} s, {rss:.1f} MiB, " \
           f"exit {rc}, {len(report.get('findings', report.get('results', [])))} findings"


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
    parser.add_argument("--sosreport", action="store_true", help="also a ~500 MB sos report tarball")
    parser.add_argument("--only-sosreport", action="store_true", help="only the sos report tarball")
    parser.add_argument("--keep", type=Path, help="generate the inputs here and keep them")
    parser.add_argument("--no-check", action="store_true", help="measure only (for code before issue 15)")
    args = parser.parse_args()
    cli = str(Path(sys.executable).with_name("nodewarden"))
    sizes = [] if args.only_sosreport else [int(s) for s in args.sizes.split(",")]
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
        if not args.no_tarball and not args.only_sosreport:
            path = folder / "bundle.tar.gz"
            if not path.exists():
                dmesg_tarball(path, 500_000_000, folder)
            inputs["bundle.tar.gz: 500 MB dmesg + nvidia-smi -q"] = path
            described["bundle.tar.gz: 500 MB dmesg + nvidia-smi -q"] = f"{path.stat().st_size / 1e6:.1f} MB compressed"
        sos_name = ""
        if args.sosreport or args.only_sosreport:
            path = folder / "sosreport-gpu-node-07-2024-11-05-qxbzkta.tar.gz"
            start = time.monotonic()
            if not path.exists():
                total = sos_tarball(path, folder)
                print(f"  built {path.name}: {total / 1e6:.1f} MB in {time.monotonic() - start:.0f} s", file=sys.stderr)
            sos_name = "sosreport tar.gz: 150 MB dmesg + 200 MB messages + 150 MB journal"
            inputs[sos_name] = path
            described[sos_name] = f"{path.stat().st_size / 1e6:.1f} MB compressed"
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in inputs}
        checks: dict[str, str] = {}
        out = folder / "snap"
        for _ in range(args.runs):
            for name, path in inputs.items():  # interleaved
                results[name].append(one_import(cli, path, out))
                print(f"  {name}: {results[name][-1][0]:.1f} s, {results[name][-1][1]:.1f} MiB", file=sys.stderr)
                if name == sos_name:
                    checks[name] = check_sos_snapshot(cli, out)
                elif not args.no_check:
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
