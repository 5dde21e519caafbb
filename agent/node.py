"""Reading a node: open it (live, snapshot or simulated), read each source with its status, describe it.

`agent.engine` judges what is read here (profile, checks, waivers -> `Report`); the daemon opens the node
and reads its BMC through the same functions. Nothing here evaluates a check.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent.credentials import BmcOptions
from agent.errors import AuditError, NodewardenError, SnapshotError
from agent.facts import BmcFacts, HostFacts, KmsgRecord, NvmlFacts
from agent.matching import Identity, identify, identify_bmc
from agent.model import Evidence, SourceStatus, Unknown, Unsupported
from agent.snapshot import Snapshot, open_snapshot, simulated_path
from agent.sources.fsroot import FsRoot, LiveFs
from agent.sources.host import absent_host_facts, read_host_facts
from agent.sources.kmsg import read_live_kmsg, read_recorded_kmsg

T = TypeVar("T")
RECORDING_MAX_BYTES = 32 << 20  # ipmi.json: a full SEL is a few MB
EVIDENCE_AREAS_MAX = 200  # fact areas read back from meta.yaml `evidence` (an import writes ~30)
EVIDENCE_REFS_MAX = 20  # inputs per area, and per finding (bundle.MAX_EVIDENCE)


class NodeRequest(Protocol):
    """What opening a node needs of a request (`agent.engine.AuditRequest` is one)."""

    @property
    def simulate(self) -> str | None: ...

    @property
    def snapshot(self) -> Path | None: ...


@dataclass
class NodeSource:
    """Where facts come from: the live machine or a recorded snapshot."""

    mode: str  # live | snapshot | simulated
    fs: FsRoot | None  # None: a snapshot without host data (e.g. an nvidia-smi import)
    snapshot: Snapshot | None = None

    @property
    def recorded(self) -> bool:
        return self.snapshot is not None

    def read_kmsg(self) -> tuple[KmsgRecord, ...] | Unknown:
        if self.snapshot is None:
            records, _raw = read_live_kmsg()
            return records
        return read_recorded_kmsg(self.snapshot.kmsg_path)

    def captured(self, source: str) -> bool:
        return self.snapshot is None or self.snapshot.has(source)

    def read_nvml(self, timeout_s: float) -> tuple[NvmlFacts | Unknown, SourceStatus]:
        from agent.sources import nvml  # pynvml only when GPUs are read

        if self.snapshot is None:
            return nvml.probe_live_nvml(timeout_s)
        if not self.snapshot.has("nvml"):
            return Unknown("not in snapshot"), SourceStatus("nvml", ok=False, configured=False,
                                                            error="not in snapshot")
        backend = nvml.RecordedNvml.from_file(self.snapshot.path / "nvml.json")
        facts, status = nvml.read_nvml(backend, timeout_s)
        status.detail["recorded"] = True
        return facts, status


def read_bmc(node: NodeSource, options: BmcOptions, sensors_only: bool = False,
             ) -> tuple[BmcFacts | Unknown, dict[str, SourceStatus]]:
    """Redfish first, IPMI where Redfish is missing or has no usable sensors.

    A BMC named on the command line (`--bmc`, `--ipmi`) is read live even for a
    recorded host: the snapshot's BMC is used only when none is named.
    `sensors_only` walks Redfish from the chassis only (the daemon's frequent poll).
    """
    from agent.sources import ipmi, redfish

    statuses: dict[str, SourceStatus] = {}
    redfish_facts: BmcFacts | Unknown | None = None
    ipmi_facts: BmcFacts | Unknown | None = None
    snap = node.snapshot
    paths = redfish.SENSOR_START if sensors_only else (redfish.ROOT,)
    if snap is not None and not options.configured:
        if snap.has("redfish"):
            redfish_facts, statuses["redfish"], _ = redfish.read_redfish(
                lambda: redfish.RecordedRedfish(snap.path), concurrency=options.concurrency,
                deadline_s=options.deadline_s, paths=paths)
        if snap.has("ipmi"):
            ipmi_facts, statuses["ipmi"] = ipmi.read_ipmi_recorded(_load_json(snap.path / "ipmi.json"))
    else:
        if options.url:
            user, password = options.user or "", options.password.reveal() if options.password else ""
            url = options.url
            redfish_facts, statuses["redfish"], _ = redfish.read_redfish(
                lambda: redfish.LiveRedfish(url, user, password, ca_file=options.ca_file, insecure=options.insecure,
                                            timeout_s=options.timeout_s, concurrency=options.concurrency,
                                            deadline_s=options.deadline_s),
                concurrency=options.concurrency, deadline_s=options.deadline_s, insecure=options.insecure,
                paths=paths)
        if options.ipmi_host:
            ipmi_facts, statuses["ipmi"], _raw = ipmi.read_ipmi_live(
                options.ipmi_host, options.ipmi_port, options.user or "",
                options.password.reveal() if options.password else "", timeout_s=options.deadline_s)
    for name in ("redfish", "ipmi"):
        if name not in statuses:
            flag = "--bmc URL" if name == "redfish" else "--ipmi HOST"
            statuses[name] = SourceStatus(name, ok=False, configured=False, error="not in snapshot" if (
                snap is not None and not options.configured) else f"not configured ({flag})")
    return merge_bmc(redfish_facts, ipmi_facts), statuses


def merge_bmc(redfish_facts: BmcFacts | Unknown | None, ipmi_facts: BmcFacts | Unknown | None
              ) -> BmcFacts | Unknown:
    """Redfish's view, with IPMI's sensors where Redfish has none that report."""
    if not isinstance(redfish_facts, BmcFacts):
        if isinstance(ipmi_facts, BmcFacts):
            return ipmi_facts
        return redfish_facts or ipmi_facts or Unsupported("no BMC configured")
    if not isinstance(ipmi_facts, BmcFacts):
        return redfish_facts
    merged = redfish_facts
    for part in ("temperatures", "fans", "psus"):
        ours = getattr(redfish_facts, part)
        # Old Redfish services list every sensor as Absent (often with 0 readings).
        usable = not isinstance(ours, Unknown) and any(getattr(item, "state", None) != "Absent" for item in ours)
        if not usable and not isinstance(getattr(ipmi_facts, part), Unknown):
            merged = merged._replace(**{part: getattr(ipmi_facts, part)})
    if isinstance(merged.events, Unknown) and not isinstance(ipmi_facts.events, Unknown):
        merged = merged._replace(events=ipmi_facts.events)
    return merged


def _load_json(path: Path) -> Any:
    from agent.jsonfile import JsonInputError, load_json_file

    try:
        return load_json_file(path, max_bytes=RECORDING_MAX_BYTES)
    except JsonInputError:
        raise
    except OSError as exc:
        raise SnapshotError(f"unreadable: {exc}", path=str(path)) from None


def open_node(request: NodeRequest) -> NodeSource:
    """The node a request names: a simulated node, a snapshot (a folder or a captured .tar.gz), or this machine."""
    if request.simulate and request.snapshot:
        raise NodewardenError("--simulate and --snapshot are mutually exclusive")
    if request.simulate:
        snap = open_snapshot(simulated_path(request.simulate))
        return NodeSource("simulated", snap.fs() if snap.has("host") else None, snap)
    if request.snapshot:
        path = request.snapshot
        if path.is_file():  # node.tar.gz from `snapshot capture --out FILE.tar.gz`
            from agent.importers.archive import extract_archive
            # The report names the archive the user gave, not the private folder it is read from.
            snap = dataclasses.replace(open_snapshot(extract_archive(path)), origin=str(path))
        else:
            snap = open_snapshot(path)
        return NodeSource("snapshot", snap.fs() if snap.has("host") else None, snap)
    return NodeSource("live", LiveFs("/"))


def node_identity(node: NodeSource, nvml_timeout_s: float = 10.0) -> Identity:
    """What profile matching sees: PCI ids and DMI, or NVML's GPUs without host data."""
    if node.fs is not None:
        return identify(read_host_facts(node.fs))
    if not node.captured("nvml") and (node.captured("redfish") or node.captured("ipmi")):
        bmc, _statuses = read_bmc(node, BmcOptions())  # a BMC-only snapshot: match on what Redfish says
        if isinstance(bmc, BmcFacts):
            return identify_bmc(bmc)
    nvml, _status = node.read_nvml(nvml_timeout_s)
    return identify(absent_host_facts("not in this snapshot"), nvml)


def _timed(name: str, func: Callable[[], T]) -> tuple[T, SourceStatus]:
    start = time.monotonic()
    value = func()
    return value, SourceStatus(name, ok=True, duration_s=time.monotonic() - start)


def read_host(node: NodeSource) -> tuple[HostFacts, SourceStatus]:
    fs = node.fs
    assert fs is not None
    try:
        return _timed("host", lambda: read_host_facts(fs))
    except NodewardenError:
        raise
    except OSError as exc:  # the parsers catch per-file errors; this is the root itself
        raise AuditError(f"cannot read the host ({fs.description}): {exc}") from exc


def read_kmsg(node: NodeSource) -> tuple[tuple[KmsgRecord, ...] | Unknown, SourceStatus]:
    """The kernel log, timed: drained live, or the snapshot's kmsg.txt (none recorded: unsupported)."""
    if not node.captured("kmsg"):
        return Unsupported("the snapshot holds no kernel log"), SourceStatus(
            "kmsg", ok=False, configured=False, error="not in snapshot")
    kmsg, status = _timed("kmsg", node.read_kmsg)
    if isinstance(kmsg, Unknown):
        status.ok, status.error = False, kmsg.reason
    return kmsg, status


def node_info(host: HostFacts, node: NodeSource) -> dict[str, Any]:
    gpus = host.nvidia_gpus
    dmi = host.dmi

    def known(value: Any) -> Any:
        return None if isinstance(value, Unknown) else value

    hostname = known(host.hostname) or (os.uname().nodename if node.mode == "live" else None)
    vendor, product = known(dmi.get("sys_vendor")), known(dmi.get("product_name"))
    info: dict[str, Any] = {
        "hostname": hostname,
        "model": " ".join(x for x in (vendor, product) if x) or None,
        "bios_version": known(dmi.get("bios_version")),
        "kernel": known(host.kernel_release),
        "nvidia_driver": known(host.nvidia_driver),
        "gpus": {
            "pci_count": None if isinstance(gpus, Unknown) else len(gpus),
            "pci_ids": None if isinstance(gpus, Unknown) else sorted({g.pci_id for g in gpus}),
        },
        "mode": node.mode,
    }
    if node.snapshot is not None:
        info["snapshot"] = snapshot_info(node.snapshot)
    return info


_INPUT_SOURCES = {"nvidia-smi": ("nvml",), "kernel-log": ("kmsg",), "lspci": ("host",), "dmidecode": ("host",),
                  "ibstat": ("host",), "ipmitool": ("ipmi",), "redfish": ("redfish",),
                  "nvidia-bug-report": ("host", "kmsg", "nvml")}


def snapshot_info(snap: Snapshot) -> dict[str, Any]:
    """The report's node.snapshot: where, when, and for an imported one the inputs it was made from."""
    info: dict[str, Any] = {"path": snap.origin or str(snap.path), "captured_at": snap.meta.get("captured_at")}
    raw = snap.meta.get("inputs")
    if isinstance(raw, list):  # meta.yaml is untrusted: only its plain fields, bounded
        def text(value: object) -> str | None:
            return value[:300] if isinstance(value, str) else None

        inputs = []
        for entry in raw[:1000]:
            if not isinstance(entry, dict):
                continue
            contributed = [str(c)[:300] for c in entry.get("contributed") or [] if isinstance(c, str)]
            skipped = [str(c)[:300] for c in entry.get("skipped") or [] if isinstance(c, str)]
            item: dict[str, Any] = {"name": text(entry.get("name")), "kind": text(entry.get("kind")),
                                    "sha256": text(entry.get("sha256")), "contributed": contributed[:20],
                                    "skipped": len(skipped)}
            if skipped:
                item["skipped_first"] = skipped[:5]
            if text(entry.get("error")):
                item["error"] = text(entry.get("error"))
            inputs.append(item)
        info["inputs"] = inputs
    return info


def snapshot_feeds(snap: Snapshot) -> dict[str, list[str]]:
    """Source -> the imported inputs that fed it (meta.yaml `fed_by`, else by each input's kind)."""
    fed = snap.meta.get("fed_by")
    if isinstance(fed, dict):
        return {str(k): [str(n)[:300] for n in v if isinstance(n, str)][:100] for k, v in fed.items()
                if isinstance(v, list)}
    out: dict[str, list[str]] = {}
    raw = snap.meta.get("inputs")
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, dict) and entry.get("contributed") and isinstance(entry.get("name"), str):
            for source in _INPUT_SOURCES.get(str(entry.get("kind")), ()):
                out.setdefault(source, []).append(entry["name"][:300])
    return out


def observed_at(node: NodeSource, now: dt.datetime) -> dt.datetime:
    """When the node was read: now, or a snapshot's captured_at (events are judged from then)."""
    if node.snapshot is None:
        return now
    text = str(node.snapshot.meta.get("captured_at") or "")
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return now
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)


def bmc_node_info(bmc: BmcFacts, node: NodeSource, identity: Identity) -> dict[str, Any]:
    """The report's `node` for a BMC audited alone: what the BMC says, not the machine nodewarden ran on."""
    def text(value: object) -> str | None:
        return value if isinstance(value, str) else None

    info: dict[str, Any] = {
        "hostname": text(node.snapshot.meta.get("hostname")) if node.snapshot is not None else None,
        "model": " ".join(x for x in (text(bmc.manufacturer), text(bmc.model)) if x) or None,
        "bios_version": text(bmc.bios_version), "kernel": None, "nvidia_driver": None,
        "gpus": {"pci_count": None, "pci_ids": sorted(set(identity.gpu_pci_ids)) or None,
                 "bmc_count": identity.gpu_count},
        "mode": node.mode, "bmc_binding": "bmc_only",
    }
    if node.snapshot is None:
        info["audited_from"] = os.uname().nodename
    else:
        info["snapshot"] = snapshot_info(node.snapshot)
    return info


def snapshot_evidence(snap: Snapshot) -> dict[str, tuple[Evidence, ...]]:
    """meta.yaml `evidence` (fact area -> the inputs that gave it), read back bounded and type-checked.

    meta.yaml is untrusted: only string areas and {file, kind, section} items with string fields are kept,
    each cut to a length; what is left out is simply not shown. The renderers clean the text.
    """
    raw = snap.meta.get("evidence")
    if not isinstance(raw, dict):
        return {}
    out: dict[str, tuple[Evidence, ...]] = {}
    for area, items in raw.items():
        if len(out) >= EVIDENCE_AREAS_MAX:
            break
        if not isinstance(area, str) or not isinstance(items, list) or len(area) > 64:
            continue
        refs: list[Evidence] = []
        for item in items[:EVIDENCE_REFS_MAX]:
            if not isinstance(item, dict):
                continue
            file, kind, section = item.get("file"), item.get("kind"), item.get("section")
            if isinstance(file, str) and file and isinstance(kind, str) and kind:
                ref = Evidence(file[:300], kind[:64], section[:200] if isinstance(section, str) and section else None)
                if ref not in refs:
                    refs.append(ref)
        if refs:
            out[area] = tuple(refs)
    return out
