"""The audit: sources -> facts -> checks(profile) -> findings -> report.

Data flows one way. The engine opens the node (live, snapshot or simulated),
reads each source with its status timed, picks the profile, runs the checks
and applies waivers. It never formats output; `agent.report` does that.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agent import __version__
from agent.binding import bind_bmc
from agent.config import Config
from agent.credentials import BmcOptions
from agent.errors import AuditError, NodewardenError, SnapshotError
from agent.facts import (
    NO_BASELINE,
    Baseline,
    BmcBinding,
    BmcFacts,
    HostFacts,
    KmsgRecord,
    NodeFacts,
    NvmlFacts,
    ProfileMatch,
)
from agent.host_parts import mask_missing_parts
from agent.matching import Identity, Selection, identify, identify_bmc, select
from agent.model import Evidence, Finding, SourceStatus, Status, Unknown, Unsupported
from agent.profiles import Profile, ProfileStore
from agent.snapshot import Snapshot, open_snapshot, simulated_path
from agent.sources.fsroot import FsRoot, LiveFs
from agent.sources.host import absent_host_facts, read_host_facts, read_sysctls
from agent.sources.kmsg import read_live_kmsg, read_recorded_kmsg
from agent.sources.xid import parse_xids
from agent.waivers import apply_waivers, load_waivers
from checks import Check, all_checks, run_checks

T = TypeVar("T")
REPORT_SCHEMA = "nodewarden.report/v1"
# Checks about the audit itself: kept under --only unless skipped by name.
ALWAYS_CHECKS = ("profile.match", "source.available")
NVML_SOURCES = ("nvml",)  # cross-checks use whichever views the other checks needed
BMC_SOURCES = ("bmc",)
RECORDING_MAX_BYTES = 32 << 20  # ipmi.json: a full SEL is a few MB
NOT_IN_BMC_AUDIT = "not in this audit (BMC only)"


@dataclass
class AuditRequest:
    config: Config
    simulate: str | None = None
    snapshot: Path | None = None
    profile: str | None = None  # None: from config; "auto": match
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    today: dt.date | None = None
    nvml_timeout_s: float = 10.0
    bmc: BmcOptions = field(default_factory=BmcOptions)


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


def open_node(request: AuditRequest) -> NodeSource:
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


@dataclass
class Report:
    node: dict[str, Any]
    profile: str
    profile_chain: tuple[str, ...]
    started_at: str
    duration_s: float
    sources: dict[str, SourceStatus]
    findings: list[Finding]
    extra: dict[str, Any] = field(default_factory=dict)
    facts: NodeFacts | None = field(default=None, repr=False, compare=False)  # for planners; not serialised

    def summary(self) -> dict[str, int]:
        counts = {s: 0 for s in ("pass", "warn", "fail", "unknown", "skip", "waived", "fixed")}
        for finding in self.findings:
            counts["waived" if finding.waiver else finding.status.value] += 1
        return counts

    @property
    def exit_code(self) -> int:
        failed = any(f.status is Status.FAIL and f.waiver is None for f in self.findings)
        return 1 if failed else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "nodewarden_version": __version__,
            "node": self.node,
            "profile": self.profile,
            "profile_chain": list(self.profile_chain),
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 6),
            "sources": {name: status.to_json() for name, status in sorted(self.sources.items())},
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary(),
            **self.extra,
        }


def _skips_source(skip: Iterable[str], source: str) -> bool:
    """Whether `--skip` removed every check whose own source is `source` (`--skip 'gpu.*'` for NVML)."""
    own = [c for c in all_checks() if c.source == source]
    return bool(own) and all(any(fnmatch.fnmatchcase(c.id, g) for g in skip) for c in own)


def select_checks(checks: Iterable[Check], only: Iterable[str], skip: Iterable[str]) -> list[Check]:
    only, skip = list(only), list(skip)
    selected = []
    for check in checks:
        if any(fnmatch.fnmatchcase(check.id, g) for g in skip):
            continue
        if only and check.id not in ALWAYS_CHECKS and not any(fnmatch.fnmatchcase(check.id, g) for g in only):
            continue
        selected.append(check)
    return selected


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


def _source_configured(source: str, sources: dict[str, SourceStatus]) -> bool:
    if source == "bmc":
        return any(sources[s].configured for s in ("redfish", "ipmi") if s in sources)
    if source == "crosscheck":
        return True  # cross-checks decide for themselves which views they have
    status = sources.get(source)
    return status is None or status.configured


def read_host(node: NodeSource) -> tuple[HostFacts, SourceStatus]:
    fs = node.fs
    assert fs is not None
    try:
        return _timed("host", lambda: read_host_facts(fs))
    except NodewardenError:
        raise
    except OSError as exc:  # the parsers catch per-file errors; this is the root itself
        raise AuditError(f"cannot read the host ({fs.description}): {exc}") from exc


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


EVIDENCE_AREAS_MAX = 200  # fact areas read back from meta.yaml `evidence` (an import writes ~30)
EVIDENCE_REFS_MAX = 20  # inputs per area, and per finding (bundle.MAX_EVIDENCE)
_EVIDENCE_SOURCES = ("host", "nvml", "kmsg", "redfish", "ipmi", "subject")


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


def _areas_of(area: str, subject: str, evidence: dict[str, tuple[Evidence, ...]]) -> list[str]:
    """The meta.yaml areas one of a check's `fact_areas` names ("sysctl" -> host.sysctl, "ipmi" -> ipmi.*)."""
    if area == "subject":
        area = subject if subject in _EVIDENCE_SOURCES[:-1] else ""
    elif area not in _EVIDENCE_SOURCES and "." not in area:
        area = f"host.{area}"  # a host part by name (agent.host_parts.HOST_PARTS)
    if not area:
        return []
    if area in ("host", "ipmi"):
        return [key for key in evidence if key.startswith(area + ".")]
    return [area]


def attach_evidence(findings: list[Finding], evidence: dict[str, tuple[Evidence, ...]]) -> None:
    """Each finding of an imported snapshot gets the inputs its check's fact areas came from (none: omitted)."""
    if not evidence:
        return
    checks = {c.id: c for c in all_checks()}
    for finding in findings:
        check = checks.get(finding.check)
        if check is None:  # waiver.expired and the like: no input behind them
            continue
        refs: list[Evidence] = []
        for area in check.fact_areas:
            for key in _areas_of(area, finding.subject, evidence):
                refs.extend(r for r in evidence.get(key, ()) if r not in refs)
        if refs:
            finding.evidence = tuple(refs[:EVIDENCE_REFS_MAX])


def run_audit(request: AuditRequest, store: ProfileStore | None = None) -> Report:
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    config = request.config
    node = open_node(request)
    sources: dict[str, SourceStatus] = {}

    if node.captured("host"):
        host, sources["host"] = read_host(node)
    elif node.captured("nvml"):
        host = absent_host_facts("not in this snapshot (it holds NVML data only)")
        sources["host"] = SourceStatus("host", ok=False, configured=False, error="not in snapshot")
    elif node.captured("kmsg") and not (node.captured("redfish") or node.captured("ipmi")):
        # A kernel log alone (a customer's dmesg): the Xid and SXid checks judge it, nothing else runs.
        host = absent_host_facts("not in this snapshot (it holds a kernel log only)")
        sources["host"] = SourceStatus("host", ok=False, configured=False, error="not in snapshot")
    elif node.captured("redfish") or node.captured("ipmi") or request.bmc.configured:
        # A BMC alone (issue 13 rule 2): the profile comes from Redfish, host and GPU checks skip.
        host = absent_host_facts(NOT_IN_BMC_AUDIT)
        sources["host"] = SourceStatus("host", ok=False, configured=False, error=NOT_IN_BMC_AUDIT)
    else:
        raise AuditError("the snapshot holds neither host nor NVML data, nor a BMC (see `captured` in meta.yaml)")

    checks = select_checks(all_checks(), request.only, request.skip)
    # --only/--skip choose checks, never the profile: what matching reads is read regardless.
    # NVML names the GPUs where PCI cannot; the BMC the node where there is no host or no GPU.
    match_on_nvml = isinstance(host.nvidia_gpus, Unknown) or identify(host).without_gpu
    nvml: NvmlFacts | Unknown
    if match_on_nvml or any(c.source in NVML_SOURCES or "nvml" in c.reads or (
            "nvml" in c.optional_reads and not _skips_source(request.skip, "nvml")) for c in checks
                            if c.id not in ALWAYS_CHECKS):
        nvml, sources["nvml"] = node.read_nvml(request.nvml_timeout_s)
    else:
        nvml = Unknown("not read: no selected check needs NVML")
        sources["nvml"] = SourceStatus("nvml", ok=False, configured=False, error="not needed by the selected checks")

    store = store or ProfileStore(config.profile_dirs, config.overrides_file)
    profile = choose_profile(request, store, host, nvml)[0]
    if node.fs is not None:
        missing = [k for k in profile.sysctl_keys if k not in host.sysctl]
        host.sysctl.update(read_sysctls(node.fs, missing))
    parts = node.snapshot.meta.get("host_parts") if node.snapshot is not None else None
    if isinstance(parts, list):  # an imported snapshot: what its inputs did not give is not evidence
        host = mask_missing_parts(host, [str(p) for p in parts])

    kmsg: tuple[KmsgRecord, ...] | Unknown
    if node.captured("kmsg"):
        kmsg, sources["kmsg"] = _timed("kmsg", node.read_kmsg)
        if isinstance(kmsg, Unknown):
            sources["kmsg"].ok, sources["kmsg"].error = False, kmsg.reason
    else:
        kmsg = Unsupported("the snapshot holds no kernel log")
        sources["kmsg"] = SourceStatus("kmsg", ok=False, configured=False, error="not in snapshot")

    bmc: BmcFacts | Unknown
    has_bmc = request.bmc.configured or (node.snapshot is not None and (
        node.snapshot.has("redfish") or node.snapshot.has("ipmi")))
    match_on_bmc = has_bmc and (identify(host, nvml).without_gpu or not (
        sources["host"].configured or sources["nvml"].configured))
    if match_on_bmc or any(c.source in BMC_SOURCES or "bmc" in c.reads for c in checks if c.id not in ALWAYS_CHECKS):
        bmc, bmc_sources = read_bmc(node, request.bmc)
        sources.update(bmc_sources)
    else:
        bmc = Unsupported("not read: no selected check needs the BMC")
        for name in ("redfish", "ipmi"):
            sources[name] = SourceStatus(name, ok=False, configured=False, error="not needed by the selected checks")
    from agent.sources.baseline import load_node_baseline

    baseline = load_node_baseline(node, config)
    report = evaluate(request, store, node, host, nvml, kmsg, bmc, sources, started, time.monotonic() - t0,
                      baseline=baseline)
    if node.snapshot is not None and "inputs" in node.snapshot.meta:  # an import: each source names its inputs
        for source, names in snapshot_feeds(node.snapshot).items():
            if source in report.sources and names:
                report.sources[source].detail["inputs"] = names
        attach_evidence(report.findings, snapshot_evidence(node.snapshot))
    return report


def _bind(request: AuditRequest, store: ProfileStore, host: HostFacts, nvml: NvmlFacts | Unknown,
          bmc: BmcFacts | Unknown, sources: dict[str, SourceStatus],
          ) -> tuple[dict[str, SourceStatus], BmcBinding, bool]:
    """Is the BMC this host's (rule 2), and is it audited alone (no host, or a jump host without GPUs)?"""
    def configured(name: str) -> bool:
        return name in sources and sources[name].configured

    alone = isinstance(bmc, BmcFacts) and not configured("host") and not configured("nvml")
    binding = bind_bmc(host, bmc, bmc_only=alone)
    if not alone and isinstance(bmc, BmcFacts) and binding.state == "remote" and \
            choose_profile(request, store, host, nvml)[1].how == "no_gpu":
        # A host without NVIDIA GPUs (a jump host) reading another node's BMC: that node is audited. An
        # identity that cannot be read (not root, IPMI) keeps no-nvidia-gpu, which judges the BMC as before.
        alone = True
        binding = BmcBinding("bmc_only", f"BMC-only audit from a host without NVIDIA GPUs: {binding.message}",
                             binding.observed)
    if alone:
        sources = {**sources, **{name: SourceStatus(name, ok=False, configured=False, error=NOT_IN_BMC_AUDIT)
                                 for name in ("host", "nvml", "kmsg") if name in sources}}
    return sources, binding, alone


def _bmc_node_info(bmc: BmcFacts, node: NodeSource, identity: Identity) -> dict[str, Any]:
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


def choose_profile(request: AuditRequest, store: ProfileStore, host: HostFacts,
                   nvml: NvmlFacts | Unknown, bmc: BmcFacts | None = None) -> tuple[Profile, Selection, Identity]:
    """The profile the request names (or the config does), else the one the hardware matches.

    `bmc`: the BMC is the node audited (no host in the audit): match on what Redfish says.
    """
    config = request.config
    identity = identify_bmc(bmc) if bmc is not None else identify(host, nvml)
    forced = request.profile if request.profile not in (None, "auto") else (
        config.profile if request.profile is None and config.profile != "auto" else None)
    selection = select(identity, store, forced)
    return selection.profile, selection, identity


def evaluate(request: AuditRequest, store: ProfileStore, node: NodeSource, host: HostFacts,
             nvml: NvmlFacts | Unknown, kmsg: tuple[KmsgRecord, ...] | Unknown, bmc: BmcFacts | Unknown,
             sources: dict[str, SourceStatus], started: dt.datetime, read_s: float,
             baseline: Baseline | Unknown = NO_BASELINE) -> Report:
    """Facts already read -> checks -> waivers -> report. The daemon calls this on its cached facts."""
    t0 = time.monotonic()
    config = request.config
    sources, binding, bmc_alone = _bind(request, store, host, nvml, bmc, sources)
    profile, selection, identity = choose_profile(request, store, host, nvml,
                                                  bmc if bmc_alone and isinstance(bmc, BmcFacts) else None)
    xids = kmsg if isinstance(kmsg, Unknown) else parse_xids(kmsg)
    facts = NodeFacts(host=host, kmsg=kmsg, sources=sources, nvml=nvml, xids=xids, bmc=bmc,
                      observed_at=observed_at(node, started), baseline=baseline, profile_match=ProfileMatch(
        profile=profile.name, how=selection.how, identity=identity.describe(),
        matched_on=selection.matched_on, also_matched=selection.also_matched,
        problems=identity.problems,
    ), binding=binding)
    checks = select_checks(all_checks(), request.only, request.skip)
    # A source that was not asked for (not in the snapshot, not configured) is
    # reported once by source.available; its checks produce nothing.
    runnable = [c for c in checks if c.id in ALWAYS_CHECKS or _source_configured(c.source, sources)]
    if selection.how == "no_gpu" or bmc_alone:  # not a GPU node / a BMC alone: the audit itself and the BMC
        runnable = [c for c in runnable if c.id in ALWAYS_CHECKS or c.source in BMC_SOURCES or "bmc" in c.reads]
    findings = run_checks(runnable, facts, profile)
    if config.waivers_file is not None:
        findings = apply_waivers(findings, load_waivers(config.waivers_file, (c.id for c in all_checks())),
                                 request.today or dt.date.today())
    return Report(
        node=_bmc_node_info(bmc, node, identity) if bmc_alone and isinstance(bmc, BmcFacts) else {
            **node_info(host, node), "bmc_binding": binding.state},
        profile=profile.name,
        profile_chain=profile.chain,
        started_at=started.isoformat(timespec="seconds"),
        duration_s=read_s + time.monotonic() - t0,
        sources=sources,
        findings=findings,
        facts=facts,
    )


