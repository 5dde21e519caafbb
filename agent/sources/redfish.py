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
import re
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from agent.errors import ConfigError
from agent.facts import (
    BiosSettings,
    BmcFacts,
    BmcFan,
    BmcGpu,
    BmcLeakDetector,
    BmcLogEntry,
    BmcPsu,
    BmcRedundancy,
    BmcSwitch,
    BmcTemperature,
    FirmwareItem,
)
from agent.model import SourceStatus, Unknown, Unsupported

ROOT = "/redfish/v1"
# Resource paths from the BMC are validated before they become URLs or files.
_PATH_RE = re.compile(r"^/redfish/v1(?:/[A-Za-z0-9_.\-:@%!$()*+,;=~]+)*$")
MAX_LOG_ENTRIES = 100  # per log service: enough to judge, bounded for BMCs with huge SELs


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
    """A BMC-supplied @odata.id, without fragment, checked before use."""
    clean = path.split("#", 1)[0].rstrip("/")
    if not _PATH_RE.match(clean) or "/../" in f"{clean}/" or "/./" in f"{clean}/":
        raise RedfishError(path, "refusing an unexpected resource path")
    return clean


# --- transports -------------------------------------------------------------------------------


class LiveRedfish:
    """HTTP(S) through the DMTF `redfish` client."""

    def __init__(self, url: str, user: str, password: str, *, ca_file: str | None = None,
                 insecure: bool = False, timeout_s: float = 10.0, retries: int = 2,
                 backoff_s: float = 0.3) -> None:
        import redfish  # only when a BMC is actually read

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
            root = json.loads(response.text) if int(response.status) == 200 else None
        except Exception:  # noqa: BLE001 - unreadable root: let the login attempt decide
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
                if attempt <= self.retries:
                    time.sleep(self.backoff_s * attempt)
                    continue
                raise RedfishError(path, reason) from None
            status = int(response.status)
            if status in (401, 403):
                raise AuthFailed(path, f"HTTP {status}: not authorised", status)
            if status >= 500 and attempt <= self.retries:
                time.sleep(self.backoff_s * attempt)
                continue
            if status != 200:
                raise RedfishError(path, f"HTTP {status}{_error_message(response)}", status)
            try:
                body = json.loads(response.text)
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


def _describe(exc: BaseException) -> str:
    """Reason text without credentials: the library's exceptions can carry URLs and headers."""
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
        body = json.loads(response.text)
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
            body = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RedfishError(path, "HTTP 404 (not in this recording)", 404) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RedfishError(path, f"unreadable recording: {exc}") from None
        if not isinstance(body, dict):
            raise RedfishError(path, "the recorded response is not a JSON object")
        return body

    def close(self) -> None:
        return None


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
    for member in collection.get("Members") or []:
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
    elif "Manager." in kind:
        links = [_link(body, "LogServices")]
    elif "Chassis." in kind:
        links = [_link(body, "Thermal"), _link(body, "Power"), _link(body, "ThermalSubsystem"),
                 _link(body, "PowerSubsystem")]
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
                              "PowerSupplies", "Fans", "LeakDetectors", "Fabrics", "Switches"})


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
    members = body.get("Members") or []
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
    members = body.get("Members") or []
    return bool(members) and all(isinstance(m, dict) and len(m) > 2 for m in members)


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

    def run(self, start: Iterable[str] = (ROOT,)) -> None:
        end = time.monotonic() + self.deadline_s
        seen: set[str] = set()
        pool = futures.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="redfish")
        pending: dict[futures.Future[dict[str, Any]], str] = {}

        known: dict[str, str] = {}  # lower-case path -> the case the BMC served it with
        expanded: set[str] = set()  # paths requested with $expand

        def submit(raw: str, parent: str | None = None) -> None:
            try:
                path = self._canonical(valid_path(raw), known)
            except RedfishError as exc:
                self.errors[raw] = exc
                return
            if path.lower() in seen or self.auth_error is not None:
                return
            seen.add(path.lower())
            expand = self.expand if (self.expand and not self.expand_refused
                                     and path.rsplit("/", 1)[-1] in COLLECTION_NAMES) else None
            if expand:
                expanded.add(path)
            self.depth[path] = self.depth.get(parent, 0) + 1 if parent else 1
            pending[pool.submit(self.transport.get, path, expand)] = path

        for path in start:
            submit(path)
        try:
            while pending:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    self.timed_out = True
                    for future, path in pending.items():
                        future.cancel()
                        self.errors[path] = RedfishError(path, f"no answer before the {self.deadline_s:g} s deadline")
                    break
                done, _ = futures.wait(pending, timeout=remaining, return_when=futures.FIRST_COMPLETED)
                for future in done:
                    path = pending.pop(future)
                    try:
                        body = future.result()
                    except AuthFailed as exc:
                        self.auth_error = exc
                        continue
                    except RedfishError as exc:
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
                    for member in _inline_expanded(body):
                        member_path = valid_path(member["@odata.id"])
                        seen.add(member_path.lower())
                        self.resources[member_path] = member
                        known[member_path.lower()] = member_path
                        self.depth[member_path] = self.depth.get(path, 1)
                        for child in _children(member_path, member):
                            submit(child, member_path)
                    self.resources[path] = body
                    known[path.lower()] = path
                    for child in _children(path, body):
                        submit(child, path)
        finally:
            # Do not wait for requests stuck on a hung BMC: their threads end with their timeouts.
            pool.shutdown(wait=False, cancel_futures=True)


# --- parsing ------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _status(body: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    status = body.get("Status") if isinstance(body.get("Status"), dict) else {}
    assert isinstance(status, dict)
    return status.get("State"), status.get("Health"), status.get("HealthRollup")


def _of_type(resources: dict[str, dict[str, Any]], marker: str) -> list[tuple[str, dict[str, Any]]]:
    return sorted((p, b) for p, b in resources.items() if marker in str(b.get("@odata.type", "")))


def _threshold(sensor: dict[str, Any], legacy: str, modern: str) -> float | None:
    value = _num(sensor.get(legacy))
    if value is None and isinstance(sensor.get("Thresholds"), dict):
        reading = sensor["Thresholds"].get(modern)
        value = _num(reading.get("Reading")) if isinstance(reading, dict) else None
    return value


def _bios(res: dict[str, dict[str, Any]], host_system: tuple[str, dict[str, Any]] | None,
          missing: Callable[[str, str], Unknown]) -> tuple[dict[str, Any] | Unknown, BiosSettings | Unknown]:
    """The current BIOS attributes and where changes to them go (the settings object).

    The settings object is itself a `Bios` resource, so the current one is
    the host system's `Bios` link, not just any resource of that type.
    """
    lowered = {p.lower(): p for p in res}
    bios_link = _link(host_system[1], "Bios") if host_system else None
    bios_path = lowered.get(valid_path(bios_link).lower()) if bios_link else None
    if bios_path is None:
        candidates = [p for p, b in _of_type(res, "Bios.") if b.get("Id") != "Settings"]
        bios_path = candidates[0] if candidates else None
    if bios_path is None:
        gone = missing("BIOS attributes", "/Bios")
        return gone, gone
    bios = res[bios_path]
    attributes = dict(bios.get("Attributes") or {})
    settings_link = _link(bios, "@Redfish.Settings", "SettingsObject")
    if settings_link is None:
        return attributes, Unsupported("the BIOS resource has no @Redfish.Settings object: "
                                       "this BMC takes no BIOS changes over Redfish")
    settings_path = valid_path(settings_link)
    settings_info = bios["@Redfish.Settings"]
    apply_times = tuple(str(t) for t in settings_info.get("SupportedApplyTimes") or [] if isinstance(t, str))
    body = res.get(lowered.get(settings_path.lower(), settings_path))
    pending: dict[str, Any] | Unknown = (dict(body.get("Attributes") or {}) if body is not None
                                         else missing("the pending BIOS settings", settings_path))
    etag = body.get("@odata.etag") if body is not None else None
    return attributes, BiosSettings(bios_path, lowered.get(settings_path.lower(), settings_path), apply_times,
                                    pending, etag if isinstance(etag, str) else None)


def parse_bmc(walk: Walk, insecure: bool = False) -> BmcFacts:
    """Turn the resources a walk fetched into BmcFacts; missing parts say why."""
    res = walk.resources
    problems = tuple(sorted(f"{e.path}: {e.reason}" for e in walk.errors.values()))

    def missing(what: str, marker: str) -> Unknown:
        related = [e for p, e in walk.errors.items() if marker.lower() in p.lower()]
        if related:
            return Unknown(f"{what}: {related[0].reason} ({related[0].path})")
        if walk.timed_out:
            return Unknown(f"{what}: not read before the deadline")
        return Unsupported(f"this BMC does not expose {what}")

    root = res.get(ROOT, {})
    systems = [(p, b) for p, b in _of_type(res, "ComputerSystem.") if "Collection" not in str(b.get("@odata.type"))]
    managers = [(p, b) for p, b in _of_type(res, "Manager.") if "Collection" not in str(b.get("@odata.type"))]
    host_system = _pick_host_system(systems)
    facts: dict[str, Any] = {
        "vendor": root.get("Vendor") or _oem_vendor(root) or missing("the vendor", ROOT),
        "redfish_version": root.get("RedfishVersion") or missing("RedfishVersion", ROOT),
    }
    if host_system is not None:
        _path, system = host_system
        state, health, rollup = _status(system)
        facts.update(
            manufacturer=system.get("Manufacturer") or Unknown("Manufacturer is empty"),
            model=system.get("Model") or Unknown("Model is empty"),
            bios_version=system.get("BiosVersion") or Unknown("BiosVersion is empty"),
            health=health or Unknown("no Status.Health"),
            health_rollup=rollup or health or Unknown("no Status.HealthRollup"),
            health_causes=_health_causes(system, res),
            power_state=system.get("PowerState") or Unknown("no PowerState"),
        )
    else:
        gone = missing("a ComputerSystem", "/Systems")
        facts.update(manufacturer=gone, model=gone, bios_version=gone, health=gone, health_rollup=gone,
                     power_state=gone)
    if managers:
        manager = sorted(managers, key=lambda m: (m[1].get("ManagerType") != "BMC", m[0]))[0][1]
        facts["manager_model"] = manager.get("Model") or Unknown("Model is empty")
        facts["manager_firmware"] = manager.get("FirmwareVersion") or Unknown("FirmwareVersion is empty")
    else:
        facts["manager_model"] = facts["manager_firmware"] = missing("a Manager", "/Managers")

    firmware = [FirmwareItem(str(b.get("Name") or b.get("Id") or p.rsplit("/", 1)[-1]), str(b["Version"]),
                             component_id=str(b.get("Id") or p.rsplit("/", 1)[-1]),
                             updateable=b.get("Updateable") if isinstance(b.get("Updateable"), bool) else None,
                             where=p)
                for p, b in _of_type(res, "SoftwareInventory.") if "Collection" not in str(b.get("@odata.type"))
                and isinstance(b.get("Version"), str) and b.get("Version")]
    facts["firmware"] = tuple(firmware) if firmware else missing("a firmware inventory", "FirmwareInventory")
    if isinstance(facts.get("bios_version"), Unknown):
        # Some BMCs leave BiosVersion empty but list the BIOS in the inventory.
        bios = [f for f in firmware if re.search(r"\bbios\b|system rom|uefi", f.name, re.IGNORECASE)]
        if bios:
            facts["bios_version"] = bios[0].version

    temperatures: list[BmcTemperature] = []
    fans: list[BmcFan] = []
    psus: list[BmcPsu] = []
    redundancy: list[BmcRedundancy] = []
    consumed: float | None = None
    thermal = _of_type(res, "Thermal.")
    for path, body in thermal:
        for t in body.get("Temperatures") or []:
            if not isinstance(t, dict):
                continue
            state, health, _ = _status(t)
            temperatures.append(BmcTemperature(
                name=str(t.get("Name") or t.get("MemberId") or "?"), reading=_num(t.get("ReadingCelsius")),
                upper_caution=_num(t.get("UpperThresholdNonCritical")),
                upper_critical=_num(t.get("UpperThresholdCritical")), upper_fatal=_num(t.get("UpperThresholdFatal")),
                state=state, health=health, context=t.get("PhysicalContext"), where=str(t.get("@odata.id") or path)))
        for f in body.get("Fans") or []:
            if not isinstance(f, dict):
                continue
            state, health, _ = _status(f)
            fans.append(BmcFan(name=str(f.get("Name") or f.get("FanName") or f.get("MemberId") or "?"),
                               reading=_num(f.get("Reading")), units=f.get("ReadingUnits"),
                               lower_critical=_num(f.get("LowerThresholdCritical")), state=state, health=health,
                               where=str(f.get("@odata.id") or path)))
    legacy_fans = bool(fans)  # Thermal.Fans and ThermalSubsystem/Fans describe the same fans
    for path, body in _of_type(res, "Fan."):
        if "Collection" in str(body.get("@odata.type")) or legacy_fans:
            continue
        state, health, _ = _status(body)
        speed = body.get("SpeedPercent") if isinstance(body.get("SpeedPercent"), dict) else {}
        assert isinstance(speed, dict)
        fans.append(BmcFan(name=str(body.get("Name") or body.get("Id")), reading=_num(speed.get("Reading")),
                           units="Percent", state=state, health=health, where=path))
    for path, body in _of_type(res, "Power."):
        for p in body.get("PowerSupplies") or []:
            if isinstance(p, dict):
                psus.append(_psu(p, str(p.get("@odata.id") or path)))
        for r in body.get("Redundancy") or []:
            if isinstance(r, dict):
                state, health, _ = _status(r)
                redundancy.append(BmcRedundancy(
                    name=str(r.get("Name") or r.get("MemberId")), mode=r.get("Mode"), state=state, health=health,
                    min_needed=r.get("MinNumNeeded") if isinstance(r.get("MinNumNeeded"), int) else None,
                    members=len(r.get("RedundancySet") or []), where=str(r.get("@odata.id") or path)))
        for control in body.get("PowerControl") or []:
            if isinstance(control, dict) and consumed is None:
                consumed = _num(control.get("PowerConsumedWatts"))
    modern_psus = [_psu(b, p) for p, b in _of_type(res, "PowerSupply.")
                   if "Collection" not in str(b.get("@odata.type"))]
    if modern_psus:
        psus = modern_psus  # the same units as Power.PowerSupplies, described by the newer schema
    if not redundancy:  # the newer schema's groups only when the legacy Power has none (no doubles)
        for path, body in _of_type(res, "PowerSubsystem."):
            for number, r in enumerate(body.get("PowerSupplyRedundancy") or []):
                if isinstance(r, dict):
                    state, health, _ = _status(r)
                    redundancy.append(BmcRedundancy(
                        name=f"PowerSupplyRedundancy {number}", mode=r.get("RedundancyType"), state=state,
                        health=health,
                        min_needed=r.get("MinNeededInGroup") if isinstance(r.get("MinNeededInGroup"), int) else None,
                        members=len(r.get("RedundancyGroup") or []), where=path))
    temperatures, fans, psus = _unique_names(temperatures), _unique_names(fans), _unique_names(psus)
    have_thermal = bool(thermal) or bool(_of_type(res, "ThermalSubsystem."))
    have_power = bool(_of_type(res, "Power.")) or bool(_of_type(res, "PowerSubsystem."))
    facts["temperatures"] = tuple(temperatures) if have_thermal else missing("thermal data", "Thermal")
    facts["fans"] = tuple(fans) if have_thermal else missing("fans", "Thermal")
    facts["psus"] = tuple(psus) if have_power else missing("power supplies", "Power")
    facts["redundancy"] = tuple(redundancy) if have_power else missing("power redundancy", "Power")
    facts["power_consumed_w"] = consumed if consumed is not None else Unsupported("no PowerConsumedWatts")

    leaks = []
    for path, body in _of_type(res, "LeakDetector."):
        if "Collection" not in str(body.get("@odata.type")):
            state, health, _ = _status(body)
            leaks.append(BmcLeakDetector(str(body.get("Name") or body.get("Id")), body.get("DetectorState"),
                                         state, health, path))
    facts["leak_detectors"] = tuple(leaks) if leaks or _of_type(res, "LeakDetection.") else (
        missing("leak detection", "LeakDetect"))

    facts["bios_attributes"], facts["bios_settings"] = _bios(res, host_system, missing)

    facts["events"] = _log_entries(res) if _of_type(res, "LogService.") else missing("log services", "LogServices")
    gpus = []
    for path, body in _of_type(res, "Processor."):
        if str(body.get("ProcessorType", "")).upper() == "GPU":
            state, health, _ = _status(body)
            gpus.append(BmcGpu(name=str(body.get("Name") or body.get("Id")), model=body.get("Model"),
                               firmware=body.get("FirmwareVersion"), serial=body.get("SerialNumber"),
                               state=state, health=health, where=path))
    facts["gpus"] = tuple(gpus) if _of_type(res, "Processor.") or _of_type(res, "ProcessorCollection") else (
        missing("processors", "Processors"))
    switches = []
    for path, body in _of_type(res, "Switch."):
        if "Collection" not in str(body.get("@odata.type")):
            state, health, _ = _status(body)
            switches.append(BmcSwitch(str(body.get("Name") or body.get("Id")), body.get("SwitchType"),
                                      body.get("Model"), body.get("FirmwareVersion"), state, health, path))
    facts["switches"] = tuple(_unique_names(switches)) if _of_type(res, "Fabric.") else missing(
        "fabrics", "Fabrics")
    return BmcFacts(protocol="redfish", problems=problems, insecure=insecure, requests=walk.transport.requests,
                    **facts)


def _unique_names(items: list[Any]) -> list[Any]:
    """Subjects must be unique: 'HpeServerPowerSupply' x4 becomes '... #1'..'... #4'."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.name] = counts.get(item.name, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for item in items:
        if counts[item.name] > 1:
            seen[item.name] = seen.get(item.name, 0) + 1
            out.append(item._replace(name=f"{item.name} #{seen[item.name]}"))
        else:
            out.append(item)
    return out


def _psu(body: dict[str, Any], where: str) -> BmcPsu:
    state, health, _ = _status(body)
    return BmcPsu(name=str(body.get("Name") or body.get("MemberId") or body.get("Id") or "?"), state=state,
                  health=health, model=body.get("Model"), firmware=body.get("FirmwareVersion"),
                  capacity_w=_num(body.get("PowerCapacityWatts")),
                  output_w=_num(body.get("LastPowerOutputWatts") or body.get("PowerOutputWatts")), where=where)


def _pick_host_system(systems: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    """The host computer system; HGX baseboards expose GPU trays as extra systems."""
    if not systems:
        return None
    physical = [s for s in systems if s[1].get("SystemType", "Physical") == "Physical"
                and "HGX" not in s[0] and s[1].get("BiosVersion")]
    return (physical or systems)[0]


def _oem_vendor(root: dict[str, Any]) -> str | None:
    oem = root.get("Oem")
    return next(iter(oem)) if isinstance(oem, dict) and oem else None


def _health_causes(system: dict[str, Any], res: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    causes = []
    status = system.get("Status") if isinstance(system.get("Status"), dict) else {}
    assert isinstance(status, dict)
    for condition in status.get("Conditions") or []:
        if isinstance(condition, dict) and condition.get("Message"):
            causes.append(f"{condition.get('Severity', '?')}: {condition['Message']}")
    for path, body in sorted(res.items()):
        state, health, _ = _status(body)
        if health in ("Warning", "Critical") and state != "Absent" and body is not system:
            causes.append(f"{body.get('Name') or path}: {health}")
        for array in ("PowerSupplies", "Fans", "Temperatures", "Redundancy"):  # items embedded in Power/Thermal
            for item in body.get(array) or []:
                if isinstance(item, dict):
                    item_state, item_health, _ = _status(item)
                    if item_health in ("Warning", "Critical") and item_state != "Absent":
                        causes.append(f"{item.get('Name') or item.get('MemberId')}: {item_health}")
    return tuple(dict.fromkeys(causes))[:10]


def _log_entries(res: dict[str, dict[str, Any]]) -> tuple[BmcLogEntry, ...]:
    entries: dict[tuple[str, ...], BmcLogEntry] = {}

    def add(log: str, entry: dict[str, Any]) -> None:
        severity = entry.get("Severity") or entry.get("MessageSeverity")
        # The resource path identifies an entry; some BMCs reuse Ids (Dell: two entries "1").
        key = (str(entry.get("@odata.id")),) if entry.get("@odata.id") else (
            log, str(entry.get("Id")), str(entry.get("Created")), str(entry.get("Message")))
        entries[key] = BmcLogEntry(log=log, entry_id=str(entry.get("Id") or entry.get("@odata.id")),
                                   severity=severity if isinstance(severity, str) else None,
                                   message=str(entry.get("Message") or entry.get("Name") or ""),
                                   created=entry.get("Created") if isinstance(entry.get("Created"), str) else None,
                                   message_id=entry.get("MessageId"))

    for path, body in res.items():
        if path.endswith("/Entries"):
            log = path.rsplit("/", 2)[-2]
            for member in body.get("Members") or []:
                if isinstance(member, dict) and len(member) > 2:
                    add(log, member)
        elif "LogEntry." in str(body.get("@odata.type", "")):
            add(path.rsplit("/", 3)[-3], body)
    return tuple(sorted(entries.values(), key=lambda e: (e.log, e.created or "", e.entry_id)))


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
    problem: str | None = f"{len(walk.errors)} resource(s) failed" if walk.errors else None
    if walk.timed_out:
        problem = f"stopped at the {deadline_s:g} s deadline; {problem or 'some resources were not read'}"
    return facts, SourceStatus("redfish", ok=not walk.timed_out, error=problem, duration_s=elapsed,
                               detail=detail), transport
