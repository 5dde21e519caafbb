"""Figure 5: the daemon's footprint over time on a recorded 8-GPU node at default intervals.

Targets (issue #6): RSS <= 60 MB and CPU <= 1 % of one core over 10 minutes.
Baseline (the floor), run at the same time: a bare prometheus-client exporter
serving one gauge. Both are scraped every 15 s (a typical Prometheus interval)
so the serving cost is part of the figure.

Method: `nodewarden daemon --simulate hgx-h100-drifted` (default intervals:
NVML 15 s, host 60 s, BMC sensors 120 s, BMC inventory 1 h; the recorded BMC
is walked like a live one) and the baseline run side by side; every 5 s psutil
samples each process's RSS; CPU is the process's user+system time over the
measured window, after a 30 s warm-up that is left out.

Usage: python benchmarks/bench_footprint.py [--duration 600]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from _timing import REPO

sys.path.insert(0, str(REPO))

from bench_scrape import BASELINE

from tests.daemon_peer import running_daemon
from tests.peers.redfish import _die_with_parent, _wait_http, free_port


def scrape(url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        response.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        log = open(Path(tmp) / "baseline.log", "ab")  # noqa: SIM115
        baseline = subprocess.Popen([sys.executable, "-c", BASELINE, str(port)], stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)  # noqa: PLW1509
        _wait_http(f"http://127.0.0.1:{port}/metrics", baseline, Path(tmp) / "baseline.log")
        with running_daemon(Path(tmp), "--simulate", "hgx-h100-drifted") as daemon:
            processes = {"baseline": psutil.Process(baseline.pid), "daemon": psutil.Process(daemon.proc.pid)}
            urls = {"baseline": f"http://127.0.0.1:{port}/metrics", "daemon": f"{daemon.url}/metrics"}
            time.sleep(args.warmup)
            cpu0 = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
            rss: dict[str, list[int]] = {name: [] for name in processes}
            start = time.monotonic()
            next_scrape = start
            while time.monotonic() - start < args.duration:
                if time.monotonic() >= next_scrape:
                    for url in urls.values():
                        scrape(url)
                    next_scrape += 15
                for name, proc in processes.items():
                    rss[name].append(proc.memory_info().rss)
                time.sleep(5)
            elapsed = time.monotonic() - start
            cpu = {name: (sum(p.cpu_times()[:2]) - cpu0[name]) / elapsed * 100 for name, p in processes.items()}
            polls = daemon.value('nodewarden_source_up{source="nvml"}')
        baseline.kill()
    print(f"window {elapsed:.0f} s after {args.warmup:.0f} s warm-up; scraped every 15 s; nvml up = {polls}")
    for name in processes:
        print(f"{name:<9} RSS max {max(rss[name]) / 2**20:6.1f} MiB  last {rss[name][-1] / 2**20:6.1f} MiB   "
              f"CPU {cpu[name]:5.2f} % of one core")
    print(f"daemon/baseline: RSS x{max(rss['daemon']) / max(rss['baseline']):.2f}, "
          f"CPU x{cpu['daemon'] / max(cpu['baseline'], 1e-9):.1f}; targets RSS <= 60 MB: "
          f"{'met' if max(rss['daemon']) <= 60e6 else 'MISSED'}, "
          f"CPU <= 1 %: {'met' if cpu['daemon'] <= 1 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
