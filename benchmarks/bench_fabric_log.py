"""Fabric Manager log and the fabric.* checks: bounded reads, small audit cost.

Targets (issue #8): reading a 100 MB /var/log/fabricmanager.log stays under
0.2 s, because only its last MiB is read (seek from the end). The baseline,
in the same process and loop, is plain Python reading the same 1 MiB tail
(open, seek, read, split lines, substring test); reading the whole file is
printed for context. Second figure: the audit of the recorded node with the
fabric checks against the same audit with `--skip 'fabric.*'` (the issue's
target is 1.2x together with the interconnect checks), plus the in-process
cost of reading the fabric facts (cgroup + log tail) from the snapshot.

Usage: python benchmarks/bench_fabric_log.py [--runs N] [--size-mb N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _timing import REPO, bin_path, report, time_commands, warm_bytecode

sys.path.insert(0, str(REPO))

from agent.sources.fabric import FM_LOG_TAIL_BYTES, read_fm_log
from agent.sources.fsroot import LiveFs
from agent.sources.fsroot_snapshot import SnapshotFs

NODE = "hgx-h100-drifted"
LINE = b"[Nov 18 2026 10:00:00] [INFO] [tid 1808] successfully setup multicast team for request id 357953574276.\n"
ERROR = (b"[Nov 19 2026 13:33:43] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on "
         b"NVSwitch pci bus id 00000000:85:00.0 physical id 2 port 32\n")


def make_log(root: Path, size_mb: int) -> Path:
    path = root / "var" / "log" / "fabricmanager.log"
    path.parent.mkdir(parents=True)
    block = LINE * ((1 << 20) // len(LINE) + 1)
    with open(path, "wb") as fh:
        for _ in range(size_mb):
            fh.write(block[: 1 << 20])
        fh.write(ERROR * 3)
    return path


def plain_tail(path: Path) -> int:
    """The baseline: what a careful script would do for the same tail."""
    with open(path, "rb") as fh:
        fh.seek(-FM_LOG_TAIL_BYTES, 2)
        lines = fh.read().decode("utf-8", "replace").splitlines()[1:]
    return sum("detected NVSwitch" in line for line in lines)


def median_s(func: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--size-mb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_log(Path(tmp), args.size_mb)
        fs = LiveFs(tmp)
        errors, read, size = read_fm_log(fs)
        assert isinstance(errors, tuple) and len(errors) == 3, errors
        agent_s = median_s(lambda: read_fm_log(fs), args.runs)
        plain_s = median_s(lambda: plain_tail(path), args.runs)
        whole_s = median_s(lambda: path.read_bytes().count(b"detected NVSwitch"), 3)
    print(f"Fabric Manager log: {size / 1e6:.0f} MB, agent read {read} bytes ({read / size:.2%} of the file)")
    print(f"{'agent read_fm_log (tail)':<40} median {agent_s * 1000:7.2f} ms   x{agent_s / plain_s:4.2f} of plain")
    print(f"{'plain Python, same 1 MiB tail':<40} median {plain_s * 1000:7.2f} ms")
    print(f"{'whole file read (context only)':<40} median {whole_s * 1000:7.2f} ms")

    from agent.sources.fabric import read_fabric

    snap = SnapshotFs(REPO / "fixtures" / "nodes" / NODE)
    facts_s = median_s(lambda: read_fabric(snap), args.runs)
    print(f"{'read_fabric on the ' + NODE + ' snapshot':<40} median {facts_s * 1000:7.2f} ms")

    warm_bytecode()
    nodewarden = bin_path("nodewarden")
    base = [nodewarden, "audit", "--simulate", NODE, "--format", "json"]
    results = time_commands({
        "audit --skip 'fabric.*' (baseline)": [*base, "--skip", "fabric.*"],
        "audit (all checks)": base,
    }, runs=args.runs, cwd="/")
    figures = report(results, "audit --skip 'fabric.*' (baseline)")
    ratio = figures["audit (all checks)"][1]
    ok = agent_s < 0.2 and read <= FM_LOG_TAIL_BYTES and ratio <= 1.2
    print("PASS" if ok else "FAIL", f"(tail read {agent_s * 1000:.1f} ms < 200 ms, {read} <= {FM_LOG_TAIL_BYTES} "
          f"bytes, audit x{ratio:.2f} <= 1.2)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
