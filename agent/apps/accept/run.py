"""`nodewarden accept`: one acceptance run, idle -> ramp -> steady -> cool-down, then judgement.

The one entry point is `run_accept(AcceptRequest) -> AcceptOutcome`. The load starts after idle;
the steady phase starts once every GPU holds the profile's load utilization for 3 samples (the
ramp gives up after `ramp_s`: "never reached load"); the load is stopped (SIGTERM, then SIGKILL)
before cool-down. SIGINT/SIGTERM end the run early the same way: load stopped, GPUs left as they
were (nothing here sets anything on a GPU), the result says it was interrupted. The recording,
the baseline and STATE_DIR/accept/last.json are written at the end of every run that could start.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.apps.accept.bmc import BmcPoller
from agent.apps.accept.request import AcceptRequest
from agent.apps.accept.runners import LoadError, LoadRunner, make_runner
from agent.apps.accept.sampler import Sampler
from agent.apps.accept.xid_log import KernelLogXids
from agent.core.errors import AuditError
from agent.core.model import SourceStatus, Status
from agent.core.series import Recording
from agent.report.model import Report
from agent.state.acceptance import AcceptStore

__all__ = ["AcceptOutcome", "AcceptRequest", "run_accept"]

log = logging.getLogger("nodewarden.accept")  # progress of a long run: -v shows it
BUSY_SAMPLES = 3  # consecutive samples at load before steady starts (one busy sample may be a blip)
DEFAULT_BUSY_PCT = 80.0


@dataclass
class AcceptOutcome:
    report: Report
    recording: Recording
    baseline: Recording | None
    last_path: Path | None
    became_baseline: bool


class _Stop:
    """SIGINT/SIGTERM/SIGHUP (the end of an ssh session) during the run: a flag the phase loop waits on
    (so a signal ends a wait at once)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: str | None = None

    def handle(self, signum: int, _frame: Any) -> None:
        self.signal = signal.Signals(signum).name
        self.event.set()


@contextmanager
def _signals(stop: _Stop) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # tests drive runs from a thread; signals only reach the main one
        return
    old = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Run:
    def __init__(self, request: AcceptRequest, recording: Recording, sampler: Sampler, runner: LoadRunner,
                 busy_pct: float, bmc: BmcPoller | None) -> None:
        self.req, self.recording, self.sampler, self.runner = request, recording, sampler, runner
        self.busy_pct, self.bmc = busy_pct, bmc
        self.stop = _Stop()
        self.t0 = time.monotonic()
        self.next_tick = self.t0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def tick(self) -> bool:
        """Wait for the next sample time and take it; False when a signal ended the run."""
        self.next_tick += self.req.interval_s
        if self.stop.event.wait(max(0.0, self.next_tick - time.monotonic())):
            return False
        self.sampler.tick(self.now())
        if self.bmc is not None:
            self.bmc.maybe_read(self.now())
        return True

    def phase(self, name: str, seconds: float) -> bool:
        start = self.now()
        self.recording.phases[name] = [round(start, 3), round(start, 3)]
        log.info("accept: %s phase at t=%.1f s (%s %g s)", name, start, "up to" if name == "ramp" else "for", seconds)
        try:
            while self.now() - start < seconds:
                if not self.tick():
                    return False
                if name in ("ramp", "steady") and (why := self.runner.ended()):
                    self.fail(f"{why} (during {name})")
                    return False
                if name == "ramp" and self.at_load():
                    return True
            if name == "ramp":
                self.fail(f"the load never reached {self.busy_pct:g} % utilization on {', '.join(self.idle_gpus())} "
                          f"within {seconds:g} s of ramp")
                return False
            return True
        finally:
            self.recording.phases[name][1] = round(self.now(), 3)

    def idle_gpus(self) -> list[str]:
        out = []
        for gpu in self.recording.gpus:
            util = gpu.series["util_pct"][-1:] if gpu.lost is None else []
            if not (util and isinstance(util[0], int | float) and util[0] >= self.busy_pct):
                out.append(gpu.label)
        return out or ["no GPU"]

    def at_load(self) -> bool:
        live = [g for g in self.recording.gpus if g.lost is None]
        if not live:
            return False
        for gpu in live:
            last = gpu.series["util_pct"][-BUSY_SAMPLES:]
            if len(last) < BUSY_SAMPLES or not all(isinstance(u, int | float) and u >= self.busy_pct for u in last):
                return False
        return True

    def fail(self, outcome: str) -> None:
        if self.recording.load.get("outcome") in (None, "ok"):
            self.recording.load["outcome"] = outcome[:500]

    def run(self) -> None:
        req = self.req
        with _signals(self.stop):
            try:
                self._phases(req)
            finally:
                how = self.runner.stop(req.grace_s)
                if how:
                    self.recording.load["stopped"] = how
            if self.stop.signal:
                self.fail(f"interrupted by {self.stop.signal} at t={self.now():.1f} s; the load was stopped")

    def _phases(self, req: AcceptRequest) -> None:
        if not self.phase("idle", req.idle_s):
            return
        try:
            self.runner.start()
        except LoadError as exc:
            self.fail(str(exc))
            return
        log.info("accept: load started: %s", self.runner.describe())
        if not self.phase("ramp", req.ramp_s):
            return
        steady_ok = self.phase("steady", req.duration_s)
        if steady_ok and (why := self.runner.ended()) and self.runner.kind != "none":
            self.fail(f"{why} (before the end of steady)")
        if self.stop.signal:
            return
        how = self.runner.stop(req.grace_s)
        if how:
            self.recording.load["stopped"] = how
        self.phase("cooldown", req.cooldown_s)
        if self.recording.load.get("outcome") is None:
            self.recording.load["outcome"] = "ok"


def _busy_pct(profile: Any) -> float:
    exp = profile.expectation("accept", "load_utilization_pct")
    value = dict(exp.comparators).get("min") if exp is not None else None
    return float(value) if isinstance(value, int | float) else DEFAULT_BUSY_PCT


def _not_passed(store: AcceptStore, run_id: str, why: str) -> None:
    baseline, _why = store.baseline()
    store.save_last({"passed": False, "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "baseline": baseline.run_id if baseline is not None else None, "run": run_id, "error": why})


def run_accept(request: AcceptRequest) -> AcceptOutcome:
    from agent.apps.accept.judge import choose, end_pci, report_for  # the profile store and checks: after usage checks

    request.validate()
    started = dt.datetime.now(dt.timezone.utc)
    run_id = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
    runner = make_runner(request.load, request.argv, request.ramp_s + request.duration_s + 60)
    recording = Recording(run_id=run_id, started_at=started.isoformat(timespec="seconds"),
                          interval_s=request.interval_s, load={"kind": runner.kind, "argv": list(request.argv)[:64],
                                                                "described": runner.describe()})
    store = AcceptStore(request.state_dir or request.config.state_dir)
    store.folder()  # an unusable state dir is exit 2 now, not after a 10-minute burn
    sampler = Sampler(recording, request.session)
    try:
        error = sampler.start()
        if error is not None or not recording.gpus:
            why = f"accept cannot run: NVML unavailable: {error}" if error else "accept cannot run: no GPU with a UUID"
            _not_passed(store, run_id, why)  # an older pass must not stand for this node now
            raise AuditError(why)
        profile, node, source = choose(request, sampler)
        recording.profile, recording.hostname = profile.name, node.get("hostname")
        bmc = BmcPoller(request.bmc, request.bmc_interval_s, recording, source) if request.bmc.configured else None
        xids = KernelLogXids(source) if recording.xid_source != "nvml events" else None
        # until the run ends this is what the scheduler reads: a run killed outright (SIGKILL, the OOM
        # killer) leaves "in progress", never an older pass
        store.save_last({"passed": False, "in_progress": True, "started_at": recording.started_at,
                         "finished_at": recording.started_at, "run": run_id, "pid": os.getpid(),
                         "error": "an acceptance run started and has not finished"})
        run = _Run(request, recording, sampler, runner, _busy_pct(profile), bmc)
        try:
            run.run()
        finally:
            sampler.finish(run.now())  # what NVML counts once the run is over
            end_pci(source, recording)
            if bmc is not None:
                bmc.close()
            if xids is not None:
                xids.finish(recording)
    finally:
        sampler.close()
    recording.finished_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    baseline, unusable = store.baseline()
    if unusable:
        recording.notes.append(unusable)
    report = report_for(request, recording, profile, node, baseline, started)
    passed = report.exit_code == 0 and not any(f.status is Status.UNKNOWN and f.check == "accept.errors"
                                               for f in report.findings)
    became = passed and (baseline is None or request.new_baseline)
    compared_with = baseline.run_id if baseline is not None else None  # what judged this run, before it may replace it
    store.save_run(recording)
    if became:
        store.save_baseline(recording)
        baseline = recording
    drift = sorted({f.subject for f in report.findings if f.check == "accept.drift" and f.status is Status.FAIL})
    interrupted = run.stop.signal
    last = store.save_last({"passed": passed, "finished_at": recording.finished_at, "interrupted": interrupted,
                            "baseline": baseline.run_id if baseline is not None else None, "run": run_id,
                            "profile": profile.name, "drift": drift})
    from agent.engine.history import action_incident, record_action

    unwritten = record_action(store.state_dir, action_incident(
        "accept", "accept", "passed" if passed else "failed", run_id,
        f"acceptance run {run_id} {'passed' if passed else 'failed'} (profile {profile.name})",
        severity="info" if passed else "warning"))
    if unwritten:
        recording.notes.append(f"the ledger did not record this run: {unwritten}")
    report.extra["acceptance"] = {"run": run_id, "passed": passed, "baseline": baseline.run_id if baseline else None,
                                  "became_baseline": became, "compared_with": compared_with,
                                  "finished_at": recording.finished_at, "load": recording.load,
                                  "phases": recording.phases, "xid_source": recording.xid_source,
                                  "notes": recording.notes[:50]}
    report.sources["nvml"] = SourceStatus("nvml", ok=True, detail={"samples": sampler.ticks,
                                                                    "read_s": round(sampler.calls_s, 4)})
    return AcceptOutcome(report, recording, baseline, last, became)
