"""Helpers shared by the GPU checks: which GPUs to judge, and the common loop."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from agent.core import versions
from agent.core.expect import Expectation
from agent.core.facts import FirmwareItem, GpuFacts, NodeFacts, NvmlFacts
from agent.core.gpu_family import ARCHITECTURES, last_driver_branch, name_architecture
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.policy.matching import GPU_MODEL_PCI_IDS, board_fit
from agent.policy.profiles import Profile
from checks import Check

# Widths of the NVML counters (nvml.h): ECC and NVLink error counts are unsigned long long; retired pages
# (nvmlDeviceGetRetiredPages), remapped rows (nvmlDeviceGetRemappedRows) and the PCIe replay counter
# (nvmlDeviceGetPcieReplayCounter) unsigned int. A reading at the maximum is a lower bound (agent.core.expect).
ECC_BITS = 64
NVLINK_BITS = 64
RETIRED_BITS = 32
REMAP_BITS = 32
PCIE_REPLAY_BITS = 32


def nvml_gpus(check: Check, facts: NodeFacts, expectation: Expectation | None) -> tuple[list[GpuFacts],
                                                                                        list[Finding]]:
    """The GPUs NVML could read, or the one finding that says why there are none.

    NVML not asked for (not in the snapshot, not needed): no finding, the
    source check says so. NVML down: one `unknown` per check, so every check
    that could not run is visible. Lost GPUs are left to `gpu.lost`.
    """
    status = facts.sources.get("nvml")
    if status is None or not status.configured:
        return [], []
    nvml = facts.nvml
    if isinstance(nvml, Unsupported):
        return [], []
    if isinstance(nvml, Unknown):
        on_pci = facts.host.nvidia_gpus
        if isinstance(on_pci, tuple) and not on_pci:
            return [], []  # no NVIDIA GPU on PCI either: not a GPU node, nothing to judge
        return [], [check.unknown("node", expectation, f"NVML unavailable: {nvml.reason}")]
    return [g for g in nvml.gpus if g.lost is None], []


def partial_view(profile: Profile, facts: NodeFacts) -> str | None:
    """Issue 13 rule 11: why the board-level expectations are not judged here, or None for the whole board.

    The one predicate is `agent.policy.matching.board_fit`, which gpu.count and fabric.nvswitch.count use too:
    fewer GPUs in view than the profile's board, and no evidence of the whole board (NVSwitches on PCI,
    DMI or the node's BMC naming an HGX/DGX system or a listed platform, the BMC's NVLink switches).
    One SXM GPU in a VM, a one-GPU `nvidia-smi` dump or a GPU selection is such a partial view: the
    board's NVLinks, Fabric Manager, fabric registration and rail HCAs are not in it to judge.
    """
    fit = board_fit(profile, facts)
    if fit.full:
        return None
    return (f"a partial view: {fit.seen} of the board's {fit.board} GPUs are visible; board-level checks need the "
            "whole board (no NVSwitch on PCI, neither DMI nor the BMC names an HGX/DGX system: a VM, a one-GPU "
            "dump or a GPU selection)")


def pci_without_gpus(facts: NodeFacts) -> str | None:
    """Why the PCI tree is not the GPUs' view, or None: it lists no NVIDIA function (no GPU, no NVSwitch)
    while NVML sees GPUs (a container or VM that reaches the GPUs through the driver only). Absent
    functions there are not evidence of GPUs or NVSwitches missing from the board (issue 23 item 2)."""
    pci, nvml = facts.host.pci, facts.nvml
    if isinstance(pci, Unknown) or not isinstance(nvml, NvmlFacts) or not nvml.gpus:
        return None
    if any(f.is_nvidia_gpu or f.is_nvswitch for f in pci):
        return None
    return (f"the PCI tree lists no NVIDIA function while NVML sees {len(nvml.gpus)} GPU(s): a container or VM "
            "without the GPUs' PCI functions (crosscheck.gpu_views)")


def not_judged_on_partial_view(check: Check, finding: Finding, why: str, detail: str) -> Finding:
    """A board-level finding that did not pass, turned into `skip` on a partial view (`why`)."""
    return check.finding(finding.subject, Status.SKIP, Severity.INFO, f"{detail}, not judged: {why}",
                         observed=finding.observed, expected=finding.expected, reason=finding.reason)


def gpu_refs(gpu: GpuFacts) -> dict[str, Any]:
    """Values a relative expectation may refer to, e.g. "@slowdown_c - 10"."""
    return gpu._asdict()


def subject(gpu: GpuFacts) -> str:
    return f"gpu{gpu.index}"


def per_gpu(check: Check, facts: NodeFacts, expectation: Expectation | None,
            observe: Callable[[GpuFacts], Any], what: str, bits: int | None = None) -> list[Finding]:
    """One finding per readable GPU: `observe(gpu)` against the expectation (a counter of `bits` if given)."""
    if expectation is None:
        return []
    gpus, findings = nvml_gpus(check, facts, expectation)
    for gpu in gpus:
        findings.append(check.compare(subject(gpu), expectation, observe(gpu), f"{gpu.label} {what}",
                                      refs=gpu_refs(gpu), bits=bits))
    return findings


# --- driver advice an old GPU can follow (issue 22 item 2) ------------------------------------------------


def _oldest_branch(facts: NodeFacts) -> tuple[int, str] | None:
    """The newest driver branch every GPU here still runs, and the architecture that limits it; None when
    the current branch runs them all (or no GPU's architecture is known)."""
    nvml = facts.nvml
    if not isinstance(nvml, NvmlFacts):
        return None
    limits = []
    for gpu in nvml.gpus:
        arch = gpu.architecture if isinstance(gpu.architecture, int) else (
            name_architecture(gpu.name) if isinstance(gpu.name, str) else None)
        branch = last_driver_branch(arch)
        if branch is not None and arch is not None:
            limits.append((branch, ARCHITECTURES[arch]))
    return min(limits) if limits else None


def _major(version: object) -> int | None:
    parsed = versions.parse(version) if isinstance(version, str) else None
    first = parsed.release[0] if parsed is not None and parsed.release else None
    return first[1] if first is not None and first[0] == 0 and isinstance(first[1], int) else None


def driver_within_branch(check: Check, finding: Finding, facts: NodeFacts, expectation: Expectation) -> Finding:
    """A driver minimum from a branch the GPU cannot run (Kepler stops at R470, Maxwell/Pascal/Volta at
    R580) becomes advice within the GPU's last branch: never tell an old GPU to install a driver it cannot run."""
    limit = _oldest_branch(facts)
    bound = dict(expectation.comparators).get("version_min")
    if limit is None or finding.status not in (Status.FAIL, Status.WARN) or bound is None:
        return finding
    branch, arch = limit
    wanted, seen = _major(str(bound)), _major(finding.observed)
    if wanted is None or wanted <= branch or seen is None:
        return finding
    expected = f"the latest R{branch} driver (the last branch that supports {arch})"
    why = (f"the profile's minimum {bound} is a branch {arch} GPUs cannot run: R{branch} is the last branch that "
           f"supports {arch}")
    if seen >= branch:
        return check.finding(finding.subject, Status.PASS, Severity.INFO,
                             f"NVIDIA driver {finding.observed}: {why}; this is that branch", observed=finding.observed,
                             expected=expected, reason=why)
    return check.finding(finding.subject, Status.WARN, Severity.WARNING,
                         f"NVIDIA driver {finding.observed} is older than R{branch}: update to the latest R{branch} "
                         f"driver ({why})", observed=finding.observed, expected=expected, reason=why,
                         action=finding.action)


# --- MIG makes some per-GPU counters N/A (issue 22 item 3) ------------------------------------------------


def not_reported_under_mig(check: Check, finding: Finding, gpu: GpuFacts, value: object, what: str) -> Finding:
    """A counter NVML does not report while MIG is enabled is `skip` that says so, not an unexplained unknown."""
    if gpu.mig_mode != "enabled" or finding.status not in (Status.SKIP, Status.UNKNOWN) or not isinstance(
            value, Unknown):
        return finding
    return check.finding(finding.subject, Status.SKIP, Severity.INFO,
                         f"{gpu.label} {what}: not reported (N/A) while MIG is enabled; NVML reports it per GPU "
                         "instance or not at all in MIG mode", observed=finding.observed, expected=finding.expected,
                         reason=finding.reason)


# --- a BMC firmware inventory entry that is a GPU's VBIOS (gpu.firmware.vbios judges it,
# firmware.consistency leaves it alone) ------------------------------------------------------------
# The HGX baseboard's image HGX_FW_GPU_SXM_N (HGX_FW_GPU_N on GB200), never its ERoT
# (HGX_FW_ERoT_GPU_SXM_N) or InfoROM; an entry named after the GPU model (HPE: "NVIDIA H100 NVL"); an
# entry whose SoftwareId or Description carries a GPU's PCI ids (HPE: "10de232110de1839").
_HGX_GPU_IMAGE = re.compile(r"HGX_FW_(GPU(?:_SXM)?_\d+)", re.IGNORECASE)
_PCI_CODE = re.compile(r"(?:0x)?10de([0-9a-f]{4})", re.IGNORECASE)  # HPE: vendor, device, subsystem ids
_GPU_PCI_IDS = {pci_id.split(":")[1]: name for name, pci_id in GPU_MODEL_PCI_IDS.items()}


class GpuImage(NamedTuple):
    hgx_name: str | None  # GPU_SXM_1 for an HGX baseboard image
    model: str | None  # the GPU model the entry names, by its name or PCI code


def gpu_vbios_image(item: FirmwareItem) -> GpuImage | None:
    """What makes a firmware inventory entry a GPU's VBIOS, or None when it is not one."""
    hgx = _HGX_GPU_IMAGE.fullmatch(item.component_id) or _HGX_GPU_IMAGE.fullmatch(item.name)
    code = next((m for m in (_PCI_CODE.match(t or "") for t in (item.software_id, item.description)) if m), None)
    named = item.name if item.name in GPU_MODEL_PCI_IDS else None
    by_code = _GPU_PCI_IDS.get(code.group(1).lower()) if code else None
    if hgx is None and named is None and by_code is None:
        return None
    return GpuImage(hgx.group(1) if hgx else None, named or by_code)
