"""/metrics under slow and fat clients (issue 21, item 6): a real daemon process on 127.0.0.1.

The attackers: 40 connections that trickle a request head a byte a second (and reconnect when
dropped), and 40 connections that send ~6 MB of headers at once. Scrapes must go on being answered,
and the daemon's peak memory must stay put. Every wait is bounded; each test runs ~15 s.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.daemon_peer import DaemonProcess, running_daemon
from tests.peers.redfish import self_signed_tls

DRIFTED = ("--simulate", "hgx-h100-drifted")


def port_of(daemon: DaemonProcess) -> int:
    return int(daemon.url.rsplit(":", 1)[1])


def memory_kib(daemon: DaemonProcess, field: str) -> int:
    for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{daemon.proc.pid}/status")


@contextlib.contextmanager
def tricklers(port: int, count: int, context: ssl.SSLContext | None = None) -> Iterator[list[int]]:
    """`count` connections (TLS with `context`), each sent one more byte of a never-ending header every second."""
    stop = threading.Event()
    sent = [0]

    def connect() -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname="localhost")
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            return sock
        except OSError:
            return None

    def run() -> None:
        socks = [connect() for _ in range(count)]
        while not stop.wait(1.0):
            for i, sock in enumerate(socks):
                try:
                    if sock is None:
                        raise OSError("reconnect")
                    sock.send(b"a")
                    sent[0] += 1
                except OSError:  # dropped by the server: an attacker simply comes back
                    if sock is not None:
                        sock.close()
                    socks[i] = connect()
        for sock in socks:
            if sock is not None:
                sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(10)


def scrapes_answered(daemon: DaemonProcess, context: ssl.SSLContext | None = None,
                     auth: tuple[str, str] | None = None) -> None:
    """40 tricklers for ~12 s while scraping every 0.25 s: at least 90 % answered within 2 s."""
    assert daemon.scrape(auth=auth)[0] == 200
    answered, tried = 0, 0
    with tricklers(port_of(daemon), 40, context) as sent:
        time.sleep(1.5)  # every trickler connected and holding its connection
        end = time.monotonic() + 12
        while time.monotonic() < end:
            tried += 1
            start = time.monotonic()
            with contextlib.suppress(OSError):
                status, body = daemon.scrape(auth=auth, timeout=2)
                if status == 200 and "nodewarden_check_status" in body and time.monotonic() - start < 2:
                    answered += 1
            time.sleep(0.25)
    assert sent[0] >= 40 * 8, sent[0]  # the attack really ran the whole time
    assert tried >= 20 and answered >= 0.9 * tried, (answered, tried)


def test_forty_clients_trickling_a_byte_a_second_do_not_starve_scrapes(tmp_path: Path) -> None:
    with running_daemon(tmp_path, *DRIFTED) as daemon:
        scrapes_answered(daemon)


def test_tricklers_over_tls_with_basic_auth_do_not_starve_scrapes(tmp_path: Path) -> None:
    tls = self_signed_tls(tmp_path)
    password = tmp_path / "metrics-password"
    password.write_text("scrape-secret\n")
    password.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(f"daemon:\n  tls_cert_file: {tls.cert}\n  tls_key_file: {tls.key}\n"
                      f"  basic_auth_user: prom\n  basic_auth_password_file: {password}\n")
    context = ssl.create_default_context(cafile=str(tls.ca))
    with running_daemon(tmp_path, *DRIFTED, "--config", str(config), scheme="https", context=context) as daemon:
        scrapes_answered(daemon, context, ("prom", "scrape-secret"))


def test_large_headers_do_not_grow_the_daemon(tmp_path: Path) -> None:
    line = b"X-Fat: " + b"a" * 64000 + b"\r\n"
    with running_daemon(tmp_path, *DRIFTED) as daemon:
        for _ in range(3):
            assert daemon.scrape()[0] == 200
        time.sleep(1.0)
        peak_before = memory_kib(daemon, "VmHWM")

        def fat_client() -> None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port_of(daemon)),
                                                                        timeout=5) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + line * 99)
                time.sleep(3)  # holds what it sent while the others send theirs

        clients = [threading.Thread(target=fat_client, daemon=True) for _ in range(40)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(20)
        status, _ = daemon.scrape(timeout=5)
        assert status == 200
        grown_peak = memory_kib(daemon, "VmHWM") - peak_before
        assert grown_peak < 24 * 1024, f"peak RSS grew by {grown_peak} KiB"
        assert memory_kib(daemon, "VmRSS") < peak_before + 24 * 1024
