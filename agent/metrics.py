"""The daemon's /metrics: families built from cached facts, and the HTTP server that serves them.

Nothing here reads hardware. The daemon builds the exposition once per
evaluation (`NodeMetrics.render`) and the server hands those bytes out, with
prometheus-client's process metrics appended per scrape, so a scrape costs
the same whether the BMC answers or hangs. Names: docs/metrics.md.
"""

from __future__ import annotations

import base64
import hmac
import logging
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from agent.credentials import Secret
from agent.errors import NodewardenError
from agent.facts import BmcFacts, NvmlFacts
from agent.model import Unknown
from agent.report.model import Report
from agent.report.prom import render_families, report_families

log = logging.getLogger(__name__)
# PSU and fan health codes, ordered by badness (max() is the worst); docs/metrics.md.
HEALTH_CODES = {"ok": 0, "absent": 1, "unknown": 2, "warning": 3, "critical": 4}
# GPU labels as dcgm-exporter names them, so the two join on (instance, gpu) or UUID.
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "modelName"]


def _known(value: Any) -> bool:
    return value is not None and not isinstance(value, Unknown)


def _health(state: str | None, health: str | None) -> str:
    if state == "Absent":
        return "absent"
    return {"ok": "ok", "warning": "warning", "critical": "critical"}.get(str(health or "").lower(), "unknown")


def _dcgm_bus_id(address: Any) -> str:
    """NVML's bus id as dcgm-exporter prints it (00000000:19:00.0) from ours (0000:19:00.0)."""
    if not isinstance(address, str) or address.count(":") != 2:
        return ""
    domain, rest = address.split(":", 1)
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return ""


@dataclass
class NodeMetrics:
    """Everything /metrics shows, as of one evaluation."""

    report: Report | None
    last_success: dict[str, float] | None = field(default_factory=dict)  # source -> Unix time (0: never)
    xid_counts: dict[tuple[str, int], int] = field(default_factory=dict)  # (PCI address, xid) -> events
    timing: bool = True  # False: the daemon serves the timestamps per scrape (`freshness_families`)

    def families(self) -> list[Metric]:
        families: list[Metric] = report_families(self.report, self.timing) if self.report is not None else []
        if self.last_success is not None:
            families.append(last_success_family(self.last_success))
        facts = self.report.facts if self.report is not None else None
        nvml = facts.nvml if facts is not None else None
        bmc = facts.bmc if facts is not None else None
        families += gpu_families(nvml if isinstance(nvml, NvmlFacts) else None)
        families += bmc_families(bmc if isinstance(bmc, BmcFacts) else None)
        families += rdma_families(facts.host.rdma if facts is not None else None)
        families.append(firmware_family(nvml if isinstance(nvml, NvmlFacts) else None,
                                        bmc if isinstance(bmc, BmcFacts) else None))
        host = facts.host if facts is not None else None
        pci_gpus = host.nvidia_gpus if host is not None and isinstance(host.nvidia_gpus, tuple) else ()
        families.append(xid_family(self.xid_counts, nvml if isinstance(nvml, NvmlFacts) else None,
                                   tuple(sorted(g.address for g in pci_gpus))))
        return families

    def render(self) -> bytes:
        return render_families(self.families())


def last_success_family(last_success: dict[str, float]) -> Metric:
    last = GaugeMetricFamily("nodewarden_source_last_success_timestamp_seconds",
                             "Unix time of the source's last successful read (0: never)", labels=["source"])
    for source, stamp in sorted(last_success.items()):
        last.add_metric([source], stamp)
    return last


def freshness_families(last_success: dict[str, float], confirmed_at: float) -> list[Metric]:
    """What changes with every poll even when the facts do not: served per scrape by the daemon."""
    audited = GaugeMetricFamily("nodewarden_audit_timestamp_seconds",
                                "When the checks last ran or their facts were last confirmed unchanged (Unix time)")
    audited.add_metric([], confirmed_at)
    return [last_success_family(last_success), audited]


def gpu_families(nvml: NvmlFacts | None) -> list[Metric]:
    labels = GPU_LABELS
    up = GaugeMetricFamily("nodewarden_gpu_up", "1 if the GPU answered its last NVML read", labels=labels)
    temp = GaugeMetricFamily("nodewarden_gpu_temperature_celsius", "GPU core temperature", labels=labels)
    margin = GaugeMetricFamily("nodewarden_gpu_thermal_margin_celsius",
                               "Slowdown threshold minus temperature (low: about to throttle)", labels=labels)
    power = GaugeMetricFamily("nodewarden_gpu_power_watts", "GPU power draw", labels=labels)
    limit = GaugeMetricFamily("nodewarden_gpu_power_limit_watts", "GPU power limits (enforced, default)",
                              labels=[*labels, "limit"])
    ecc = GaugeMetricFamily("nodewarden_gpu_ecc_errors", "ECC error counts as NVML reports them",
                            labels=[*labels, "type", "scope"])
    remap = GaugeMetricFamily("nodewarden_gpu_remapped_rows", "HBM row remaps", labels=[*labels, "type"])
    nvlink = GaugeMetricFamily("nodewarden_gpu_nvlink_active_links", "NVLink links in the active state",
                               labels=labels)
    width = GaugeMetricFamily("nodewarden_gpu_pcie_link_width", "PCIe link width", labels=[*labels, "which"])
    families: list[Metric] = [up, temp, margin, power, limit, ecc, remap, nvlink, width]
    if nvml is None:
        return families
    for gpu in nvml.gpus:
        key = [str(gpu.index), gpu.uuid if isinstance(gpu.uuid, str) else "", _dcgm_bus_id(gpu.pci_bus_id),
               gpu.name if isinstance(gpu.name, str) else ""]
        readable = gpu.lost is None and not isinstance(gpu.name, Unknown)
        up.add_metric(key, 1 if readable else 0)
        if not readable:
            continue
        _add(temp, key, gpu.temperature_c)
        if _known(gpu.temperature_c) and _known(gpu.slowdown_c):
            margin.add_metric(key, float(gpu.slowdown_c) - float(gpu.temperature_c))  # type: ignore[arg-type]
        _add(power, key, gpu.power_w)
        # The board's min/max limits are constants no alert or panel reads: left out (cardinality).
        for name, value in (("enforced", gpu.enforced_limit_w), ("default", gpu.default_limit_w)):
            _add(limit, [*key, name], value)
        for kind, scope, value in (("corrected", "volatile", gpu.ecc_volatile_corrected),
                                   ("uncorrected", "volatile", gpu.ecc_volatile_uncorrected),
                                   ("corrected", "aggregate", gpu.ecc_aggregate_corrected),
                                   ("uncorrected", "aggregate", gpu.ecc_aggregate_uncorrected)):
            _add(ecc, [*key, kind, scope], value)
        for kind, value in (("correctable", gpu.remapped_correctable), ("uncorrectable", gpu.remapped_uncorrectable),
                            ("pending", gpu.remap_pending), ("failure", gpu.remap_failure)):
            _add(remap, [*key, kind], value)
        states = gpu.nvlink_states
        if isinstance(states, tuple):
            nvlink.add_metric(key, len([state for state in states if state == 1]))
        _add(width, [*key, "current"], gpu.pcie_width)
        _add(width, [*key, "max"], gpu.pcie_width_max)
    return families


def _add(family: GaugeMetricFamily, labels: list[str], value: Any) -> None:
    if _known(value) and isinstance(value, (int, float)):
        family.add_metric(labels, float(value))


def bmc_families(bmc: BmcFacts | None) -> list[Metric]:
    temps = GaugeMetricFamily("nodewarden_bmc_temperature_celsius", "BMC temperature sensors", labels=["sensor"])
    psu = GaugeMetricFamily("nodewarden_psu_health", "PSU health: 0 ok, 1 absent, 2 unknown, 3 warning, 4 critical",
                            labels=["psu"])
    fan = GaugeMetricFamily("nodewarden_fan_health", "Fan health: 0 ok, 1 absent, 2 unknown, 3 warning, 4 critical",
                            labels=["fan"])
    redundancy = GaugeMetricFamily("nodewarden_psu_redundancy_ok", "1 if the PSU redundancy group is healthy",
                                   labels=["group"])
    families: list[Metric] = [temps, psu, fan, redundancy]
    if bmc is None:
        return families
    if isinstance(bmc.temperatures, tuple):
        for sensor in bmc.temperatures:
            if sensor.reading is not None and sensor.state != "Absent":
                temps.add_metric([sensor.name], sensor.reading)
    for family, items in ((psu, bmc.psus), (fan, bmc.fans)):
        if isinstance(items, tuple):
            seen: set[str] = set()
            for item in items:
                if item.name not in seen:  # a series must be unique; the first item of a name wins
                    seen.add(item.name)
                    family.add_metric([item.name], HEALTH_CODES[_health(item.state, item.health)])
    if isinstance(bmc.redundancy, tuple):
        for group in bmc.redundancy:
            ok = str(group.health or "").lower() == "ok" and group.state not in ("Disabled", "UnavailableOffline")
            redundancy.add_metric([group.name], 1 if ok else 0)
    return families


IB_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                     "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


def rdma_families(rdma: Any) -> list[Metric]:
    """RDMA ports: state, rate and the error counters as counters, so Prometheus turns them into rates."""
    up = GaugeMetricFamily("nodewarden_ib_port_up", "1 if the RDMA port is ACTIVE and LinkUp",
                           labels=["device", "port"])
    rate = GaugeMetricFamily("nodewarden_ib_port_rate_gbps", "The RDMA port's link rate", labels=["device", "port"])
    errors = CounterMetricFamily("nodewarden_ib_port_errors", "RDMA port error counters since boot",
                                 labels=["device", "port", "counter"])
    families: list[Metric] = [up, rate, errors]
    if not isinstance(rdma, tuple):
        return families
    for device in rdma:
        if not isinstance(device.ports, tuple):
            continue
        for port in device.ports:
            key = [device.name, str(port.port)]
            up.add_metric(key, 1 if (port.state, port.phys_state) == ("ACTIVE", "LinkUp") else 0)
            if isinstance(port.rate, str) and port.rate.split(" ", 1)[0].replace(".", "", 1).isdigit():
                rate.add_metric(key, float(port.rate.split(" ", 1)[0]))
            if isinstance(port.counters, dict):
                for name in IB_ERROR_COUNTERS:
                    value = port.counters.get(name)
                    if isinstance(value, int):
                        errors.add_metric([*key, name], value)
    return families


def firmware_family(nvml: NvmlFacts | None, bmc: BmcFacts | None) -> Metric:
    info = GaugeMetricFamily("nodewarden_firmware_info", "Firmware and driver versions",
                             labels=["component", "version"])
    seen: set[tuple[str, str]] = set()

    def add(component: str, version: Any) -> None:
        if isinstance(version, str) and version and (component, version) not in seen:
            seen.add((component, version))
            info.add_metric([component, version], 1)

    if bmc is not None:
        add("bmc", bmc.manager_firmware)
        add("bios", bmc.bios_version)
        if isinstance(bmc.firmware, tuple):
            for item in bmc.firmware:
                if item.installed:
                    add(item.stable_id, item.version)
    if nvml is not None:
        add("driver", nvml.driver_version)
        for gpu in nvml.gpus:
            add(f"gpu{gpu.index}.vbios", gpu.vbios)
    return info


def xid_family(counts: dict[tuple[str, int], int], nvml: NvmlFacts | None, pci_gpus: tuple[str, ...] = ()) -> Metric:
    """Xid events since the daemon started (the boot's earlier ones counted at start); gpu = NVML index.

    A GPU NVML cannot read (fallen off the bus: the Xid that matters most) has no bus id from
    NVML; NVML numbers GPUs in PCI bus order, so its place among the host's NVIDIA GPUs gives it.
    """
    index_of: dict[str, str] = {address: str(number) for number, address in enumerate(pci_gpus)}
    if nvml is not None:
        for gpu in nvml.gpus:
            if isinstance(gpu.pci_bus_id, str):
                index_of[gpu.pci_bus_id] = str(gpu.index)
    family = CounterMetricFamily("nodewarden_xid_errors", "Xid events in the kernel log", labels=["gpu", "xid"])
    for (address, xid), count in sorted(counts.items()):
        family.add_metric([index_of.get(address, address), str(xid)], count)
    return family


# --- the server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 9847
    tls_cert: Path | None = None
    tls_key: Path | None = None
    user: str | None = None
    password: Secret | None = None


class Exposition:
    """The metrics text, and its gzip form compressed once: a scrape only compresses its own tail.

    The compressor is flushed (Z_SYNC_FLUSH) after the bulk, and each scrape continues a copy
    of it with the per-scrape process metrics, so the response is one ordinary gzip stream
    (curl and others do not read concatenated gzip members).
    """

    def __init__(self, plain: bytes) -> None:
        self.plain = plain
        self._compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
        self._prefix = self._compressor.compress(plain) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def gzip_with(self, tail: bytes) -> bytes:
        compressor = self._compressor.copy()
        return self._prefix + compressor.compress(tail) + compressor.flush()


class _ProcessMetrics:
    """prometheus-client's process, platform and GC metrics, rendered at most once a second."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._registry)
        PlatformCollector(registry=self._registry)
        GCCollector(registry=self._registry)
        self._lock = threading.Lock()
        self._cached: tuple[float, Exposition | None, bytes, bytes] = (0.0, None, b"", b"")

    def response(self, body: Exposition, compressed: bool, tail: Callable[[], bytes] = bytes) -> bytes:
        with self._lock:
            made, for_body, plain, packed = self._cached
            if for_body is not body or time.monotonic() - made >= 1.0:
                process = tail() + generate_latest(self._registry)
                plain, packed = body.plain + process, body.gzip_with(process)
                self._cached = (time.monotonic(), body, plain, packed)
        return packed if compressed else plain


MAX_CONNECTIONS = 32  # served at once; a few Prometheus servers and curl need a handful
FIRST_REQUEST_TIMEOUT_S = 2.0  # from connect to a complete first request (TLS handshake included)
IDLE_TIMEOUT_S = 10.0  # between requests on a keep-alive connection


class _Server(ThreadingHTTPServer):
    """One thread per connection, but never more than MAX_CONNECTIONS: 200 half-open sockets from a
    scanner or a misbehaving client must not become 200 threads. Over the cap a connection is closed
    at once; the cap's slots come back as handlers finish or time out (IDLE_TIMEOUT_S)."""

    daemon_threads = True
    request_queue_size = 128  # 20 scrapers connecting at once must not overflow the backlog (default 5)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.tls: ssl.SSLContext | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            if self.tls is not None:
                # The handshake runs here, bounded, not in accept(): a client that connects and
                # never says hello would otherwise stall the accept loop for every scraper.
                request.settimeout(FIRST_REQUEST_TIMEOUT_S)
                request = self.tls.wrap_socket(request, server_side=True)
            super().process_request_thread(request, client_address)
        except (OSError, ssl.SSLError):
            self.shutdown_request(request)
        finally:
            self.slots.release()


class MetricsServer:
    """A threaded HTTP(S) server for /metrics; optional basic auth. Never blocks on the daemon."""

    def __init__(self, settings: ServerSettings, body: Callable[[], Exposition],
                 tail: Callable[[], bytes] = bytes) -> None:
        """`body()` returns the exposition made at the last evaluation."""
        self.settings = settings
        self._body = body
        self._tail = tail  # rendered with the process metrics, at most once a second
        self._process = _ProcessMetrics()
        try:
            self._httpd = _Server((settings.host, settings.port), self._handler())
        except OSError as exc:
            raise NodewardenError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
        self._httpd.daemon_threads = True
        if settings.tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
            self._httpd.tls = context  # wrapped per connection, in its handler thread
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="metrics-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _authorized(self, header: str | None) -> bool:
        settings = self.settings
        if settings.user is None or settings.password is None:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        # Compare both in constant time, always both (no early exit on the user name).
        user_ok = hmac.compare_digest(user.encode(), settings.user.encode())
        password_ok = hmac.compare_digest(password.encode(), settings.password.reveal().encode())
        return user_ok and password_ok

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "nodewarden"
            sys_version = ""
            protocol_version = "HTTP/1.1"  # keep-alive for Prometheus' persistent connections
            timeout = FIRST_REQUEST_TIMEOUT_S  # a silent or trickling client frees its slot quickly

            def handle(self) -> None:
                self.close_connection = True
                self.handle_one_request()
                self.connection.settimeout(IDLE_TIMEOUT_S)  # Prometheus keeps its connection between scrapes
                while not self.close_connection:
                    self.handle_one_request()

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes; without NODELAY, Nagle and the client's
                # delayed ACK add ~40 ms to every scrape.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                if not server._authorized(self.headers.get("Authorization")):
                    self._send(401, b"authentication required\n", "text/plain; charset=utf-8",
                               {"WWW-Authenticate": 'Basic realm="nodewarden"'})
                    return
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    compressed = "gzip" in self.headers.get("Accept-Encoding", "")
                    payload = server._process.response(server._body(), compressed, server._tail)
                    self._send(200, payload, CONTENT_TYPE_LATEST, {"Content-Encoding": "gzip"} if compressed else None)
                elif path in ("/", "/-/healthy"):
                    self._send(200, b"nodewarden: metrics at /metrics\n", "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http %s", format % args)  # the request line only; headers are never logged

        return Handler
