"""Opening a node (live, snapshot or simulated) and describing it: identity, node info, a snapshot's inputs.

Its sources are read through `agent.sources.registry` (each `Source` reads live or from the recording);
`agent.engine.audit` decides which to read and judges them. Nothing here evaluates a check.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.core.errors import NodewardenError
from agent.core.facts import BmcFacts, HostFacts
from agent.core.model import Evidence, Unknown
from agent.core.numbers import parse_iso_time
from agent.policy.matching import Identity, identify, identify_bmc
from agent.sources.fsroot import FsRoot, LiveFs
from agent.sources.registry import BMC, HOST, NVML
from agent.sources.snapshot import Snapshot, open_snapshot, simulated_path
from agent.sources.source import ReadOptions

EVIDENCE_AREAS_MAX = 200  # fact areas read back from meta.yaml `evidence` (an import writes ~30)
EVIDENCE_REFS_MAX = 20  # inputs per area, and per finding (bundle.MAX_EVIDENCE)


class NodeRequest(Protocol):
    """What opening a node needs of a request (`agent.engine.audit.AuditRequest` is one)."""

    @property
    def simulate(self) -> str | None: ...

    @property
    def snapshot(self) -> Path | None: ...


@dataclass
class NodeSource:
    """Where facts come from: the live machine or a recorded snapshot (read through `agent.sources.registry`)."""

    mode: str  # live | snapshot | simulated
    fs: FsRoot | None  # None: a snapshot without host data (e.g. an nvidia-smi import)
    snapshot: Snapshot | None = None

    @property
    def recorded(self) -> bool:
        return self.snapshot is not None

    def captured(self, source: str) -> bool:
        return self.snapshot is None or self.snapshot.has(source)


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
            from agent.sources.importers.archive import extract_archive
            # The report names the archive the user gave, not the private folder it is read from.
            snap = dataclasses.replace(open_snapshot(extract_archive(path)), origin=str(path))
        else:
            snap = open_snapshot(path)
        return NodeSource("snapshot", snap.fs() if snap.has("host") else None, snap)
    return NodeSource("live", LiveFs("/"))


def node_identity(node: NodeSource, nvml_timeout_s: float = 10.0) -> Identity:
    """What profile matching sees: PCI ids and DMI, or NVML's GPUs without host data."""
    options = ReadOptions(nvml_timeout_s=nvml_timeout_s)
    if node.fs is not None:
        # As the audit: NVML's names place GPUs no id rule lists, its ids count where PCI shows no GPU.
        nvml = NVML.read(node, options)[0] if node.captured("nvml") else None
        return identify(HOST.read(node, options)[0], nvml)
    if not node.captured("nvml") and (node.captured("redfish") or node.captured("ipmi")):
        bmc, _statuses = BMC.read(node, options)  # a BMC-only snapshot: match on what Redfish says
        if isinstance(bmc, BmcFacts):
            return identify_bmc(bmc)
    nvml, _status = NVML.read(node, options)
    return identify(HOST.absent("not in this snapshot"), nvml)


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
    stamp = parse_iso_time(text)
    if stamp is None:  # unparsable, or year 1/9999 (overflows in arithmetic): judged from now, and said so
        if text:
            logging.getLogger(__name__).warning("snapshot meta.yaml: captured_at %r is not a usable time "
                                                "(ISO 8601, years 1970-9000); events are judged from now", text[:64])
        return now
    return stamp


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
