"""Figure 2: cost of the GPU side of an audit on the recorded 8-GPU node.

Targets (issue #3): at most 40 NVML calls per GPU per audit (counted in the
recorded backend; one batched nvmlDeviceGetFieldValues counts as one call),
and the audit of the recorded 8-GPU node within 1.3x the wall time of the
same audit with `--skip 'gpu.*'`.

Usage: python benchmarks/bench_gpu.py [--runs N]
"""

from __future__ import annotations

import argparse
import sys

from _timing import REPO, bin_path, report, time_commands, warm_bytecode

NODE = "hgx-h100-healthy"


def calls_per_gpu() -> dict[int, int]:
    sys.path.insert(0, str(REPO))
    from agent.sources.nvml import RecordedNvml, read_nvml

    backend = RecordedNvml.from_file(REPO / "fixtures" / "nodes" / NODE / "nvml.json")
    _facts, status = read_nvml(backend)
    if not status.ok:
        raise SystemExit(f"replay failed: {status.error}")
    return dict(backend.calls_per_device)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    per_gpu = calls_per_gpu()
    worst = max(per_gpu.values())
    print(f"NVML calls per GPU per audit: {per_gpu} (max {worst}, target <= 40)")
    warm_bytecode()
    nodewarden = bin_path("nodewarden")
    base = [nodewarden, "audit", "--simulate", NODE, "--format", "json"]
    results = time_commands({
        "audit --skip 'gpu.*' (baseline)": [*base, "--skip", "gpu.*"],
        "audit (all checks)": base,
    }, runs=args.runs, cwd="/")
    figures = report(results, "audit --skip 'gpu.*' (baseline)")
    ratio = figures["audit (all checks)"][1]
    ok = worst <= 40 and ratio <= 1.3
    print("PASS" if ok else "FAIL", f"(calls/GPU {worst} <= 40, ratio x{ratio:.2f} <= 1.3)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
