"""Figure 16: the ledger at a real cluster's rate (issue 33).

Targets (issue 33): 30 days at 10 incidents per node per hour (about what a real 1,100-node cluster
produced) in at most 50 MB on disk; the history rules evaluated in at most 10 ms per daemon poll; one
incident recorded in at most 1 ms at p99.

Method: one process. A ledger under a temporary folder is filled with 30 days of incidents at 10 an
hour (7,200: Xids on 8 GPUs, 60 % of them fatal, kernel events, SXids, a drain or a remediation a day,
a reboot every 5 days), then pruned as the daemon prunes. Then, interleaved run by run:

* baseline: every other check of the audit (`run_checks`, all of them but history.*) on the facts of
  the simulated hgx-h100-drifted node: what a daemon poll already costs;
* history: what the engine adds per poll: the window the shipped rules need read back from the ledger
  (30 days, and every sticky rule's memory) and the four shipped rules evaluated over it, both checks;
* insert: one new incident recorded (a transaction of its own, as the daemon records a new Xid line),
  timed one by one for the p99.

The ratios are history / baseline (what the ledger adds to a poll) and the insert p99 against the
target. Usage: python benchmarks/bench_ledger.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _timing import REPO

sys.path.insert(0, str(REPO))

from agent.core.history import GpuRef, Incident, digest
from agent.engine.audit import AuditRequest, run_audit
from agent.engine.history import HistorySession
from agent.policy.config import load_config
from agent.policy.profiles import ProfileStore
from checks import all_checks, run_checks
from checks.history import rules_of

HOUR = 3600.0
DAYS = 30
RATE = 10  # incidents per node per hour
GPUS = [GpuRef(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", f"16501240{i:05d}") for i in range(8)]


def incidents(now: float) -> list[Incident]:
    out = []
    start = now - DAYS * 24 * HOUR
    for n in range(DAYS * 24 * RATE):
        ts = start + n * HOUR / RATE
        boot = f"boot-{int((ts - start) // (5 * 24 * HOUR))}"
        gpu = GPUS[n % 8]
        if n % 10 < 6:
            code, severity = ("79", "critical") if n % 10 < 4 else ("13", "warning")
            out.append(Incident(ts=ts, kind="xid", source="kmsg", code=code, gpu=gpu, subject=f"0000:{n % 8:02x}:00.0",
                                severity=severity, boot_id=boot, detail=f"NVRM: Xid (PCI:0000:{n % 8:02x}:00): {code}",
                                digest=digest("xid", n)))
        elif n % 10 < 9:
            out.append(Incident(ts=ts, kind="kernel_event", source="kmsg", code="pcie.aer", subject="0000:17:00.0",
                                boot_id=boot, detail="pcieport 0000:17:00.0: AER: Corrected error received",
                                digest=digest("ke", n)))
        elif n % 240 == 9:
            out.append(Incident(ts=ts, kind="drain" if n % 480 == 9 else "remediation", source="health-check",
                                code="DRAIN", subject="node", detail="gpu.lost gpu7", digest=digest("act", n)))
        else:
            out.append(Incident(ts=ts, kind="sxid", source="kmsg", code="12028", subject="nvswitch2 link 32",
                                boot_id=boot, detail="SXid 12028 Non-fatal", digest=digest("sxid", n)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    config = load_config(None)
    report = run_audit(AuditRequest(config=config, simulate="hgx-h100-drifted"))
    facts = report.facts
    assert facts is not None
    store = ProfileStore()
    profile = store.profile(report.profile)
    rules = rules_of(profile)
    others = [c for c in all_checks() if c.input == "facts" and not c.id.startswith("history.")]
    history_checks = [c for c in all_checks() if c.id.startswith("history.")]
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        session = HistorySession.open(state, source="daemon", writable=True)
        assert session.ledger is not None
        filled = incidents(now)
        started = time.perf_counter()
        session.ledger.record(filled, now=now)
        fill_s = time.perf_counter() - started
        session.ledger.prune(now=now)
        session.ledger._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        size = sum(os.path.getsize(p) for p in state.iterdir())
        base, history, inserts = [], [], []
        facts.observed_at = None
        for run in range(args.runs):
            t0 = time.process_time()
            run_checks(others, facts, profile)
            base.append(time.process_time() - t0)
            t0 = time.process_time()
            session.observe(facts, rules, now=now)
            run_checks(history_checks, facts, profile)
            history.append(time.process_time() - t0)
            for k in range(100):
                new = Incident(ts=now + run * 100 + k, kind="xid", source="kmsg", code="79", gpu=GPUS[k % 8],
                               severity="critical", boot_id="boot-now", detail="NVRM: Xid 79",
                               digest=digest("new", run, k))
                t0 = time.perf_counter()
                session.ledger.record([new], now=now)
                inserts.append(time.perf_counter() - t0)
        held = len(facts.history.incidents) if facts.history is not None else 0
        session.close()
    b, h = statistics.median(base), statistics.median(history)
    inserts.sort()
    p50, p99 = inserts[len(inserts) // 2], inserts[int(len(inserts) * 0.99)]
    print(f"ledger: {len(filled)} incidents over {DAYS} days filled in {fill_s:.2f} s; {size / 1e6:.2f} MB on disk "
          f"(target <= 50 MB); the rules read {held} incidents back")
    print(f"baseline: every other check          median {b * 1000:7.2f} ms CPU")
    print(f"history: window read + 4 rules, checks median {h * 1000:7.2f} ms CPU   x{h / b:4.2f} of baseline "
          f"(target <= 10 ms)")
    print(f"insert: one incident, its own transaction   p50 {p50 * 1000:.3f} ms   p99 {p99 * 1000:.3f} ms "
          f"(target p99 <= 1 ms; {len(inserts)} inserts)")


if __name__ == "__main__":
    main()
