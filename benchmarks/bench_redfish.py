"""Figure 3: a full BMC read over Redfish with a fixed latency per request.

Targets (issue #4): with 100 ms injected per request, the full read takes
<= 1.3x (longest chain of dependent requests x latency) and is >= 4x faster
than the same requests made one after another. Also reports requests per read
for each mockup in the test set (fewer is better).

Method: sushy-static serves a real vendor mockup; a mitmdump reverse proxy adds
`latency 0.1` to every request (requests overlap, the proxy is asynchronous).
The same walker reads the BMC with the default concurrency (4) and with
concurrency 1 (serial). The longest chain counts the login requests (which
are sequential) plus the deepest resource in the walk's dependency graph.

Usage: python benchmarks/bench_redfish.py [--latency 0.1] [--runs 3]
(needs the peers from python -m tests.peers.setup)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _timing import REPO

sys.path.insert(0, str(REPO))

from agent.sources import redfish
from tests.peers.redfish import fault_proxy, mockup, sushy_static

MOCKUPS = ["hpe-dl380a-gen11", "supermicro-x10", "gpu_info_unknown_multi", "powershelf_liteon"]


def read(url: str, concurrency: int) -> tuple[float, redfish.Walk, int]:
    walks: list[redfish.Walk] = []
    original_run = redfish.Walk.run

    def spy(self: redfish.Walk, start: object = (redfish.ROOT,)) -> None:
        walks.append(self)
        original_run(self)

    redfish.Walk.run = spy  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        _facts, _status, transport = redfish.read_redfish(
            lambda: redfish.LiveRedfish(url, "bench", "bench", timeout_s=10), concurrency=concurrency,
            deadline_s=120)
        elapsed = time.perf_counter() - start
    finally:
        redfish.Walk.run = original_run  # type: ignore[method-assign]
    assert transport is not None
    return elapsed, walks[0], transport.requests


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    ok = True
    for name in MOCKUPS:
        with sushy_static(mockup(name)) as peer, fault_proxy(peer.url) as proxy:
            proxy.set_rules([f"latency {args.latency}"])
            proxy.reset_requests()
            serial_s, walk, walk_requests = read(proxy.url, 1)
            total = sum(proxy.requests().values())
            login = total - walk_requests  # the library's own requests: service root, session, basic check
            chain = login + max(walk.depth.values())
            bound = chain * args.latency
            print(f"{name}: {total} requests per read ({walk_requests} by the walk, {login} to log in), "
                  f"{len(walk.resources)} resources, longest chain {chain} requests = {bound:.2f} s; "
                  f"serial {serial_s:.2f} s")
            for concurrency in args.concurrency:
                best = statistics.median(read(proxy.url, concurrency)[0] for _ in range(args.runs))
                ratio, speedup = best / bound, serial_s / best
                verdict = "ok" if ratio <= 1.3 and speedup >= 4 else "missed"
                if concurrency == 4:
                    ok &= verdict == "ok"
                print(f"    concurrency {concurrency:>2}: {best:5.2f} s = {ratio:4.2f}x the chain, "
                      f"{speedup:4.1f}x faster than serial [{verdict}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
