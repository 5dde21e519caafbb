"""The exposition the daemon renders: identical to prometheus-client's, label values escaped."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agent.config import Config
from agent.engine import AuditRequest, run_audit
from agent.metrics import NodeMetrics
from agent.report.prom import render_families, render_with_client


def test_our_fast_rendering_is_byte_identical_to_prometheus_client() -> None:
    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))
    metrics = NodeMetrics(report, {"host": 1700000000.5}, {("0000:db:00.0", 79): 1, ('odd"\\name\n', 3): 2})
    ours = render_families(metrics.families())
    assert ours == render_with_client(metrics.families())
    parsed = {f.name: f for f in text_string_to_metric_families(ours.decode())}
    (odd,) = [s for s in parsed["nodewarden_xid_errors"].samples if s.labels["xid"] == "3"]
    assert odd.labels["gpu"] == 'odd"\\name\n' and odd.value == 2  # escaped and read back intact
    assert {s.labels["gpu"] for s in parsed["nodewarden_xid_errors"].samples} >= {"7"}  # PCI address -> index
