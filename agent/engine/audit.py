"""The audit: sources -> facts -> checks(profile) -> findings -> report.

Data flows one way. `agent.sources.node` opens the node (live, snapshot or simulated)
and reads each source with its status timed; the engine decides which sources
the selected checks need, picks the profile, runs the checks, applies waivers
and attaches evidence, and returns a `Report` (`agent.report.model`). It never
formats output; `agent.report` does that.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.core.binding import bind_bmc
from agent.core.errors import AuditError
from agent.core.facts import (
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
from agent.core.model import Evidence, Finding, SourceStatus, Unknown, Waiver
from agent.io.credentials import BmcOptions
from agent.policy.config import Config
from agent.policy.matching import (
    Identity,
    Selection,
    bmc_gpus_host_lacks,
    forced_misfit,
    identify,
    identify_bmc,
    select,
)
from agent.policy.profiles import Profile, ProfileStore
from agent.policy.waivers import apply_waivers, load_waivers
from agent.report.model import Report
from agent.sources.host import read_sysctls
from agent.sources.host_parts import mask_missing_parts
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.node import (
    EVIDENCE_REFS_MAX,
    NodeSource,
    bmc_node_info,
    node_info,
    observed_at,
    open_node,
    snapshot_evidence,
    snapshot_feeds,
)
from agent.sources.registry import BMC, HOST, KMSG, NVML
from agent.sources.source import NOT_IN_SNAPSHOT, ReadOptions
from agent.state.layout import DAEMON_DIR, LEDGER_FILE
from checks import Check, all_checks, run_checks
from checks.history import rules_of
from checks.history_counters import counter_rules_of

if TYPE_CHECKING:  # a session is built by the caller: a one-shot audit without a ledger never imports sqlite3
    from agent.engine.history import HistorySession

# Checks about the audit itself: kept under --only unless skipped by name.
ALWAYS_CHECKS = ("profile.match", "source.available")
NVML_SOURCES = ("nvml",)  # cross-checks use whichever views the other checks needed
BMC_SOURCES = ("bmc",)
NOT_IN_BMC_AUDIT = "not in this audit (BMC only)"
NOT_NEEDED = "not needed by the selected checks"
NO_GPU_NOT_NEEDED = "no NVIDIA GPU on PCI and no NVIDIA driver: not needed"


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


def _skips_source(skip: Iterable[str], source: str) -> bool:
    """Whether `--skip` removed every check whose own source is `source` (`--skip 'gpu.*'` for NVML)."""
    own = [c for c in all_checks() if c.source == source and c.input == "facts"]
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


def _source_configured(source: str, sources: dict[str, SourceStatus]) -> bool:
    if source == "bmc":
        return any(sources[s].configured for s in ("redfish", "ipmi") if s in sources)
    if source == "crosscheck":
        return True  # cross-checks decide for themselves which views they have
    status = sources.get(source)
    return status is None or status.configured


_EVIDENCE_SOURCES = ("host", "nvml", "kmsg", "redfish", "ipmi", "subject")


def _areas_of(area: str, subject: str, evidence: dict[str, tuple[Evidence, ...]]) -> list[str]:
    """The meta.yaml areas one of a check's `fact_areas` names ("sysctl" -> host.sysctl, "ipmi" -> ipmi.*)."""
    if area == "subject":
        area = subject if subject in _EVIDENCE_SOURCES[:-1] else ""
    elif area not in _EVIDENCE_SOURCES and "." not in area:
        area = f"host.{area}"  # a host part by name (agent.sources.host_parts.HOST_PARTS)
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

    options = ReadOptions(bmc=request.bmc, nvml_timeout_s=request.nvml_timeout_s)

    if node.captured("host"):
        host, read = HOST.read(node, options)
        sources.update(read)
    elif node.captured("nvml"):
        host = HOST.absent("not in this snapshot (it holds NVML data only)")
        sources.update(HOST.not_read(NOT_IN_SNAPSHOT))
    elif node.captured("kmsg") and not BMC.captured(node):
        # A kernel log alone (a customer's dmesg): the Xid and SXid checks judge it, nothing else runs.
        host = HOST.absent("not in this snapshot (it holds a kernel log only)")
        sources.update(HOST.not_read(NOT_IN_SNAPSHOT))
    elif BMC.captured(node) or request.bmc.configured:
        # A BMC alone (issue 13 rule 2): the profile comes from Redfish, host and GPU checks skip.
        host = HOST.absent(NOT_IN_BMC_AUDIT)
        sources.update(HOST.not_read(NOT_IN_BMC_AUDIT))
    else:
        raise AuditError("the snapshot holds neither host nor NVML data, nor a BMC (see `captured` in meta.yaml)")

    # An audit judges a node's facts: the checks of an acceptance run's series (accept.*) are `accept`'s.
    checks = [c for c in select_checks(all_checks(), request.only, request.skip) if c.input == "facts"]
    # --only/--skip choose checks, never the profile: what matching reads is read regardless.
    # NVML names the GPUs where PCI cannot; the BMC the node where there is no host or no GPU.
    # A profile named (--profile, or the config's) is not matched: NVML is read only if a check needs it.
    forced = request.profile not in (None, "auto") or (request.profile is None and config.profile != "auto")
    match_on_nvml = not forced and (isinstance(host.nvidia_gpus, Unknown) or identify(host).without_gpu)
    nvml: NvmlFacts | Unknown
    if match_on_nvml or any(c.source in NVML_SOURCES or "nvml" in c.reads or (
            "nvml" in c.optional_reads and not _skips_source(request.skip, "nvml")) for c in checks
                            if c.id not in ALWAYS_CHECKS):
        nvml, read = NVML.read(node, options)
        sources.update(read)
    else:
        nvml = NVML.absent("not read: no selected check needs NVML")
        sources.update(NVML.not_needed(NOT_NEEDED))

    store = store or ProfileStore(config.profile_dirs, config.overrides_file)
    profile = choose_profile(request, store, host, nvml)[0]
    if node.fs is not None:
        missing = [k for k in profile.sysctl_keys if k not in host.sysctl]
        host.sysctl.update(read_sysctls(node.fs, missing))
    parts = node.snapshot.meta.get("host_parts") if node.snapshot is not None else None
    if isinstance(parts, list):  # an imported snapshot: what its inputs did not give is not evidence
        host = mask_missing_parts(host, [str(p) for p in parts])

    kmsg, read = KMSG.read(node, options)
    sources.update(read)

    bmc: BmcFacts | Unknown
    has_bmc = request.bmc.configured or (node.snapshot is not None and BMC.captured(node))
    match_on_bmc = has_bmc and (identify(host, nvml).without_gpu or not (
        sources["host"].configured or sources["nvml"].configured))
    if match_on_bmc or any(c.source in BMC_SOURCES or "bmc" in c.reads for c in checks if c.id not in ALWAYS_CHECKS):
        bmc, read = BMC.read(node, options)
        sources.update(read)
    else:
        bmc = BMC.absent("not read: no selected check needs the BMC")
        sources.update(BMC.not_needed(NOT_NEEDED))
    from agent.sources.baseline import load_node_baseline

    baseline = load_node_baseline(node, config)
    history = _node_history(node, config)
    if history is None and node.snapshot is not None and isinstance(kmsg, tuple) and any(r.boot for r in kmsg):
        from agent.engine.history import LogHistory  # a log of several boots, no ledger: history from the log

        history = LogHistory.of(kmsg)
    try:
        report = evaluate(request, store, node, host, nvml, kmsg, bmc, sources, started, time.monotonic() - t0,
                          baseline=baseline, history=history)
    finally:
        if history is not None:
            history.close()
    if node.snapshot is not None and "inputs" in node.snapshot.meta:  # an import: each source names its inputs
        for source, names in snapshot_feeds(node.snapshot).items():
            if source in report.sources and names:
                report.sources[source].detail["inputs"] = names
        attach_evidence(report.findings, snapshot_evidence(node.snapshot))
    return report


def _node_history(node: NodeSource, config: Config) -> HistorySession | None:
    """The ledger a one-shot audit reads (never writes): a snapshot's copy, or the live node's own. None
    when there is none, so a node without history is judged exactly as before (and sqlite3 is not loaded)."""
    import os

    if node.snapshot is not None:
        candidates = [node.snapshot.path / LEDGER_FILE]
    else:
        candidates = [config.state_dir / DAEMON_DIR / LEDGER_FILE, config.state_dir / LEDGER_FILE]
    if not any(os.path.lexists(c) for c in candidates):
        return None
    from agent.engine.history import HistorySession

    if node.snapshot is not None:
        return HistorySession.of_file(candidates[0])
    return HistorySession.open(config.state_dir, source="audit", writable=False)


def _bind(request: AuditRequest, store: ProfileStore, host: HostFacts, nvml: NvmlFacts | Unknown,
          bmc: BmcFacts | Unknown, sources: dict[str, SourceStatus],
          ) -> tuple[dict[str, SourceStatus], BmcBinding, bool]:
    """Is the BMC this host's (rule 2), and is it audited alone (no host, or a jump host without GPUs)?"""
    def configured(name: str) -> bool:
        return name in sources and sources[name].configured

    alone = isinstance(bmc, BmcFacts) and not configured("host") and not configured("nvml")
    binding = bind_bmc(host, bmc, bmc_only=alone)
    if not alone and isinstance(bmc, BmcFacts) and binding.state in ("remote", "unknown"):
        _, selection, identity = choose_profile(request, store, host, nvml)
        lacks = bmc_gpus_host_lacks(bmc, identity) if selection.how == "no_gpu" else 0
        if selection.how == "no_gpu" and (binding.state == "remote" or lacks):
            # A host without NVIDIA GPUs (a jump host) reading another node's BMC: that node is audited. With an
            # identity that cannot be read, the BMC listing GPUs this host cannot have says the same.
            alone = True
            why = binding.message if binding.state == "remote" else \
                f"the BMC lists {lacks} GPU(s) this host does not have (and {binding.message})"
            binding = BmcBinding("bmc_only", f"BMC-only audit from a host without NVIDIA GPUs: {why}",
                                 binding.observed)
    if alone:
        sources = {**sources, **{name: SourceStatus(name, ok=False, configured=False, error=NOT_IN_BMC_AUDIT)
                                 for name in ("host", "nvml", "kmsg") if name in sources}}
    return sources, binding, alone


def needed_sources(sources: dict[str, SourceStatus], selection: Selection, host: HostFacts,
                   ) -> dict[str, SourceStatus]:
    """The one rule for which sources the judged node needs; the audit and the daemon both judge through it.

    A host with positive evidence of no NVIDIA GPU (PCI read and lists none, no driver: profile
    no-nvidia-gpu) has nothing for NVML to say, so NVML failing there is "not needed", never a source
    down (no `nodewarden_source_up{source="nvml"}` series, no NodewardenSourceDown on a jump host).
    """
    nvml = sources.get("nvml")
    no_gpu_on_pci = isinstance(host.nvidia_gpus, tuple) and not host.nvidia_gpus
    if nvml is None or nvml.ok or not nvml.configured or selection.how != "no_gpu" or not no_gpu_on_pci:
        return sources
    return {**sources, **NVML.not_needed(f"{NO_GPU_NOT_NEEDED} ({nvml.error})")}


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
             baseline: Baseline | Unknown = NO_BASELINE, waivers: Sequence[Waiver] | None = None,
             history: HistorySession | None = None) -> Report:
    """Facts already read -> checks -> waivers -> report. The daemon calls this on its cached facts.

    `waivers`: already loaded (the daemon keeps its last good ones); None reads the config's file.
    `history`: the node's ledger (agent.engine.history): incidents recorded, history judged; None: none.
    """
    t0 = time.monotonic()
    config = request.config
    sources, binding, bmc_alone = _bind(request, store, host, nvml, bmc, sources)
    profile, selection, identity = choose_profile(request, store, host, nvml,
                                                  bmc if bmc_alone and isinstance(bmc, BmcFacts) else None)
    sources = needed_sources(sources, selection, host)
    facts = parse_kernel_log(NodeFacts(host=host, kmsg=kmsg, sources=sources, nvml=nvml, bmc=bmc,
                      observed_at=observed_at(node, started), baseline=baseline, profile_match=ProfileMatch(
        profile=profile.name, how=selection.how, identity=identity.describe(),
        matched_on=selection.matched_on, also_matched=selection.also_matched,
        problems=identity.problems, misfit=forced_misfit(profile, identity) if selection.how == "forced" else "",
        id_conflicts=identity.id_conflicts,
    ), binding=binding))
    if history is not None:
        facts = history.observe(facts, rules_of(profile), counter_rules_of(profile))
    checks = [c for c in select_checks(all_checks(), request.only, request.skip) if c.input == "facts"]
    # A source that was not asked for (not in the snapshot, not configured) is
    # reported once by source.available; its checks produce nothing.
    runnable = [c for c in checks if c.id in ALWAYS_CHECKS or _source_configured(c.source, sources)]
    if selection.how == "no_gpu" or bmc_alone:  # not a GPU node / a BMC alone: the audit itself and the BMC
        runnable = [c for c in runnable if c.id in ALWAYS_CHECKS or c.source in BMC_SOURCES or "bmc" in c.reads]
    findings = run_checks(runnable, facts, profile)
    if waivers is None and config.waivers_file is not None:
        waivers = load_waivers(config.waivers_file, (c.id for c in all_checks()))
    if waivers:
        findings = apply_waivers(findings, list(waivers), request.today or dt.date.today())
    if history is not None:
        history.remember(findings, facts)
    return Report(
        node=bmc_node_info(bmc, node, identity) if bmc_alone and isinstance(bmc, BmcFacts) else {
            **node_info(host, node), "bmc_binding": binding.state},
        profile=profile.name,
        profile_chain=profile.chain,
        started_at=started.isoformat(timespec="seconds"),
        duration_s=read_s + time.monotonic() - t0,
        sources=sources,
        findings=findings,
        facts=facts,
    )


