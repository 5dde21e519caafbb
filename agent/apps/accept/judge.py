"""Profile choice and the report of an acceptance run: checks.accept over the recording, waivers, Report.

The profile is chosen as an audit chooses it (agent.engine.audit.choose_profile: `--profile`, the config,
else the hardware match from the host and the run's first NVML read). The report is the audit's
`Report`, so table/JSON/JUnit/Prometheus rendering, waivers and exit codes are the audit's.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from agent.apps.accept.request import AcceptRequest
from agent.apps.accept.sampler import Sampler
from agent.core.facts import NodeFacts
from agent.core.model import SourceStatus, Unknown
from agent.core.series import AcceptanceRun, Recording
from agent.engine.audit import AuditRequest, choose_profile
from agent.policy.matching import board_fit
from agent.policy.profiles import Profile, ProfileStore
from agent.policy.waivers import apply_waivers, load_waivers
from agent.report.model import Report
from checks import all_checks
from checks.accept import judge_run


def choose(request: AcceptRequest, sampler: Sampler) -> tuple[Profile, dict[str, Any], Any]:
    """(profile, the report's node block, the node source for BMC reads)."""
    from agent.sources.node import node_info, open_node
    from agent.sources.registry import HOST
    from agent.sources.source import ReadOptions

    audit = AuditRequest(config=request.config, profile=request.profile, bmc=request.bmc)
    node = open_node(audit)
    host = HOST.read(node, ReadOptions())[0]
    store = ProfileStore(request.config.profile_dirs, request.config.overrides_file)
    nvml = sampler.first
    assert nvml is not None, "the sampler read NVML before a profile is chosen"
    profile = choose_profile(audit, store, host, nvml)[0]
    start = sampler.recording.inventory.setdefault("start", {})
    start.update(pci_view(host.nvidia_gpus))
    size = profile.section("board").get("gpus")
    if isinstance(size, int) and not isinstance(size, bool):
        fit = board_fit(profile, NodeFacts(host=host, kmsg=(), nvml=nvml))
        start.update(board_gpus=size, board_full=fit.full, board_why=fit.why[:500])
    info = node_info(host, node)
    info["gpus"] = {**info["gpus"], "nvml_count": len(sampler.recording.gpus)}
    return profile, info, node


def pci_view(gpus: Any) -> dict[str, Any]:
    """The NVIDIA GPUs on PCI, by address, for the inventory (`pci`: None with `pci_error` when unread)."""
    if isinstance(gpus, Unknown):
        return {"pci": None, "pci_error": gpus.reason[:300]}
    return {"pci": sorted(str(g.address) for g in gpus)[:128]}


def end_pci(source: Any, recording: Recording) -> None:
    """PCI read again at the end of the run: a GPU that left the bus under load is gone from it."""
    from agent.sources.host import read_pci

    fs = getattr(source, "fs", None)
    if fs is None:
        return
    pci = read_pci(fs)
    gpus = pci if isinstance(pci, Unknown) else tuple(f for f in pci if f.is_nvidia_gpu)
    recording.inventory.setdefault("end", {}).update(pci_view(gpus))


def report_for(request: AcceptRequest, recording: Recording, profile: Profile, node: dict[str, Any],
               baseline: Recording | None, started: dt.datetime) -> Report:
    findings = judge_run(AcceptanceRun(recording, baseline), profile)  # the registry's series checks (32.3)
    config = request.config
    if config.waivers_file is not None:
        waivers = load_waivers(config.waivers_file, (c.id for c in all_checks()))
        if waivers:
            findings = apply_waivers(findings, waivers, dt.date.today())
    bmc = recording.bmc
    sources = {"nvml": SourceStatus("nvml", ok=True)}
    if bmc is not None:
        sources["bmc"] = SourceStatus("bmc", ok=bool(bmc.t), error=bmc.error if not bmc.t else None,
                                      detail={"readings": len(bmc.t)})
    return Report(node=node, profile=profile.name, profile_chain=profile.chain,
                  started_at=started.isoformat(timespec="seconds"),
                  duration_s=time.time() - started.timestamp(), sources=sources, findings=findings)
