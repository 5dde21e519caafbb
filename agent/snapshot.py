"""Snapshots: a recorded node on disk (DESIGN.md "Snapshot = recorded node").

    SNAPSHOT/meta.yaml      hostname, captured_at, nodewarden_version, captured: [...]
    SNAPSHOT/fs/            fake root holding the files the host source read
    SNAPSHOT/fs_links.json  symlinks (path -> target), since zip/wheel cannot hold links
    SNAPSHOT/fs_errors.json paths whose read failed live, with the errno name
    SNAPSHOT/kmsg.txt       /dev/kmsg records

`capture` writes into a temporary sibling folder and renames it into place,
so an interrupted capture never leaves a half-written snapshot behind.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import __version__
from agent.errors import SnapshotError
from agent.profiles import data_dir
from agent.sources.fsroot import LiveFs, RecordingFs, SnapshotFs
from agent.sources.host import read_host_facts
from agent.sources.kmsg import KMSG_DEVICE, read_live_kmsg
from agent.yamlfile import load_yaml_file

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Read on capture besides the profiles' own keys: what support engineers ask for.
CAPTURE_SYSCTLS = (
    "vm.swappiness", "vm.max_map_count", "vm.overcommit_memory", "kernel.pid_max",
    "net.core.somaxconn", "net.core.netdev_max_backlog", "net.core.rmem_default",
    "net.core.wmem_default", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "fs.file-max",
)


@dataclass(frozen=True)
class Snapshot:
    path: Path
    meta: dict[str, Any]

    @property
    def captured(self) -> list[str]:
        return [str(c) for c in self.meta.get("captured", [])]

    def has(self, source: str) -> bool:
        return source in self.captured

    def fs(self) -> SnapshotFs:
        return SnapshotFs(self.path)

    @property
    def kmsg_path(self) -> Path:
        return self.path / "kmsg.txt"


def simulated_nodes_dir() -> Path:
    return data_dir("fixtures") / "nodes"


def list_simulated() -> list[str]:
    base = simulated_nodes_dir()
    return sorted(p.name for p in base.iterdir() if (p / "meta.yaml").is_file())


def simulated_path(name: str) -> Path:
    if not _NAME_RE.match(name):
        raise SnapshotError(f"invalid simulated node name {name!r}")
    path = simulated_nodes_dir() / name
    if not (path / "meta.yaml").is_file():
        raise SnapshotError(f"no simulated node {name!r} (available: {', '.join(list_simulated())})")
    return path


def open_snapshot(path: Path) -> Snapshot:
    if not path.is_dir():
        raise SnapshotError("snapshot directory does not exist", path=str(path))
    meta_path = path / "meta.yaml"
    if not meta_path.is_file():
        raise SnapshotError("not a snapshot: meta.yaml is missing", path=str(path))
    meta, lines = load_yaml_file(meta_path, SnapshotError)
    if not isinstance(meta, dict):
        raise SnapshotError("meta.yaml must be a mapping", path=str(meta_path), line=1)
    captured = meta.get("captured")
    if not isinstance(captured, list) or not all(isinstance(c, str) for c in captured):
        raise SnapshotError("`captured` must list the recorded sources, e.g. [host, kmsg]",
                            path=str(meta_path), line=lines.line_for(("captured",)))
    if "host" in captured and not (path / "fs").is_dir():
        raise SnapshotError("partial snapshot: meta.yaml says host was captured but fs/ is missing",
                            path=str(path))
    if "kmsg" in captured and not (path / "kmsg.txt").is_file():
        raise SnapshotError("partial snapshot: meta.yaml says kmsg was captured but kmsg.txt is missing",
                            path=str(path))
    return Snapshot(path, meta)


def _prepare_out(out: Path) -> Path:
    import tempfile  # capture-only imports stay off the audit path
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SnapshotError("output exists and is not an empty directory; refusing to overwrite",
                            path=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))


def _finish(tmp: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty, checked above
    os.replace(tmp, out)


def write_meta(path: Path, hostname: str, captured: list[str], **extra: Any) -> None:
    import yaml
    meta = {
        "hostname": hostname,
        "captured_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "nodewarden_version": __version__,
        "captured": captured,
        **extra,
    }
    (path / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")


def _capture_nvml(tmp: Path, backend: Any) -> str | None:
    """Record every NVML answer into nvml.json; None on success, else why not."""
    from agent.sources import nvml

    if backend is None:
        try:
            backend = nvml.load_live_nvml()
        except ImportError as exc:
            return f"nvml not captured: pynvml is not installed ({exc})"
    recorder = nvml.RecordingNvml(backend)
    _facts, status = nvml.read_nvml(recorder)
    if not status.ok and not recorder.devices:
        return f"nvml not captured: {status.error}"
    (tmp / "nvml.json").write_text(json.dumps(recorder.to_json(), indent=1, sort_keys=True), encoding="utf-8")
    return None


def _capture_bmc(tmp: Path, options: Any) -> tuple[list[str], list[str]]:
    """Record what the BMC answered: the Redfish tree (mockup layout) and/or ipmi.json."""
    captured: list[str] = []
    notes: list[str] = []
    if options.url:
        from agent.sources import redfish

        password = options.password.reveal() if options.password else ""
        recorders: list[redfish.RecordingRedfish] = []

        def make() -> redfish.RecordingRedfish:
            recorders.append(redfish.RecordingRedfish(redfish.LiveRedfish(
                options.url, options.user or "", password, ca_file=options.ca_file, insecure=options.insecure,
                timeout_s=options.timeout_s)))
            return recorders[-1]

        _facts, status, _transport = redfish.read_redfish(make, concurrency=options.concurrency,
                                                          deadline_s=options.deadline_s, insecure=options.insecure)
        if recorders and recorders[-1].answers:
            recorders[-1].write(tmp)
            captured.append("redfish")
        if not status.ok:
            notes.append(f"redfish: {status.error}")
    if options.ipmi_host:
        from agent.sources import ipmi

        password = options.password.reveal() if options.password else ""
        _facts, status, raw = ipmi.read_ipmi_live(options.ipmi_host, options.ipmi_port, options.user or "",
                                                  password, timeout_s=options.deadline_s)
        if raw:
            (tmp / "ipmi.json").write_text(json.dumps(raw, indent=1, sort_keys=True, default=str), encoding="utf-8")
            captured.append("ipmi")
        if not status.ok:
            notes.append(f"ipmi: {status.error}")
    return captured, notes


def capture_live(out: Path, sysctl_keys: list[str], root: LiveFs | None = None,
                 kmsg_device: str = KMSG_DEVICE, nvml_backend: Any = None, bmc: Any = None) -> list[str]:
    """Record this node's host files, kernel log and NVML answers into `out`.

    `root`, `kmsg_device` and `nvml_backend` exist for tests, which capture a
    fake root and a replayed NVML.
    """
    import shutil

    tmp = _prepare_out(out)
    try:
        recorder = RecordingFs(root or LiveFs("/"))
        facts = read_host_facts(recorder, [*sysctl_keys, *CAPTURE_SYSCTLS])
        fs_dir = tmp / "fs"
        fs_dir.mkdir()
        for rel in sorted(recorder.dirs):
            (fs_dir / rel).mkdir(parents=True, exist_ok=True)
        for rel, data in sorted(recorder.files.items()):
            target = fs_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (tmp / SnapshotFs.LINKS_FILE).write_text(json.dumps(recorder.links, indent=1, sort_keys=True))
        if recorder.errors:
            (tmp / SnapshotFs.ERRORS_FILE).write_text(json.dumps(recorder.errors, indent=1, sort_keys=True))
        captured = ["host"]
        records, raw = read_live_kmsg(kmsg_device)
        if not isinstance(records, tuple) and not raw:
            notes = [f"kmsg not captured: {records.reason}"]
        else:
            (tmp / "kmsg.txt").write_text("\n".join(raw) + ("\n" if raw else ""), encoding="utf-8")
            captured.append("kmsg")
            notes = []
        nvml_note = _capture_nvml(tmp, nvml_backend)
        if nvml_note is None:
            captured.append("nvml")
        else:
            notes.append(nvml_note)
        if bmc is not None and bmc.configured:
            bmc_captured, bmc_notes = _capture_bmc(tmp, bmc)
            captured += bmc_captured
            notes += bmc_notes
        hostname = facts.hostname if isinstance(facts.hostname, str) else "unknown"
        write_meta(tmp, hostname, captured, notes=notes)
        _finish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return captured


def copy_snapshot(source: Snapshot, out: Path) -> list[str]:
    """A writable copy of a recorded (or simulated) node, e.g. to practise on."""
    import shutil
    tmp = _prepare_out(out)
    try:
        shutil.rmtree(tmp)
        shutil.copytree(source.path, tmp, symlinks=False)
        _finish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return source.captured
