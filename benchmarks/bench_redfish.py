"""Figure 3: a full BMC read over Redfish with a fixed latency per request.

Targets: issue #16: the HPE iLO 6 tree at 100 ms per request, concurrency 8, reads in
<= 1.5x the true chain bound. Issue #4 (kept for reference): <= 1.3x the chain and >= 4x faster
than serial at concurrency 4. Also reports requests per read for each mockup (fewer is better).

Method: sushy-static serves a real vendor mockup; a mitmdump reverse proxy adds `latency 0.1`
to every request (requests overlap, the proxy is asynchronous). The walker reads the BMC as the
audit does (`read_redfish`, `LiveRedfish` given the walk's concurrency) serially once, then at
each concurrency, the concurrencies interleaved within each of `--runs` rounds (in a rotating
order), so drift on a shared machine hits all of them alike.

The chain bound of a read is (requests on its longest chain of dependent requests) x latency,
counted per read: the login's requests (one after another: service root, session POST,
basic-auth check), plus the walk's deepest resource (`Walk.depth`: the requests on the chain that
led to it, a refused `$expand` and its plain resubmission both counted), plus the logout's. The
proxy counts every request, so login + walk + logout = what it saw.

Usage: python benchmarks/bench_redfish.py [--latency 0.1] [--runs 3] [--concurrency 4 8 16]
(needs the peers from python -m tests.peers.setup)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, NamedTuple

from _timing import REPO

sys.path.insert(0, str(REPO))

from agent.sources import redfish
from tests.peers.redfish import FaultProxy, fault_proxy, mockup, sushy_static

MOCKUPS = ["hpe-dl380a-gen11", "supermicro-x10", "gpu_info_unknown_multi", "powershelf_liteon"]
TARGET_MOCKUP, TARGET_CONCURRENCY, TARGET_RATIO = "hpe-dl380a-gen11", 8, 1.5  # issue #16


class Read(NamedTuple):
    seconds: float
    requests: int  # all the proxy saw: login + walk + logout
    walk_requests: int
    chain: int  # requests on the longest dependent chain
    deepest: str  # the resource at its end


def read(proxy: FaultProxy, concurrency: int) -> Read:
    walks: list[redfish.Walk] = []
    original_run = redfish.Walk.run

    def spy(self: redfish.Walk, start: Any = (redfish.ROOT,)) -> None:
        walks.append(self)
        original_run(self, start)

    proxy.reset_requests()
    redfish.Walk.run = spy  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        _facts, _status, transport = redfish.read_redfish(
            lambda: redfish.LiveRedfish(proxy.url, "bench", "bench", timeout_s=10, concurrency=concurrency),
            concurrency=concurrency, deadline_s=120)
        elapsed = time.perf_counter() - start
    finally:
        redfish.Walk.run = original_run  # type: ignore[method-assign]
    assert transport is not None and walks
    total = sum(proxy.requests().values())
    walk = walks[0]
    # Before issue #16 the transport did not count its login; then login = all but the walk's (no logout
    # request with basic auth, which sushy-static always ends up with).
    login = int(getattr(transport, "login_requests", total - transport.requests))
    logout = total - login - transport.requests
    deepest = max(walk.depth, key=lambda p: walk.depth[p])
    return Read(elapsed, total, transport.requests, login + walk.depth[deepest] + logout, deepest)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--mockups", nargs="+", default=MOCKUPS)
    args = parser.parse_args()
    ok = True
    for name in args.mockups:
        with sushy_static(mockup(name)) as peer, fault_proxy(peer.url) as proxy:
            proxy.set_rules([f"latency {args.latency}"])
            serial = read(proxy, 1)
            reads: dict[int, list[Read]] = {c: [] for c in args.concurrency}
            for round_ in range(args.runs):
                shift = round_ % len(args.concurrency)
                for concurrency in args.concurrency[shift:] + args.concurrency[:shift]:
                    reads[concurrency].append(read(proxy, concurrency))
            print(f"{name}: {serial.requests} requests per read ({serial.walk_requests} by the walk), "
                  f"longest chain {serial.chain} requests (to {serial.deepest}) = "
                  f"{serial.chain * args.latency:.2f} s; serial {serial.seconds:.2f} s "
                  f"= {serial.seconds / (serial.chain * args.latency):.2f}x the chain")
            for concurrency, runs in reads.items():
                seconds = statistics.median(r.seconds for r in runs)
                ratio = statistics.median(r.seconds / (r.chain * args.latency) for r in runs)
                chains = sorted({r.chain for r in runs})
                requests = sorted({r.requests for r in runs})
                speedup = serial.seconds / seconds
                line = (f"    concurrency {concurrency:>2}: {seconds:5.2f} s (median of {len(runs)}; "
                        f"{min(r.seconds for r in runs):.2f}-{max(r.seconds for r in runs):.2f}) = "
                        f"{ratio:4.2f}x the chain ({'/'.join(map(str, chains))} requests), "
                        f"{speedup:4.1f}x faster than serial, {'/'.join(map(str, requests))} requests")
                if name == TARGET_MOCKUP and concurrency == TARGET_CONCURRENCY:
                    met = ratio <= TARGET_RATIO
                    ok &= met
                    line += f" [issue #16 target <= {TARGET_RATIO}x: {'met' if met else 'missed'}]"
                print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
