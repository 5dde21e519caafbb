"""The fleet's findings as Prometheus holds them (the daemons' /metrics), read over its HTTP API.

The same `NodeSummary` as from audit files, built from instant queries: a
node is an `instance` (its port dropped). Messages and observed values are
not in Prometheus, so finding rows carry the check and subject only, and only
for findings that do not pass: a passing or skipped finding is a count in
`nodewarden_checks{check,status}`, not a series of its own (docs/metrics.md).
"""

from __future__ import annotations

import datetime as dt
import re
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from typing import Any

from agent.fleet.records import BASELINE_CHECK, FindingRow, FleetInputError, NodeSummary
from agent.jsonfile import load_json_bytes

MAX_ANSWER_BYTES = 1 << 30  # one instant query over 20,000 nodes' check series is ~1 GB at worst

# nodewarden_check_status's value -> status (agent.report.prom.STATUS_CODES; a test keeps them equal).
STATUS_OF_CODE = {0: "pass", 1: "skip", 2: "fixed", 3: "warn", 4: "unknown", 5: "fail"}

QUERIES = {
    "checks": "nodewarden_checks > 0",
    "status": "nodewarden_check_status",
    "waived": "nodewarden_check_waived == 1",
    "profile": "nodewarden_profile_info == 1",
    "firmware": "nodewarden_firmware_info == 1",
    "temperature": "nodewarden_gpu_temperature_celsius",
    "xid": "nodewarden_xid_errors_total",
    "down": "nodewarden_source_up == 0",
    "audited": "nodewarden_audit_timestamp_seconds",
}


def _query(base: str, expr: str, timeout_s: float) -> list[dict[str, Any]]:
    url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            body = load_json_bytes(response.read(MAX_ANSWER_BYTES + 1), what=f"Prometheus at {base}",
                                   max_bytes=MAX_ANSWER_BYTES, max_depth=16)
    except (OSError, ValueError) as exc:
        raise FleetInputError(f"cannot query Prometheus at {base}: {exc}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise FleetInputError(f"Prometheus at {base} answered {str(body)[:200]}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or not all(isinstance(r, dict) and isinstance(r.get("metric"), dict)
                                               for r in result):
        raise FleetInputError(f"Prometheus at {base} answered without a list of samples for {expr}")
    return result


def _node(metric: dict[str, str]) -> str:
    return re.sub(r":\d+$", "", metric.get("instance", "?"))


def _count(sample: dict[str, Any]) -> int:
    try:
        return int(float(sample["value"][1]))
    except (KeyError, IndexError, TypeError, ValueError, OverflowError):
        return -1


def read_prometheus(base: str, keep_rows: bool = False, timeout_s: float = 30.0) -> list[NodeSummary]:
    if not re.match(r"^https?://", base):
        raise FleetInputError(f"--prometheus takes an http(s) URL, got {base!r}")
    results = {name: _query(base, expr, timeout_s) for name, expr in QUERIES.items()}
    waived = {(_node(r["metric"]), r["metric"].get("check"), r["metric"].get("subject")) for r in results["waived"]}
    per_node: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "counts": Counter(), "failing": [], "checks": {}, "firmware": defaultdict(set), "temps": {},
        "xids": Counter(), "waivers": [], "down": {}, "profile": "?", "started": None, "rows": [], "baseline": False})
    for sample in results["checks"]:
        m = sample["metric"]
        node = per_node[_node(m)]
        check, status, count = m.get("check", "?"), m.get("status", ""), _count(sample)
        if count < 0:
            continue
        node["baseline"] = node["baseline"] or check == BASELINE_CHECK
        node["counts"][status] += count
        node["checks"][check] = node["checks"].get(check, True) and not (status == "fail" and count > 0)
    for sample in results["status"]:
        m = sample["metric"]
        status = STATUS_OF_CODE.get(_count(sample))
        if status is None:
            continue
        node = per_node[_node(m)]
        check, subject = m.get("check", "?"), m.get("subject", "")
        is_waived = (_node(m), check, subject) in waived
        row = FindingRow(check, subject, status, m.get("severity", ""), is_waived, f"{check} {subject}: {status}")
        if status in ("fail", "warn") and not is_waived:
            node["failing"].append(row)
        if is_waived:
            node["waivers"].append(row)
        if keep_rows:
            node["rows"].append(row)
    for sample in results["profile"]:
        per_node[_node(sample["metric"])]["profile"] = sample["metric"].get("profile", "?")
    for sample in results["firmware"]:
        m = sample["metric"]
        component = m.get("component", "?")
        key = ("gpu vbios" if component.endswith(".vbios") else
               "nvidia driver" if component == "driver" else f"bmc {component}")
        per_node[_node(m)]["firmware"][key].add(m.get("version", "?"))
    for sample in results["temperature"]:
        per_node[_node(sample["metric"])]["temps"][f"gpu{sample['metric'].get('gpu')}"] = float(sample["value"][1])
    for sample in results["xid"]:
        xid = sample["metric"].get("xid", "")
        if xid.isdigit():
            per_node[_node(sample["metric"])]["xids"][int(xid)] += int(float(sample["value"][1]))
    for sample in results["down"]:
        per_node[_node(sample["metric"])]["down"][sample["metric"].get("source", "?")] = "down (nodewarden_source_up 0)"
    for sample in results["audited"]:
        per_node[_node(sample["metric"])]["started"] = dt.datetime.fromtimestamp(float(sample["value"][1]),
                                                                                 dt.timezone.utc)
    return [NodeSummary(name, f"prometheus:{base}", d["profile"], None, d["started"], dict(d["counts"]), d["failing"],
                        d["checks"], dict(d["firmware"]), d["temps"], dict(d["xids"]), d["waivers"], d["down"],
                        d["rows"], d["baseline"])
            for name, d in sorted(per_node.items()) if d["checks"]]
