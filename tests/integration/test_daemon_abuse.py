"""The daemon under abuse (issue 12, 9): half-open sockets, a TLS client that never says hello, and
SIGTERM in the middle of a reload or of a hung BMC read. Real daemon process, real sockets, all on
127.0.0.1, every wait bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

from tests.daemon_peer import DaemonProcess, running_daemon
from tests.peers.redfish import self_signed_tls, silent_listener

DRIFTED = ("--simulate", "hgx-h100-drifted")


def threads(daemon: DaemonProcess) -> int:
    return len(os.listdir(f"/proc/{daemon.proc.pid}/task"))


@contextlib.contextmanager
def half_open(port: int, count: int) -> Iterator[list[socket.socket]]:
    socks = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def port_of(daemon: DaemonProcess) -> int:
    return int(daemon.url.rsplit(":", 1)[1])


def test_200_half_open_sockets_do_not_become_200_threads(tmp_path: Path) -> None:
    with running_daemon(tmp_path, *DRIFTED) as daemon:
        assert daemon.scrape()[0] == 200
        before = threads(daemon)
        with half_open(port_of(daemon), 200):
            time.sleep(0.5)
            during = threads(daemon)
            assert during <= before + 2, (before, during)  # one event loop: a socket is not a thread
            # Silent sockets hold no slot a scrape needs (issue 21): it is answered at once.
            assert daemon.scrape(timeout=1)[0] == 200
        assert daemon.wait_for(lambda: threads(daemon) <= before + 2, timeout=6, what="threads back")


def test_a_tls_client_that_never_says_hello_does_not_stall_the_server(tmp_path: Path) -> None:
    tls = self_signed_tls(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"daemon:\n  tls_cert_file: {tls.cert}\n  tls_key_file: {tls.key}\n")
    context = ssl.create_default_context(cafile=str(tls.ca))
    with running_daemon(tmp_path, *DRIFTED, "--config", str(config), scheme="https", context=context) as daemon, \
            half_open(port_of(daemon), 3):
        time.sleep(0.2)
        start = time.monotonic()
        status, body = daemon.scrape(timeout=5)
        assert status == 200 and "nodewarden_check_status" in body
        assert time.monotonic() - start < 1.0  # not queued behind the silent handshakes


def test_sigterm_during_a_reload_exits_within_five_seconds(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("daemon:\n  intervals: {host: 1, nvml: 1}\n")
    with running_daemon(tmp_path, *DRIFTED, "--config", str(config)) as daemon:
        for _ in range(5):
            daemon.proc.send_signal(signal.SIGHUP)
        took = daemon.stop(signal.SIGTERM)
        assert daemon.proc.returncode == 0 and took < 5, took


def test_sigterm_during_a_hung_bmc_read_after_start(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("daemon:\n  timeouts: {bmc_sensors: 60, bmc_inventory: 60}\n")
    with silent_listener() as (host, port), running_daemon(
            tmp_path, *DRIFTED, "--config", str(config), "--bmc", f"http://{host}:{port}") as daemon:
        time.sleep(1.5)  # both BMC pollers are now inside their hung reads
        took = daemon.stop(signal.SIGTERM)
        assert daemon.proc.returncode == 0 and took < 5, took


def test_more_idle_sockets_than_connections_allowed_still_leave_room_for_a_scrape(tmp_path: Path) -> None:
    # Issue 21: over the cap (256) the connection waiting longest for its request is dropped for the newcomer.
    with running_daemon(tmp_path, *DRIFTED) as daemon, half_open(port_of(daemon), 300) as socks:
        time.sleep(0.3)
        start = time.monotonic()
        assert daemon.scrape(timeout=1)[0] == 200
        assert time.monotonic() - start < 1.0
        dropped = 0
        for sock in socks[:50]:  # the oldest were evicted: the server closed them
            sock.settimeout(0.5)
            with contextlib.suppress(OSError):
                dropped += sock.recv(1) == b""
        assert dropped >= 40, dropped
