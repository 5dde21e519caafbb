"""Figure 9: series per node, what one Prometheus holding 10,000 nodes must carry.

Targets (issue #14): <= 600 series per scrape for the simulated drifted 8-GPU node and <= 450 for
the healthy one.

Method: for hgx-h100-drifted and hgx-h100-healthy, the exposition of
`nodewarden audit --simulate NODE --format prom` (what node_exporter's textfile collector adds to
its own metrics) and one scrape of the daemon's /metrics (`nodewarden daemon --simulate NODE`,
scraped once every source has been read: the steady state, process metrics included). A series is
one sample line of the text format. The largest families are listed, and the bytes of a scrape.

Usage: python benchmarks/bench_series.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from _timing import REPO

sys.path.insert(0, str(REPO))

from tests.daemon_peer import running_daemon

TARGETS = {"hgx-h100-drifted": 600, "hgx-h100-healthy": 450}
NODES = 10_000


def series(text: str) -> Counter[str]:
    """Sample lines per metric name."""
    return Counter(line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
                   if line and not line.startswith("#"))


def audit_text(node: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "agent", "audit", "--simulate", node, "--format", "prom"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"audit of {node} exited {proc.returncode}: {proc.stderr[-400:]}")
    return proc.stdout


def daemon_text(node: str) -> str:
    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp), "--simulate", node) as daemon:
        return daemon.settled_scrape()


def main() -> int:
    failed = False
    rows = []
    for node, target in TARGETS.items():
        audit, daemon = series(audit_text(node)), daemon_text(node)
        counts = series(daemon)
        total = sum(counts.values())
        top = ", ".join(f"{name.removeprefix('nodewarden_')} {n}" for name, n in counts.most_common(5))
        ok = total <= target
        failed = failed or not ok
        rows.append((node, sum(audit.values()), total, target, len(daemon.encode()), counts["nodewarden_check_status"],
                     counts["nodewarden_checks"], top, ok))
    print("| node | audit (textfile) | daemon /metrics | target | bytes per scrape | check_status | checks |"
          f" at {NODES:,} nodes | largest families |")
    print("|---|---|---|---|---|---|---|---|---|")
    for node, audit_n, total, target, size, status, checks, top, ok in rows:
        print(f"| {node} | {audit_n} | **{total}** {'ok' if ok else 'OVER'} | <= {target} | {size:,} | {status} | "
              f"{checks} | {total * NODES / 1e6:.1f} M | {top} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
