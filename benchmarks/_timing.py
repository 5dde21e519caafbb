"""Shared helpers: time whole processes, median of repeated runs, interleaved.

Each benchmark runs its baseline in the same process and the same loop, so
the ratio holds on any machine; absolute numbers are printed for context.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bin_path(name: str) -> str:
    """A console script next to the running interpreter (the project's venv)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def warm_bytecode() -> None:
    # Installed packages ship compiled bytecode; an editable checkout may not
    # (PYTHONDONTWRITEBYTECODE is common in CI). Compile ours once, as pip would.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "agent"), str(REPO / "checks"),
                    str(REPO / "remediations")], check=True)


def time_commands(commands: dict[str, Sequence[str]], runs: int, ok_codes: Sequence[int] = (0, 1),
                  cwd: str | None = None) -> dict[str, list[float]]:
    """Run each command `runs` times, interleaved so drift hits all of them alike."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    results: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            start = time.perf_counter()
            proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                  check=False)
            elapsed = time.perf_counter() - start
            if proc.returncode not in ok_codes:
                raise SystemExit(f"{name} exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
            results[name].append(elapsed)
    return results


def report(results: dict[str, list[float]], baseline: str) -> dict[str, tuple[float, float]]:
    base = statistics.median(results[baseline])
    out = {}
    for name, samples in results.items():
        med = statistics.median(samples)
        out[name] = (med, med / base)
        print(f"{name:<40} median {med * 1000:7.1f} ms   x{med / base:4.2f} of {baseline}")
    return out
