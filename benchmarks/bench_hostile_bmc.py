"""Figure 8: what a hostile BMC costs an audit (peak RSS and wall time).

Targets (issue #12): against a BMC that sends 300 MB and one whose collections fan out without
end, the audit's peak RSS stays under 100 MiB and it finishes within its total BMC deadline.

Method: `nodewarden audit --simulate hgx-h100-healthy --only 'bmc.*' --bmc URL` as a whole process,
against tests/peers/hostile_redfish.py on 127.0.0.1 in three modes, interleaved run by run and
repeated: `normal` (a tiny honest service: the baseline), `huge` (300 MB chunked body for
/Chassis) and `fanout` (every collection answers 1,000 fresh member collections). Peak RSS is the
audit process's ru_maxrss, read by a wrapper whose only child is the audit. BMC deadline 30 s,
per-request timeout 10 s.

Usage: python benchmarks/bench_hostile_bmc.py [--runs 3]
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

sys.path.insert(0, str(REPO))

from tests.peers.hostile_redfish import hostile_bmc

WRAPPER = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
DEADLINE_S = 30


def one_audit(tmp: Path, url: str) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one audit against `url`."""
    config = tmp / "config.yaml"
    config.write_text(f"bmc:\n  deadline_s: {DEADLINE_S}\n  timeout_s: 10\n")
    password = tmp / "pw"
    password.write_text("benchmark\n")
    password.chmod(0o600)
    argv = [sys.executable, "-m", "agent", "audit", "--simulate", "hgx-h100-healthy", "--config", str(config),
            "--bmc", url, "--bmc-user", "u", "--bmc-password-file", str(password), "--only", "bmc.*",
            "--format", "json"]
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=DEADLINE_S + 60, check=True, env={**os.environ})
    return time.monotonic() - start, int(out.stdout.strip()) / 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    modes = ("normal", "huge", "fanout")
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for mode in modes:  # interleaved: every run sees the same machine state for each mode
                with hostile_bmc(mode) as bmc:
                    results[mode].append(one_audit(Path(tmp), bmc.url))
    base_s = statistics.median(s for s, _ in results["normal"])
    base_rss = statistics.median(r for _, r in results["normal"])
    print(f"| BMC | median wall | ratio | median peak RSS | max peak RSS | ratio |  ({args.runs} runs)")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        wall = statistics.median(s for s, _ in results[mode])
        rss = statistics.median(r for _, r in results[mode])
        top = max(r for _, r in results[mode])
        print(f"| {mode} | {wall:.2f} s | {wall / base_s:.2f} | {rss:.1f} MiB | {top:.1f} MiB | {rss / base_rss:.2f} |")
    worst = max(r for mode in ("huge", "fanout") for _, r in results[mode])
    slowest = max(s for mode in ("huge", "fanout") for s, _ in results[mode])
    print(f"target: peak RSS < 100 MiB (worst {worst:.1f}), "
          f"within the {DEADLINE_S} s deadline (slowest {slowest:.1f} s)")
    return 0 if worst < 100 and slowest < DEADLINE_S + 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
