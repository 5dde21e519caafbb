"""Figure 6: `nodewarden fleet report` over 10,000, 50,000 and 100,000 synthetic nodes.

Targets (issue #16): at most 5 KiB retained per node in the report process;
100,000 nodes -> HTML and JSON each in <= 2 GB peak RSS and within 2.2x the
50,000-node time. Baseline, measured in the same loop: one Python process
that only `json.load`s every report file (the floor of reading the input).

Method: `fleet_generator.py` writes the largest fleet once (cached under
--work); each smaller fleet is a folder of hard links to its first N nodes
(plus the duplicates and broken files), so every size reads the same kind of
files. Each measured command is its own process; sizes are interleaved
within each of --runs rounds and the median is reported. Peak RSS: the
report process's own `ru_maxrss` (os.wait4), and the sum over its process
tree (the parsing workers included), sampled by psutil every 20 ms.
Retained bytes per node: tracemalloc in a separate process reading 2,000
nodes in-process, after the read, divided by the nodes.

Usage: python benchmarks/bench_fleet.py [--work /tmp/nodewarden-fleet] [--sizes 10000,50000,100000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from _timing import REPO, bin_path

sys.path.insert(0, str(REPO / "benchmarks"))

from fleet_generator import generate

BASELINE = "import json,pathlib,sys\nfor p in pathlib.Path(sys.argv[1]).glob('*.json'):\n" \
           "    try: json.loads(p.read_bytes())\n    except ValueError: pass\n"
RETAINED = """
import gc, sys, tracemalloc
from pathlib import Path
from agent.apps.fleet import input_files, read_reports
files, _ = input_files([Path(sys.argv[1])])
tracemalloc.start()
gc.collect()
before = tracemalloc.get_traced_memory()[0]
reader = read_reports(files, workers=1)
gc.collect()
print((tracemalloc.get_traced_memory()[0] - before) / len(reader.by_name))
"""


def measure(argv: list[str]) -> tuple[float, int, int, float]:
    """Wall seconds, the process's own peak RSS, the peak RSS of its whole tree (bytes), and the CPU
    seconds (user + system) of the process and the workers it waited for (what the disk does not add)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree_peak = 0
    root = psutil.Process(proc.pid)
    status, usage = 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            tree = [root, *root.children(recursive=True)]
            tree_peak = max(tree_peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    own = usage.ru_maxrss * 1024  # KiB on Linux
    return elapsed, own, max(tree_peak, own), usage.ru_utime + usage.ru_stime


def fleets(work: Path, sizes: list[int]) -> dict[int, Path]:
    """The largest fleet generated once; each smaller one hard links to its first nodes."""
    largest = max(sizes)
    full = work / f"fleet-{largest}"
    if not (full / "broken-2.json").exists():  # written last
        print(f"generating {largest} nodes in {full} ...", flush=True)
        generate(full, largest, seed=largest)
    out = {largest: full}
    for size in sizes:
        if size == largest:
            continue
        folder = work / f"fleet-{largest}-first-{size}"
        if not (folder / "broken-2.json").exists():
            folder.mkdir(parents=True, exist_ok=True)
            names = [f"gpu-{n:05d}.json" for n in range(size)]
            names += [p.name for p in full.glob("*.old.json")] + [p.name for p in full.glob("broken-*.json")]
            for name in names:
                if not (folder / name).exists():
                    os.link(full / name, folder / name)
        out[size] = folder
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/nodewarden-fleet"))
    parser.add_argument("--sizes", default="10000,50000,100000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    nodewarden = bin_path("nodewarden")
    folders = fleets(args.work, sorted({*sizes, 2000}))
    retained = float(subprocess.run([sys.executable, "-c", RETAINED, str(folders[2000])], capture_output=True,
                                    text=True, check=True, cwd=REPO).stdout)
    print(f"retained in the report process: {retained:.0f} bytes per node at 2,000 nodes (target < 5120)",
          flush=True)
    samples: dict[tuple[int, str], list[tuple[float, int, int, float]]] = {}
    for run in range(args.runs):
        for size in sizes:  # interleaved: drift on a shared machine hits every size alike
            fleet = folders[size]
            commands = {
                "floor": [sys.executable, "-c", BASELINE, str(fleet)],
                "html": [nodewarden, "fleet", "report", str(fleet), "--format", "html",
                         "--output", str(args.work / f"fleet-{size}.html")],
                "json": [nodewarden, "fleet", "report", str(fleet), "--format", "json",
                         "--output", str(args.work / f"fleet-{size}.json")],
            }
            for name, argv in commands.items():
                sample = measure(argv)
                samples.setdefault((size, name), []).append(sample)
                print(f"  run {run + 1} {size:>6} {name:5}: {sample[0]:6.1f} s, CPU {sample[3]:6.1f} s, "
                      f"own {sample[1] / 2**20:5.0f} MiB, tree {sample[2] / 2**20:5.0f} MiB", flush=True)

    def med(size: int, name: str, index: int) -> float:
        return statistics.median(s[index] for s in samples[(size, name)])

    print(f"\nmedian of {args.runs} runs:")
    for size in sizes:
        floor = med(size, "floor", 0)
        cells = [f"{size:>6} nodes: json.load floor {floor:5.1f} s"]
        for name in ("html", "json"):
            cells.append(f"{name} {med(size, name, 0):5.1f} s x{med(size, name, 0) / floor:.2f} "
                         f"CPU {med(size, name, 3):5.1f} s "
                         f"(own {med(size, name, 1) / 2**20:4.0f} MiB, tree {med(size, name, 2) / 2**20:4.0f} MiB)")
        print(" | ".join(cells), flush=True)
    if 50000 in sizes and 100000 in sizes:
        for name in ("html", "json"):
            ratio = med(100000, name, 0) / med(50000, name, 0)
            cpu = med(100000, name, 3) / med(50000, name, 3)
            print(f"{name}: 100,000 vs 50,000 nodes x{ratio:.2f} wall, x{cpu:.2f} CPU (target <= 2.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
