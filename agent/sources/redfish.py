"""Redfish source: the node as its BMC reports it, gently.

BMCs are small, slow and fragile, so the walker:
* asks for each resource once per audit (a cache by path),
* keeps at most `concurrency` requests in flight (default 4) and schedules a
  resource's children as soon as it arrives (no level-by-level waiting),
* uses `$expand` only when the service root says it supports it, and falls
  back to plain GETs when the expanded request is refused,
* retries GETs (never anything else) with backoff on timeouts, resets and
  5xx, and never retries after a 401 (no account lock-outs),
* stops at an overall deadline; what it could not read is reported per
  resource, never raised.

Transports: `LiveRedfish` (DMTF `redfish` library: session login with
fallback to basic auth, logout always, TLS verified unless told otherwise),
`RecordedRedfish` (a snapshot's `redfish/v1/**/index.json`, the DMTF mockup
layout, so a captured BMC can be served back by a mockup server) and
`RecordingRedfish` (live, remembering every answer for `snapshot capture`).
The parser (`parse_bmc`) is shared by all three.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from agent.errors import ConfigError
from agent.facts import BmcFacts
from agent.jsonfile import load_json_bytes, load_json_file
from agent.model import SourceStatus, Unknown
from agent.sources.redfish_parse import parse_bmc as parse_bmc  # noqa: PLC0414 - re-exported
from agent.sources.redfish_registry import RegistryChain

T = TypeVar("T")
ROOT = "/redfish/v1"
# Resource paths from the BMC are validated before they become URLs or files.
_PATH_RE = re.compile(r"^/redfish/v1(?:/[A-Za-z0-9_.\-:@%!$()*+,;=~]+)*$")
MAX_LOG_ENTRIES = 100  # per log service: enough to judge, bounded for BMCs with huge SELs
# Fan-out bounds: the largest real tree we hold (an HPE iLO 6 with two GPUs) has ~400 resources.
MAX_RESOURCES = 4000  # per walk
MAX_COLLECTION_MEMBERS = 512  # followed per collection (a real one holds at most a few hundred)
MAX_MEMBERS_KEPT = 20_000  # collection members kept over a whole walk (memory: ~200 bytes each)


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
        self.requests = 0
        self.auth = "none"
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
            raise RedfishError(ROOT, _describe(exc)) from None
        # Every request of the library (login included) goes through this session: no redirects,
        # a capped body, one total deadline and a pool the size of the walk's concurrency. The
        # library has no public hook for it; its `_session` attribute is the requests.Session.
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.session = BoundedSession(pool_size=concurrency, max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                                      deadline=deadline)
        self._client._session = self.session
        self.cleartext = self.url.startswith("http://")
        self._login()

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
        return bool(_link(root, "Links", "Sessions") or _link(root, "SessionService"))

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
            raise RedfishError(ROOT, f"login failed: {_describe(exc)}") from None

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
                reason = _describe(exc)
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
            raise RedfishError(clean, _describe(exc)) from None
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


def _describe(exc: BaseException) -> str:
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


def _checked_path(path: str) -> str | None:
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
            body = load_json_file(file, max_bytes=32 << 20)
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

    def close(self) -> None:
        self.inner.close()

    def write(self, snapshot_dir: Path) -> None:
        for path, body in sorted(self.answers.items()):
            target = snapshot_dir / path.lstrip("/") / "index.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")


# --- the walk ------------------------------------------------------------------------------------


def _link(resource: dict[str, Any], *keys: str) -> str | None:
    node: Any = resource
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, dict) and isinstance(node.get("@odata.id"), str):
        return str(node["@odata.id"])
    return None


def _members(collection: dict[str, Any]) -> list[str]:
    out = []
    members = collection.get("Members")
    for member in members if isinstance(members, list) else []:  # "Members": 1 is the parser's problem
        if isinstance(member, dict) and isinstance(member.get("@odata.id"), str):
            out.append(member["@odata.id"])
    return list(dict.fromkeys(out))  # some BMCs list a member twice


def _children(path: str, body: dict[str, Any]) -> list[str]:
    """Which resources to read next, given one that arrived (the walk's plan)."""
    kind = str(body.get("@odata.type", ""))
    if path == ROOT:
        return [p for p in (_link(body, "Systems"), _link(body, "Managers"), _link(body, "Chassis"),
                            _link(body, "UpdateService"), _link(body, "Fabrics")) if p]
    if "Collection" in kind or ("Members" in body and "Members@odata.count" in body):
        if _inline_expanded(body) and not path.endswith("/Entries"):
            return []  # the walk registered the inline members and follows their links
        members = _members(body)
        if path.endswith("/Entries"):
            # Inline entries need no more requests; linked ones are bounded.
            return [] if _inline_members(body) else members[-MAX_LOG_ENTRIES:]
        return members
    links: list[str | None] = []
    if "ComputerSystem." in kind:
        links = [_link(body, "Bios"), _link(body, "Processors"), _link(body, "LogServices")]
        if _unhealthy(body):  # what explains the rollup: storage, drives, memory (no cost on a healthy node)
            links += [_link(body, "Storage"), _link(body, "Memory"), _link(body, "SimpleStorage")]
    elif "Storage." in kind and _unhealthy(body):
        drives = body.get("Drives")
        links = [d.get("@odata.id") for d in drives if isinstance(d, dict) and isinstance(d.get("@odata.id"), str)
                 ] if isinstance(drives, list) else []
    elif "Manager." in kind:
        links = [_link(body, "LogServices")]
    elif "Chassis." in kind:
        links = [_link(body, "Thermal"), _link(body, "Power"), _link(body, "ThermalSubsystem"),
                 _link(body, "PowerSubsystem"), _link(body, "Oem", "Alarms")]  # HPE Cray: leak alarms
    elif "ThermalSubsystem." in kind:
        links = [_link(body, "Fans"), _link(body, "LeakDetection")]
    elif "LeakDetection." in kind:
        links = [_link(body, "LeakDetectors")]
    elif "PowerSubsystem." in kind:
        links = [_link(body, "PowerSupplies")]
    elif "UpdateService." in kind:
        links = [_link(body, "FirmwareInventory")]
    elif "LogService." in kind:
        links = [_link(body, "Entries")]
    elif "Bios." in kind:
        links = [_link(body, "@Redfish.Settings", "SettingsObject")]  # pending BIOS changes
    elif "Fabric." in kind:
        links = [_link(body, "Switches")]  # NVSwitches on HGX baseboards; ports are not needed
    return [p for p in links if p]


COLLECTION_NAMES = frozenset({"Systems", "Managers", "Chassis", "FirmwareInventory", "Processors", "LogServices",
                              "PowerSupplies", "Fans", "LeakDetectors", "Fabrics", "Switches", "Memory", "Storage",
                              "Alarms"})


def _unhealthy(body: dict[str, Any]) -> bool:
    status = body.get("Status")
    return isinstance(status, dict) and any(status.get(k) in ("Warning", "Critical")
                                            for k in ("Health", "HealthRollup"))


def expand_form(root: dict[str, Any]) -> str | None:
    """The $expand value to use, from ProtocolFeaturesSupported.ExpandQuery (None: not supported)."""
    features = root.get("ProtocolFeaturesSupported")
    query = features.get("ExpandQuery") if isinstance(features, dict) else None
    if not isinstance(query, dict):
        return None
    if query.get("Levels") and query.get("NoLinks"):
        return ".($levels=1)"
    if query.get("NoLinks"):
        return "."
    return None


def _inline_expanded(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Members an expanded collection carried inline (full resources, not just links)."""
    listed = body.get("Members")
    members: list[Any] = listed if isinstance(listed, list) else []  # "Members": 1 is the parser's problem
    out = []
    for member in members:
        if isinstance(member, dict) and isinstance(member.get("@odata.id"), str) and "@odata.type" in member:
            try:
                valid_path(member["@odata.id"])
            except RedfishError:
                continue
            out.append(member)
    return out


def _inline_members(body: dict[str, Any]) -> bool:
    listed = body.get("Members")
    members: list[Any] = listed if isinstance(listed, list) else []  # "Members": 1 is the parser's problem
    return bool(members) and all(isinstance(m, dict) and len(m) > 2 for m in members)


class DaemonPool:
    """A fixed set of daemon worker threads handing out futures.

    Not concurrent.futures.ThreadPoolExecutor: its workers are joined at interpreter exit, so one
    request hung on a trickling BMC would hold the process long after the audit is done.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[futures.Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._workers = max(1, workers)
        for index in range(self._workers):
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True).start()

    def submit(self, func: Callable[..., T], *args: Any) -> futures.Future[T]:
        future: futures.Future[T] = futures.Future()
        self._queue.put((future, func, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, func, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(func(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Let the workers end after what they are doing; never waits."""
        for _ in range(self._workers):
            self._queue.put(None)


class Walk:
    """Fetches the resource graph from the root with bounded concurrency."""

    def __init__(self, transport: Transport, concurrency: int = 4, deadline_s: float = 30.0) -> None:
        self.transport = transport
        self.concurrency = max(1, concurrency)
        self.deadline_s = deadline_s
        self.resources: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, RedfishError] = {}
        self.auth_error: AuthFailed | None = None
        self.timed_out = False
        self.depth: dict[str, int] = {}  # requests on the longest dependent chain to each resource
        self.expand: str | None = None  # the $expand form the service supports, if any
        self.expand_refused = False
        self.caps_hit: set[str] = set()  # fan-out bounds the walk stopped at (reported as unknown)
        self._members_kept = 0
        # Bios -> Registries -> MessageRegistryFile -> AttributeRegistry (agent.sources.redfish_registry):
        # its failures are kept there, never among the walk's failed resources.
        self.registry = RegistryChain(_checked_path)

    @staticmethod
    def _canonical(path: str, known: dict[str, str]) -> str:
        """Fix the case of a link against resources already read.

        iLO links to "/redfish/v1/systems/1/bios" from "/redfish/v1/Systems/1";
        real BMCs ignore case, mockup servers and recordings do not.
        """
        parts = path.split("/")
        for end in range(len(parts), 2, -1):
            prefix = known.get("/".join(parts[:end]).lower())
            if prefix is not None:
                return "/".join([prefix, *parts[end:]])
        return path

    def _bounded_members(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The body with at most what the walk can still keep of its `Members` (a copy if cut)."""
        members = body.get("Members")
        if not isinstance(members, list):
            return body
        allowed = max(0, min(MAX_COLLECTION_MEMBERS, MAX_MEMBERS_KEPT - self._members_kept))
        if len(members) > allowed:
            newest = path.endswith("/Entries")  # log entries: the newest are the last
            self.caps_hit.add(f"{path}: {len(members)} members, only the {'last' if newest else 'first'} "
                              f"{allowed} read")
            body = {**body, "Members": members[-allowed:] if newest and allowed else members[:allowed]}
        self._members_kept += min(len(members), allowed)
        return body

    def run(self, start: Iterable[str] = (ROOT,)) -> None:
        end = time.monotonic() + self.deadline_s
        seen: set[str] = set()
        pool = DaemonPool(self.concurrency, "redfish")
        pending: dict[futures.Future[dict[str, Any]], str] = {}

        known: dict[str, str] = {}  # lower-case path -> the case the BMC served it with
        expanded: set[str] = set()  # paths requested with $expand

        def submit(raw: str, parent: str | None = None) -> str | None:
            try:
                path = self._canonical(valid_path(raw), known)
            except RedfishError as exc:
                self.errors[raw] = exc
                return None
            if path.lower() in seen or self.auth_error is not None:
                return None
            if len(seen) >= MAX_RESOURCES:
                self.caps_hit.add(f"more than {MAX_RESOURCES} resources: the rest were not read")
                return None
            seen.add(path.lower())
            expand = self.expand if (self.expand and not self.expand_refused
                                     and path.rsplit("/", 1)[-1] in COLLECTION_NAMES) else None
            if expand:
                expanded.add(path)
            self.depth[path] = self.depth.get(parent, 0) + 1 if parent else 1
            pending[pool.submit(self.transport.get, path, expand)] = path
            return path

        def follow(path: str, body: dict[str, Any]) -> None:
            replaces, chain = self.registry.plan(path, body, self.resources.get(ROOT))
            for child in [] if replaces else _children(path, body):
                submit(child, path)
            for child in chain:
                if (asked := submit(child, path)) is not None:
                    self.registry.asked(asked)

        for path in start:
            submit(path)
        try:
            while pending:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    self.timed_out = True
                    for future, path in pending.items():
                        future.cancel()
                        late = RedfishError(path, f"no answer before the {self.deadline_s:g} s deadline")
                        if self.registry.owns(path):
                            self.registry.failed(path, late.reason, None)
                        else:
                            self.errors[path] = late
                    break
                done, _ = futures.wait(pending, timeout=remaining, return_when=futures.FIRST_COMPLETED)
                for future in done:
                    path = pending.pop(future)
                    try:
                        body = future.result()
                    except RedfishError as exc:
                        if self.registry.owns(path):  # a registry this BMC will not serve: aliases, not a failure
                            self.registry.failed(path, exc.reason, exc.status)
                            continue
                        if isinstance(exc, AuthFailed):
                            self.auth_error = exc
                            continue
                        if path in expanded and exc.status in (400, 404, 405, 501):
                            # The service advertised $expand but refuses it: plain GETs from now on.
                            self.expand_refused = True
                            expanded.discard(path)
                            seen.discard(path.lower())
                            submit(path)
                            continue
                        self.errors[path] = exc
                        continue
                    if path == ROOT:
                        self.expand = expand_form(body) if getattr(self.transport, "supports_expand", False) else None
                    body = self._bounded_members(path, body)
                    for member in _inline_expanded(body):
                        member_path = valid_path(member["@odata.id"])
                        seen.add(member_path.lower())
                        self.resources[member_path] = member
                        known[member_path.lower()] = member_path
                        self.depth[member_path] = self.depth.get(path, 1)
                        follow(member_path, member)
                    self.resources[path] = body
                    known[path.lower()] = path
                    follow(path, body)
        finally:
            # Do not wait for requests stuck on a hung BMC: their daemon threads end with their
            # timeouts, and nothing joins them at exit (the audit ends when it is done).
            pool.shutdown()


# --- parsing: agent.sources.redfish_parse (typed fields, sensors, inventory, logs) -----------------


# --- reading with a deadline ------------------------------------------------------------------------


SENSOR_START = (f"{ROOT}/Chassis",)  # thermal, power, fans, PSUs, leak detectors: what changes minute to minute


def read_redfish(make_transport: Callable[[], Transport], *, concurrency: int = 4, deadline_s: float = 30.0,
                 insecure: bool = False, paths: tuple[str, ...] = (ROOT,),
                 ) -> tuple[BmcFacts | Unknown, SourceStatus, Transport | None]:
    """Connect, walk (from `paths`: the whole service, or e.g. SENSOR_START), parse.

    Never raises; never blocks much past `deadline_s`.
    """
    start = time.monotonic()
    outcome: dict[str, Any] = {}

    def connect() -> None:
        try:
            outcome["transport"] = make_transport()
        except AuthFailed as exc:
            outcome["auth"] = exc
        except RedfishError as exc:
            outcome["error"] = exc.reason
        except Exception as exc:  # noqa: BLE001 - anything else is reported, not raised
            outcome["error"] = _describe(exc)

    worker = threading.Thread(target=connect, name="redfish-connect", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        error = f"the BMC did not answer the login within {deadline_s:g} s"
        return Unknown(error), SourceStatus("redfish", ok=False, error=error,
                                            duration_s=time.monotonic() - start), None
    if "auth" in outcome or "error" in outcome:
        error = str(outcome["auth"].reason if "auth" in outcome else outcome["error"])
        failed: dict[str, Any] = {"auth_failed": True} if "auth" in outcome else {}
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=time.monotonic() - start,
                                            detail=failed), None
    transport: Transport = outcome["transport"]
    walk = Walk(transport, concurrency=concurrency, deadline_s=max(0.1, deadline_s - (time.monotonic() - start)))
    try:
        walk.run(paths)
    finally:
        closer = threading.Thread(target=transport.close, daemon=True)
        closer.start()
        closer.join(2.0)
    elapsed = time.monotonic() - start
    if walk.auth_error is not None:
        error = walk.auth_error.reason
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=elapsed,
                                            detail={"auth_failed": True, "requests": transport.requests}), transport
    if not any(path in walk.resources for path in paths):
        # The walk's own start (the service root, or /Chassis for the daemon's sensor poll) is the
        # evidence that the BMC answered; a sensor walk never asks for the root.
        first = paths[0]
        error = walk.errors[first].reason if first in walk.errors else (
            "the service root did not answer" if first == ROOT else f"{first} did not answer")
        return Unknown(error), SourceStatus("redfish", ok=False, error=error, duration_s=elapsed), transport
    facts = parse_bmc(walk, insecure=insecure)
    detail: dict[str, Any] = {"requests": transport.requests, "resources": len(walk.resources),
                              "failed_resources": len(walk.errors)}
    if hasattr(transport, "auth"):
        detail["auth"] = transport.auth
    if getattr(transport, "cleartext", False) or getattr(getattr(transport, "inner", None), "cleartext", False):
        detail["cleartext"] = True  # bmc.reachable warns: credentials went over plain HTTP
    problem: str | None = f"{len(walk.errors)} resource(s) failed" if walk.errors else None
    if walk.caps_hit:
        problem = "; ".join(filter(None, [problem, *sorted(walk.caps_hit)]))
    if walk.timed_out:
        problem = f"stopped at the {deadline_s:g} s deadline; {problem or 'some resources were not read'}"
    return facts, SourceStatus("redfish", ok=not walk.timed_out, error=problem, duration_s=elapsed,
                               detail=detail), transport
