"""A synthetic fleet of audit reports, varied the way real fleets vary.

Each node starts from a real `nodewarden audit --simulate` report of one of
the shipped simulated nodes (healthy or drifted HGX H100, healthy DGX A100)
and gets: its own hostname and report time (a few reports old or missing),
a firmware mix (most nodes on the current BMC and BIOS, some a release behind,
one node far behind), GPU temperatures with per-node noise and a few hot slots,
Xid errors on a few nodes, waivers (some expiring soon), a source down here and
there, duplicates and broken files. Findings are trimmed to about
`--findings` per node (the issue's sizing: ~150).

Usage: python benchmarks/fleet_generator.py OUT_DIR --nodes 10000 [--seed 1] [--findings 150]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASES = {"hgx-h100-healthy": 0.7, "hgx-h100-drifted": 0.1, "dgx-a100-healthy": 0.2}
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
BMC_VERSIONS = [("7.10.50.00", 0.86), ("7.00.00.00", 0.12), ("6.10.80.00", 0.02)]


def base_reports() -> dict[str, dict[str, Any]]:
    reports = {}
    for name in BASES:
        proc = subprocess.run([sys.executable, "-m", "agent", "audit", "--simulate", name, "--format", "json"],
                              capture_output=True, text=True, cwd=REPO, check=False)
        reports[name] = json.loads(proc.stdout)
    return reports


_TEXT: dict[tuple[int, str], str] = {}


def _base_text(bases: dict[str, dict[str, Any]], name: str) -> str:
    key = (id(bases), name)
    if key not in _TEXT:
        _TEXT[key] = json.dumps(bases[name])
    return _TEXT[key]


def _pick(rng: random.Random, weighted: list[tuple[str, float]]) -> str:
    return rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def make_node(rng: random.Random, number: int, bases: dict[str, dict[str, Any]], findings: int) -> dict[str, Any]:
    base_name = rng.choices(list(BASES), list(BASES.values()))[0]
    report = json.loads(_base_text(bases, base_name))  # a deep copy, several times faster than copy.deepcopy
    host = f"gpu-{number:05d}"
    report["node"]["hostname"] = host
    age = rng.choice([0.1, 0.5, 1, 2, 3, 6]) if rng.random() > 0.01 else rng.choice([30, 72, 200])
    report["started_at"] = (NOW - dt.timedelta(hours=age)).isoformat(timespec="seconds")
    hot_slot = rng.randrange(8) if rng.random() < 0.03 else None
    bmc_version = _pick(rng, BMC_VERSIONS)
    if number == 4242:
        bmc_version = "5.00.00.00"  # the one machine whose firmware is especially old
    kept = []
    for finding in report["findings"]:
        check, subject = finding["check"], finding["subject"]
        if check == "gpu.temperature" and isinstance(finding["observed"], int):
            extra = 12 if hot_slot is not None and subject == f"gpu{hot_slot}" else 0
            finding["observed"] = finding["observed"] + rng.randint(-2, 2) + extra
        elif check == "bmc.firmware" and subject == "bmc":
            finding["observed"] = bmc_version
            finding["status"] = "pass" if bmc_version >= "7" else "fail"
        elif check == "gpu.xid" and rng.random() < 0.004:
            finding["observed"] = {rng.choice(["79", "48", "94", "13"]): rng.randint(1, 3)}
            finding["status"] = "fail"
        kept.append(finding)
    # Trim to about `findings`, keeping everything that is not a pass.
    passes = [f for f in kept if f["status"] == "pass" and f["check"] not in ("gpu.temperature", "bmc.firmware")]
    drop = set(map(id, rng.sample(passes, max(0, min(len(passes), len(kept) - findings)))))
    report["findings"] = [f for f in kept if id(f) not in drop]
    if rng.random() < 0.02:
        target = next(f for f in report["findings"]
                      if f["status"] in ("fail", "warn") or f["check"] == "gpu.temperature")
        expires = (NOW + dt.timedelta(days=rng.choice([3, 10, 90]))).date().isoformat()
        target["waiver"] = {"reason": "vendor RMA open", "expires": expires}
    if rng.random() < 0.01:
        report["sources"]["redfish"] = {"ok": False, "error": "timed out", "duration_s": 60.0, "configured": True}
    return report


def generate(out: Path, nodes: int, seed: int = 1, findings: int = 150, broken: int = 3, duplicates: int = 2) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    bases = base_reports()
    out.mkdir(parents=True, exist_ok=True)
    for number in range(nodes):
        report = make_node(rng, number, bases, findings)
        (out / f"{report['node']['hostname']}.json").write_text(json.dumps(report))
        if number < duplicates:  # an older report of the same node, fetched twice
            older = dict(report, started_at=(NOW - dt.timedelta(days=3)).isoformat(timespec="seconds"))
            (out / f"{report['node']['hostname']}.old.json").write_text(json.dumps(older))
    for number in range(broken):
        (out / f"broken-{number}.json").write_text(['{"schema": "nodewarden.report/v1", "node": {',
                                                    '{"unrelated": "json"}', "\x00\xff not json"][number % 3])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", type=int, default=150)
    args = parser.parse_args()
    generate(args.out, args.nodes, args.seed, args.findings)
    print(f"{args.nodes} nodes written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
