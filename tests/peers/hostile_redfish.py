"""A hostile Redfish server on 127.0.0.1 for tests and benchmarks: it redirects, trickles, nests,
floods and fans out, and records every request (path, headers) it receives.

    with hostile_bmc("trickle") as bmc:   # HostileBmc(url, requests)
        ...
    with hostile_bmc("redirect", redirect_to=other.url) as bmc: ...

Behaviours (`mode`):
  normal     a tiny valid service: root, a session service, one chassis with one PSU
  redirect   the service root answers 302 to `redirect_to` (another origin)
  trickle    the Chassis collection's body (the first resource the walk asks for after login, which
             reuses the login's service root) arrives one byte every `trickle_s` seconds, forever
  deep       /Chassis answers an object nested `depth` levels deep
  huge       /Chassis answers `huge_bytes` of a JSON string, chunked, without Content-Length
  fanout     every collection answers `fanout` fresh member collections, without end
  dotdot     /Chassis lists members whose @odata.id hide `..` and control characters
`resources` ({path: body}, in any mode) serves those bodies instead: an object as JSON, bytes as they are
(hostile numbers such as `1e999` or a 4,000-digit reading, which json.dumps cannot write).
Every mode but `redirect` serves the normal root and session login (token TOKEN).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "tok-9f8e7d6c5b4a-SECRET"  # the session token the server hands out; must never leak
ROOT_BODY = {
    "@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot", "Id": "RootService",
    "RedfishVersion": "1.6.0", "Vendor": "Hostile",
    "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
    "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
    "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class HostileBmc:
    url: str
    requests: list[Seen] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


def _collection(path: str, members: list[str]) -> dict[str, Any]:
    return {"@odata.id": path, "@odata.type": "#ChassisCollection.ChassisCollection", "Name": "Chassis",
            "Members": [{"@odata.id": m} for m in members], "Members@odata.count": len(members)}


@contextlib.contextmanager
def hostile_bmc(mode: str = "normal", *, host: str = "127.0.0.1", redirect_to: str = "", trickle_s: float = 0.3,
                depth: int = 100_000, huge_bytes: int = 300 * 1024 * 1024, fanout: int = 1000,
                resources: dict[str, Any] | None = None) -> Iterator[HostileBmc]:
    stop = threading.Event()
    bmc = HostileBmc("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _record(self) -> str:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            bmc.requests.append(Seen(self.command, self.path, dict(self.headers.items())))
            return path

        def _json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self._record()
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self._json({"@odata.id": "/redfish/v1/SessionService/Sessions/1", "Id": "1"}, 201,
                       {"X-Auth-Token": TOKEN, "Location": "/redfish/v1/SessionService/Sessions/1"})

        def do_DELETE(self) -> None:
            self._record()
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            path = self._record()
            if path == "/redfish/v1" and mode == "redirect":
                self.send_response(302)
                self.send_header("Location", f"{redirect_to}/redfish/v1/")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif resources and path in resources:
                body = resources[path]
                self._raw(body) if isinstance(body, bytes) else self._json(body)
            elif path == "/redfish/v1/Chassis" and mode == "trickle":
                self._trickle()
            elif path == "/redfish/v1":
                self._json(ROOT_BODY)
            elif path == "/redfish/v1/SessionService":
                self._json({"@odata.id": path, "@odata.type": "#SessionService.v1_1_0.SessionService",
                            "Sessions": {"@odata.id": f"{path}/Sessions"}})
            elif mode == "deep" and path == "/redfish/v1/Chassis":
                data = ('{"@odata.id": "/redfish/v1/Chassis", "Members": ' + "[" * depth + "]" * depth + "}").encode()
                self._raw(data)
            elif mode == "huge" and path == "/redfish/v1/Chassis":
                self._huge()
            elif mode == "fanout" and path.startswith("/redfish/v1/Chassis"):
                self._json(_collection(path, [f"{path}/{i}" for i in range(fanout)]))
            elif mode == "dotdot" and path == "/redfish/v1/Chassis":
                self._json(_collection(path, ["/redfish/v1/Chassis/%2e%2e/%2e%2e/Managers",
                                              "/redfish/v1/Chassis/a%2fb", "/redfish/v1/Chassis/x%0d%0aInjected: 1",
                                              "/redfish/v1/Chassis/1"]))
            elif path == "/redfish/v1/Chassis":
                self._json(_collection(path, ["/redfish/v1/Chassis/1"]))
            elif path == "/redfish/v1/Chassis/1":
                self._json({"@odata.id": path, "@odata.type": "#Chassis.v1_10_0.Chassis", "Id": "1",
                            "Status": {"State": "Enabled", "Health": "OK"}})
            else:
                self._json({"error": {"message": "not found"}}, 404)

        def _raw(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _trickle(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")  # no length: nothing says "too big"
            self.end_headers()
            with contextlib.suppress(OSError):
                self._chunk(b'{"Name": "')
                while not stop.wait(trickle_s):
                    self._chunk(b"a")
                    self.wfile.flush()

        def _huge(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"a" * (1024 * 1024)
            sent = 0
            with contextlib.suppress(OSError):
                self._chunk(b'{"@odata.id": "/redfish/v1/Chassis", "Name": "')
                while sent < huge_bytes and not stop.is_set():
                    self._chunk(chunk)
                    sent += len(chunk)
                self._chunk(b'"}')
                self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            return  # clients hanging up on a flood or a trickle is the point, not news

    server = Server((host, 0), Handler)
    bmc.url = f"http://{host}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield bmc
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        time.sleep(0.05)
