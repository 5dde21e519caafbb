"""What a source of facts is: the one interface host files, NVML, the kernel log and the BMC implement.

A `Source` declares, once:
* its name, the status names it reports (the BMC reports `redfish` and `ipmi`), the `NodeFacts`
  field its facts fill, its names in a snapshot's `captured` list and the snapshot entries that hold it;
* how it is read live and from a recording (`read_live`, `read_recorded`; `read` picks one), and
  how a live read is recorded into a new snapshot (`record`);
* what its facts and statuses are when it was not read (`absent`, `not_read`);
* the daemon's polls of it (`polls`: name, default interval and timeout) and how the newest poll
  results become facts and statuses (`from_polls`).

`agent.sources.registry` lists them. `agent.engine.audit` decides which to read and reads through them,
the daemon makes one poller per `Poll` and judges `from_polls`, `snapshot capture` calls `record`,
and the importers write the recording files with the sources' own encoders. Nothing here judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from agent.core.model import SourceStatus, Unknown
from agent.io.credentials import BmcOptions
from agent.policy.polls import Poll

if TYPE_CHECKING:
    from agent.sources.fsroot import FsRoot, LiveFs
    from agent.sources.snapshot_dir import Snapshot

T = TypeVar("T")
NOT_IN_SNAPSHOT = "not in snapshot"
PENDING = "not read yet"  # a configured source whose first poll has not returned yet


@dataclass(frozen=True)
class ReadOptions:
    bmc: BmcOptions = field(default_factory=BmcOptions)
    nvml_timeout_s: float = 10.0
    sensors_only: bool = False


@dataclass(frozen=True)
class CaptureOptions:
    """What `snapshot capture` records; `root`, `kmsg_device` and `nvml_backend` let tests record a fake node."""

    sysctl_keys: tuple[str, ...] = ()
    bmc: BmcOptions | None = None
    root: LiveFs | None = None
    kmsg_device: str | None = None
    nvml_backend: Any = None


@dataclass
class Recording:
    """What a capture recorded so far: `captured` names for meta.yaml, notes on what was not, the host name."""

    captured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hostname: str | None = None


@dataclass
class PollResult:
    value: Any  # the source's facts; None: the poll failed (its statuses say why)
    statuses: dict[str, SourceStatus]
    finished_at: float  # time.time()


class NodeView(Protocol):
    """What a source reads of an opened node (`agent.sources.node.NodeSource` is one)."""

    @property
    def snapshot(self) -> Snapshot | None: ...

    @property
    def fs(self) -> FsRoot | None: ...


def pending_status(name: str) -> SourceStatus:
    """A configured source whose first read has not returned yet (`nodewarden_source_pending`)."""
    return SourceStatus(name, ok=False, error=PENDING, detail={"pending": True})


def timed(name: str, func: Callable[[], T]) -> tuple[T, SourceStatus]:
    start = time.monotonic()
    value = func()
    return value, SourceStatus(name, ok=True, duration_s=time.monotonic() - start)


class Source:
    """A source of facts (see the module docstring); subclasses fill the declarations and the reads."""

    name: ClassVar[str]
    statuses: ClassVar[tuple[str, ...]]  # the SourceStatus names it reports
    facts_field: ClassVar[str]  # its NodeFacts field
    recorded_as: ClassVar[tuple[str, ...]]  # its names in meta.yaml `captured`
    files: ClassVar[tuple[str, ...]]  # the snapshot entries that hold it
    polls: ClassVar[tuple[Poll, ...]] = ()

    def captured(self, node: NodeView) -> bool:
        """Whether the node holds this source: always live, else when the snapshot recorded it."""
        snap = node.snapshot
        return snap is None or any(snap.has(name) for name in self.recorded_as)

    def reads_live(self, node: NodeView, options: ReadOptions) -> bool:
        return node.snapshot is None

    def read(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        """Facts and statuses: live, from the node's recording, or `absent` when it holds none."""
        if self.reads_live(node, options):
            return self.read_live(node, options)
        snap = node.snapshot
        if snap is None or not self.captured(node):
            return self.absent(NOT_IN_SNAPSHOT), self.not_read(NOT_IN_SNAPSHOT)
        return self.read_recorded(node, snap, options)

    # The three hooks below have no default: a source reads live and recorded (or overrides `read`,
    # as host and kmsg do, whose live and recorded reads are one parser over another root) and records
    # itself. tests/unit/sources/test_source_registry.py checks every registered source provides them.
    def read_live(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        raise NotImplementedError(f"source {self.name!r} has no live read")

    def read_recorded(self, node: NodeView, snap: Snapshot, options: ReadOptions,
                      ) -> tuple[Any, dict[str, SourceStatus]]:
        raise NotImplementedError(f"source {self.name!r} has no recorded read")

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        """Read this node live and write what was read into the new snapshot folder `out`."""
        raise NotImplementedError(f"source {self.name!r} cannot be captured")

    def absent(self, reason: str) -> Any:
        """The facts of a source that was not read, saying why."""
        return Unknown(reason)

    def not_read(self, error: str, configured: bool = False) -> dict[str, SourceStatus]:
        return {name: SourceStatus(name, ok=False, configured=configured, error=error) for name in self.statuses}

    def not_needed(self, why: str) -> dict[str, SourceStatus]:
        """The statuses of a source the judged node does not need (`agent.engine.audit.needed_sources`).

        Not configured, so never a source down: no `nodewarden_source_up` series, `source.available`
        says skip with `why`; `detail.needed` False tells it from a source nobody asked for.
        """
        return {name: SourceStatus(name, ok=False, configured=False, error=why, detail={"needed": False})
                for name in self.statuses}

    # --- the daemon's view -----------------------------------------------------------------

    def polled(self, node: NodeView, bmc: BmcOptions) -> bool:
        """Whether the daemon polls this source on this node."""
        return bool(self.polls) and self.captured(node)

    def reports(self, node: NodeView, bmc: BmcOptions) -> tuple[str, ...]:
        """The status names a failed poll is reported under."""
        return self.statuses

    def from_polls(self, node: NodeView, bmc: BmcOptions, results: Mapping[str, PollResult | None],
                   ) -> tuple[Any, dict[str, SourceStatus]]:
        """The newest poll results as facts and statuses (not polled: not in the snapshot; none yet: pending)."""
        if not self.polled(node, bmc):
            return self.unpolled(), self.not_read(NOT_IN_SNAPSHOT)
        result = _newest(results.values())
        if result is None:
            return self.absent(PENDING), {name: pending_status(name) for name in self.statuses}
        value = result.value
        if value is None:
            errors = [s.error for s in result.statuses.values() if s.error]
            value = self.absent(errors[0] if errors else "not read")
        return value, dict(result.statuses)

    def unpolled(self) -> Any:
        """The facts of a source the daemon does not poll on this node."""
        return self.absent(NOT_IN_SNAPSHOT)


def _newest(results: Iterable[PollResult | None]) -> PollResult | None:
    polled = [r for r in results if r is not None]
    return max(polled, key=lambda r: r.finished_at) if polled else None
