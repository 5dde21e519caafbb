"""Figure 4: /metrics latency under 20 concurrent scrapers while the BMC hangs.

Target (issue #6): p99 <= 20 ms. Baseline, measured in the same run with the
same load: a bare prometheus-client exporter (`start_http_server`) serving one
gauge, i.e. the floor of an HTTP scrape in Python on this machine.

Method: `nodewarden daemon --simulate hgx-h100-drifted` with `--bmc` pointing at
a TCP listener that accepts and never answers (every BMC read hangs until its
timeout, then the next one hangs again). `curl --parallel` keeps 20
transfers in flight (fresh connections, gzip accepted as Prometheus does) for
`--per-thread` x 20 scrapes; the two servers are loaded alternately in rounds so
machine noise hits both alike. curl is the client because a Python client in
this process would mostly measure its own GIL.

Usage: python benchmarks/bench_scrape.py [--per-thread 50] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from _timing import REPO

sys.path.insert(0, str(REPO))

from tests.daemon_peer import running_daemon
from tests.peers.redfish import _die_with_parent, _wait_http, free_port, silent_listener

BASELINE = """
import sys, time
from prometheus_client import Gauge, start_http_server
Gauge("bench_value", "one gauge").set(1)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
while True:
    time.sleep(3600)
"""


def load(url: str, threads: int, per_thread: int) -> list[float]:
    """`threads` concurrent connections from curl (a separate process, like a real scraper: a Python
    client in this process would measure its own GIL), `per_thread` scrapes each, gzip accepted
    as Prometheus does. Returns every transfer's total time."""
    count = threads * per_thread
    config = "".join(f'url = "{url}?n={n}"\noutput = "/dev/null"\n' for n in range(count))
    proc = subprocess.run(
        ["curl", "-s", "-S", "--no-progress-meter", "--compressed", "--parallel", "--parallel-immediate",
         "--parallel-max", str(threads),
         "-w", "%{http_code} %{time_total}\n", "-K", "-"],
        input=config, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"curl exited {proc.returncode}: {proc.stderr[-500:]}")
    samples = []
    for line in proc.stdout.splitlines():
        code, seconds = line.split()
        assert code == "200", line
        samples.append(float(seconds))
    assert len(samples) == threads * per_thread, len(samples)
    return samples


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--per-thread", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, silent_listener() as (host, port):
        port_base = free_port()
        log = open(Path(tmp) / "baseline.log", "ab")  # noqa: SIM115
        baseline = subprocess.Popen([sys.executable, "-c", BASELINE, str(port_base)], stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)  # noqa: PLW1509
        _wait_http(f"http://127.0.0.1:{port_base}/metrics", baseline, Path(tmp) / "baseline.log")
        config = Path(tmp) / "config.yaml"
        config.write_text("daemon:\n  timeouts: {bmc_sensors: 2, bmc_inventory: 2}\n"
                          "  intervals: {bmc_sensors: 1, bmc_inventory: 1}\n")
        with running_daemon(Path(tmp), "--simulate", "hgx-h100-drifted", "--config", str(config),
                            "--bmc", f"http://{host}:{port}") as daemon:
            daemon.wait_for(lambda: daemon.value('nodewarden_source_up{source="redfish"}') == 0, what="BMC down")
            results: dict[str, list[float]] = {"baseline": [], "daemon": []}
            size = {"baseline": len(urllib.request.urlopen(f"http://127.0.0.1:{port_base}/metrics").read()),
                    "daemon": len(daemon.scrape()[1].encode())}
            for _ in range(args.rounds):
                results["baseline"] += load(f"http://127.0.0.1:{port_base}/metrics", args.threads, args.per_thread)
                results["daemon"] += load(f"{daemon.url}/metrics", args.threads, args.per_thread)
            assert daemon.value('nodewarden_source_up{source="redfish"}') == 0  # it hung all along
        baseline.kill()
    print(f"{args.threads} concurrent scrapers, {args.threads * args.per_thread * args.rounds} scrapes per server")
    for name, samples in results.items():
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        print(f"{name:<9} body {size[name]:>7} B   p50 {p50 * 1000:6.2f} ms   p99 {p99 * 1000:6.2f} ms   "
              f"max {max(samples) * 1000:6.2f} ms")
    ratio = percentile(results["daemon"], 0.99) / percentile(results["baseline"], 0.99)
    print(f"daemon p99 = x{ratio:.2f} of the bare exporter's p99; target p99 <= 20 ms: "
          f"{'met' if percentile(results['daemon'], 0.99) <= 0.020 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
