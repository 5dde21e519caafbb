"""The ledger in the audit pipeline (issue 33): record what the facts show, read the history back for
the rules, remember a sticky rule that fired.

One `HistorySession` per writer (the daemon keeps one open; a one-shot command opens one per run):
* `observe(facts, rules)`: the facts' incidents (agent.sources.incidents) recorded when writable, then
  the window the longest rule needs (and every sticky rule's memory) read into `facts.history`, and
  the `ledger` source's status. A ledger that cannot be used is a source that is down: its checks say
  nothing, `source.available` warns, the audit goes on.
* `remember(findings, facts)`: a sticky rule's first firing as a `rule` incident (its memory across
  windows and restarts), and hardware faults the checks found (a PSU lost, ECC, a GPU off the bus), one
  incident per fault per boot, so "the same fault after two reboots" can be counted.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from agent.core.counters import CounterRule, samples_of
from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.facts_nvml import NvmlFacts
from agent.core.history import GpuRef, History, Incident, digest
from agent.core.history_rules import Rule
from agent.core.model import Finding, Severity, SourceStatus, Status
from agent.sources.incidents import gpu_refs, incidents_from_facts
from agent.sources.kernel_log import parse_kernel_log
from agent.state.ledger import DEFAULT_MAX_AGE_S, Ledger, LedgerError, open_ledger
from agent.state.ledger.store import MAX_ROWS_READ

log = logging.getLogger("nodewarden.ledger")

PRUNE_EVERY_S = 3600.0
# Hardware faults the checks find that the ledger keeps (tuning drift is not an incident); kind by check id.
_FAULT_AREAS = ("gpu.", "bmc.", "fabric.", "ib.", "pcie.", "accept.")
_NOT_FAULTS = ("gpu.xid", "history.", "host.kernel.events")  # recorded from the log itself / ours


def fault_kind(check: str) -> str:
    for word, kind in (("psu", "psu"), ("power_suppl", "psu"), ("ecc", "ecc"), ("remap", "remap"),
                       ("pcie", "pcie"), ("nvlink", "nvlink"), ("bmc.events", "bmc_event")):
        if word in check:
            return kind
    return "fault"


class HistorySession:
    def __init__(self, ledger: Ledger | None, *, source: str, writable: bool, error: str = "") -> None:
        self.ledger = ledger
        self.source = source  # daemon, health-check, accept, remediate, audit
        self.writable = writable and ledger is not None and not ledger.readonly
        self.error = error
        self._pruned_at = 0.0
        self._cache: list[Incident] = []  # a recording session's window, kept between polls (_held)
        self._last_id = 0
        self._cache_since = float("inf")

    @classmethod
    def open(cls, state_dir: Path, *, source: str, writable: bool) -> HistorySession:
        """The node's ledger under `state_dir`; a reader without one gets a session that says so."""
        try:
            ledger = open_ledger(state_dir, readonly=not writable)
        except FileNotFoundError:
            return cls(None, source=source, writable=False, error="no ledger yet")
        except (LedgerError, OSError) as exc:
            log.warning("ledger not used: %s", exc)
            return cls(None, source=source, writable=False, error=str(exc))
        if ledger.note:
            log.warning("%s", ledger.note, extra={"fields": {"event": "ledger_rebuilt"}})
        session = cls(ledger, source=source, writable=writable)
        if session.writable:  # pruned at most hourly by whichever writer comes (a health-check run, the daemon)
            session._pruned_at = ledger.last_pruned()
        return session

    @classmethod
    def of_file(cls, path: Path, *, source: str = "audit") -> HistorySession:
        """A snapshot's copy of a ledger, read-only."""
        try:
            return cls(Ledger.open(path, readonly=True), source=source, writable=False)
        except FileNotFoundError:
            return cls(None, source=source, writable=False, error="the snapshot holds no ledger")
        except (LedgerError, OSError) as exc:
            return cls(None, source=source, writable=False, error=str(exc))

    @property
    def usable(self) -> bool:
        return self.ledger is not None

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None

    def status(self, duration_s: float = 0.0) -> SourceStatus:
        if self.ledger is None:
            return SourceStatus("ledger", ok=False, error=self.error or "not open", duration_s=duration_s)
        return SourceStatus("ledger", ok=True, duration_s=duration_s,
                            detail={"note": self.ledger.note} if self.ledger.note else {})

    def record(self, incidents: Iterable[Incident], *, now: float | None = None) -> list[Incident]:
        """Store incidents (a drain, a remediation, an accept run); [] when the ledger is not writable."""
        if not self.writable or self.ledger is None:
            return []
        try:
            new = self.ledger.record(incidents, now=now)
            self._maybe_prune(time.time() if now is None else now)
            return new
        except LedgerError as exc:
            log.warning("ledger not written: %s", exc)
            self.error = str(exc)
            return []

    def _maybe_prune(self, now: float) -> None:
        if self.ledger is None or now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        removed = self.ledger.prune(now=now, max_age_s=DEFAULT_MAX_AGE_S)
        if removed:
            log.info("ledger: %d incidents past retention removed", removed)

    def observe(self, facts: NodeFacts, rules: Sequence[Rule], counter_rules: Sequence[CounterRule] = (), *,
                now: float | None = None) -> NodeFacts:
        """`facts` with `history` filled and the ledger's status in `sources` (see the module docstring)."""
        started = time.monotonic()
        now = time.time() if now is None else now
        boot = facts.host.boot_id if isinstance(facts.host.boot_id, str) else ""
        until = facts.observed_at.timestamp() if facts.observed_at is not None else now
        if self.writable:
            self.record(incidents_from_facts(facts, boot_id=boot, source=self.source, now=now), now=now)
            if isinstance(facts.nvml, NvmlFacts) and self.ledger is not None:
                try:
                    self.ledger.record_samples(samples_of(facts.nvml.gpus, until, boot))
                except LedgerError as exc:
                    log.warning("ledger: counters not written: %s", exc)
        history: History | None = None
        if self.ledger is not None:
            span = max((r.window_s for r in rules), default=0.0)
            try:
                held = self._held(until - span, until + 60, sticky=any(r.sticky for r in rules)) if rules else ()
                totals = tuple((kind, n, last) for kind, (n, last) in sorted(self.ledger.totals().items()))
                rates = max((r.window_s for r in counter_rules), default=0.0)
                samples = self.ledger.samples(until - rates, until + 60) if counter_rules else ()
                history = History(held, until - span, until, boot, self.ledger.note, totals,
                                  (*(r.name for r in rules), *(r.name for r in counter_rules)), samples)
            except LedgerError as exc:  # this evaluation goes without history; the next may try again
                self.error = str(exc)
                self.close()
        facts.history = history
        facts.sources["ledger"] = self.status(time.monotonic() - started)
        return facts

    def _held(self, since: float, until: float, *, sticky: bool) -> tuple[Incident, ...]:
        """The incidents from `since` to `until` (and, for sticky rules, every `rule` and `clear`), oldest
        first. A reader that records (the daemon) keeps them between polls and reads only the rows
        recorded since (by anyone: health-check's drains too), so a poll costs what is new, not 30 days."""
        assert self.ledger is not None
        if not self.writable:  # a one-shot reader: one query
            recent = self.ledger.window(since, until)
            memory = self.ledger.window(0.0, kinds=("rule", "clear")) if sticky else ()
            seen = {i.digest for i in recent}
            return tuple(sorted([*recent, *(m for m in memory if m.digest not in seen)], key=lambda i: i.ts))
        if since < self._cache_since:  # a longer window than the one kept (a reload's rules): read it all again
            self._cache, self._last_id = [], 0
        self._cache_since = since
        for _ in range(8):  # bounded: the file is capped at 64 MiB, some 150,000 rows
            new, self._last_id = self.ledger.after(self._last_id)
            self._cache.extend(new)
            if len(new) < MAX_ROWS_READ:
                break
        # what no rule can count any more goes (a sticky rule's memory and an operator's clear stay)
        self._cache = [i for i in self._cache if i.ts >= since or i.kind in ("rule", "clear")][-MAX_ROWS_READ:]
        return tuple(sorted((i for i in self._cache if i.ts <= until and (i.ts >= since or (
            sticky and i.kind in ("rule", "clear")))), key=lambda i: i.ts))

    def remember(self, findings: Sequence[Finding], facts: NodeFacts, *, now: float | None = None) -> None:
        """Sticky rules that fired for the first time, and the hardware faults found, into the ledger."""
        if not self.writable:
            return
        now = time.time() if now is None else now
        boot = facts.host.boot_id if isinstance(facts.host.boot_id, str) else ""
        refs = {f"gpu{r.index}": r for r in gpu_refs(facts).values()}
        out: list[Incident] = []
        for finding in findings:
            if finding.check.startswith("history.") and finding.status in (Status.FAIL, Status.WARN):
                out.extend(_memories(finding, now))
            elif (finding.status is Status.FAIL and finding.severity is Severity.CRITICAL
                  and finding.check.startswith(_FAULT_AREAS) and not finding.check.startswith(_NOT_FAULTS)
                  and finding.waiver is None):
                gpu = refs.get(finding.subject, GpuRef())
                out.append(Incident(ts=now, kind=fault_kind(finding.check), source=self.source, code=finding.check,
                                    gpu=gpu, subject=finding.subject, severity="critical", boot_id=boot,
                                    detail=finding.message,
                                    # one per fault per boot (without a boot id: per day)
                                    digest=digest("fault", boot or time.strftime("%Y-%m-%d", time.gmtime(now)),
                                                  finding.check, finding.subject)))
        if out:
            self.record(out, now=now)


def _memories(finding: Finding, now: float) -> list[Incident]:
    """A `rule` incident for each sticky firing not yet remembered (no `since`)."""
    observed = finding.observed if isinstance(finding.observed, list) else []
    out = []
    for item in observed:
        if not isinstance(item, dict) or not item.get("sticky") or "since" in item:
            continue
        rule, key = str(item.get("rule", "")), str(item.get("memory", ""))
        out.append(Incident(ts=now, kind="rule", source="ledger", code=rule, subject=key,
                            severity=finding.severity.value, detail=finding.message,
                            digest=digest("rule", rule, key, item.get("first"))))
    return out



def action_incident(kind: str, source: str, code: str, subject: str, detail: str, *, severity: str = "info",
                    gpu: GpuRef | None = None, now: float | None = None) -> Incident:
    """An action nodewarden took (drain, resume, remediation, accept) as an incident: one per act."""
    now = time.time() if now is None else now
    return Incident(ts=now, kind=kind, source=source, code=code, subject=subject, severity=severity,
                    gpu=gpu or GpuRef(), detail=detail, digest=digest("action", kind, source, code, subject, now))


def record_action(state_dir: Path, incident: Incident) -> str | None:
    """`incident` into the node's ledger under `state_dir`; the error text when it could not be written
    (the action itself stands: its own trail and journal say it happened)."""
    session = HistorySession.open(state_dir, source=incident.source, writable=True)
    try:
        if session.ledger is None:
            return session.error or "no ledger"
        session.record([incident], now=incident.ts)
        return session.error or None
    finally:
        session.close()


def copy_ledger(state_dir: Path, out: Path) -> str:
    """The node's ledger copied into a capture at `out` (consistent while the daemon writes); "" when
    copied, else why not (none yet, not usable): a capture never fails for its history."""
    try:
        ledger = open_ledger(state_dir, readonly=True)
    except FileNotFoundError:
        return "no ledger on this node yet"
    except (LedgerError, OSError) as exc:
        return f"the ledger is not usable: {exc}"
    try:
        ledger.backup(out)
    except (LedgerError, OSError, sqlite3.Error) as exc:
        return f"the ledger could not be copied: {exc}"
    finally:
        ledger.close()
    return ""


class LogHistory(HistorySession):
    """History from a kernel log that spans boots (an imported `journalctl -k` with its boot separators),
    for a capture that carries no ledger: each boot's records become its incidents, in memory.

    Which board had an earlier boot's Xid the log cannot say (NVML's serial is today's board), so every
    GPU is keyed by its slot (its NVML index); checks/history.py caps what a slot-keyed rule finds at a
    warning that says so. Nothing is written anywhere."""

    def __init__(self, records: Sequence[KmsgRecord]) -> None:
        super().__init__(None, source="kmsg", writable=False, error="")
        self.records = tuple(records)
        self.boots = sorted({r.boot for r in self.records if r.boot}, key=self._first_seen)

    def _first_seen(self, boot: str) -> int:
        return next(i for i, r in enumerate(self.records) if r.boot == boot)

    @classmethod
    def of(cls, kmsg: object) -> LogHistory | None:
        """A history for a log of two boots or more; None otherwise (one boot is no history)."""
        if not isinstance(kmsg, tuple) or not kmsg:
            return None
        log_history = cls(kmsg)
        return log_history if len(log_history.boots) >= 2 else None

    def status(self, duration_s: float = 0.0) -> SourceStatus:
        return SourceStatus("ledger", ok=True, duration_s=duration_s,
                            detail={"note": f"no ledger in the snapshot: history from its kernel log's "
                                            f"{len(self.boots)} boots, GPUs by slot"})

    def observe(self, facts: NodeFacts, rules: Sequence[Rule], counter_rules: Sequence[CounterRule] = (), *,
                now: float | None = None) -> NodeFacts:
        started = time.monotonic()
        now = time.time() if now is None else now
        until = facts.observed_at.timestamp() if facts.observed_at is not None else now
        incidents: list[Incident] = []
        for boot in self.boots:
            mine = tuple(r for r in self.records if r.boot == boot)
            segment = parse_kernel_log(dataclasses.replace(facts, kmsg=mine))
            incidents += incidents_from_facts(segment, boot_id=boot, source="kmsg", now=until, by_slot=True)
        span = max((r.window_s for r in rules), default=0.0)
        facts.history = History(tuple(sorted((i for i in incidents if until - span <= i.ts <= until + 60),
                                             key=lambda i: i.ts)), until - span, until, self.boots[-1],
                                self.status().detail["note"], (), tuple(r.name for r in rules))
        facts.sources["ledger"] = self.status(time.monotonic() - started)
        return facts

    def remember(self, findings: Sequence[Finding], facts: NodeFacts, *, now: float | None = None) -> None:
        return None  # a capture's log is read, never written
