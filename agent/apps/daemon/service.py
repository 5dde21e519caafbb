"""`nodewarden daemon`: poll each source on its own interval, judge cached facts, serve /metrics.

Threads, and why:
* one poller per source (host, nvml, bmc_sensors, bmc_inventory), each
  running its read in a throw-away worker bounded by a timeout: a hung NVML
  call or a BMC that never answers marks that source down and leaves the
  others alone; a poll that is still hung is not started again;
* a kernel-log follower, so an Xid is counted within a second, not a poll;
* NVML's event set (agent.sources.nvml_events), which gets an Xid there without a driver's
  kernel log in reach and polls NVML at once; each Xid counts once, whichever way it came;
* the HTTP server, which only hands out bytes rendered at the last
  evaluation (a scrape never waits for hardware);
* the main thread: evaluates the checks when a source brought news, logs
  what changed, publishes metrics, pings the systemd watchdog, and handles
  SIGHUP (reload) and SIGTERM (exit).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.apps.daemon.config import (
    DEFAULT_INTERVALS,
    DEFAULT_LISTEN,
    DEFAULT_TIMEOUTS,
    DaemonSettings,
    FileWatch,
    Judging,
    ReloadStatus,
    daemon_settings,
    first_judging,
    is_system_state_dir,
    load_judging,
    parse_listen,
    replay_state_dir,
    with_waivers,
)
from agent.apps.daemon.gate import Gate, NoGate
from agent.apps.daemon.poller import SourcePoller
from agent.core.errors import NodewardenError
from agent.core.facts import Baseline, BmcFacts, HostFacts, KmsgRecord, NvmlFacts
from agent.core.model import SourceStatus, Status, Unknown, Unsupported
from agent.engine.audit import AuditRequest, choose_profile, evaluate
from agent.engine.history import HistorySession
from agent.io import sdnotify
from agent.io.credentials import BmcOptions
from agent.policy.config import Config
from agent.policy.profiles import ProfileStore
from agent.report.metrics import Exposition, GpuLabels, MetricsServer, NodeMetrics, freshness_families, reload_families
from agent.report.model import Report
from agent.report.prom import render_families
from agent.sources.host import read_sysctls
from agent.sources.kmsg import KMSG_DEVICE, KmsgFollower, boot_start
from agent.sources.node import NodeSource, open_node
from agent.sources.nvml_events import NvmlEvent, NvmlEventWatcher, XidLedger
from agent.sources.registry import HOST, SOURCES
from agent.sources.source import PENDING, PollResult, ReadOptions, Source
from agent.sources.xid import parse_xid

# Moved to agent.apps.daemon.config, still importable from here.
__all__ = ["DEFAULT_INTERVALS", "DEFAULT_LISTEN", "DEFAULT_TIMEOUTS", "Daemon", "DaemonSettings", "PollResult",
           "SourcePoller", "daemon_settings", "is_system_state_dir", "parse_listen",
           "replay_state_dir"]
log = logging.getLogger("nodewarden.daemon")

EVALUATE_AT_MOST_EVERY_S = 1.0
# The first evaluation waits for these pollers only (fast, local); a slow or hung BMC shows as
# pending until it answers instead of holding back every other finding.
FIRST_PUBLISH_POLLERS = ("host", "nvml")
FIRST_PUBLISH_GRACE_S = 1.0  # how long the first publish waits for the other pollers at most
LEDGER_RETRY_S = 300.0  # a ledger that could not be opened is tried again this often (not at every poll)


def _outcome(result: PollResult) -> list[tuple[str, bool, bool, str | None]]:
    """How a poll went, without what varies between identical polls (durations, request counts)."""
    return sorted((name, s.ok, s.configured, s.error) for name, s in result.statuses.items())


def _failure(result: PollResult) -> list[tuple[str, bool, str | None]]:
    return sorted((name, status.ok, status.error) for name, status in result.statuses.items())


class Daemon:
    def __init__(self, request: AuditRequest, settings: DaemonSettings, config_path: Path | None,
                 listen_override: str | None, cli_bmc: Callable[[Config], BmcOptions], *,
                 state_dir: Path | None = None,
                 gate: Callable[[Path, dict[str, float]], Gate] = NoGate) -> None:
        self._config_path, self._listen_override, self._cli_bmc = config_path, listen_override, cli_bmc
        self._state_dir = state_dir  # --state-dir (or a replay's own folder): kept over every reload
        self.node: NodeSource = open_node(request)
        # Config, profiles, waivers and baseline: replaced whole by a reload that worked (agent.apps.daemon.config).
        self._judging: Judging = first_judging(request, settings, self.node)
        self.reload_status = ReloadStatus()
        self._watch = FileWatch()
        self._judging_ok = True  # the last evaluation ran: only then may a poll confirm its findings
        self._judged_on = dt.date.today()
        self._watched_files()  # the files as they were loaded: a later change is news
        self.stop = threading.Event()
        self._reload = threading.Event()
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self._results: dict[str, PollResult] = {}
        self._last_success: dict[str, float] = {}
        self._xids: dict[tuple[str, int], int] = {}
        self._gpu_labels = GpuLabels()  # a lost GPU's series keep the labels it had when last seen
        self._kmsg_started = False
        self._sysctl_keys: tuple[str, ...] = ()
        self._body = Exposition(b"")
        self._report: Report | None = None
        self._previous: dict[tuple[str, str], str] | None = None
        self._source_state: dict[str, bool] = {}
        self._last_auto_apply = 0.0
        self._auto_apply_thread: threading.Thread | None = None
        self._nvml: Any = None  # the NVML poller's NvmlSession, opened at its first read
        self._xid_ledger = XidLedger()  # one Xid counted once, from the NVML event set or the kernel log
        self._events: NvmlEventWatcher | None = None
        self.pollers = self._make_pollers()
        self.kmsg = self._make_follower()
        self._last_published: dict[str, float] = {}
        self._confirmed_at = 0.0  # when the facts were last judged or last confirmed unchanged
        self._gate: Gate = gate(request.config.state_dir, settings.intervals)  # health-check's state file, metrics
        self._history: HistorySession | None = None  # the node's ledger, opened at the first evaluation
        self._history_tried = 0.0
        self.server = MetricsServer(settings.server, lambda: self._body, self._freshness)

    @property
    def request(self) -> AuditRequest:
        return self._judging.request

    @property
    def settings(self) -> DaemonSettings:
        return self._judging.settings

    @property
    def store(self) -> ProfileStore:
        return self._judging.store

    @property
    def baseline(self) -> Baseline | Unknown:
        return self._judging.baseline

    # --- sources -------------------------------------------------------------------------------

    def _make_pollers(self) -> list[SourcePoller]:
        """One poller per poll of each source the node has (the registry's order and defaults)."""
        def interval(name: str) -> Callable[[], float]:
            return lambda: self.settings.intervals[name]

        def timeout(name: str) -> Callable[[], float]:
            return lambda: self.settings.timeouts[name]

        # The daemon's own policy for these two: NVML stays initialised between polls, and the host
        # read adds the judging profile's sysctls.
        special: dict[str, Callable[[], tuple[Any, dict[str, SourceStatus]]]] = {
            "host": self._read_host, "nvml": self._read_nvml}
        pollers = []
        for src in SOURCES:
            if not src.polled(self.node, self.request.bmc):
                continue
            for poll in src.polls:
                read = special.get(poll.name) or self._reader(src, poll.sensors_only)
                pollers.append(SourcePoller(poll.name, read, src.reports(self.node, self.request.bmc),
                                            interval(poll.name), timeout(poll.name), self._on_result, self.stop))
        return pollers

    def _reader(self, src: Source, sensors_only: bool) -> Callable[[], tuple[Any, dict[str, SourceStatus]]]:
        return lambda: src.read(self.node, ReadOptions(bmc=self.request.bmc, sensors_only=sensors_only))

    def _read_host(self) -> tuple[HostFacts, dict[str, SourceStatus]]:
        fs = self.node.fs
        assert fs is not None
        start = time.monotonic()
        host, _status = HOST.read(self.node, ReadOptions())
        # Before the first evaluation the judging profile is not known yet: match it from this very
        # read, so the first report has every sysctl its profile names (no "was not read").
        keys = self._sysctl_keys or self._profile_sysctls(host)
        missing = [k for k in keys if k not in host.sysctl]
        host.sysctl.update(read_sysctls(fs, missing))
        return host, {"host": SourceStatus("host", ok=True, duration_s=time.monotonic() - start)}

    def _profile_sysctls(self, host: HostFacts) -> tuple[str, ...]:
        try:
            profile = choose_profile(self.request, self.store, host, Unknown(PENDING))[0]
        except NodewardenError:
            return ()
        return tuple(profile.sysctl_keys)

    def _read_nvml(self) -> tuple[NvmlFacts | Unknown, dict[str, SourceStatus]]:
        # One NVML session for the daemon's life: initialised once, each GPU's static values cached
        # between polls and read again after a driver reload or a new Xid (agent.sources.nvml_live).
        from agent.sources.nvml_live import NvmlSession  # pynvml only when GPUs are read

        if self._nvml is None:
            snap = self.node.snapshot
            self._nvml = NvmlSession.live() if snap is None else NvmlSession.replay(snap.path / "nvml.json")
        facts, status = self._nvml.read(self.settings.timeouts["nvml"])
        return facts, {"nvml": status}

    def _make_follower(self) -> KmsgFollower | None:
        if self.node.snapshot is None:
            return KmsgFollower(KMSG_DEVICE, live=True, on_new=self._on_kmsg)
        if self.node.snapshot.has("kmsg") and self.node.snapshot.kmsg_path.is_file():
            return KmsgFollower(self.node.snapshot.kmsg_path, live=False, on_new=self._on_kmsg)
        return None

    def _on_kmsg(self, records: list[KmsgRecord]) -> None:
        fresh = self._kmsg_started  # the first batch is history: NVML's first read came after it
        if not self._kmsg_started:
            # The first batch is the whole log so far: a recorded one may hold earlier boots,
            # whose Xids are history (the audit drops them the same way).
            self._kmsg_started = True
            records = records[boot_start(records):]
        new = [event for event in (parse_xid(r) for r in records) if event is not None]
        with self._lock:
            for event in new:
                if self._xid_ledger.from_kmsg(event):  # not already counted from the event set
                    key = (event.pci_bus_id, event.xid)
                    self._xids[key] = self._xids.get(key, 0) + 1
        for event in new:
            log.warning("Xid %d on %s: %s", event.xid, event.pci_bus_id, event.message,
                        extra={"fields": {"event": "xid", "xid": event.xid, "pci": event.pci_bus_id}})
            if fresh and self._nvml is not None:
                self._nvml.gpu_event(event.pci_bus_id)  # its static NVML values are read again
        self._changed.set()

    def _on_nvml_event(self, event: NvmlEvent) -> None:
        """From the event thread: an Xid counts now (unless the kernel log had it); any event polls NVML now."""
        if event.xid is not None and self._xid_ledger.from_event(event):
            with self._lock:
                self._xids[(event.pci_bus_id, event.xid)] = self._xids.get((event.pci_bus_id, event.xid), 0) + 1
            log.warning("Xid %d on %s (NVML event)", event.xid, event.pci_bus_id,
                        extra={"fields": {"event": "xid", "xid": event.xid, "pci": event.pci_bus_id}})
            if self._nvml is not None:
                self._nvml.gpu_event(event.pci_bus_id)
        for poller in self.pollers:
            if poller.name == "nvml":
                poller.poll_now()
        self._changed.set()

    def _on_result(self, name: str, result: PollResult) -> None:
        with self._lock:
            previous = self._results.get(name)
            self._results[name] = result
            for source, status in result.statuses.items():
                if status.ok and status.configured:
                    self._last_success[source] = result.finished_at
        if previous is not None and result.value is not None and result.value == previous.value and (
                _outcome(previous) == _outcome(result)):
            # The same facts again (a steady node): nothing to judge or re-render; the per-scrape
            # timestamps say they were confirmed. Only after an evaluation that ran: findings of
            # a judging that stopped are never called fresh (nodewarden_audit_timestamp_seconds).
            if self._judging_ok:
                self._confirmed_at = max(self._confirmed_at, result.finished_at)
            return
        # A source that keeps failing the same way brings no news: judging again would only cost
        # CPU that scrapes need (a hung BMC fails every poll).
        if result.value is None and previous is not None and previous.value is None and (
                _failure(previous) == _failure(result)):
            return
        self._changed.set()

    # --- judging -------------------------------------------------------------------------------

    def _sources_now(self) -> tuple[HostFacts, NvmlFacts | Unknown, BmcFacts | Unknown,
                                    dict[str, SourceStatus]]:
        """Each polled source's facts and statuses from its newest polls (pending, failed or not polled)."""
        with self._lock:
            results = dict(self._results)
        facts: dict[str, Any] = {}
        sources: dict[str, SourceStatus] = {}
        for src in SOURCES:
            if src.polls:
                facts[src.facts_field], statuses = src.from_polls(
                    self.node, self.request.bmc, {poll.name: results.get(poll.name) for poll in src.polls})
                sources.update(statuses)
        if self.kmsg is not None:  # followed, not polled
            error = self.kmsg.error
            sources["kmsg"] = SourceStatus("kmsg", ok=error is None, error=error)
        else:
            sources["kmsg"] = SourceStatus("kmsg", ok=False, configured=False, error="not in snapshot")
        return facts["host"], facts["nvml"], facts["bmc"], sources

    def evaluate(self, judging: Judging | None = None) -> Report:
        """The cached facts judged by `judging` (default: the running one; a reload tries its new one)."""
        judging = judging or self._judging
        host, nvml, bmc, sources = self._sources_now()
        kmsg = self.kmsg.snapshot() if self.kmsg is not None else Unsupported("the snapshot holds no kernel log")
        if self._events is not None and not isinstance(kmsg, Unknown):  # event Xids the log has not shown yet
            kmsg = (*kmsg, *self._xid_ledger.records())
        started = dt.datetime.now(dt.timezone.utc)
        # The ledger of the state folder the daemon started with (a snapshot replay's is its own). A
        # simulated node keeps none: a shipped recording, the same at every start, has no history, and
        # its daemon judges exactly as its one-shot audit does.
        if self.request.simulate is None and (self._history is None or (
                not self._history.usable and time.monotonic() - self._history_tried > LEDGER_RETRY_S)):
            # a ledger locked or refused at one evaluation is tried again, at most every LEDGER_RETRY_S
            self._history_tried = time.monotonic()
            self._history = HistorySession.open(self.request.config.state_dir, source="daemon", writable=True)
        report = evaluate(judging.request, judging.store, self.node, host, nvml, kmsg, bmc, sources, started, 0.0,
                          baseline=judging.baseline, waivers=judging.waivers, history=self._history)
        ledger = report.sources.get("ledger")
        if ledger is not None and ledger.ok:  # read (and written) at each evaluation, not by a poller
            with self._lock:
                self._last_success["ledger"] = time.time()
        self._sysctl_keys = tuple(judging.store.profile(report.profile).sysctl_keys)
        return report

    def publish(self, report: Report) -> None:
        with self._lock:
            last = {source: self._last_success.get(source, 0.0) for source in report.sources
                    if report.sources[source].configured}
            xids = dict(self._xids)
        if self.kmsg is not None and "kmsg" in last:
            last["kmsg"] = self.kmsg.last_read_s
        self._report = report
        self._last_published = last
        self._confirmed_at = time.time()
        plain = NodeMetrics(report, None, xids, timing=False, seen=self._gpu_labels).render()
        if plain != self._body.plain:  # unchanged text: keep the exposition and its gzip form
            self._body = Exposition(plain)  # one assignment: old or new

    def _freshness(self) -> bytes:
        """Last-success and audit timestamps, rendered per scrape (they move while the facts do not)."""
        with self._lock:
            last = {source: (self._last_success.get(source, 0.0) if source != "kmsg" or self.kmsg is None
                             else self.kmsg.last_read_s) for source in self._last_published}
        status = self.reload_status
        families = [*reload_families(status.ok, status.last_success_s, status.failed_file), *self._gate.families()]
        if self._report is not None:
            families = [*freshness_families(last, self._confirmed_at), *families]
        return render_families(families)

    def log_changes(self, report: Report) -> None:
        # A finding that is unknown only because its source's first read is still running is not
        # news: it is logged when the source answers ("new -> fail"), not as a flood at start.
        current = {(f.check, f.subject): ("waived" if f.waiver else f.status.value) for f in report.findings
                   if not (f.status is Status.UNKNOWN and PENDING in f.message)}
        messages = {(f.check, f.subject): f for f in report.findings}
        previous = self._previous
        if previous is None:
            summary = report.summary()
            log.info("first evaluation: profile %s, %d fail, %d warn, %d unknown, %d pass", report.profile,
                     summary["fail"], summary["warn"], summary["unknown"], summary["pass"],
                     extra={"fields": {"event": "evaluated", "profile": report.profile, **summary}})
        for key, status in sorted(current.items()):
            before = previous.get(key) if previous is not None else None
            if before == status or (previous is None and status in ("pass", "skip", "waived")):
                continue
            finding = messages[key]
            level = logging.WARNING if status in (Status.FAIL.value, Status.UNKNOWN.value) else logging.INFO
            log.log(level, "%s %s: %s -> %s: %s", key[0], key[1], before or "new", status, finding.message,
                    extra={"fields": {"event": "finding_changed", "check": key[0], "subject": key[1],
                                      "from": before, "to": status, "severity": finding.severity.value}})
        if previous is not None:
            for key in sorted(set(previous) - set(current)):
                log.info("%s %s: %s -> gone", key[0], key[1], previous[key],
                         extra={"fields": {"event": "finding_changed", "check": key[0], "subject": key[1],
                                           "from": previous[key], "to": None}})
        self._previous = current
        for name, src in sorted(report.sources.items()):
            if not src.configured or src.detail.get("pending"):
                continue
            was = self._source_state.get(name)
            if was is None and src.ok:
                self._source_state[name] = True
                continue
            if was != src.ok:
                level = logging.INFO if src.ok else logging.WARNING
                log.log(level, "source %s %s%s", name, "up" if src.ok else "down",
                        "" if src.ok else f": {src.error}",
                        extra={"fields": {"event": "source_changed", "source": name, "up": src.ok,
                                          "error": src.error}})
                self._source_state[name] = src.ok

    # --- auto-apply ----------------------------------------------------------------------------

    def maybe_auto_apply(self, report: Report) -> None:
        if not self.settings.auto_apply or self.request.simulate is not None:
            return
        fixable = [f for f in report.findings if f.remediation and f.waiver is None
                   and f.status in (Status.FAIL, Status.WARN)]
        running = self._auto_apply_thread is not None and self._auto_apply_thread.is_alive()
        if not fixable or running or time.monotonic() - self._last_auto_apply < self.settings.auto_apply_interval_s:
            return
        self._last_auto_apply = time.monotonic()
        self._auto_apply_thread = threading.Thread(target=self._auto_apply, name="auto-apply", daemon=True)
        self._auto_apply_thread.start()

    def _auto_apply(self) -> None:
        from agent.engine.remediate import RemediationRequest, remediate
        from remediations import ActionClass, Outcome

        request = RemediationRequest(audit=self.request, apply=True, allow=frozenset({ActionClass.SAFE}),
                                     state_dir=self.request.config.state_dir)
        try:
            result = remediate(request, self.store)
        except NodewardenError as exc:
            log.warning("auto-apply could not run: %s", exc,
                        extra={"fields": {"event": "auto_apply", "error": str(exc)}})
            return
        for action in result.actions:
            if action.outcome in (Outcome.APPLIED, Outcome.FAILED, Outcome.REFUSED):
                log.warning("auto-apply %s: %s (%s -> %s)%s", action.id, action.outcome.value, action.before,
                            action.after, f": {action.refused or action.error}" if action.refused or action.error
                            else "", extra={"fields": {"event": "auto_apply", "action": action.id,
                                                       "outcome": action.outcome.value, "run_id": result.run_id}})
        if result.changed:
            for poller in self.pollers:
                if poller.name in ("host", "nvml"):
                    poller.poll_now()  # see the fix now, not at the next interval

    # --- lifecycle -----------------------------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: config, profiles, waivers and baseline again, adopted only whole and only if they judge
        the cached facts; otherwise the running ones keep judging and /metrics says the reload failed."""
        profile = self._report.profile if self._report is not None else None
        try:
            judging = load_judging(self._judging, self._config_path, self._listen_override, self._cli_bmc,
                                   self.node, profile, state_dir=self._state_dir)
            if self._report is not None:
                self.evaluate(judging)  # a profile that no longer matches or builds fails here, not later
        except NodewardenError as exc:
            self._reload_failed(exc, whole=True, default=self.request.config.path)
            return
        settings = judging.settings
        if settings.server != self.settings.server:
            log.warning("the listen address, TLS and basic-auth settings take effect at the next restart",
                        extra={"fields": {"event": "reload", "restart_needed": True}})
            settings = dataclasses.replace(settings, server=self.settings.server)
            judging = dataclasses.replace(judging, settings=settings)
        self._reloaded(judging, str(judging.request.config.path or "the default configuration"))

    def _reload_waivers(self) -> None:
        """The waivers file changed (no SIGHUP): read it again, as evaluations used to at every run."""
        try:
            judging = with_waivers(self._judging)
        except NodewardenError as exc:
            self._reload_failed(exc, whole=False, default=self.request.config.waivers_file)
            return
        self._reloaded(judging, str(judging.request.config.waivers_file))

    def _reload_failed(self, exc: NodewardenError, whole: bool, default: Path | None) -> None:
        self.reload_status.failed(exc, whole, str(default or ""))
        log.error("reload failed, keeping the last good configuration: %s", exc,
                  extra={"fields": {"event": "reload", "ok": False, "error": str(exc),
                                    "file": self.reload_status.failed_file}})
        self._watched_files()  # what failed is what is watched for its fix from now on

    def _reloaded(self, judging: Judging, what: str) -> None:
        self._judging = judging
        self.reload_status.succeeded()
        log.info("reloaded %s", what, extra={"fields": {"event": "reload", "ok": True}})
        self._follow_gate()
        self._watched_files()
        self._changed.set()

    def _follow_gate(self) -> None:
        """health-check reads the state file where the config now says: write it there from now on.
        The old one is left (another reader may hold it); it goes stale, which health-check handles."""
        writer = self._gate
        was = writer.state_dir
        if writer.follow(self.request.config.state_dir, self.settings.intervals):
            log.info("health-check state file: %s, fresh for %g s (was under %s)", writer.state_dir / "scheduler",
                     writer.fresh_for_s, was, extra={"fields": {"event": "state_file", "was": str(was),
                                                                "state_dir": str(writer.state_dir),
                                                                "fresh_for_s": writer.fresh_for_s}})

    def _watched_files(self) -> bool:
        """Whether the waivers file, or the file a failed reload named, changed since last asked."""
        paths = [p for p in (self.request.config.waivers_file, self.reload_status.failed_file) if p]
        return self._watch.changed([Path(p) for p in dict.fromkeys(str(p) for p in paths)])

    def _check_files(self) -> None:
        """Each loop turn: a watched file that changed is read again; a new day re-judges waiver expiry."""
        if self._watched_files():
            if self.reload_status.whole:
                self.reload()  # the SIGHUP that failed, again now that its file changed
            else:
                self._reload_waivers()
        if dt.date.today() != self._judged_on:
            self._judged_on = dt.date.today()
            self._changed.set()

    def _on_hup(self, *_: Any) -> None:
        self._reload.set()
        self._changed.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, self._on_hup)
        self.server.start()
        host, port = self.server.address
        log.info("serving metrics on %s://%s:%d/metrics", "https" if self.settings.server.tls_cert else "http",
                 host, port, extra={"fields": {"event": "listening", "host": host, "port": port}})
        where = self._gate.state_dir
        replay = self.request.snapshot is not None or self.request.simulate is not None
        log.info("health-check state file under %s%s", where, " (a recorded node's: kept out of the system state "
                 "folder)" if replay and not is_system_state_dir(where) else "",
                 extra={"fields": {"event": "state_file_start", "state_dir": str(where)}})
        for poller in self.pollers:
            poller.start()
        if self.kmsg is not None:
            self.kmsg.start()
        if self.node.snapshot is None and any(p.name == "nvml" for p in self.pollers):
            from agent.sources.nvml_live import load_live_nvml  # pynvml only when GPUs are read
            self._events = NvmlEventWatcher(load_live_nvml, self._on_nvml_event)
            self._events.start()
        watchdog = sdnotify.watchdog_interval_s()
        started = time.monotonic()
        next_ping = time.monotonic()
        ready = False
        last_evaluation = 0.0
        while not self.stop.is_set():
            wait = 1.0 if watchdog is None else min(1.0, max(0.0, next_ping - time.monotonic()))
            throttled = max(0.0, last_evaluation + EVALUATE_AT_MOST_EVERY_S - time.monotonic())
            if self._changed.is_set() and (throttled > 0 or not self._collected(started)):
                # News is waiting but may not be judged yet: sleep, do not spin on the set event.
                self.stop.wait(min(wait, throttled or 0.1))
            else:
                self._changed.wait(wait)
            if self.stop.is_set():
                break
            if self._reload.is_set():
                self._reload.clear()
                sdnotify.notify("RELOADING=1")
                self.reload()
                sdnotify.notify("READY=1")
            else:
                self._check_files()
            if self._collected(started) and self._changed.is_set() and (
                    time.monotonic() - last_evaluation >= EVALUATE_AT_MOST_EVERY_S):
                self._changed.clear()
                last_evaluation = time.monotonic()
                self._evaluate_and_publish()
                if not ready:
                    ready = True
                    # Profiles, modules and caches live as long as the process: move them out of the
                    # collector's sight so a full collection stays short (scrape latency).
                    gc.collect()
                    gc.freeze()
                    pending = sorted(p.name for p in self.pollers if p.polls == 0)
                    sdnotify.notify("READY=1\nSTATUS=first evaluation published" +
                                    (f"; still reading {', '.join(pending)}" if pending else ""))
                    log.info("ready: first evaluation published%s",
                             f" (still reading {', '.join(pending)})" if pending else "",
                             extra={"fields": {"event": "ready", "pending": pending}})
            self._gate.update(self._report, self._confirmed_at, dict(self._last_success))  # cheap if unchanged
            if watchdog is not None and time.monotonic() >= next_ping:
                sdnotify.notify("WATCHDOG=1")
                next_ping = time.monotonic() + watchdog
        sdnotify.notify("STOPPING=1")
        log.info("stopping", extra={"fields": {"event": "stopping"}})
        if self.kmsg is not None:
            self.kmsg.stop()
        if self._events is not None:
            self._events.stop()
        if self._nvml is not None:
            self._nvml.close()
        if self._history is not None:
            self._history.close()
        self.server.stop()
        return 0

    def _collected(self, started: float) -> bool:
        """Whether the node may be judged: host and NVML read once (a half-read host would match
        the wrong profile), and the other sources read too or given FIRST_PUBLISH_GRACE_S to be."""
        if not all(p.polls > 0 for p in self.pollers if p.name in FIRST_PUBLISH_POLLERS):
            return False
        return all(p.polls > 0 for p in self.pollers) or time.monotonic() - started >= FIRST_PUBLISH_GRACE_S

    def _evaluate_and_publish(self) -> None:
        try:
            report = self.evaluate()
        except NodewardenError as exc:  # e.g. a profile that stopped matching: keep the last metrics
            self._judging_ok = False  # their timestamp stops until checks run again
            log.error("evaluation failed: %s", exc, extra={"fields": {"event": "evaluate", "error": str(exc)}})
            return
        self._judging_ok = True
        self.publish(report)
        self.log_changes(report)
        self.maybe_auto_apply(report)
