"""The exposition the daemon renders: identical to prometheus-client's, label values escaped; its size per node."""

from __future__ import annotations

import copy
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from agent.apps.fleet.prometheus import STATUS_OF_CODE
from agent.core.model import Finding, Status, Waiver
from agent.engine.audit import AuditRequest, run_audit
from agent.io import metrics_server
from agent.io.metrics_server import MAX_HEAD_BYTES, Exposition, MetricsServer, ServerSettings
from agent.policy.config import Config
from agent.report.collapse import display_subjects
from agent.report.metrics import HEALTH_CODES, NodeMetrics
from agent.report.model import Report
from agent.report.prom import PASSING, STATUS_CODES, render_families, render_prom, render_with_client, report_families


def test_our_fast_rendering_is_byte_identical_to_prometheus_client() -> None:
    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))
    metrics = NodeMetrics(report, {"host": 1700000000.5}, {("0000:db:00.0", 79): 1, ('odd"\\name\n', 3): 2})
    ours = render_families(metrics.families())
    assert ours == render_with_client(metrics.families())
    parsed = {f.name: f for f in text_string_to_metric_families(ours.decode())}
    (odd,) = [s for s in parsed["nodewarden_xid_errors"].samples if s.labels["xid"] == "3"]
    assert odd.labels["gpu"] == 'odd"\\name\n' and odd.value == 2  # escaped and read back intact
    assert {s.labels["gpu"] for s in parsed["nodewarden_xid_errors"].samples} >= {"7"}  # PCI address -> index


# ---- issue 14: what a Prometheus of 10,000 nodes can carry ----

DRIFTED_BUDGET, HEALTHY_BUDGET = 600, 450  # series per scrape of the daemon's /metrics


def series_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def process_series() -> int:
    """prometheus-client's process, platform and GC metrics, which the server appends to every scrape."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return len(series_lines(generate_latest(registry).decode()))


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {name: run_audit(AuditRequest(config=Config(), simulate=f"hgx-h100-{name}")) for name in ("drifted", "healthy")}


def daemon_text(report: Report) -> str:
    last = {name: 1.7e9 for name, src in report.sources.items() if src.configured}
    return NodeMetrics(report, last, {("0000:db:00.0", 79): 1}).render().decode()


@pytest.mark.parametrize(("name", "budget"), [("drifted", DRIFTED_BUDGET), ("healthy", HEALTHY_BUDGET)])
def test_series_per_node_fit_the_budget(reports: dict[str, Report], name: str, budget: int) -> None:
    report = reports[name]
    daemon = len(series_lines(daemon_text(report))) + process_series()
    audit = len(series_lines(render_prom(report)))
    assert daemon <= budget, f"{name}: {daemon} series on /metrics"
    assert audit <= budget // 3, f"{name}: {audit} series in the audit's textfile"
    assert len(report.findings) > 300  # the budget holds with every finding counted


def test_a_finding_has_a_series_only_while_it_does_not_pass(reports: dict[str, Report]) -> None:
    for name, report in reports.items():
        families = {f.name: f for f in report_families(report)}
        codes = {(s.labels["check"], s.labels["subject"]): s.value for s in families["nodewarden_check_status"].samples}
        first: dict[tuple[str, str], Finding] = {}
        shown = display_subjects(report.findings)  # a firmware group's name, not its grouping key
        for finding in report.findings:
            first.setdefault((finding.check, shown[id(finding)]), finding)
        problems = {key: STATUS_CODES[f.status] for key, f in first.items() if f.status not in PASSING}
        assert codes == problems, name
        counts = {(s.labels["check"], s.labels["status"]): s.value for s in families["nodewarden_checks"].samples}
        assert sum(counts.values()) == len(report.findings) and 0 not in counts.values()
    assert not [s for s in report_families(reports["healthy"])[0].samples]  # a healthy node: no finding series
    # Ordered by badness: max() over a node's findings is its worst status.
    assert sorted(STATUS_CODES, key=STATUS_CODES.__getitem__) == [
        Status.PASS, Status.SKIP, Status.FIXED, Status.WARN, Status.UNKNOWN, Status.FAIL]
    assert {code: status.value for status, code in STATUS_CODES.items()} == STATUS_OF_CODE  # the fleet reader's


def test_waived_and_unknown_findings_keep_their_series(reports: dict[str, Report]) -> None:
    report = copy.deepcopy(reports["drifted"])
    rmem = next(f for f in report.findings if f.subject == "net.core.rmem_max")
    rmem.waiver = Waiver(check="host.sysctl", subject="net.core.rmem_max", reason="test", expires="2099-01-01")
    first_gpu = next(f for f in report.findings if f.check == "gpu.temperature")
    first_gpu.status = Status.UNKNOWN
    families = {f.name: f for f in report_families(report)}
    status = {(s.labels["check"], s.labels["subject"]): s.value for s in families["nodewarden_check_status"].samples}
    assert status[("host.sysctl", "net.core.rmem_max")] == 5  # still failing, and marked waived
    assert status[("gpu.temperature", first_gpu.subject)] == 4
    waived = [(s.labels, s.value) for s in families["nodewarden_check_waived"].samples]
    assert waived == [({"check": "host.sysctl", "subject": "net.core.rmem_max"}, 1)]
    counts = {(s.labels["check"], s.labels["status"]): s.value for s in families["nodewarden_checks"].samples}
    assert counts[("host.sysctl", "waived")] == 1 and ("host.sysctl", "fail") not in counts


def test_gpu_labels_are_dcgm_exporters(reports: dict[str, Report]) -> None:
    families = {f.name: f for f in text_string_to_metric_families(daemon_text(reports["drifted"]))}
    temps = {s.labels["gpu"]: s.labels for s in families["nodewarden_gpu_temperature_celsius"].samples}
    assert set(temps["0"]) == {"gpu", "UUID", "pci_bus_id", "modelName"}
    assert temps["0"]["pci_bus_id"] == "00000000:19:00.0" and temps["1"]["pci_bus_id"] == "00000000:3B:00.0"
    assert temps["0"]["UUID"].startswith("GPU-") and temps["0"]["modelName"] == "NVIDIA H100 80GB HBM3"
    limits = {s.labels["limit"] for s in families["nodewarden_gpu_power_limit_watts"].samples}
    assert limits == {"enforced", "default"}


def test_psu_and_fan_health_is_one_series_per_item(reports: dict[str, Report]) -> None:
    families = {f.name: f for f in text_string_to_metric_families(daemon_text(reports["drifted"]))}
    psus = {s.labels["psu"]: s.value for s in families["nodewarden_psu_health"].samples}
    assert psus == {f"PS{i} Status": (HEALTH_CODES["critical"] if i == 3 else HEALTH_CODES["ok"]) for i in range(1, 7)}
    fans = [s for s in families["nodewarden_fan_health"].samples]
    assert len(fans) == len({s.labels["fan"] for s in fans}) == 12 and {s.value for s in fans} == {0}
    assert list(HEALTH_CODES) == ["ok", "absent", "unknown", "warning", "critical"]  # ordered by badness


# ---- issue 21, item 6: the server bounds every request (the attacks: tests/attacks/test_metrics_slowloris.py) ----

def _serving(monkeypatch: pytest.MonkeyPatch, deadline_s: float) -> MetricsServer:
    monkeypatch.setattr(metrics_server, "REQUEST_DEADLINE_S", deadline_s)
    server = MetricsServer(ServerSettings(port=0), lambda: Exposition(b"up 1\n"))
    server.start()
    return server


def _read_all(sock: socket.socket, within_s: float) -> bytes:
    sock.settimeout(within_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_request_head_over_the_cap_is_refused_and_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _serving(monkeypatch, 5.0)
    try:
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 100) + b"\r\n\r\n")
            answer = _read_all(sock, 5)  # ends: the server closed the connection
        assert answer.startswith(b"HTTP/1.1 431 ")
        with socket.create_connection(server.address, timeout=5) as sock:  # and a normal scrape still works
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = _read_all(sock, 5)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\n\r\nup 1\n" in answer
    finally:
        server.stop()


def test_a_trickling_request_is_cut_at_the_total_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _serving(monkeypatch, 1.0)
    try:
        with socket.create_connection(server.address, timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            closed_after = None
            while time.monotonic() - start < 5:
                try:
                    sock.sendall(b"a")  # a byte every 0.2 s: no single read ever waits long
                    sock.settimeout(0.2)
                    if sock.recv(1) == b"":
                        closed_after = time.monotonic() - start
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed_after = time.monotonic() - start
                    break
        assert closed_after is not None and 0.9 <= closed_after < 2.0, closed_after
    finally:
        server.stop()
