"""The Redfish walk: what to fetch, in what order, how many at a time.

BMCs are small, slow and fragile, so the walker:
* asks for each resource once per audit (a cache by path), and takes the service root the login
  already read (`service_root` on the transport) instead of asking again,
* keeps at most `concurrency` requests in flight (default 4; the transport's connection pool is
  sized to it) and schedules a resource's children as soon as it arrives (no level-by-level waiting),
* uses `$expand` only when the service root says it supports it, and probes it once: the first
  collection asks with it, the others go plain until that answer shows it works; refused, the
  probed collection is asked again plainly, one request further down its chain,
* stops at an overall deadline; what it could not read is reported per resource, never raised.

A recording (`RecordedRedfish`, local files) is read in the calling thread, one resource at a
time in the same priority order: threads would add only their hand-offs there.

`depth` holds, per resource, the requests on the longest dependent chain that led to it (a
refused `$expand` counts as one), which is what the latency bound of a read is made of.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agent.sources.redfish_client import (
    ROOT,
    AuthFailed,
    RecordedRedfish,
    RedfishError,
    Transport,
    checked_path,
    link,
    valid_path,
)
from agent.sources.redfish_registry import RegistryChain

if TYPE_CHECKING:  # concurrent.futures and queue load only where a BMC is read over the network
    import queue
    from concurrent import futures

T = TypeVar("T")
MAX_LOG_ENTRIES = 100  # per log service: enough to judge, bounded for BMCs with huge SELs
# Fan-out bounds: the largest real tree we hold (an HPE iLO 6 with two GPUs) has ~400 resources.
MAX_RESOURCES = 4000  # per walk
MAX_COLLECTION_MEMBERS = 512  # followed per collection (a real one holds at most a few hundred)
MAX_MEMBERS_KEPT = 20_000  # collection members kept over a whole walk (memory: ~200 bytes each)
MAX_DRIVES = 256  # drive links followed per Storage (a 2U JBOD head holds ~100)


def _members(collection: dict[str, Any]) -> list[str]:
    out = []
    members = collection.get("Members")
    for member in members if isinstance(members, list) else []:  # "Members": 1 is the parser's problem
        if isinstance(member, dict) and isinstance(member.get("@odata.id"), str):
            out.append(member["@odata.id"])
    return list(dict.fromkeys(out))  # some BMCs list a member twice


def children(path: str, body: dict[str, Any]) -> list[str]:
    """Which resources to read next, given one that arrived (the walk's plan)."""
    kind = str(body.get("@odata.type", ""))
    if path == ROOT:
        return [p for p in (link(body, "Systems"), link(body, "Managers"), link(body, "Chassis"),
                            link(body, "UpdateService"), link(body, "Fabrics")) if p]
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
        # Storage always (issue 22 item 7: a predicted failure or a worn SSD does not reach the rollup);
        # memory only to explain an unhealthy rollup (no cost on a healthy node).
        links = [link(body, "Bios"), link(body, "Processors"), link(body, "LogServices"), link(body, "Storage"),
                 link(body, "SimpleStorage")]  # SimpleStorage: the drives of BMCs without Storage (issue 31.6)
        if _unhealthy(body):
            links += [link(body, "Memory")]
    elif "Storage." in kind and "SimpleStorage." not in kind:
        drives = body.get("Drives")
        links = [d.get("@odata.id") for d in drives if isinstance(d, dict) and isinstance(d.get("@odata.id"), str)
                 ][:MAX_DRIVES] if isinstance(drives, list) else []
        links.append(link(body, "Volumes"))
    elif "Manager." in kind:
        links = [link(body, "LogServices")]
    elif "Chassis." in kind:
        links = [link(body, "Thermal"), link(body, "Power"), link(body, "ThermalSubsystem"),
                 link(body, "PowerSubsystem"), link(body, "Sensors"),  # Sensors: OpenBMC, Cray EX (issue 31.2)
                 link(body, "Controls"),  # power caps as `#Control` (issue 31.5)
                 link(body, "EnvironmentMetrics"),  # power and temperature excerpts (31.2)
                 link(body, "Oem", "Alarms")]  # HPE Cray: leak alarms
        # Its drives: `chassis_drives` (a whole walk only, the drives after everything else).
    elif "ThermalSubsystem." in kind:
        links = [link(body, "Fans"), link(body, "LeakDetection"), link(body, "ThermalMetrics")]
    elif "LeakDetection." in kind:
        links = [link(body, "LeakDetectors")]
    elif "PowerSubsystem." in kind:
        links = [link(body, "PowerSupplies"), link(body, "Batteries")]  # Batteries: a tray's BBU (31.2)
    elif "UpdateService." in kind:
        links = [link(body, "FirmwareInventory")]
    elif "LogService." in kind:
        links = [link(body, "Entries")]
    elif "Bios." in kind:
        links = [link(body, "@Redfish.Settings", "SettingsObject")]  # pending BIOS changes
    elif "Fabric." in kind:
        links = [link(body, "Switches")]  # NVSwitches on HGX baseboards; ports are not needed
    return [p for p in links if p]


def chassis_drive_collection(path: str) -> bool:
    """`Chassis/{id}/Drives`: its members are read with the Chassis drives, after the rest of the walk."""
    parts = path.split("/")
    return len(parts) == 6 and parts[3] == "Chassis" and parts[5] == "Drives"


def chassis_drives(path: str, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The drives a Chassis lists (issue 22 item 7): (its `Drives` collection, to read now; the drives, to
    read once the rest of the walk is read).

    HPE, Dell, Supermicro, Lenovo and Huawei list drives under Chassis (`Chassis/{id}/Drives`, Chassis
    v1.14+, or `Links.Drives`), NVMe backplanes often only there. Most are the drives a Storage already
    links: deferred, they are skipped as already read, no request, and the depth the walk records for each
    drive stays that of the Storage chain whatever order the answers came in.
    """
    if chassis_drive_collection(path):
        return [], [] if _inline_expanded(body) else _members(body)[:MAX_DRIVES]
    kind = str(body.get("@odata.type", ""))
    if "Chassis." not in kind or "Collection" in kind:
        return [], []
    links = body.get("Links")
    listed = links.get("Drives") if isinstance(links, dict) else None
    drives = [d["@odata.id"] for d in listed if isinstance(d, dict) and isinstance(d.get("@odata.id"), str)
              ] if isinstance(listed, list) else []
    collection = link(body, "Drives")
    return [collection] if collection else [], list(dict.fromkeys(drives))[:MAX_DRIVES]


COLLECTION_NAMES = frozenset({"Systems", "Managers", "Chassis", "FirmwareInventory", "Processors", "LogServices",
                              "PowerSupplies", "Fans", "LeakDetectors", "Fabrics", "Switches", "Memory", "Storage",
                              "Alarms", "Drives", "Volumes"})


def _optional(path: str) -> bool:
    """A collection the walk reads on every node although many BMCs link it without serving it (Supermicro
    X10 and exporter-era firmware link Systems/*/Storage and answer 404): its 404 means no storage is
    exposed, which the storage check reports as such, not a failed read."""
    return path.rstrip("/").rsplit("/", 1)[-1] in ("Storage", "Volumes", "Drives")


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


# Collections whose members the walk reads nothing below: their GETs wait behind those that lead further
# (a tree's read is as long as its longest chain; 34 firmware leaves must not hold up the log services).
LEAF_COLLECTIONS = frozenset({"FirmwareInventory", "Processors", "Fans", "PowerSupplies", "Memory", "Switches",
                              "LeakDetectors", "Alarms", "Entries", "Drives"})


def _priority(path: str, depth: int) -> tuple[int, int]:
    """Lower first: what leads further (not a leaf member), then the deeper (its chain is the longer)."""
    parent = path.rsplit("/", 2)[-2] if path.count("/") > 3 else ""
    return (1 if parent in LEAF_COLLECTIONS else 0, -depth)


_Work = tuple["futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class Ticket(Protocol):
    """A request handed to a pool: its answer once done."""

    def result(self) -> Any: ...

    def cancel(self) -> bool: ...


class DaemonPool:
    """A fixed set of daemon worker threads handing out futures, the lowest `priority` first.

    Not concurrent.futures.ThreadPoolExecutor: its workers are joined at interpreter exit, so one
    request hung on a trickling BMC would hold the process long after the audit is done.
    """

    def __init__(self, workers: int, name: str) -> None:
        import queue

        self._queue: queue.PriorityQueue[tuple[tuple[int, ...], int, _Work | None]] = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO among equal priorities
        self._workers = max(1, workers)
        for index in range(self._workers):
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True).start()

    def submit(self, func: Callable[..., T], *args: Any, priority: tuple[int, ...] = ()) -> futures.Future[T]:
        from concurrent import futures

        future: futures.Future[T] = futures.Future()
        self._queue.put((priority, next(self._order), (future, func, args)))
        return future

    def wait(self, pending: Collection[Any], timeout: float) -> Iterable[Any]:
        """The futures among `pending` that are done, as soon as one is (none after `timeout`)."""
        from concurrent import futures

        return futures.wait(pending, timeout=timeout, return_when=futures.FIRST_COMPLETED)[0]

    def _work(self) -> None:
        while (item := self._queue.get()[2]) is not None:
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
            self._queue.put(((1 << 30,), next(self._order), None))  # after whatever is queued (cancelled)


class _Answer:
    """What one request of an `InlinePool` gave: the body, or the error it raised."""

    __slots__ = ("body", "error")

    def __init__(self) -> None:
        self.body: Any = None
        self.error: Exception | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.body

    def cancel(self) -> bool:
        return False  # nothing runs behind the caller's back


class InlinePool:
    """`DaemonPool`'s interface, run in the calling thread: each wait runs the queued request of the
    lowest priority (for a transport that reads local files, where a thread would only add hand-offs)."""

    def __init__(self) -> None:
        self._queue: list[tuple[tuple[int, ...], int, _Answer, Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()  # FIFO among equal priorities

    def submit(self, func: Callable[..., Any], *args: Any, priority: tuple[int, ...] = ()) -> _Answer:
        answer = _Answer()
        heapq.heappush(self._queue, (priority, next(self._order), answer, func, args))
        return answer

    def wait(self, pending: Collection[Any], timeout: float) -> Iterable[Any]:
        while self._queue:
            _priority, _order, answer, func, args = heapq.heappop(self._queue)
            if answer in pending:
                try:
                    answer.body = func(*args)
                except Exception as exc:  # noqa: BLE001 - handed to the walk, as a future would
                    answer.error = exc
                return (answer,)
        return ()

    def shutdown(self) -> None:
        self._queue.clear()


class Walk:
    """Fetches the resource graph from the root with bounded concurrency."""

    def __init__(self, transport: Transport, concurrency: int = 4, deadline_s: float = 30.0) -> None:
        self.transport = transport
        self.concurrency = max(1, concurrency)
        self.deadline_s = deadline_s
        self.resources: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, RedfishError] = {}
        self.not_exposed: set[str] = set()  # optional collections the BMC links but answers 404 for
        self.auth_error: AuthFailed | None = None
        self.timed_out = False
        self.depth: dict[str, int] = {}  # requests on the longest dependent chain to each resource
        self.expand: str | None = None  # the $expand form the service supports, if any
        self.expand_refused = False
        self.expand_probe: str | None = None  # the one collection asked with $expand before it was known to work
        self.expand_works = False
        self.caps_hit: set[str] = set()  # fan-out bounds the walk stopped at (reported as unknown)
        self._members_kept = 0
        # Bios -> Registries -> MessageRegistryFile -> AttributeRegistry (agent.sources.redfish_registry):
        # its failures are kept there, never among the walk's failed resources.
        self.registry = RegistryChain(checked_path)

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
        resize = getattr(self.transport, "use_concurrency", None)
        if callable(resize):
            resize(self.concurrency)  # a pooled connection for every request in flight
        local = isinstance(self.transport, RecordedRedfish)
        pool: DaemonPool | InlinePool = InlinePool() if local else DaemonPool(self.concurrency, "redfish")
        pending: dict[Ticket, str] = {}
        # The drives Chassis list, read once nothing else is pending (`chassis_drives`), each at the shortest
        # chain that listed it. Not on the daemon's sensor walk (from /Chassis): drives are inventory.
        later: dict[str, int] = {}
        start = tuple(start)
        whole = ROOT in start

        known: dict[str, str] = {}  # lower-case path -> the case the BMC served it with
        expanded: set[str] = set()  # paths requested with $expand

        def expand_for(path: str) -> str | None:
            """The $expand to ask `path` with: the probe (once), then only once the probe worked."""
            if not self.expand or self.expand_refused or path.rsplit("/", 1)[-1] not in COLLECTION_NAMES:
                return None
            if self.expand_works:
                return self.expand
            if self.expand_probe is None:
                self.expand_probe = path
                return self.expand
            return None  # the probe has not answered (or failed otherwise): plain GETs

        def submit(raw: str, depth: int) -> str | None:
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
            expand = expand_for(path)
            if expand:
                expanded.add(path)
            self.depth[path] = depth
            pending[pool.submit(self.transport.get, path, expand, priority=_priority(path, depth))] = path
            return path

        def follow(path: str, body: dict[str, Any]) -> None:
            replaces, chain = self.registry.plan(path, body, self.resources.get(ROOT))
            below = self.depth.get(path, 0) + 1
            for child in [] if replaces or chassis_drive_collection(path) else children(path, body):
                submit(child, below)
            now, drives = chassis_drives(path, body) if whole else ([], [])
            for child in now:
                submit(child, below)
            for child in drives:
                later[child] = min(below, later.get(child, below))
            for child in chain:
                if (asked := submit(child, below)) is not None:
                    self.registry.asked(asked)

        def arrived(path: str, body: dict[str, Any]) -> None:
            if path == ROOT:
                self.expand = expand_form(body) if getattr(self.transport, "supports_expand", False) else None
            if path == self.expand_probe and path in expanded:
                self.expand_works = True
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

        for path in start:
            take = getattr(self.transport, "service_root", None) if path == ROOT else None
            root = take() if callable(take) else None
            if isinstance(root, dict):  # the login read it: no request, nothing on the chain
                seen.add(ROOT.lower())
                self.depth[ROOT] = 0
                arrived(ROOT, root)
            else:
                submit(path, 1)
        try:
            while pending or later:
                if not pending:  # everything else is read: the Chassis drives no Storage listed
                    for child, depth in sorted(later.items()):
                        submit(child, depth)
                    later.clear()
                    continue
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
                for future in pool.wait(pending, remaining):
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
                            # The service advertised $expand but refuses it: plain GETs from now on, this
                            # one a request further down the chain than the refused one.
                            self.expand_refused = True
                            expanded.discard(path)
                            seen.discard(path.lower())
                            submit(path, self.depth[path] + 1)
                            continue
                        if exc.status == 404 and _optional(path):
                            self.not_exposed.add(path)  # advertised but not served: no storage, not a failure
                            continue
                        self.errors[path] = exc
                        continue
                    arrived(path, body)
        finally:
            # Do not wait for requests stuck on a hung BMC: their daemon threads end with their
            # timeouts, and nothing joins them at exit (the audit ends when it is done).
            pool.shutdown()
