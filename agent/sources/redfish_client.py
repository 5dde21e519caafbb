"""Redfish client side: the transports the walk reads through, and the errors they raise.

* `LiveRedfish`: HTTP(S) through the DMTF `redfish` library (session login with fallback to basic
  auth, logout always, TLS verified unless told otherwise), every request through a
  `redfish_http.BoundedSession` (no redirects, capped bodies, one deadline, a pool sized to the
  walk's concurrency). The service root it reads to choose the login is handed to the walk
  (`service_root`), so a read asks for it once.
* `RecordedRedfish`: a snapshot's `redfish/v1/**/index.json` (the DMTF mockup layout) served back.
* `RecordingRedfish`: live, remembering every answer for `snapshot capture`.

What to fetch, and how many at a time, is agent.sources.redfish_walk's business.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from agent.core.errors import ConfigError
from agent.io.jsonfile import load_json_bytes, load_json_file

ROOT = "/redfish/v1"
# Resource paths from the BMC are validated before they become URLs or files.
_PATH_RE = re.compile(r"^/redfish/v1(?:/[A-Za-z0-9_.\-:@%!$()*+,;=~]+)*$")

RECORDED_RESOURCE_MAX_BYTES = 32 << 20  # one recorded resource read back; an import writes no larger one


class RedfishError(Exception):
    """A GET that failed, with a reason fit for a finding."""

    def __init__(self, path: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"GET {path}: {reason}")
        self.path, self.reason, self.status = path, reason, status


class AuthFailed(RedfishError):
    """401/403: stop at once, retrying would lock the account."""


class PatchResult(NamedTuple):
    status: int
    location: str | None  # a task or job monitor (iDRAC: /redfish/v1/Managers/iDRAC.Embedded.1/Jobs/JID_...)


class Transport(Protocol):
    @property
    def requests(self) -> int: ...

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]: ...

    def close(self) -> None: ...


MAX_SEGMENT_BYTES = 255  # NAME_MAX: the longest file name a recording of the path can hold


def valid_path(path: str) -> str:
    """A BMC-supplied @odata.id, without fragment, checked before it becomes a URL or a file name.

    Percent-encoding is checked decoded too: `%2e%2e` is `..` to a server and `%2f` a separator
    in a recording's file name, and control characters have no place in either.
    """
    if not isinstance(path, str) or len(path) > 1024:
        raise RedfishError(str(path)[:80], "refusing an unexpected resource path")
    clean = path.split("#", 1)[0].rstrip("/")
    decoded = urllib.parse.unquote(clean)
    segments = decoded.split("/")
    if (not _PATH_RE.match(clean) or any(s in ("..", ".") for s in segments) or "%2f" in clean.lower()
            or "\\" in decoded or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in decoded)):
        raise RedfishError(path, "refusing an unexpected resource path")
    if any(len(s.encode("utf-8")) > MAX_SEGMENT_BYTES for s in clean.split("/")):
        # Each segment becomes a folder name in a recording: past NAME_MAX the capture would die (ENAMETOOLONG).
        raise RedfishError(path[:80], f"refusing a resource path with a segment longer than {MAX_SEGMENT_BYTES} bytes")
    return clean


# --- transports -------------------------------------------------------------------------------


class LiveRedfish:
    """HTTP(S) through the DMTF `redfish` client."""

    def __init__(self, url: str, user: str, password: str, *, ca_file: str | None = None,
                 insecure: bool = False, timeout_s: float = 10.0, retries: int = 2,
                 backoff_s: float = 0.3, concurrency: int = 4, deadline_s: float | None = None,
                 max_body_bytes: int | None = None) -> None:
        import redfish  # only when a BMC is actually read

        from agent.sources.redfish_http import DEFAULT_MAX_BODY_BYTES, BoundedSession

        if not re.match(r"^https?://[A-Za-z0-9.\-:\[\]]+(:\d+)?/?$", url):
            raise ConfigError(f"BMC URL must be http(s)://host[:port], got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.requests = 0  # the walk's (get and patch), retries included; not the login's
        self.login_requests = 0  # what the login cost, service root included (sequential, before the walk)
        self.auth = "none"
        self._root: dict[str, Any] | None = None  # the service root as the login read it, for the walk
        self._lock = threading.Lock()
        self._rest = redfish.rest.v1
        if insecure or url.startswith("http://"):
            cafile = None  # the library then does not verify (and plain HTTP has nothing to verify)
        else:
            import certifi

            cafile = ca_file or certifi.where()  # verified by default, against the system bundle
        try:
            self._client = redfish.redfish_client(
                base_url=self.url, username=user, password=password, default_prefix=f"{ROOT}/",
                cafile=cafile, timeout=timeout_s, max_retry=0, check_connectivity=False)
        except Exception as exc:  # noqa: BLE001 - the library raises many types; report, never crash
            raise RedfishError(ROOT, describe(exc)) from None
        # Every request of the library (login included) goes through this session: no redirects,
        # a capped body, one total deadline and a pool the size of the walk's concurrency. The
        # library has no public hook for it; its `_session` attribute is the requests.Session.
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.session = BoundedSession(pool_size=concurrency, max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                                      deadline=deadline)
        self._client._session = self.session
        self.cleartext = self.url.startswith("http://")
        self._login()
        self.login_requests = self.session.sent

    def service_root(self) -> dict[str, Any] | None:
        """The service root the login read (once: a second call returns None, and then the walk GETs it).

        Only a root that links what the walk reads is handed over: a BMC that shows less of it
        before authentication is read again, authenticated.
        """
        root, self._root = self._root, None
        if root is None or not any(link(root, key) for key in ("Systems", "Chassis", "Managers")):
            return None
        return root

    def use_concurrency(self, concurrency: int) -> None:
        """Size the connection pool to the walk's concurrency (a connection per request in flight)."""
        self.session.resize_pool(concurrency)

    def _advertises_sessions(self) -> bool:
        """Whether the (unauthenticated) service root offers a SessionService; True when unsure.

        A service without one may answer a session login with 401 (sushy-emulator with auth
        does), which must not be mistaken for wrong credentials.
        """
        try:
            # The library's own root read (it keeps it for login, so this costs no extra request).
            self._client.get_root_object()
            response = self._client.root_resp
            status = int(response.status)
            root = load_json_bytes(response.text, what=ROOT) if status == 200 else None
        except Exception as exc:  # noqa: BLE001 - unreadable root: let the login attempt decide
            bound = _bound_broken(exc)
            if bound is not None:
                raise RedfishError(ROOT, bound) from None
            response = getattr(exc, "response", None)  # the library's ServerDownOrUnreachableError carries it
            status = int(getattr(response, "status", 0) or 0)
            if not 300 <= status < 400:
                return True
        if 300 <= status < 400:  # never log in to wherever a redirect points
            raise RedfishError(ROOT, f"HTTP {status}: redirect not followed (to "
                               f"{_redirect_origin(response, self.url)})", status)
        if status != 200:
            return True
        if not isinstance(root, dict):
            return True
        self._root = root
        return bool(link(root, "Links", "Sessions") or link(root, "SessionService"))

    def _login(self) -> None:
        rest = self._rest
        if not self._advertises_sessions():
            self._basic_login()
            return
        try:
            with warnings.catch_warnings():  # the library warns about BMCs without a Location header
                warnings.simplefilter("ignore")
                self._client.login(auth="session")
            self.auth = "session"
            if getattr(self._client, "get_session_key", lambda: None)():
                return
        except rest.InvalidCredentialsError:
            raise AuthFailed(f"{ROOT}/SessionService/Sessions", "authentication failed (HTTP 401)",
                             401) from None
        except Exception:  # noqa: BLE001, S110 - no session service (or a broken one): basic auth below
            pass
        self._basic_login()

    def _basic_login(self) -> None:
        self.auth = "basic"
        try:
            self._client.login(auth="basic")
        except self._rest.InvalidCredentialsError:
            raise AuthFailed(ROOT, "authentication failed (HTTP 401)", 401) from None
        except Exception as exc:  # noqa: BLE001
            raise RedfishError(ROOT, f"login failed: {describe(exc)}") from None

    supports_expand = True

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        attempt = 0
        args = {"$expand": expand} if expand else None
        while True:
            attempt += 1
            with self._lock:
                self.requests += 1
            try:
                response = self._client.get(path, args=args, timeout=self.timeout_s, max_retry=0)
            except Exception as exc:  # noqa: BLE001 - connection errors, timeouts, resets
                reason = describe(exc)
                if attempt <= self.retries and _bound_broken(exc) is None:
                    time.sleep(self.backoff_s * attempt)
                    continue
                raise RedfishError(path, reason) from None
            status = int(response.status)
            if status in (401, 403):
                raise AuthFailed(path, f"HTTP {status}: not authorised", status)
            if 300 <= status < 400:
                raise RedfishError(path, f"HTTP {status}: redirect not followed (to "
                                   f"{_redirect_origin(response, self.url)})", status)
            if status >= 500 and attempt <= self.retries:
                time.sleep(self.backoff_s * attempt)
                continue
            if status != 200:
                raise RedfishError(path, f"HTTP {status}{_error_message(response)}", status)
            try:
                body = load_json_bytes(response.text, what=path, max_bytes=32 << 20)
            except (ValueError, TypeError):
                raise RedfishError(path, "the response is not JSON", status) from None
            if not isinstance(body, dict):
                raise RedfishError(path, "the response is not a JSON object", status)
            return body

    def patch(self, path: str, body: dict[str, Any], etag: str | None = None) -> PatchResult:
        """One PATCH, never retried (it is not idempotent on every BMC: iDRAC queues a job per call)."""
        clean = valid_path(path)
        headers = {"Content-Type": "application/json"}
        if etag:
            headers["If-Match"] = etag  # iLO and newer iDRACs refuse a PATCH without it (HTTP 428)
        with self._lock:
            self.requests += 1
        try:
            response = self._client.patch(clean, body=body, headers=headers, timeout=self.timeout_s, max_retry=0)
        except Exception as exc:  # noqa: BLE001 - connection errors, timeouts, resets
            raise RedfishError(clean, describe(exc)) from None
        status = int(response.status)
        if status in (401, 403):
            raise AuthFailed(clean, f"HTTP {status}: not authorised", status)
        if status not in (200, 202, 204):
            raise RedfishError(clean, f"PATCH refused: HTTP {status}{_error_message(response)}", status)
        return PatchResult(status, _location_path(response.getheader("Location")))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # logging out of a dead BMC must not fail the audit
            self._client.logout()


def _bound_broken(exc: BaseException) -> str | None:
    """The reason of the size or deadline bound (redfish_http) this failure came from, if any."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        reason = getattr(seen, "bound_reason", None)
        if isinstance(reason, str):
            return reason
        seen = seen.__cause__ or seen.__context__
    return None


def _redirect_origin(response: Any, own: str) -> str:
    """Where a 3xx pointed, as origin only (a Location may carry a token in its query)."""
    location = str(response.getheader("Location") or "")
    parts = urllib.parse.urlsplit(location)
    if not parts.netloc:
        return "the same BMC"
    origin = f"{parts.scheme}://{parts.hostname}"
    return "the same BMC" if f"{parts.scheme}://{parts.netloc}" == own else origin


def describe(exc: BaseException) -> str:
    """Reason text without credentials: the library's exceptions can carry URLs and headers."""
    bound = _bound_broken(exc)
    if bound is not None:
        return bound
    cause = exc.__cause__ or exc.__context__
    if type(exc).__name__ == "RetriesExhaustedError" and cause is not None:
        exc = cause
    name = type(exc).__name__
    text = str(exc)
    if "timed out" in text.lower() or "Timeout" in name:
        return "timed out"
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSLError" in name:
        return "TLS certificate verification failed (pass --bmc-ca-file, or --bmc-insecure)"
    if "Connection refused" in text:
        return "connection refused"
    if "reset" in text.lower() or "RemoteDisconnected" in text or "Connection aborted" in text:
        return "connection reset"
    return name


def checked_path(path: str) -> str | None:
    """`valid_path`, or None where it refuses the path."""
    try:
        return valid_path(path)
    except RedfishError:
        return None


def _location_path(location: str | None) -> str | None:
    """The path of a Location header (absolute or relative), if it is a Redfish path."""
    if not location:
        return None
    try:
        return valid_path(urllib.parse.urlsplit(location).path)
    except RedfishError:
        return None


def _error_message(response: Any) -> str:
    try:
        body = load_json_bytes(response.text, what="error body", max_bytes=1 << 20)
        info = body.get("error", {}).get("@Message.ExtendedInfo") or [{}]
        message = info[0].get("Message") or body.get("error", {}).get("message")
        return f" ({message})" if message else ""
    except Exception:  # noqa: BLE001 - error bodies are best effort
        return ""


class RecordedRedfish:
    """A snapshot's `redfish/` tree (DMTF mockup layout: <path>/index.json)."""

    supports_expand = False  # a recording holds resources as they were, one per path

    def __init__(self, base: Path) -> None:
        self.base = base
        self.requests = 0

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        if expand:
            raise RedfishError(path, "$expand is not available from a recording", 501)
        self.requests += 1
        clean = valid_path(path)
        file = self.base / clean.lstrip("/") / "index.json"
        try:
            body = load_json_file(file, max_bytes=RECORDED_RESOURCE_MAX_BYTES)
        except FileNotFoundError:
            raise _recorded_error(path, file.parent) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RedfishError(path, f"unreadable recording: {exc}") from None
        if not isinstance(body, dict):
            raise RedfishError(path, "the recorded response is not a JSON object")
        return body

    def close(self) -> None:
        return None


def _recorded_error(path: str, folder: Path) -> RedfishError:
    """A resource the recording does not hold, or the error the BMC answered when it was captured.

    The DMTF Mockup Creator writes `error.txt` ("HTTP 500" and the body) where a GET failed.
    """
    try:
        first = (folder / "error.txt").read_text(encoding="utf-8", errors="replace")[:200].splitlines()[0]
    except (OSError, IndexError):
        return RedfishError(path, "HTTP 404 (not in this recording)", 404)
    match = re.match(r"^HTTP (\d{3})\b", first.strip())
    status = int(match.group(1)) if match else None
    return RedfishError(path, f"HTTP {status} when recorded" if status else "an error when recorded", status)


class RecordingRedfish:
    """Wraps a live transport and keeps every successful answer."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.answers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def requests(self) -> int:
        return self.inner.requests

    @property
    def supports_expand(self) -> bool:
        return bool(getattr(self.inner, "supports_expand", False))

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        body = self.inner.get(path, expand)
        with self._lock:
            self.answers[valid_path(path)] = body
        return body

    def service_root(self) -> dict[str, Any] | None:
        """The inner transport's login-time service root, recorded like any answer."""
        take = getattr(self.inner, "service_root", None)
        body = take() if callable(take) else None
        if isinstance(body, dict):
            with self._lock:
                self.answers[ROOT] = body
            return body
        return None

    def use_concurrency(self, concurrency: int) -> None:
        resize = getattr(self.inner, "use_concurrency", None)
        if callable(resize):
            resize(concurrency)

    def close(self) -> None:
        self.inner.close()

    def write(self, snapshot_dir: Path) -> None:
        from agent.io.fsutil import create_file

        for path, body in sorted(self.answers.items()):  # mockup layout; create_file refuses `..`
            create_file(snapshot_dir, f"{path.strip('/')}/index.json", json.dumps(body, indent=1, sort_keys=True))


def link(resource: dict[str, Any], *keys: str) -> str | None:
    """The `@odata.id` at `resource[keys[0]][keys[1]]...`, if there is one."""
    node: Any = resource
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, dict) and isinstance(node.get("@odata.id"), str):
        return str(node["@odata.id"])
    return None
