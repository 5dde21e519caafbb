"""GPU firmware and software versions: VBIOS, InfoROM, driver (as NVML sees it), CUDA.

`gpu.firmware.vbios` (issue 13 rule 4): each GPU's VBIOS against the profile's `gpu.vbios`
minimum, and one VBIOS across the node's GPUs of one model: a GPU on another version than the
rest of its model fails, naming it (with no majority, every GPU of the model is named). The
versions come from NVML; where NVML is not in the audit (a BMC-only audit, a jump host auditing
a BMC) or the BMC is another node's (remote), from the BMC (NVML down on a GPU node stays
`unknown`): the GPU Processors' `FirmwareVersion` (HGX baseboards), else the firmware
inventory's GPU entries (the HGX baseboard's `HGX_FW_GPU_SXM_N`, linked to its GPU by
RelatedItem; HPE's entry named after the GPU model, e.g. "NVIDIA H100 NVL" in "PCI-E Slot 14").
ERoT and InfoROM images are not VBIOS.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from agent.core.expect import Expectation
from agent.core.facts import BmcFacts, FirmwareItem, Maybe, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._gpu import driver_within_branch, gpu_vbios_image, nvml_gpus, per_gpu, subject

# NVML's view, else the BMC's: a cross-check in the engine's terms, so it runs in a BMC-only audit too.
VBIOS = Check("gpu.firmware.vbios", "GPU VBIOS version", source="crosscheck", action="update_firmware",
              reads=("nvml", "bmc"),
              evidence=("each GPU's VBIOS vs the profile's minimum and vs the other GPUs of its model (the odd ones "
                        "named), from NVML, else from the BMC's GPU Processors or firmware inventory"),
              parts=("nvml", "redfish"))
INFOROM = Check("gpu.inforom", "GPU InfoROM", source="nvml", action="contact_support",
                evidence="NVML InfoROM image version and its validity check")
DRIVER = Check("gpu.driver", "NVIDIA driver as NVML reports it", source="nvml", action="upgrade_driver",
               evidence="the driver version NVML reports against the profile's minimum")
CUDA = Check("gpu.cuda", "CUDA driver API version", source="nvml", action="upgrade_driver",
             evidence="the CUDA driver API version NVML reports against the profile's minimum")


class _Vbios(NamedTuple):
    """One GPU's VBIOS as one view reports it."""

    subject: str
    label: str
    model: str  # GPUs are compared with the others of the same model only
    version: Maybe[str]


@VBIOS.evaluator
def evaluate_vbios(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """`version_min` per GPU, and one VBIOS across the GPUs of the same model (NVML, else the BMC)."""
    expectation = profile.expectation("gpu", "vbios")
    gpus, findings = nvml_gpus(VBIOS, facts, expectation)
    views = [_Vbios(subject(g), g.label, str(g.pci_id), g.vbios) for g in gpus]
    findings += _judge(views, expectation)
    for finding in findings:
        finding.source = "nvml"
    bmc = facts.bmc
    remote = facts.binding is not None and facts.binding.state == "remote"
    # NVML down on a GPU node is its `unknown` above, not a reason to judge another view.
    if isinstance(bmc, BmcFacts) and ((not gpus and not findings) or remote):
        bmc_views, why_none = bmc_vbios(bmc)
        source = bmc.protocol
        if bmc_views:
            judged = _judge(bmc_views, expectation)
        elif why_none and expectation is not None:
            judged = [VBIOS.finding("bmc", Status.SKIP, expectation.severity, f"GPU VBIOS from the BMC: {why_none}",
                                    expected=expectation.expected, reason=expectation.reason)]
        else:
            judged = []
        for finding in judged:
            finding.source = source
        findings += judged
    return findings


def _judge(views: list[_Vbios], expectation: Expectation | None) -> list[Finding]:
    by_model: dict[str, Counter[str]] = {}
    for view in views:
        if isinstance(view.version, str):
            by_model.setdefault(view.model, Counter())[view.version] += 1
    findings = []
    for view in views:
        if expectation is not None:
            finding = VBIOS.compare(view.subject, expectation, view.version, f"{view.label} VBIOS")
        elif isinstance(view.version, Unknown):
            continue
        else:
            finding = VBIOS.finding(view.subject, Status.PASS, Severity.WARNING, f"{view.label} VBIOS is "
                                    f"{view.version}", observed=view.version)
        versions = by_model.get(view.model, Counter())
        if len(versions) > 1 and isinstance(view.version, str) and finding.status is Status.PASS:
            ranked = versions.most_common()
            common, count = ranked[0]
            if count == ranked[1][1]:  # no majority: every GPU of the model is one of the odd ones
                spread = ", ".join(f"{v} on {n}" for v, n in sorted(versions.items()))
                finding.message = (f"{view.label} VBIOS {view.version}: the node's {view.model} GPUs run "
                                   f"{len(versions)} versions with no majority ({spread}): mixed firmware on one node")
            elif view.version != common:
                finding.message = (f"{view.label} VBIOS {view.version} differs from {common} on {count} other "
                                   f"{view.model} GPU(s): mixed firmware on one node")
            else:
                findings.append(finding)
                continue
            finding.status = Status.FAIL
            finding.action = "update_firmware"
        findings.append(finding)
    return findings




def bmc_vbios(bmc: BmcFacts) -> tuple[list[_Vbios], str | None]:
    """Each GPU's VBIOS as the BMC reports it, or why there is none (None: the BMC lists no GPU)."""
    gpus = bmc.gpus if isinstance(bmc.gpus, tuple) else ()
    views = [_Vbios(_gpu_id(g.where, g.name), f"{_gpu_id(g.where, g.name)} ({g.slot or g.name}, BMC)",
                    g.model or g.name, g.firmware) for g in gpus if g.firmware]
    if views:
        return _unique(views), None
    inventory = bmc.firmware if isinstance(bmc.firmware, tuple) else ()
    models = {g.where: g.model or g.name for g in (bmc.gpu_views if isinstance(bmc.gpu_views, tuple) else gpus)}
    for item in inventory:
        view = _inventory_view(item, models)
        if view is not None:
            views.append(view)
    if views:
        return _unique(views), None
    if not gpus:
        return [], None
    where = ("the firmware inventory has no GPU entry" if inventory else
             bmc.firmware.reason if isinstance(bmc.firmware, Unknown) else "no firmware inventory")
    return [], (f"the BMC lists {len(gpus)} GPU(s) but no VBIOS version: their Processors report no "
                f"FirmwareVersion and {where}")


def _inventory_view(item: FirmwareItem, models: dict[str, str]) -> _Vbios | None:
    """A firmware inventory entry that is a GPU's VBIOS, or None."""
    if not item.installed:
        return None
    image = gpu_vbios_image(item)
    if image is None:
        return None
    gpu = next((models[r] for r in item.related if r in models), None)
    model = gpu or item.model or image.model or "HGX baseboard GPU"
    name = image.hgx_name or item.name
    where = item.location or item.component_id
    return _Vbios(name if image.hgx_name else f"{name} [{where}]", f"{name} ({where}, BMC firmware inventory)",
                  model, item.version)


def _gpu_id(where: str, name: str) -> str:
    """The Processor's own id (GPU_SXM_1); NVIDIA names every Processor just "Processor"."""
    return where.rstrip("/").rsplit("/", 1)[-1] or name


def _unique(views: list[_Vbios]) -> list[_Vbios]:
    seen: Counter[str] = Counter(v.subject for v in views)
    count: Counter[str] = Counter()
    out = []
    for view in views:
        if seen[view.subject] > 1:
            count[view.subject] += 1
            out.append(view._replace(subject=f"{view.subject} #{count[view.subject]}"))
        else:
            out.append(view)
    return out


@INFOROM.evaluator
def evaluate_inforom(facts: NodeFacts, profile: Profile) -> list[Finding]:
    return per_gpu(INFOROM, facts, profile.expectation("gpu", "inforom"), lambda g: g.inforom_valid,
                   "InfoROM")


@DRIVER.evaluator
def evaluate_driver(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """NVML's driver version against the profile, and against the loaded kernel module."""
    expectation = profile.expectation("driver", "version")
    _gpus, findings = nvml_gpus(DRIVER, facts, expectation)
    if findings or isinstance(facts.nvml, Unknown):
        return findings
    version = facts.nvml.driver_version
    module = facts.host.nvidia_driver
    if isinstance(version, str) and isinstance(module, str) and version != module:
        return [DRIVER.finding("node", Status.FAIL, Severity.CRITICAL,
                               f"NVML library {version} does not match the loaded kernel module {module} "
                               "(driver/library version mismatch: reboot or reload the module)",
                               observed=version, expected=module, action="reboot",
                               reason="A library/kernel module mismatch makes every CUDA program fail")]
    if expectation is None:
        return []
    return [driver_within_branch(DRIVER, DRIVER.compare("node", expectation, version, "NVIDIA driver (NVML)"), facts,
                                 expectation)]


@CUDA.evaluator
def evaluate_cuda(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "cuda")
    _gpus, findings = nvml_gpus(CUDA, facts, expectation)
    if findings or expectation is None or isinstance(facts.nvml, Unknown):
        return findings
    return [CUDA.compare("node", expectation, facts.nvml.cuda_driver_version, "CUDA driver API version")]
