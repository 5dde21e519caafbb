"""The fleet's findings as Prometheus holds them (the daemons' /metrics), read over its HTTP API.

The same `NodeSummary` as from audit files, built from instant queries: a
node is an `instance` (its port dropped). Messages and observed values are
not in Prometheus, so finding rows carry the check and subject only, and only
for findings that do not pass: a passing or skipped finding is a count in
`nodewarden_checks{check,status}`, not a series of its own (docs/metrics.md).

Prometheus is read as hostile input: all queries share one total deadline (a
server that trickles a byte at a time never trips a per-read timeout, so a
timer cuts the socket at the deadline), and each answer is capped in bytes
before it is parsed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from typing import Any

from agent.apps.fleet.records import BASELINE_CHECK, FindingRow, FleetInputError, NodeSummary
from agent.io.jsonfile import load_json_bytes

# One query's answer. ~250 bytes a series and ~50 series a node in the largest query: 128 MiB holds
# ~10,000 nodes; parsed, it takes several times that. Larger fleets raise it (--prometheus-max-mb).
MAX_ANSWER_BYTES = 128 << 20
TOTAL_TIMEOUT_S = 300.0  # all queries together; Prometheus' own per-query limit is 2 min

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


def _cut(conn: http.client.HTTPConnection) -> None:
    """The deadline passed: shut the socket so a blocked read returns at once (from the timer thread)."""
    sock = conn.sock
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _fetch(base: str, expr: str, deadline: float, max_bytes: int) -> bytes:
    """One query's answer, read in bounded chunks; raises FleetInputError past the deadline or the cap."""
    parts = urllib.parse.urlsplit(base)
    target = f"{parts.path.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=remaining)
    timer = threading.Timer(remaining, _cut, (conn,))
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", target, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = bytearray()
        while chunk := response.read1(1 << 16):
            body += chunk
            if len(body) > max_bytes:
                raise FleetInputError(f"Prometheus at {base} answered more than {max_bytes >> 20} MiB for {expr} "
                                      "(raise --prometheus-max-mb for a larger fleet)")
        if time.monotonic() >= deadline:
            raise TimeoutError
        if response.length:  # the connection ended before Content-Length
            raise ValueError(f"answer cut short ({response.length} bytes missing)")
        if response.status != 200 and not body.lstrip().startswith(b"{"):
            raise ValueError(f"HTTP {response.status} {response.reason}")
        return bytes(body)
    except (OSError, http.client.HTTPException):
        if time.monotonic() >= deadline:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
        conn.close()


def _query(base: str, expr: str, deadline: float, max_bytes: int, timeout_s: float) -> list[dict[str, Any]]:
    try:
        body = load_json_bytes(_fetch(base, expr, deadline, max_bytes), what=f"Prometheus at {base}",
                               max_bytes=max_bytes, max_depth=16)
    except TimeoutError:
        raise FleetInputError(f"Prometheus at {base} did not answer all queries within {timeout_s:g} s "
                              "(--prometheus-timeout)") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
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


def read_prometheus(base: str, keep_rows: bool = False, timeout_s: float = TOTAL_TIMEOUT_S,
                    max_bytes: int = MAX_ANSWER_BYTES) -> list[NodeSummary]:
    """The fleet from Prometheus: every query within `timeout_s` in total, each answer at most `max_bytes`."""
    if not re.match(r"^https?://[^/]", base):
        raise FleetInputError(f"--prometheus takes an http(s) URL, got {base!r}")
    deadline = time.monotonic() + timeout_s
    results = {name: _query(base, expr, deadline, max_bytes, timeout_s) for name, expr in QUERIES.items()}
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
