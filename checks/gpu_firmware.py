"""GPU firmware and software versions: VBIOS, InfoROM, driver (as NVML sees it), CUDA."""

from __future__ import annotations

from collections import Counter

from agent.facts import NodeFacts
from agent.model import Finding, Severity, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._gpu import nvml_gpus, per_gpu, subject

VBIOS = Check("gpu.firmware.vbios", "GPU VBIOS version", source="nvml", action="update_firmware")
INFOROM = Check("gpu.inforom", "GPU InfoROM", source="nvml", action="contact_support")
DRIVER = Check("gpu.driver", "NVIDIA driver as NVML reports it", source="nvml", action="upgrade_driver")
CUDA = Check("gpu.cuda", "CUDA driver API version", source="nvml", action="upgrade_driver")


@VBIOS.evaluator
def evaluate_vbios(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """`version_min` per GPU, and one VBIOS across the GPUs of the same model."""
    expectation = profile.expectation("gpu", "vbios")
    gpus, findings = nvml_gpus(VBIOS, facts, expectation)
    by_model: dict[str, Counter[str]] = {}
    for gpu in gpus:
        if isinstance(gpu.vbios, str):
            by_model.setdefault(str(gpu.pci_id), Counter())[gpu.vbios] += 1
    for gpu in gpus:
        name = subject(gpu)
        if expectation is not None:
            finding = VBIOS.compare(name, expectation, gpu.vbios, f"{gpu.label} VBIOS")
        elif isinstance(gpu.vbios, Unknown):
            continue
        else:
            finding = VBIOS.finding(name, Status.PASS, Severity.WARNING, f"{gpu.label} VBIOS is {gpu.vbios}",
                                    observed=gpu.vbios)
        versions = by_model.get(str(gpu.pci_id), Counter())
        if len(versions) > 1 and isinstance(gpu.vbios, str):
            common, count = versions.most_common(1)[0]
            if gpu.vbios != common and finding.status is Status.PASS:
                finding.status = Status.FAIL
                finding.message = (f"{gpu.label} VBIOS {gpu.vbios} differs from {common} on {count} other "
                                   f"{gpu.pci_id} GPU(s): mixed firmware on one node")
                finding.action = "update_firmware"
        findings.append(finding)
    return findings


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
    return [DRIVER.compare("node", expectation, version, "NVIDIA driver (NVML)")]


@CUDA.evaluator
def evaluate_cuda(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("gpu", "cuda")
    _gpus, findings = nvml_gpus(CUDA, facts, expectation)
    if findings or expectation is None or isinstance(facts.nvml, Unknown):
        return findings
    return [CUDA.compare("node", expectation, facts.nvml.cuda_driver_version, "CUDA driver API version")]
