"""Figure 10: what the safe writer and the bounded reader cost, against the code before them.

Target (issue #12): within 3 % of the code before them.

Method: the I/O layer alone, from two source trees, interleaved run by run and repeated:

* baseline: a `git worktree` of the commit before issue 12's file-safety work (default 814cf29),
  imported with `PYTHONPATH=<worktree>`;
* now: this checkout.

Each run is a fresh process that opens the simulated 8-GPU node (hgx-h100-drifted, ~1,500 host
files) and, 5 times, reads the whole host through the snapshot reader (`read_host_facts`: every
file through `SnapshotFs`) and writes a 200 KB report to a file through the output writer
(`agent.fsutil.write_output` now; `agent.report.write_atomic` before); it prints the mean of
the 5. Whole-audit time is not the figure: the audit also gained checks since, which is
benchmarks/bench_startup.py's business.

Usage: python benchmarks/bench_safe_io.py [--runs 11] [--base 814cf29]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import REPO

PROBE = """
import sys, time
from pathlib import Path
from agent.snapshot import open_snapshot, simulated_path
from agent.sources.host import read_host_facts
try:
    from agent.fsutil import write_output as write
except ImportError:
    from agent.report import write_atomic as write
out, text = Path(sys.argv[1]), "x" * 200_000 + "\\n"
snap = open_snapshot(simulated_path("hgx-h100-drifted"))
read_host_facts(snap.fs())  # warm: imports, page cache
start = time.perf_counter()
for _ in range(5):
    read_host_facts(snap.fs())
    write(out, text)
print((time.perf_counter() - start) / 5)
"""


def worktree(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where), commit], check=True)
    return where


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--base", default="814cf29")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = worktree(args.base, Path(tmp) / "base")
        try:
            for _ in range(args.runs):
                for name, tree in (("before", base), ("now", REPO)):
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    proc = subprocess.run([sys.executable, "-c", PROBE, str(Path(tmp) / "report.json")], cwd="/",
                                          env=env, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        raise SystemExit(f"{name}: {proc.stderr[-400:]}")
                    samples[name].append(float(proc.stdout.strip()))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    before, now = statistics.median(samples["before"]), statistics.median(samples["now"])
    print(f"| I/O layer | median per host read + report write | ratio |  ({args.runs} runs, interleaved)")
    print("|---|---|---|")
    print(f"| before (unbounded reader, mkstemp + chmod writer) | {before * 1000:.1f} ms | 1.000 |")
    print(f"| now (O_NOFOLLOW reader with kept folder fds, fsutil writer) | {now * 1000:.1f} ms | {now / before:.3f} |")
    print(f"target: <= 1.03 (now {now / before:.3f})")
    return 0 if now / before <= 1.03 else 1


if __name__ == "__main__":
    raise SystemExit(main())
