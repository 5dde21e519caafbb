"""HTTP bounds for the Redfish client: the BMC is hostile input too.

The DMTF `redfish` library sends every request through one `requests.Session`. We give it ours,
which holds each request to what a one-shot audit can afford:

* redirects are never followed (a 3xx comes back as it is and the caller reports it), so neither
  basic credentials nor a session token (`X-Auth-Token`, which `requests` would not strip) ever
  reach another origin;
* the body is streamed and capped (`max_body_bytes`, and `MAX_CONTAINERS` JSON objects): a BMC that
  sends 300 MB, or a flood of tiny objects, costs a few MiB;
* one total deadline for the whole BMC read: each request's socket timeout is clipped to what is
  left, and reading the body stops when it passes, so a trickling (slow-loris) BMC cannot hold
  the audit past it;
* the connection pool matches the walk's concurrency (`resize_pool`: the walk sets it), so no
  request in flight waits for, or throws away, a connection;
* `sent` counts every request that went out (the login's too);
* a session token a response hands out is registered with agent.io.log, so no log line shows it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from agent.io.log import register_secret

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # the largest real resource we hold is 340 KB (an iLO 5 event log)
# JSON objects and arrays per response. Parsed, a small object costs ~10x its text, so this bounds
# what one answer can cost in memory (~30 MiB); a real 340 KB event log has ~3,000.
MAX_CONTAINERS = 50_000
_CHUNK = 64 * 1024


class BoundExceeded(requests.RequestException):
    """A response broke a bound (size or deadline); `reason` is fit for a finding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.bound_reason = reason  # read by name in agent.sources.redfish (no import of requests there)


class ResponseTooLarge(BoundExceeded):
    pass


class DeadlineExceeded(BoundExceeded):
    pass


class BoundedSession(requests.Session):
    def __init__(self, *, pool_size: int = 4, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 deadline: float | None = None) -> None:
        super().__init__()
        self.max_body_bytes = max_body_bytes
        self.deadline = deadline  # time.monotonic() value; None: per-request timeouts only
        self.trust_env = False  # no proxies or .netrc credentials from the environment for a BMC
        self.sent = 0
        self._count_lock = threading.Lock()
        self.pool_size = 0
        self.resize_pool(pool_size)

    def resize_pool(self, pool_size: int) -> None:
        """One pool of `pool_size` connections for the BMC (replacing a pool of another size)."""
        size = max(1, pool_size)
        if size == self.pool_size:
            return
        old = self.adapters.get("http://")
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=size, max_retries=0)
        self.mount("http://", adapter)
        self.mount("https://", adapter)
        self.pool_size = size
        if old is not None:
            old.close()  # its idle connections (the login's); none is in use between login and walk

    def _remaining(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the BMC read passed its total deadline")
        return left

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["allow_redirects"] = False
        kwargs["stream"] = True
        left = self._remaining()
        with self._count_lock:
            self.sent += 1
        if left is not None:
            timeout = kwargs.get("timeout")
            kwargs["timeout"] = left if not isinstance(timeout, (int, float)) else min(float(timeout), left)
        # requests' own annotations take str, its stubs str | bytes: pass str to both.
        method_name = method.decode("ascii") if isinstance(method, bytes) else method
        target = url.decode("utf-8") if isinstance(url, bytes) else url
        response = super().request(method_name, target, *args, **kwargs)
        token = response.headers.get("X-Auth-Token")
        if token:  # masked in every form in every later log line, keyed or not (a BMC may echo it)
            register_secret(token, session=True)
        try:
            response._content = self._read_body(response)  # what response.text / .content then serve
        finally:
            response.close()
        return response

    def _read_body(self, response: requests.Response) -> bytes:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ResponseTooLarge(f"response of {int(declared)} bytes exceeds the {self._cap()} cap")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_content(_CHUNK):
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ResponseTooLarge(f"response exceeds the {self._cap()} cap")
            chunks.append(chunk)
            self._remaining()
        body = b"".join(chunks)
        if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:
            raise ResponseTooLarge(f"response holds more than {MAX_CONTAINERS} JSON objects and arrays")
        return body

    def _cap(self) -> str:
        return f"{self.max_body_bytes // (1024 * 1024)} MiB" if self.max_body_bytes >= 1024 * 1024 else (
            f"{self.max_body_bytes} byte")
