"""The daemon's /metrics HTTP(S) server: one selectors event loop, every request under a total deadline.

Why an event loop and not a thread per connection: a thread (or a slot) per
connection lets clients that trickle a byte a second hold every slot while a
scrape waits (issue 21, item 6). Here a connection is a socket and a small
buffer; nothing blocks, and each request must be complete *and answered*
within REQUEST_DEADLINE_S of the moment the connection became ready for it
(accept, or the previous response sent), TLS handshake included. The request
head is capped at MAX_HEAD_BYTES and MAX_HEADERS; its buffer is dropped once
parsed and with the connection, so a large-headers client cannot keep memory.
Responses are the shared cached exposition bytes, sent from a memoryview.
Over MAX_CONNECTIONS the oldest connection still waiting for its request is
dropped, so a flood of idle sockets cannot lock new scrapers out.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hmac
import logging
import selectors
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from agent.core.errors import NodewardenError
from agent.io.credentials import Secret

log = logging.getLogger("agent.report.metrics")

MAX_CONNECTIONS = 256  # open at once; each costs one fd and at most MAX_HEAD_BYTES
REQUEST_DEADLINE_S = 10.0  # from accept (or the last response) to this response sent, TLS included
MAX_HEAD_BYTES = 8192  # request line + headers; Prometheus sends ~300 bytes
MAX_HEADERS = 64
RECV_CHUNK = 4096
SEND_CHUNK = 256 << 10
LINGER_S = 1.0  # after a last response, how long the rest of a request is read and dropped
TICK_S = 0.2  # how often deadlines and stop() are looked at when nothing happens
TEXT = "text/plain; charset=utf-8"
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           505: "HTTP Version Not Supported"}


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


class _Request:
    """A parsed request head: what the handler needs, nothing kept from the raw bytes."""

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method, self.target, self.version, self.headers = method, target, version, headers

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_head(head: bytes) -> _Request:
    """The request line and headers (without the blank line); _BadRequest for anything off."""
    lines = head.split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(431, "too many headers")
    try:
        request_line = lines[0].decode("ascii")
        method, target, version = request_line.split(" ")
    except (UnicodeDecodeError, ValueError):
        raise _BadRequest(400, "bad request line") from None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise _BadRequest(400, "bad header line")  # obs-fold and spaces before the colon: smuggling tricks
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return _Request(method, target, version, headers)


class _Connection:
    """One client: handshake -> read a head -> answer -> (keep-alive) read the next head."""

    def __init__(self, sock: socket.socket, now: float, tls: bool) -> None:
        self.sock = sock
        self.fd = sock.fileno()  # kept: a closed socket's fileno() is -1
        self.deadline = now + REQUEST_DEADLINE_S
        self.handshaking = tls
        self.inbox = bytearray()
        self.outbox: list[memoryview] | None = None  # head, then the body: the shared bytes, not a copy
        self.close_after = False
        self.draining = False  # the last response is sent; reading what is left until EOF
        self.interest = selectors.EVENT_READ

    @property
    def waiting(self) -> bool:
        """No response in flight: reading its request (or idle between requests)."""
        return self.outbox is None


class MetricsServer:
    """The /metrics server (HTTP or HTTPS, optional basic auth); never blocks on the daemon or a client."""

    def __init__(self, settings: ServerSettings, body: Callable[[], Exposition],
                 tail: Callable[[], bytes] = bytes) -> None:
        """`body()` returns the exposition made at the last evaluation."""
        self.settings = settings
        self._body = body
        self._tail = tail  # rendered with the process metrics, at most once a second
        self._process = _ProcessMetrics()
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((settings.host, settings.port))
            self._listener.listen(128)  # 20 scrapers connecting at once must not overflow the backlog
        except OSError as exc:
            self._listener.close()
            raise NodewardenError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
        self._listener.setblocking(False)
        self._tls: ssl.SSLContext | None = None
        if settings.tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
            self._tls = context
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(2 * TICK_S + 1.0)
        else:
            self._close_all()

    # -- the loop ----------------------------------------------------------------------------------

    def _serve(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                for key, _events in self._selector.select(TICK_S):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._step(self._connections.get(key.fd))
                self._reap(time.monotonic())
        except Exception:  # the loop must say why it died rather than vanish
            log.exception("metrics server loop failed")
        finally:
            self._close_all()

    def _accept(self) -> None:
        for _ in range(64):  # a burst is taken in one go, but the loop is not starved by it
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: leave it in the backlog, try next tick
                log.debug("http accept failed: %s", exc)
                return
            if len(self._connections) >= MAX_CONNECTIONS and not self._evict():
                sock.close()
                continue
            try:
                sock.setblocking(False)
                # Headers and body go out at once; without NODELAY, Nagle and delayed ACK add ~40 ms.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except OSError:  # reset before we got to it (ssl.SSLError is an OSError)
                sock.close()
                continue
            conn = _Connection(sock, time.monotonic(), self._tls is not None)
            self._connections[conn.fd] = conn
            self._selector.register(sock, selectors.EVENT_READ)
            self._step(conn)

    def _evict(self) -> bool:
        """Full: drop the oldest connection that is still waiting for its request (a slow or idle one)."""
        waiting = [c for c in self._connections.values() if c.waiting]
        if not waiting:
            return False
        self._close(min(waiting, key=lambda c: c.deadline))  # the longest without a complete request
        return True

    def _reap(self, now: float) -> None:
        for conn in [c for c in self._connections.values() if now >= c.deadline]:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._connections.pop(conn.fd, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.fd)
        conn.inbox = bytearray()  # given back now, not when the object is collected
        conn.outbox = None
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn)
        try:
            self._selector.close()
        finally:
            self._listener.close()

    # -- one connection ----------------------------------------------------------------------------

    def _step(self, conn: _Connection | None) -> None:
        """Move a connection on as far as it goes without blocking."""
        if conn is None:
            return
        try:
            want = self._advance(conn)
        except ssl.SSLWantReadError:
            want = selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            want = selectors.EVENT_WRITE
        except (OSError, ssl.SSLError, EOFError):
            want = 0
        except Exception:  # a bug in one request must not stop the loop that serves all of them
            log.exception("metrics request failed")
            want = 0
        if want == 0:
            self._close(conn)
        elif want != conn.interest:
            conn.interest = want
            self._selector.modify(conn.sock, want)

    def _advance(self, conn: _Connection) -> int:
        """The event wanted next (0: close). SSLWant* bubble up to `_step`."""
        sock = conn.sock
        if conn.handshaking:
            assert isinstance(sock, ssl.SSLSocket)
            sock.do_handshake()
            conn.handshaking = False
        if conn.draining:
            return self._linger(conn)
        while True:
            if conn.outbox is not None:
                while conn.outbox:
                    try:
                        sent = sock.send(conn.outbox[0][:SEND_CHUNK])
                    except BlockingIOError:
                        return selectors.EVENT_WRITE
                    conn.outbox[0] = conn.outbox[0][sent:]
                    if not conn.outbox[0]:
                        conn.outbox.pop(0)
                conn.outbox = None
                if conn.close_after:
                    return self._linger(conn)
                conn.deadline = time.monotonic() + REQUEST_DEADLINE_S  # the next request's clock
            end = conn.inbox.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.inbox) >= MAX_HEAD_BYTES:
                    self._respond(conn, 431, b"request head too large\n", TEXT, close=True)
                    continue
                try:
                    chunk = sock.recv(min(RECV_CHUNK, MAX_HEAD_BYTES + 4 - len(conn.inbox)))
                except BlockingIOError:
                    return selectors.EVENT_READ
                if not chunk:
                    return 0
                conn.inbox += chunk
                continue
            if end > MAX_HEAD_BYTES:
                self._respond(conn, 431, b"request head too large\n", TEXT, close=True)
                continue
            head = bytes(conn.inbox[:end])
            del conn.inbox[:end + 4]  # a pipelined next request stays
            self._handle(conn, head)

    def _linger(self, conn: _Connection) -> int:
        """After a last response: FIN, then read and drop what the client still sends (at most LINGER_S).

        Closing with unread input makes the kernel send RST, which can destroy the response in
        flight (a 431 would never arrive). Nothing read here is kept.
        """
        if isinstance(conn.sock, ssl.SSLSocket):
            return 0
        if not conn.draining:
            conn.draining = True
            conn.inbox = bytearray()
            conn.deadline = min(conn.deadline, time.monotonic() + LINGER_S)
            conn.sock.shutdown(socket.SHUT_WR)
        while True:
            try:
                if not conn.sock.recv(RECV_CHUNK):
                    return 0
            except BlockingIOError:
                return selectors.EVENT_READ

    def _handle(self, conn: _Connection, head: bytes) -> None:
        try:
            request = parse_head(head)
        except _BadRequest as exc:
            self._respond(conn, exc.code, f"{exc}\n".encode(), TEXT, close=True)
            return
        log.debug("http %s %s %s", request.method, request.target[:200], request.version)
        if request.method not in ("GET", "HEAD"):
            self._respond(conn, 405, b"only GET\n", TEXT, {"Allow": "GET, HEAD"}, close=True)
            return
        if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
            self._respond(conn, 413, b"a GET takes no body\n", TEXT, close=True)
            return
        close = not request.keep_alive
        head_only = request.method == "HEAD"
        if not self._authorized(request.headers.get("authorization")):
            self._respond(conn, 401, b"authentication required\n", TEXT,
                          {"WWW-Authenticate": 'Basic realm="nodewarden"'}, close=close, head_only=head_only)
            return
        path = request.target.split("?", 1)[0]
        if path == "/metrics":
            compressed = "gzip" in request.headers.get("accept-encoding", "")
            payload = self._process.response(self._body(), compressed, self._tail)
            self._respond(conn, 200, payload, CONTENT_TYPE_LATEST, {"Content-Encoding": "gzip"} if compressed else None,
                          close=close, head_only=head_only)
        elif path in ("/", "/-/healthy"):
            self._respond(conn, 200, b"nodewarden: metrics at /metrics\n", TEXT, close=close, head_only=head_only)
        else:
            self._respond(conn, 404, b"not found\n", TEXT, close=close, head_only=head_only)

    def _respond(self, conn: _Connection, code: int, body: bytes, content_type: str,
                 headers: dict[str, str] | None = None, close: bool = False, head_only: bool = False) -> None:
        lines = [f"HTTP/1.1 {code} {REASONS.get(code, '')}", "Server: nodewarden",
                 f"Date: {email.utils.formatdate(usegmt=True)}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if close:
            lines.append("Connection: close")
            conn.inbox = bytearray()
        conn.close_after = close
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if head_only or not body:
            conn.outbox = [memoryview(head)]
        elif len(body) <= SEND_CHUNK // 4:  # small: one send (one packet with NODELAY)
            conn.outbox = [memoryview(head + body)]
        else:  # large: the cached exposition itself, so a client that reads slowly holds no copy of it
            conn.outbox = [memoryview(head), memoryview(body)]

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
