"""What the daemon holds of the scheduler gate, as an interface: the CLI hands the daemon the gate
(agent.apps.scheduler.metrics.DaemonGate), so the daemon never imports another app (issue 32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agent.report.model import Report


class Gate(Protocol):
    """What the daemon holds of the scheduler gate: the state file health-check reads and the decision
    metrics it exports (agent.apps.scheduler.metrics.DaemonGate, handed in by the CLI)."""

    @property
    def state_dir(self) -> Path: ...

    @property
    def fresh_for_s(self) -> float: ...

    def follow(self, state_dir: Path, poll_intervals: dict[str, float]) -> bool: ...

    def update(self, report: Report | None, confirmed_at: float, last_read: dict[str, float]) -> None: ...

    def families(self) -> list[Any]: ...


class NoGate:
    """No scheduler gate (a daemon built without one, as some tests do): no state file, no gate series."""

    def __init__(self, state_dir: Path, poll_intervals: dict[str, float]) -> None:
        self.state_dir, self.fresh_for_s = state_dir, 0.0

    def follow(self, state_dir: Path, poll_intervals: dict[str, float]) -> bool:
        moved, self.state_dir = state_dir != self.state_dir, state_dir
        return moved

    def update(self, report: Report | None, confirmed_at: float, last_read: dict[str, float]) -> None:
        return None

    def families(self) -> list[Any]:
        return []
