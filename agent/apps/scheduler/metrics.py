"""The daemon's view of the scheduler gate: health-check runs as its own short process and leaves its
last decision in STATE_DIR/scheduler/decision.json; the daemon exports it per scrape.

Read again only when the file's mtime or size moved (one stat per scrape), bounded and type-checked
(agent.apps.scheduler.state.read_decision).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from agent.apps.scheduler.state import ACTIONS, DECISION_FILE, DaemonStateFile, read_decision
from agent.report.model import Report


class DecisionMetrics:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "scheduler" / DECISION_FILE
        self.state_dir = state_dir
        self._seen: tuple[int, int] | None = None
        self._decision: tuple[float, str] | None = None

    def families(self) -> list[Metric]:
        try:
            st = os.stat(self.path)
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen != self._seen:
            self._seen = seen
            self._decision = read_decision(self.state_dir) if seen is not None else None
        if self._decision is None:
            return []  # health-check never ran here: no series rather than a made-up zero
        at, action = self._decision
        last = GaugeMetricFamily("nodewarden_health_check_last_run_timestamp_seconds",
                                 "When `nodewarden health-check --slurm` last decided (Unix time)")
        last.add_metric([], at)
        decided = GaugeMetricFamily("nodewarden_health_check_action",
                                    "1 for what the last health-check decided: drain, resume, none, or breaker "
                                    "(the circuit breaker held a drain back)", labels=["action"])
        for name in ACTIONS:
            decided.add_metric([name], 1 if name == action else 0)
        return [last, decided]



class DaemonGate:
    """All the daemon holds of the scheduler gate (issue 24): the state file it writes for health-check and the
    decision it exports. The CLI hands it to the daemon (agent.apps.daemon.service.Gate): one app never
    imports another (issue 32)."""

    def __init__(self, state_dir: Path, poll_intervals: dict[str, float]) -> None:
        self.state_file = DaemonStateFile(state_dir, poll_intervals)
        self.decisions = DecisionMetrics(state_dir)

    @property
    def state_dir(self) -> Path:
        return self.state_file.state_dir

    @property
    def fresh_for_s(self) -> float:
        return self.state_file.fresh_for_s

    def follow(self, state_dir: Path, poll_intervals: dict[str, float]) -> bool:
        """Write where the config now says (a reload); health-check leaves its decisions there too."""
        was = self.state_file.state_dir
        moved = self.state_file.follow(state_dir, poll_intervals)
        if moved and self.state_file.state_dir != was:
            self.decisions = DecisionMetrics(self.state_file.state_dir)  # one assignment, seen whole by scrapes
        return moved

    def update(self, report: Report | None, confirmed_at: float, last_read: dict[str, float]) -> None:
        self.state_file.update(report, confirmed_at, last_read)

    def families(self) -> list[Metric]:
        return self.decisions.families()
