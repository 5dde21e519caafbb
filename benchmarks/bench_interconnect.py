"""Figure: the cost of the interconnect checks on a simulated audit.

Target (issue #8): `nodewarden audit --simulate hgx-h100-drifted` with every
interconnect check (ib.*, pcie.*, topology.*, host.iommu, fabric.*) within
1.2x of the same audit with those checks skipped, median of repeated runs,
timed in the same process and loop (interleaved). The host source reads the
RDMA ports, ACS config space and IOMMU in both runs; what differs is the
evaluation and the findings written out.

Usage: python benchmarks/bench_interconnect.py [--runs N]
"""

from __future__ import annotations

import argparse
import sys

from _timing import bin_path, report, time_commands, warm_bytecode

INTERCONNECT = ("ib.*", "pcie.*", "topology.*", "host.iommu", "fabric.*")
TARGET = 1.2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    warm_bytecode()
    audit = [bin_path("nodewarden"), "audit", "--simulate", "hgx-h100-drifted", "--format", "json"]
    skip = [x for glob in INTERCONNECT for x in ("--skip", glob)]
    baseline = "audit, interconnect checks skipped"
    results = time_commands({baseline: [*audit, *skip], "audit, all checks": audit}, runs=args.runs, cwd="/")
    ratio = report(results, baseline)["audit, all checks"][1]
    ok = ratio <= TARGET
    print("PASS" if ok else "FAIL", f"(all checks x{ratio:.2f} of the audit without the interconnect checks, "
                                    f"target <= {TARGET})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
