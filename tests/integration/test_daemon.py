"""`nodewarden daemon` as a real process: metrics scraped by a real Prometheus, signals, sd_notify, faults."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_peer import running_daemon
from tests.peers.redfish import _die_with_parent, _stop, free_port, self_signed_tls, silent_listener

DRIFTED = ("--simulate", "hgx-h100-drifted")


def write_config(tmp: Path, text: str) -> Path:
    path = tmp / "config.yaml"
    path.write_text(text)
    return path


def finding_status(body: str, check: str, subject: str) -> float | None:
    """The value of a finding's nodewarden_check_status series (5 fail, 4 unknown, 3 warn), None if it has none."""
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "nodewarden_check_status" and (sample.labels["check"], sample.labels["subject"]) == (
                    check, subject):
                return float(sample.value)
    return None


# ---- a real Prometheus scrapes the daemon ----

@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    binary = shutil.which("prometheus")
    assert binary, "the prometheus binary is missing: run `.venv/bin/python -m tests.peers.setup` (Debian package prometheus)"

    class Server:
        url = ""
        proc: subprocess.Popen[bytes] | None = None

        def start(self, target: str) -> None:
            port = free_port()
            config = tmp_path / "prometheus.yml"
            config.write_text(json.dumps({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "nodewarden", "static_configs": [{"targets": [target]}]}]}))
            log = open(tmp_path / "prometheus.log", "ab")  # noqa: SIM115 - closed with the process
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent)  # noqa: PLW1509
            self.url = f"http://127.0.0.1:{port}"

        def query(self, expr: str) -> list[dict[str, Any]]:
            url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(url, timeout=5) as response:
                body = json.loads(response.read())
            assert body["status"] == "success", body
            return list(body["data"]["result"])

        def wait(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    result = self.query(expr)
                except OSError:
                    result = []
                if result:
                    return result
                time.sleep(0.25)
            raise AssertionError(f"Prometheus has no result for {expr}; see {tmp_path / 'prometheus.log'}")

    server = Server()
    yield server
    if server.proc is not None:
        _stop(server.proc)


def test_prometheus_scrapes_the_daemon_on_a_recorded_node(tmp_path: Path, prometheus: Any) -> None:
    with running_daemon(tmp_path, *DRIFTED) as daemon:
        prometheus.start(daemon.url.removeprefix("http://"))
        assert prometheus.wait('up{job="nodewarden"} == 1')
        # A drifted 8-GPU node: at most 600 series per scrape (10,000 nodes in one Prometheus).
        assert float(prometheus.wait('scrape_samples_scraped{job="nodewarden"}')[0]["value"][1]) <= 600
        def one(expr: str) -> float:
            (sample,) = prometheus.wait(expr)
            return float(sample["value"][1])

        # The GPU that fell off the bus: a failing critical finding (5 = fail), its Xid counted against GPU 7.
        assert one('nodewarden_check_status{check="gpu.xid",subject="gpu7",severity="critical"}') == 5
        assert one('nodewarden_xid_errors_total{gpu="7",xid="79"}') == 1
        assert one('nodewarden_gpu_up{gpu="7"}') == 0
        # One series per finding that does not pass, the status in its value; passing ones are counted.
        (capped,) = prometheus.wait('nodewarden_check_status{check="gpu.power.limit"}')
        assert capped["metric"]["subject"] == "gpu2" and capped["metric"]["remediation"] == "gpu_power_limit"
        assert float(capped["value"][1]) == 5
        assert one('nodewarden_checks{check="gpu.power.limit",status="pass"}') == 6
        assert one('nodewarden_checks{check="gpu.power.limit",status="fail"}') == 1
        assert one('max(nodewarden_check_status)') == 5  # the worst status of the node
        assert one('nodewarden_gpu_power_limit_watts{gpu="2",limit="enforced"}') == 500
        assert len(prometheus.wait("nodewarden_gpu_temperature_celsius")) == 7
        margin = one('nodewarden_gpu_thermal_margin_celsius{gpu="0"}')
        temperature = one('nodewarden_gpu_temperature_celsius{gpu="0"}')
        assert margin == 89 - temperature  # H100 slowdown threshold 89 °C
        for source in ("host", "nvml", "kmsg", "redfish"):
            assert one(f'nodewarden_source_up{{source="{source}"}}') == 1
            assert one(f'nodewarden_source_last_success_timestamp_seconds{{source="{source}"}}') > time.time() - 300
        assert one('nodewarden_profile_info{profile="hgx-h100-sxm"}') == 1
        assert one('nodewarden_psu_redundancy_ok') == 0  # the drifted node lost PSU redundancy
        assert one('count(nodewarden_psu_health == 4)') == 1  # one series per PSU, 4 = critical
        assert one('nodewarden_firmware_info{component="driver",version="535.129.03"}') == 1  # the downgrade
        assert one('nodewarden_firmware_info{component="BIOS.Setup.1-1",version="2.3.5"}') == 1  # stable ids
        assert one('nodewarden_findings{status="fail",severity="critical"}') >= 1
        assert one("process_resident_memory_bytes") > 0
        # RDMA rails: the flapping port's counter (Prometheus makes the rate), the half-rate rail.
        assert one('nodewarden_ib_port_errors_total{device="mlx5_4",port="1",counter="link_downed"}') == 7
        assert one('nodewarden_ib_port_rate_gbps{device="mlx5_3",port="1"}') == 200


# ---- the kernel log is followed ----

def test_an_xid_appended_to_the_log_is_counted_within_seconds(tmp_path: Path, drifted_copy: Path) -> None:
    with running_daemon(tmp_path, "--snapshot", str(drifted_copy)) as daemon:
        assert daemon.value('nodewarden_xid_errors_total{gpu="0",xid="48"}') is None
        kmsg = drifted_copy / "kmsg.txt"
        text = kmsg.read_text()
        kmsg.unlink()  # shares an inode with the session's capture
        # Stamped after the log's last record (253,412 s since boot): an earlier stamp would read as a new boot.
        line = "3,99001,253500000000,-;NVRM: Xid (PCI:0000:19:00): 48, pid=4242, name=python, An uncorrectable double bit error"
        kmsg.write_text(text + line + "\n")
        appended = time.monotonic()
        daemon.wait_for(lambda: daemon.value('nodewarden_xid_errors_total{gpu="0",xid="48"}') == 1, timeout=10,
                        what="the new Xid in /metrics")
        assert time.monotonic() - appended < 5
        body = daemon.scrape()[1]
        assert finding_status(body, "gpu.xid", "gpu0") == 5
        assert any(e.get("event") == "xid" and e.get("xid") == 48 for e in daemon.log_events())
        # A counter, not a last value: the same Xid again counts 2.
        kmsg.write_text(kmsg.read_text() + line.replace("99001", "99002") + "\n")
        daemon.wait_for(lambda: daemon.value('nodewarden_xid_errors_total{gpu="0",xid="48"}') == 2, timeout=10,
                        what="the second Xid")


# ---- signals: reload and shutdown ----

def test_sighup_reloads_waivers_and_a_bad_config_keeps_the_old_one(tmp_path: Path) -> None:
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text("waivers: []\n")
    config = write_config(tmp_path, f"waivers_file: {waivers}\n")
    series = 'nodewarden_check_waived{check="gpu.power.limit",subject="gpu2"}'
    with running_daemon(tmp_path, *DRIFTED, "--config", str(config)) as daemon:
        assert daemon.value(series) is None  # a waiver series exists only while a waiver covers the finding
        waivers.write_text("waivers:\n  - check: gpu.power.limit\n    subject: gpu2\n"
                           "    reason: capped on purpose during the PSU swap\n    expires: 2099-01-01\n")
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: daemon.value(series) == 1, what="the waiver after SIGHUP")
        xid_before = daemon.value('nodewarden_xid_errors_total{gpu="7",xid="79"}')

        config.write_text("waivers_file: [not, a, path\n")  # broken YAML
        daemon.proc.send_signal(signal.SIGHUP)
        failed = daemon.wait_for(lambda: [e for e in daemon.log_events() if e.get("event") == "reload"
                                          and e.get("ok") is False], what="the failed reload")
        assert str(config) in failed[0]["error"] and "line" in failed[0]["error"]
        status, body = daemon.scrape()
        assert status == 200 and daemon.value(series, body) == 1  # still the old, good configuration
        assert daemon.value('nodewarden_xid_errors_total{gpu="7",xid="79"}', body) == xid_before  # nothing lost
        assert daemon.proc.poll() is None


def test_sigterm_exits_within_five_seconds_even_with_a_hung_bmc(tmp_path: Path) -> None:
    with silent_listener() as (host, port), running_daemon(tmp_path, *DRIFTED, "--bmc", f"http://{host}:{port}",
                                                           ready=False) as daemon:
        daemon.wait_for(lambda: daemon.scrape(timeout=2)[0] == 200, what="the server")
        took = daemon.stop(signal.SIGTERM)
        assert daemon.proc.returncode == 0 and took < 5
        assert any(e.get("event") == "stopping" for e in daemon.log_events())


def test_a_hung_bmc_never_slows_a_scrape(tmp_path: Path) -> None:
    config = write_config(tmp_path, "daemon:\n  timeouts: {bmc_sensors: 2, bmc_inventory: 2}\n"
                                    "  intervals: {bmc_sensors: 1, bmc_inventory: 1}\n")
    with silent_listener() as (host, port), running_daemon(
            tmp_path, *DRIFTED, "--config", str(config), "--bmc", f"http://{host}:{port}") as daemon:
        def redfish_down() -> str | None:  # down after its first read timed out, no longer pending
            body = daemon.scrape()[1]
            return body if daemon.value('nodewarden_source_up{source="redfish"}', body) == 0 and daemon.value(
                'nodewarden_source_pending{source="redfish"}', body) == 0 else None

        body = daemon.wait_for(redfish_down, what="redfish down")
        assert daemon.value('nodewarden_source_up{source="nvml"}', body) == 1  # the others carry on
        assert finding_status(body, "bmc.reachable", "redfish") == 5
        latencies = []
        for _ in range(30):  # while reads keep hanging and timing out behind the scenes
            start = time.monotonic()
            status, _ = daemon.scrape()
            latencies.append(time.monotonic() - start)
            assert status == 200
        assert max(latencies) < 0.5, latencies
        events = [e for e in daemon.log_events() if e.get("event") == "source_changed" and e.get("source") == "redfish"]
        assert events and events[0]["up"] is False
        assert "timed out after 2 s" in events[0]["error"] or "has not returned" in events[0]["error"]


# ---- systemd integration: sd_notify over a real datagram socket ----

def test_sd_notify_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.2)
    messages: list[tuple[float, str]] = []
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                messages.append((time.monotonic(), sock.recv(4096).decode()))
            except TimeoutError:
                continue

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    try:
        with running_daemon(tmp_path, *DRIFTED, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"},
                            ready=False) as daemon:
            daemon.wait_for(lambda: any("READY=1" in m for _, m in messages), what="READY=1")
            ready_at = next(t for t, m in messages if "READY=1" in m)
            status, body = daemon.scrape()
            assert status == 200 and "nodewarden_profile_info" in body  # ready means collected
            daemon.wait_for(lambda: sum(1 for t, m in messages if m == "WATCHDOG=1" and t > ready_at) >= 3,
                            what="watchdog pings")
            pings = [t for t, m in messages if m == "WATCHDOG=1"]
            assert max(b - a for a, b in itertools.pairwise(pings)) < 1.0  # WatchdogSec/2 = 0.5 s
            daemon.stop()
        assert any(m == "STOPPING=1" for _, m in messages)
    finally:
        done.set()
        reader.join()
        sock.close()


# ---- access control: TLS and basic auth ----

def test_tls_and_basic_auth(tmp_path: Path) -> None:
    tls = self_signed_tls(tmp_path)
    password_file = tmp_path / "metrics-password"
    password_file.write_text("scrape-secret\n")
    password_file.chmod(0o600)
    config = write_config(tmp_path, f"daemon:\n  tls_cert_file: {tls.cert}\n  tls_key_file: {tls.key}\n"
                                    f"  basic_auth_user: prom\n  basic_auth_password_file: {password_file}\n")
    context = ssl.create_default_context(cafile=str(tls.ca))
    with running_daemon(tmp_path, *DRIFTED, "--config", str(config), scheme="https", context=context) as daemon:
        assert daemon.scrape()[0] == 401
        assert daemon.scrape(auth=("prom", "wrong"))[0] == 401
        status, body = daemon.scrape(auth=("prom", "scrape-secret"))
        assert status == 200 and "nodewarden_check_status" in body
        assert "scrape-secret" not in daemon.log_path.read_text()


def test_bad_daemon_config_names_file_and_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, "daemon:\n  intervals:\n    nvml: -5\n")
    proc = subprocess.run([sys.executable, "-m", "agent", "daemon", "--config", str(config), *DRIFTED],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert f"{config}:3" in proc.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "agent", "daemon", "--listen", f"127.0.0.1:{port}", *DRIFTED],
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2  # a configuration problem: the listen address
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stdout + proc.stderr


# ---- optional auto-apply of safe fixes ----

def test_auto_apply_fixes_safe_drift_and_journals_it(tmp_path: Path, drifted_copy: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, f"state_dir: {state}\ndaemon:\n  auto_apply: true\n")
    rmem = drifted_copy / "fs/proc/sys/net/core/rmem_max"
    assert rmem.read_text() == "4194304\n"
    with running_daemon(tmp_path, "--snapshot", str(drifted_copy), "--config", str(config)) as daemon:
        daemon.wait_for(lambda: rmem.read_text() == "134217728\n", what="the safe fix applied")
        daemon.wait_for(lambda: finding_status(daemon.scrape()[1], "host.sysctl", "net.core.rmem_max") is None,
                        what="the finding passing after the fix (a passing finding has no series)")
        assert daemon.value('nodewarden_checks{check="host.sysctl",status="pass"}') == 3
        applied = [e for e in daemon.log_events() if e.get("event") == "auto_apply"]
        assert any(e.get("action") == "sysctl:net.core.rmem_max" and e.get("outcome") == "applied" for e in applied)
        assert not any(e.get("action", "").startswith("bios_attribute") and e.get("outcome") == "applied"
                       for e in applied)  # reboot class is never auto-applied
    assert len(list((state / "journal").iterdir())) == 1


def test_auto_apply_is_off_by_default(tmp_path: Path, drifted_copy: Path) -> None:
    before = (drifted_copy / "fs/proc/sys/net/core/rmem_max").read_bytes()
    with running_daemon(tmp_path, "--snapshot", str(drifted_copy)) as daemon:
        time.sleep(2)
        assert not any(e.get("event") == "auto_apply" for e in daemon.log_events())
    assert (drifted_copy / "fs/proc/sys/net/core/rmem_max").read_bytes() == before

