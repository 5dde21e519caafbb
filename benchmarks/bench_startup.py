"""Figure 1: start-up and simulated audit time against `python -c "import click"`.

Targets: `nodewarden --version` <= 1.5x (issue #2) and the one-shot
`nodewarden audit --simulate hgx-h100-drifted --format json` <= 3.0x (issue #16; every check,
GPU ones included) the time of `python -c "import click"`, medians of repeated runs interleaved in
one process. Also checks that the simulated audit imports no NVML, Redfish, IPMI, HTTP or metrics
library (tests/unit/engine/test_startup_imports.py pins the same by module name).

Each run is timed twice: wall clock, and the CPU time (user + system) the child used, from
`getrusage`. On a machine shared with other work the wall time includes waiting for a core; the
CPU time does not, so its ratios stay put when the wall ratios wander. The verdict uses wall time
unless `--cpu` is given.

Every command runs once untimed first: a node audits with its YAML parse and profile-validation
caches warm (agent.io.yamlfile) and the files in the page cache; timing the first, cold run of a
freshly edited tree would measure PyYAML and the schema check instead.

Usage: python benchmarks/bench_startup.py [--runs N] [--cpu]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from _timing import bin_path, warm_bytecode

HEAVY = ("pynvml", "redfish", "requests", "urllib3", "pyghmi", "prometheus_client", "psutil")
BASELINE = "python -c 'import click' (baseline)"


def heavy_imports(args: list[str]) -> list[str]:
    code = ("import sys; from agent.apps.cli.main import cli\n"
            "try:\n    cli.main(args=sys.argv[1:], prog_name='nodewarden')\n"
            "except SystemExit:\n    pass\n"
            f"print('heavy=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, cwd="/")
    line = next(x for x in reversed(proc.stderr.splitlines()) if x.startswith("heavy="))
    return [m for m in line[len("heavy="):].split(",") if m]


def time_commands(commands: dict[str, Sequence[str]], runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU seconds of each command, `runs` times, interleaved so drift hits all of them alike."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in commands}
    for argv in commands.values():  # warm-up, untimed (see the module docstring)
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd="/", check=False)
    for _ in range(runs):
        for name, argv in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd="/",
                                  check=False)
            elapsed = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{name} exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
            results[name][0].append(elapsed)
            results[name][1].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return results


def report(results: dict[str, tuple[list[float], list[float]]]) -> dict[str, tuple[float, float]]:
    """Print each command's medians; return name -> (wall ratio, CPU ratio) to the baseline."""
    base_wall, base_cpu = (statistics.median(s) for s in results[BASELINE])
    ratios = {}
    for name, (wall, cpu) in results.items():
        med_wall, med_cpu = statistics.median(wall), statistics.median(cpu)
        ratios[name] = (med_wall / base_wall, med_cpu / base_cpu)
        print(f"{name:<40} wall {med_wall * 1000:7.1f} ms x{med_wall / base_wall:4.2f}   "
              f"cpu {med_cpu * 1000:7.1f} ms x{med_cpu / base_cpu:4.2f}")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--cpu", action="store_true", help="judge by CPU time instead of wall time")
    args = parser.parse_args()
    warm_bytecode()
    nodewarden = bin_path("nodewarden")
    audit = [nodewarden, "audit", "--simulate", "hgx-h100-drifted", "--format", "json"]
    ratios = report(time_commands({
        BASELINE: [sys.executable, "-c", "import click"],
        "nodewarden --version": [nodewarden, "--version"],
        "audit --simulate, host checks (json)": [*audit, "--skip", "gpu.*"],
        "audit --simulate, all checks (json)": audit,
    }, runs=args.runs))
    pick = 1 if args.cpu else 0
    version_ratio = ratios["nodewarden --version"][pick]
    full_ratio = ratios["audit --simulate, all checks (json)"][pick]
    loaded = heavy_imports(audit[1:])
    print(f"heavy libraries imported by the simulated audit: {loaded or 'none'}")
    ok = version_ratio <= 1.5 and full_ratio <= 3.0 and not loaded
    print("PASS" if ok else "FAIL", f"({'cpu' if args.cpu else 'wall'}: --version x{version_ratio:.2f} <= 1.5, "
                                    f"audit x{full_ratio:.2f} <= 3.0)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
