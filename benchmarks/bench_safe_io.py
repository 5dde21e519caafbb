"""Figure 10: what the safe writer and the bounded reader cost a simulated audit.

Target (issue #12): within 3 % of the code before them.

Method: the same command from two source trees, interleaved run by run and repeated, as whole
processes from `/` with bytecode compiled once:

* baseline: `git worktree` of the commit before issue 12's file-safety work (default 814cf29),
  run with `PYTHONPATH=<worktree>` so its agent/ is imported instead of the installed one;
* now: this checkout.

Command: `python -m agent audit --simulate hgx-h100-drifted --format prom --output FILE` (the
timer's textfile job: every host read goes through the bounded snapshot reader, the report
through the safe writer), and the same with `--format json --output FILE`.

Usage: python benchmarks/bench_safe_io.py [--runs 21] [--base 814cf29]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import REPO


def worktree(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where), commit], check=True)
    return where


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--base", default="814cf29")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = worktree(args.base, Path(tmp) / "base")
        try:
            for tree in (base, REPO):
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "agent"), str(tree / "checks"),
                                str(tree / "remediations")], check=True)
            samples: dict[str, list[float]] = {f"{fmt} {name}": [] for fmt in ("prom", "json")
                                               for name in ("before", "now")}
            for _ in range(args.runs):
                for fmt in ("prom", "json"):
                    for name, tree in (("before", base), ("now", REPO)):
                        out = Path(tmp) / f"out.{fmt}"
                        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                               "PYTHONPATH": str(tree)}
                        start = time.perf_counter()
                        proc = subprocess.run([sys.executable, "-m", "agent", "audit", "--simulate",
                                               "hgx-h100-drifted", "--format", fmt, "--output", str(out)],
                                              cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              check=False)
                        samples[f"{fmt} {name}"].append(time.perf_counter() - start)
                        if proc.returncode not in (0, 1):
                            raise SystemExit(f"{name} {fmt}: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    print(f"| audit --format | before (median) | now (median) | ratio |  ({args.runs} runs, interleaved)")
    print("|---|---|---|---|")
    worst = 0.0
    for fmt in ("prom", "json"):
        before = statistics.median(samples[f"{fmt} before"])
        now = statistics.median(samples[f"{fmt} now"])
        worst = max(worst, now / before)
        print(f"| {fmt} | {before * 1000:.1f} ms | {now * 1000:.1f} ms | {now / before:.3f} |")
    print(f"target: <= 1.03 (worst {worst:.3f})")
    return 0 if worst <= 1.03 else 1


if __name__ == "__main__":
    raise SystemExit(main())
