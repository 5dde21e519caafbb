"""Actuators: how a finding becomes a change, and how the change is undone.

An actuator (one module per tunable, like tuned's plugins) turns a failed or
warned finding into an `Action`: a list of `Change`s against a `HostTarget`.
A change is declarative — "write VALUE to this kernel attribute" or "rewrite
this file with EDIT" — so the engine can journal the exact before-state of
every path, apply, re-read and verify, and roll back generically. The
actuator's `parse` is the same function the host source uses to read the
value, so plan, verify and the next audit agree on what "current" means.

Actuators are discovered from this package; the registry key is the
`remediation` id that checks put on their findings.
"""

from __future__ import annotations

import enum
import fnmatch
import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.core.expect import Expectation
from agent.core.facts import NodeFacts
from agent.core.model import Finding
from agent.core.sanitise import is_clean
from agent.policy.profiles import Profile
from agent.sources.fsroot import FsRoot


class ActionClass(str, enum.Enum):
    SAFE = "safe"              # runtime, reversible, no disruption
    DISRUPTIVE = "disruptive"  # needs idle GPUs or a link bounce
    REBOOT = "reboot"          # takes effect after a reboot


class Outcome(str, enum.Enum):
    PLANNED = "planned"        # would change (plan mode)
    APPLIED = "applied"        # changed and verified
    FAILED = "failed"          # applied but the re-read disagrees, or the write failed
    REFUSED = "refused"        # cannot or must not be done (reason says why)
    NOT_ALLOWED = "not_allowed"  # class not allowed by --allow
    UNCHANGED = "unchanged"    # already at the target when applying


@dataclass(frozen=True)
class AttrWrite:
    """Write `value` to a kernel attribute (/proc/sys, /sys).

    `parse` turns the attribute's bytes into the value an audit compares;
    `shown` is what the kernel shows after a write (a snapshot has no kernel,
    so the recorded file is rewritten the way the kernel would show it).
    """

    path: str
    value: str
    parse: Callable[[bytes], str] = field(repr=False, compare=False)
    shown: Callable[[bytes, str], bytes] = field(repr=False, compare=False)


@dataclass(frozen=True)
class FileEdit:
    """Rewrite a configuration file atomically; `edit(old or None) -> new`."""

    path: str
    edit: Callable[[bytes | None], bytes] = field(repr=False, compare=False)
    mode: int = 0o644


def _undo_with_same_setter(before: Any) -> list[Any]:
    return [before]


@dataclass(frozen=True)
class NvmlSet:
    """Call an NVML setter on one GPU: `setter(handle, *args)`, read back with `getter(handle, *read)`.

    `value` is the setter's argument (a tuple for setters taking several); `reads` lists the
    getter's arguments after the handle, one read each (the before-state is the list of them
    when there are several); `undo` turns the before-state into the setter arguments that
    restore it, and is journaled as such (a live GPU has no bytes to put back).
    """

    index: int
    getter: str
    setter: str
    value: Any
    parse: Callable[[Any], str] = field(repr=False, compare=False)
    reads: tuple[tuple[Any, ...], ...] = ((),)
    undo: Callable[[Any], list[Any]] = field(default=_undo_with_same_setter, repr=False, compare=False)

    def setter_args(self) -> list[Any]:
        return list(self.value) if isinstance(self.value, tuple) else [self.value]

    @property
    def path(self) -> str:  # what the journal and rollback output call it
        return f"nvml:gpu{self.index}:{self.setter}"


@dataclass(frozen=True)
class RedfishPatch:
    """PATCH attributes into a BMC's `@Redfish.Settings` object (the BIOS applies them at the next boot).

    `bios_path` is the current resource, read with the settings object to
    know each attribute's effective value before the change.
    """

    bios_path: str
    settings_path: str
    attributes: tuple[tuple[str, Any], ...]
    apply_time: str | None = None  # @Redfish.SettingsApplyTime, when the BMC lists it as supported
    etag: str | None = None

    def __post_init__(self) -> None:
        # Write-time guard: no PATCH body ever holds an attribute name or text value with a line break.
        guard_config_text(*(n for n, _ in self.attributes), *(v for _, v in self.attributes if isinstance(v, str)))

    @property
    def path(self) -> str:
        return f"redfish:{self.settings_path}"


@dataclass(frozen=True)
class ByteWrite:
    """Write `data` at byte `offset` of a binary kernel file (PCI config space), as setpci does.

    `parse` turns the whole file's bytes into the value an audit compares (the
    same parser the host source uses). The before-state is the bytes at that
    offset; rollback writes them back, so a snapshot's file is restored byte for byte.
    """

    path: str
    offset: int
    data: bytes
    parse: Callable[[bytes], str] = field(repr=False, compare=False)


Change = AttrWrite | FileEdit | NvmlSet | RedfishPatch | ByteWrite


class BmcWriter(Protocol):
    """The BMC as remediation sees it: reads, one PATCH, and (for a recording) the raw files."""

    def get(self, path: str) -> dict[str, Any]:
        """The resource, or RedfishError (404 when absent)."""

    def patch(self, path: str, body: dict[str, Any], etag: str | None = None) -> Any:
        """A PatchResult (status, location of a task or job)."""

    def raw(self, path: str) -> bytes | None:
        """A recording's bytes for the resource (None: absent, or a live BMC)."""

    def restore_raw(self, path: str, raw: bytes | None) -> None: ...


@dataclass
class Action:
    id: str                 # "<actuator>:<subject>", stable, matched by --only
    actuator: str
    action_class: ActionClass
    subject: str
    finding: str            # check id of the finding this fixes
    before: Any
    after: Any
    changes: tuple[Change, ...] = ()
    refused: str | None = None
    notes: list[str] = field(default_factory=list)
    expectation: Expectation | None = field(default=None, repr=False)
    finding_subject: str = ""  # set by the engine: the finding's own subject
    outcome: Outcome = Outcome.PLANNED
    verified: bool | None = None
    observed_after: Any = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "class": self.action_class.value,
            "subject": self.subject,
            "finding": self.finding,
            "before": self.before,
            "after": self.after,
            "status": self.outcome.value,
            "applied": self.outcome in (Outcome.APPLIED, Outcome.FAILED) and self.error is None,
            "verified": self.verified,
            "observed_after": self.observed_after,
            "reason": self.refused or self.error,
            "notes": self.notes,
        }


class HostTarget(Protocol):
    """Where changes land: the live root or a snapshot's fs/ tree."""

    description: str
    live: bool
    fs: FsRoot  # the same read view the audit's host source uses

    def read(self, path: str) -> bytes | None: ...

    def write_attr(self, path: str, value: str, shown: Callable[[bytes, str], bytes]) -> None: ...

    def restore_attr(self, path: str, raw: bytes, value: str) -> None: ...

    def write_file(self, path: str, data: bytes | None, mode: int) -> None: ...

    def write_at(self, path: str, offset: int, data: bytes) -> None:
        """Write bytes at an offset of an existing file (sysfs `config`: one pwrite)."""

    def file_mode(self, path: str) -> int | None: ...

    def remove_leftover_temps(self, paths: list[str]) -> list[str]: ...

    def listdir(self, path: str) -> list[str]: ...

    def nvml(self) -> Any:
        """A pynvml-like object (live binding or the recording), initialised; None without NVML."""

    def nvml_commit(self) -> None:
        """Make NVML writes durable (rewrites a snapshot's nvml.json; nothing live)."""

    def nvml_raw(self) -> bytes | None:
        """The recording's bytes before a write (snapshot), None live."""

    def nvml_restore_raw(self, raw: bytes) -> None: ...

    def is_dir(self, path: str) -> bool: ...

    def remove_empty_dir(self, path: str) -> None: ...

    def bmc(self) -> BmcWriter | None:
        """The node's BMC over Redfish (live, or the snapshot's redfish/ tree); None when there is none."""

    def close(self) -> None:
        """Log out of the BMC, if we logged in."""


class PlanContext(Protocol):
    profile: Profile
    target: HostTarget
    facts: NodeFacts | None  # what the audit read (the planners' view of the BMC)
    cache: dict[str, Any]  # per plan: e.g. the NVML facts read once for all GPU findings


Planner = Callable[[Finding, PlanContext], list[Action]]

_PLANNERS: dict[str, Planner] = {}
_WRITES: dict[str, tuple[str, ...]] = {}


def actuator(name: str, *, writes: tuple[str, ...]) -> Callable[[Planner], Planner]:
    """Register a planner for findings whose `remediation` is `name`.

    `writes` declares every path the actuator's changes may touch, as patterns
    over a change's `path`: `*` matches within one path segment, `**` one or
    more segments (`/proc/sys/**`, `nvml:gpu*:nvmlDeviceSetEccMode`,
    `redfish:/redfish/v1/**`). The engine refuses a change outside them, and
    rollback refuses a journal entry outside them (a planted journal cannot
    make root write /etc/shadow).
    """
    def register(func: Planner) -> Planner:
        if name in _PLANNERS:
            raise RuntimeError(f"duplicate actuator {name}")
        if not writes:
            raise RuntimeError(f"actuator {name} declares no paths it writes")
        _PLANNERS[name] = func
        _WRITES[name] = writes
        return func
    return register


def _segments_match(patterns: list[str], parts: list[str]) -> bool:
    if not patterns:
        return not parts
    head, rest = patterns[0], patterns[1:]
    if head == "**":
        return any(_segments_match(rest, parts[n:]) for n in range(1, len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _segments_match(rest, parts[1:])


def path_matches(pattern: str, path: str) -> bool:
    """`path` matches `pattern` segment by segment; `.`, `..`, empty segments and NUL never match."""
    parts = path.split("/")
    if "\x00" in path or any(p in (".", "..") for p in parts) or "" in parts[1:]:
        return False
    return _segments_match(pattern.split("/"), parts)


def declared_writes(name: str) -> tuple[str, ...]:
    """The path patterns actuator `name` declared (empty for an unknown actuator)."""
    _discover()
    return _WRITES.get(name, ())


def may_write(name: str, path: str) -> bool:
    """Could actuator `name` have written `path`?"""
    return any(path_matches(pattern, path) for pattern in declared_writes(name))


@functools.cache
def _discover() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def planners() -> dict[str, Planner]:
    _discover()
    return dict(_PLANNERS)


def refused(action_id: str, finding: Finding, action_class: ActionClass, before: Any, reason: str) -> Action:
    name, _, subject = action_id.partition(":")
    return Action(action_id, name, action_class, subject, finding.check, before, finding.expected, refused=reason)


class UnsafeValue(ValueError):
    """A key or value that must not be written into a config file or a BMC request."""


def unsafe_for_config(*texts: str) -> str | None:
    """Why these texts must not go into sysctl.d, boot.conf or a BIOS PATCH (None: they may).

    They are one line of printable text or nothing: a newline in a value would add a line of
    the profile author's (or a hostile snapshot's) choosing to a file root applies at boot.
    Profiles are checked at load too; this is the same rule at plan and at write time.
    """
    for text in texts:
        if not is_clean(text):
            return f"{text!r} holds a control character or line break: nodewarden does not write it"
    return None


def guard_config_text(*texts: str) -> None:
    """Raise UnsafeValue (a ValueError: the apply loop's failure) for a text `unsafe_for_config` refuses."""
    problem = unsafe_for_config(*texts)
    if problem is not None:
        raise UnsafeValue(problem)


def target_value(expectation: Expectation) -> str | None:
    """The single value to set for an expectation, or None when it gives none.

    `equals` sets that value; `one_of` the first (the profile lists its
    preference first); `min`/`max` the bound itself (the least change that
    passes). `range` and version bounds name no value to write.
    """
    ops = dict(expectation.comparators)
    if "equals" in ops:
        return str(ops["equals"])
    if ops.get("one_of"):
        return str(ops["one_of"][0])
    if set(ops) == {"min"}:
        return str(ops["min"])
    if set(ops) == {"max"}:
        return str(ops["max"])
    return None
