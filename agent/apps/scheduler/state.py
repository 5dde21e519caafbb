"""The files health-check shares with the daemon and with `nodewarden accept`, in STATE_DIR/scheduler/:

* daemon.json    the daemon's last evaluation (agent.apps.scheduler.answer's summary) with `confirmed_at`
                 (when its facts were last judged or confirmed unchanged), `fresh_for_s` (3 of its
                 host/NVML poll intervals) and when each source was last read. Written atomically by
                 the daemon (`DaemonStateFile.update`, after each evaluation and as polls confirm it).
                 Each action names its GPUs (`gpus`: agent.report.gpu_identity's objects, as in the
                 JSON report); a GPU lost since the daemon started keeps the UUID NVML gave it before.
* verdict.json   written by the daemon, after daemon.json, only when the node's verdict changes
                 ({verdict, at}): what the event-driven gate waits for (agent.apps.scheduler.trigger, or
                 systemd's nodewarden-gate.path). Its content is never trusted: the gate it starts
                 reads daemon.json by the usual rule; a change is all it says.
* decision.json  health-check's last decision ({at, action, verdict, node, why}): the daemon exports it
                 (`nodewarden_health_check_last_run_timestamp_seconds`, `..._action{action}`), since
                 health-check runs as its own short process.
* STATE_DIR/accept/last.json, written by `nodewarden accept`: {"passed": bool, "finished_at": ISO 8601}.
  With `health_check.require_accept`, a drain of ours is resumed only after a passing run that
  finished after the drain (`accepted_since`).

Every write goes through agent.io.fsutil (atomic, owner-only folder); every read is bounded
(agent.io.jsonfile) and type-checked: the folder is root's, its content still is not trusted.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from agent.apps.scheduler.answer import Answer, SummaryError, parse_summary, summarise
from agent.apps.scheduler.settings import DEFAULT_MAX_AGE_S
from agent.core.errors import NodewardenError
from agent.io.fsutil import remove_temp_files, replace_file
from agent.io.jsonfile import JsonInputError, load_json_bytes, load_json_file
from agent.report.gpu_identity import GpuIdentity, gpu_identities, learn
from agent.report.model import Report
from agent.state.daemon_dir import has_daemon_dir, read_daemon_file
from agent.state.layout import daemon_folder, scheduler_folder

log = logging.getLogger("nodewarden.scheduler")

STATE_FILE, DECISION_FILE, VERDICT_FILE = "daemon.json", "decision.json", "verdict.json"
MAX_STATE_BYTES = 256 << 10
MAX_SMALL_BYTES = 16 << 10
FUTURE_SLACK_S = 30.0  # a state file from further in the future than this is not believed
REWRITE_EVERY_S = 5.0  # a steady node's state file is refreshed at most this often
STALE_TEMP_S = 60.0  # a temporary daemon.json older than this is a killed daemon's, not a write in flight
ACTIONS = ("drain", "resume", "none", "breaker")  # the decisions the daemon exports





def _load_state(state_dir: Path) -> Any:
    """daemon.json by the rule of the folder it is in (agent.state.daemon_dir)."""
    if has_daemon_dir(state_dir):
        data = read_daemon_file(state_dir, STATE_FILE, MAX_STATE_BYTES)
        return load_json_bytes(data, max_bytes=MAX_STATE_BYTES, what="health-check state file")
    return load_json_file(scheduler_folder(state_dir, create=False) / STATE_FILE, max_bytes=MAX_STATE_BYTES,
                          what="health-check state file")


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False) + "\n"


def _fresh_for(poll_intervals: dict[str, float]) -> float:
    return 3 * max((poll_intervals.get(name, 60.0) for name in ("host", "nvml")), default=60.0)


class DaemonStateFile:
    """The daemon's side: `update` after each evaluation and each loop turn (cheap when nothing moved)."""

    def __init__(self, state_dir: Path, poll_intervals: dict[str, float]) -> None:
        self.state_dir, self.fresh_for_s = state_dir, _fresh_for(poll_intervals)
        self._report: Report | None = None
        self._summary: dict[str, Any] = {}
        self._written_at = 0.0
        self._written_confirmed = 0.0
        self._failed: str | None = None
        # Each GPU's identity as NVML last gave it: a GPU that falls off the bus later is still named
        # by its UUID in the state file (agent.report.gpu_identity).
        self._gpus: dict[str, GpuIdentity] = {}
        self._swept = False  # the temporary files a killed daemon left: removed before the first write
        self._signalled: str | None = None  # the verdict verdict.json last said (the event gate's trigger)

    def follow(self, state_dir: Path, poll_intervals: dict[str, float]) -> bool:
        """A reload's settings: whether they moved the file (written there at the next update)."""
        where = (state_dir, _fresh_for(poll_intervals))
        if where == (self.state_dir, self.fresh_for_s):
            return False
        self.state_dir, self.fresh_for_s = where
        self._report, self._failed, self._swept = None, None, False  # rewritten, and that folder swept
        self._signalled = None
        return True

    def _sweep(self, path: Path) -> None:
        self._swept = True
        try:
            removed = remove_temp_files(path, min_age_s=STALE_TEMP_S, own_only=True)
        except OSError as exc:  # a file that went while we looked: the next start tries again
            log.warning("could not remove stale temporary state files: %s", exc)
            return
        if removed:
            log.info("removed %d stale temporary state file(s) in %s", len(removed), path.parent,
                     extra={"fields": {"event": "state_file", "removed": removed}})

    def update(self, report: Report | None, confirmed_at: float, last_read: dict[str, float]) -> None:
        if report is None:
            return
        now = time.monotonic()
        if self._failed is not None and now - self._written_at < REWRITE_EVERY_S:
            return  # a state dir that refused the last write is tried again every few seconds, not every turn
        if report is self._report and (confirmed_at <= self._written_confirmed
                                       or now - self._written_at < REWRITE_EVERY_S):
            return
        if report is not self._report:
            self._summary = summarise(report, self._gpus)
            self._gpus = learn(self._gpus, gpu_identities(report.facts))
        doc = {**self._summary, "confirmed_at": confirmed_at, "fresh_for_s": self.fresh_for_s,
               "sources": {name: {"ok": status.ok, "last_read": last_read.get(name)}
                           for name, status in report.sources.items() if status.configured}}
        try:
            path = daemon_folder(self.state_dir, create=True) / STATE_FILE
            if not self._swept:
                self._sweep(path)
            replace_file(path, _dump(doc), 0o644)
        except (OSError, NodewardenError) as exc:  # the daemon goes on; health-check will see a stale file
            if str(exc) != self._failed:
                log.error("could not write the health-check state file: %s", exc,
                          extra={"fields": {"event": "state_file", "error": str(exc)}})
            self._failed, self._written_at = str(exc), now
            return
        self._failed = None
        self._report, self._written_at, self._written_confirmed = report, now, confirmed_at
        self._signal(path.parent)

    def _signal(self, where: Path) -> None:
        """Say in verdict.json that the verdict changed (after daemon.json: a gate it starts reads the new one)."""
        verdict = self._summary.get("verdict")
        if verdict == self._signalled:
            return
        try:
            replace_file(where / VERDICT_FILE, _dump({"verdict": verdict, "at": time.time()}), 0o644)
        except (OSError, NodewardenError) as exc:  # the periodic health-check still sees daemon.json
            log.error("could not write the verdict-change file: %s", exc,
                      extra={"fields": {"event": "state_file", "error": str(exc)}})
            return
        self._signalled = str(verdict)


def read_state(state_dir: Path, max_age_s: float | None, now: float | None = None, *,
               judged: str = "live") -> Answer | None:
    """The daemon's last evaluation of `judged` (answer.reading); None when there is no state file of
    it (no daemon here, or one replaying another recording: audit instead).

    A file too old, from the future, unreadable or malformed is an Answer without a verdict: the
    daemon was there but its word cannot be used, so the health-check must not decide.
    """
    now = time.time() if now is None else now
    try:
        doc = _load_state(state_dir)
    except FileNotFoundError:
        return None
    except (OSError, JsonInputError, NodewardenError) as exc:
        return Answer(None, "state file", f"state file unreadable: {exc}")
    if not isinstance(doc, dict):
        return Answer(None, "state file", "state file malformed: not an object")
    if doc.get("reading", "live") != judged:
        return None
    confirmed, fresh_for = doc.get("confirmed_at"), doc.get("fresh_for_s")
    if not isinstance(confirmed, int | float) or isinstance(confirmed, bool) or not 0 <= confirmed < 1e11:
        return Answer(None, "state file", "state file malformed: no confirmed_at")
    limit = max_age_s if max_age_s is not None else (
        float(fresh_for) if isinstance(fresh_for, int | float) and 0 < fresh_for < 1e6 else DEFAULT_MAX_AGE_S)
    age = now - float(confirmed)
    if age < -FUTURE_SLACK_S:
        return Answer(None, "state file", f"state file from the future ({-age:.0f} s ahead)", age_s=age)
    if age > limit:
        return Answer(None, "state file", f"state file stale: {age:.0f} s old, limit {limit:.0f} s "
                      "(is the daemon running?)", age_s=age)
    try:
        return parse_summary(doc, "state file", age_s=max(age, 0.0))
    except SummaryError as exc:
        return Answer(None, "state file", f"state file malformed: {exc}", age_s=age)


def foreign_state(state_dir: Path, judged: str = "live") -> str | None:
    """What the state file there judged when it is not `judged` (another node's recording, a simulated
    daemon): the health-check ignores it and says so (issue 36.6); None otherwise."""
    try:
        doc = _load_state(state_dir)
    except (OSError, JsonInputError, NodewardenError):
        return None
    reading = doc.get("reading", "live") if isinstance(doc, dict) else None
    return reading[:200] if isinstance(reading, str) and reading != judged else None


def write_decision(state_dir: Path, doc: dict[str, Any]) -> None:
    replace_file(scheduler_folder(state_dir, create=True) / DECISION_FILE, _dump(doc), 0o644)


def read_decision(state_dir: Path) -> tuple[float, str] | None:
    """(when, action) of health-check's last decision, for the daemon's metrics; None if none readable."""
    try:
        # The same folder rule as every other reader of the state folder (issue 30.12).
        doc = load_json_file(scheduler_folder(state_dir, create=False) / DECISION_FILE, max_bytes=MAX_SMALL_BYTES,
                             what="health-check decision")
    except (OSError, JsonInputError, NodewardenError):
        return None
    if not isinstance(doc, dict):
        return None
    at, action = doc.get("at"), doc.get("action")
    if not isinstance(at, int | float) or isinstance(at, bool) or not 0 <= at < 1e11 or action not in ACTIONS:
        return None
    return float(at), str(action)
