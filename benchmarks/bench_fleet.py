"""Figure 6: `nodewarden fleet report` over 10,000 and 20,000 synthetic nodes.

Targets (issue #7): 10,000 nodes with ~150 findings each -> HTML + JSON in
<= 15 s and <= 1.5 GB RSS on a 2-core machine; 20,000 nodes within 2.2x the
10,000 time. Baseline, measured in the same run: one Python process that only
`json.load`s every report file (the floor of reading the input at all).

Method: `fleet_generator.py` writes the fleets once (cached under --work);
each measured command runs as a separate process, its peak RSS summed over
its process tree (the parsing workers included) by psutil every 20 ms.

Usage: python benchmarks/bench_fleet.py [--work /tmp/nodewarden-fleet] [--sizes 10000,20000]
"""

from __future__ import annotations

import argparse
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


def measure(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (bytes, whole process tree) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return elapsed, peak


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/nodewarden-fleet"))
    parser.add_argument("--sizes", default="10000,20000")
    args = parser.parse_args()
    nodewarden = bin_path("nodewarden")
    results = {}
    for size in (int(s) for s in args.sizes.split(",")):
        fleet = args.work / f"fleet-{size}"
        if not (fleet / f"gpu-{size - 1:05d}.json").exists():
            print(f"generating {size} nodes in {fleet} ...", flush=True)
            generate(fleet, size, seed=size)
        base_s, base_rss = measure([sys.executable, "-c", BASELINE, str(fleet)])
        html_s, html_rss = measure([nodewarden, "fleet", "report", str(fleet), "--format", "html",
                                    "--output", str(args.work / f"fleet-{size}.html")])
        json_s, json_rss = measure([nodewarden, "fleet", "report", str(fleet), "--format", "json",
                                    "--output", str(args.work / f"fleet-{size}.json")])
        results[size] = html_s + json_s
        print(f"{size:>6} nodes: json.load floor {base_s:5.1f} s ({base_rss / 2**20:5.0f} MiB) | "
              f"html {html_s:5.1f} s ({html_rss / 2**20:5.0f} MiB) x{html_s / base_s:.2f} | "
              f"json {json_s:5.1f} s ({json_rss / 2**20:5.0f} MiB) x{json_s / base_s:.2f} | "
              f"html+json {html_s + json_s:5.1f} s (target <= 15 s at 10,000)", flush=True)
    if len(results) == 2:
        small, large = sorted(results)
        print(f"{large} vs {small}: x{results[large] / results[small]:.2f} (target <= 2.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
