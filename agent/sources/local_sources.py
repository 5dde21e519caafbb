"""The node's own sources: host files, the GPUs over NVML, the kernel log (`agent.sources.source.Source`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.core.errors import AuditError, NodewardenError
from agent.core.model import SourceStatus, Unknown, Unsupported
from agent.policy.polls import HOST as HOST_POLL
from agent.policy.polls import NVML as NVML_POLL
from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.source import (
    NOT_IN_SNAPSHOT,
    CaptureOptions,
    NodeView,
    ReadOptions,
    Recording,
    Source,
    timed,
)

if TYPE_CHECKING:
    from agent.sources.snapshot_dir import Snapshot

# Recorded by every capture besides the profiles' own keys: what support engineers ask for first.
CAPTURE_SYSCTLS = (
    "vm.swappiness", "vm.max_map_count", "vm.overcommit_memory", "kernel.pid_max",
    "net.core.somaxconn", "net.core.netdev_max_backlog", "net.core.rmem_default",
    "net.core.wmem_default", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "fs.file-max",
)
NVML_FILE = "nvml.json"
KMSG_FILE = "kmsg.txt"
LINKS_FILE = SnapshotFs.LINKS_FILE  # what SnapshotFs reads back
ERRORS_FILE = SnapshotFs.ERRORS_FILE


def json_recording(document: Any) -> bytes:
    """A recording's JSON (nvml.json, ipmi.json, fs_links.json) as capture and import both write it."""
    return (json.dumps(document, indent=1, sort_keys=True, default=str) + "\n").encode()


class HostSource(Source):
    """sysctl, sysfs and procfs through one `FsRoot`: the live root or the snapshot's fs/."""

    name = "host"
    statuses = ("host",)
    facts_field = "host"
    recorded_as = ("host",)
    files = ("fs", LINKS_FILE, ERRORS_FILE)
    polls = (HOST_POLL,)

    def captured(self, node: NodeView) -> bool:
        return super().captured(node) and node.fs is not None

    def read(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        from agent.sources.host import read_host_facts

        fs = node.fs
        if fs is None or not self.captured(node):
            return self.absent("not in this snapshot"), self.not_read(NOT_IN_SNAPSHOT)
        try:
            facts, status = timed("host", lambda: read_host_facts(fs))
        except NodewardenError:
            raise
        except OSError as exc:  # the parsers catch per-file errors; this is the root itself
            raise AuditError(f"cannot read the host ({fs.description}): {exc}") from exc
        return facts, {"host": status}

    def absent(self, reason: str) -> Any:
        from agent.sources.host import absent_host_facts

        return absent_host_facts(reason)

    def unpolled(self) -> Any:
        return self.absent("not in this snapshot")

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        from agent.io.fsutil import create_file  # capture-only: off the audit's import path
        from agent.sources.fsroot import LiveFs
        from agent.sources.fsroot_recording import RecordingFs
        from agent.sources.host import read_host_facts

        recorder = RecordingFs(options.root or LiveFs("/"))
        facts = read_host_facts(recorder, [*options.sysctl_keys, *CAPTURE_SYSCTLS])
        fs_dir = out / "fs"
        fs_dir.mkdir()
        for rel in sorted(recorder.dirs):
            (fs_dir / rel).mkdir(parents=True, exist_ok=True)
        for rel, data in sorted(recorder.files.items()):
            create_file(fs_dir, rel, data)
        create_file(out, LINKS_FILE, json_recording(recorder.links))
        if recorder.errors:
            create_file(out, ERRORS_FILE, json_recording(recorder.errors))
        done.captured.append("host")
        done.hostname = facts.hostname if isinstance(facts.hostname, str) else None


class NvmlSource(Source):
    """The GPUs through pynvml's names: the real library live, nvml.json replayed."""

    name = "nvml"
    statuses = ("nvml",)
    facts_field = "nvml"
    recorded_as = ("nvml",)
    files = (NVML_FILE,)
    polls = (NVML_POLL,)

    def read_live(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        from agent.sources.nvml_live import probe_live_nvml  # pynvml only when GPUs are read

        facts, status = probe_live_nvml(options.nvml_timeout_s)
        return facts, {"nvml": status}

    def read_recorded(self, node: NodeView, snap: Snapshot, options: ReadOptions,
                      ) -> tuple[Any, dict[str, SourceStatus]]:
        from agent.sources.nvml_facts import read_nvml
        from agent.sources.nvml_replay import RecordedNvml  # raises its own classes: no pynvml

        facts, status = read_nvml(RecordedNvml.from_file(snap.path / NVML_FILE), options.nvml_timeout_s)
        status.detail["recorded"] = True
        return facts, {"nvml": status}

    def unpolled(self) -> Any:
        return Unsupported(NOT_IN_SNAPSHOT)

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        from agent.io.fsutil import create_file
        from agent.sources import nvml

        backend = options.nvml_backend
        if backend is None:
            try:
                backend = nvml.load_live_nvml()
            except ImportError as exc:
                done.notes.append(f"nvml not captured: pynvml is not installed ({exc})")
                return
        recorder = nvml.RecordingNvml(backend)
        _facts, status = nvml.read_nvml(recorder)
        if not status.ok and not recorder.devices:
            done.notes.append(f"nvml not captured: {status.error}")
            return
        create_file(out, NVML_FILE, json_recording(recorder.to_json()))
        done.captured.append("nvml")


def kmsg_recording(lines: Iterable[str], per_part: int = 8192) -> Iterator[bytes]:
    """kmsg.txt as capture and import write it, in parts of `per_part` lines (never one more copy in memory)."""
    part: list[str] = []
    for line in lines:
        part.append(line)
        if len(part) >= per_part:
            yield ("\n".join(part) + "\n").encode("utf-8", "surrogateescape")
            part = []
    if part:
        yield ("\n".join(part) + "\n").encode("utf-8", "surrogateescape")


class KmsgSource(Source):
    """The kernel log: /dev/kmsg drained live, the snapshot's kmsg.txt. The daemon follows it instead of polling."""

    name = "kmsg"
    statuses = ("kmsg",)
    facts_field = "kmsg"
    recorded_as = ("kmsg",)
    files = (KMSG_FILE,)

    def read(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        from agent.sources.kmsg import read_live_kmsg, read_recorded_kmsg

        snap = node.snapshot
        if snap is not None and not self.captured(node):
            return self.absent(""), self.not_read(NOT_IN_SNAPSHOT)
        if snap is None:
            records, status = timed("kmsg", lambda: read_live_kmsg()[0])
        else:
            records, status = timed("kmsg", lambda: read_recorded_kmsg(snap.kmsg_path))
        if isinstance(records, Unknown):
            status.ok, status.error = False, records.reason
        return records, {"kmsg": status}

    def absent(self, reason: str) -> Any:
        return Unsupported("the snapshot holds no kernel log")

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        from agent.io.fsutil import create_file
        from agent.sources.kmsg import KMSG_DEVICE, read_live_kmsg

        records, raw = read_live_kmsg(options.kmsg_device or KMSG_DEVICE)
        if not isinstance(records, tuple) and not raw:
            done.notes.append(f"kmsg not captured: {records.reason}")
            return
        create_file(out, KMSG_FILE, kmsg_recording(raw))
        done.captured.append("kmsg")
