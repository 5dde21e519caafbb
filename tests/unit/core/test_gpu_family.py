"""Issue 22 items 1-3: GPUs are classified by what they report (brand, name, architecture, PCI class,
NVSwitches), not by id lists; driver advice stays within the branch an old GPU can run; MIG is
configuration, and the counters MIG makes N/A say so.

The RTX 2000 Ada and RTX PRO 6000 Blackwell Max-Q dumps are the real telegraf RTX 4000 SFF Ada dump
(fixtures/nvidia-smi/telegraf/rtx-4000-sff-ada-v13.xml, same brand "NVIDIA RTX", ECC off as shipped)
with the product name, device id and architecture those boards report. On the code before this change
both fell back to generic-nvidia and failed gpu.ecc.mode as critical; a GPU generation no profile lists
did too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import NvmlFacts
from agent.sources.importers.nvidia_smi import parse_nvidia_smi
from agent.sources.local_sources import json_recording
from tests.conftest import REPO, RunCli
from tests.factories import gpu_facts, nvml_node, profile

DUMPS = REPO / "fixtures" / "nvidia-smi"
RTX_4000 = "telegraf/rtx-4000-sff-ada-v13.xml"


def dump_as(rel: str, **swap: str) -> str:
    text = (DUMPS / rel).read_text(encoding="utf-8")
    for old, new in swap.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def audit_dump(run_cli: RunCli, tmp_path: Path, text: str) -> dict[str, Any]:
    """The snapshot `snapshot import-nvidia-smi` writes (meta.yaml, nvml.json), audited through the CLI."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "nvml.json").write_bytes(json_recording(parse_nvidia_smi(text, "dump")))
    (snap / "meta.yaml").write_text("hostname: dump\ncaptured_at: '2025-06-01T00:00:00+00:00'\ncaptured: [nvml]\n"
                                    "source: nvidia-smi import of dump\n")
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", "json")
    assert result.stdout, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def criticals(report: dict[str, Any]) -> list[str]:
    return [f"{f['check']} {f['subject']}: {f['message']}" for f in report["findings"]
            if f["severity"] == "critical" and f["status"] in ("fail", "warn")]


def finding(report: dict[str, Any], check: str, subject: str = "gpu0") -> dict[str, Any]:
    return next(f for f in report["findings"] if f["check"] == check and f["subject"] == subject)


# --- the classifier -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "brand", "family", "arch"), [
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 13, "workstation", 10),
    ("NVIDIA RTX 2000 Ada Generation", 13, "workstation", 8),
    ("NVIDIA RTX 2000 Ada Generation", None, "workstation", 8),  # the name alone places it
    ("NVIDIA RTX 2000E Ada Generation", None, "workstation", 8),
    ("NVIDIA RTX 5000 Ada Generation", 13, "workstation", 8),  # not a GeForce RTX 50x0
    ("NVIDIA GeForce RTX 5090", 5, "geforce", 10),
    ("Quadro RTX 6000", 12, "workstation", 6),
    ("NVIDIA H100 80GB HBM3", 14, "datacenter-sxm", 9),
    ("NVIDIA H100 PCIe", 14, "datacenter-pcie", 9),
    ("NVIDIA H100 NVL", None, "datacenter-pcie", 9),
    ("NVIDIA A100-SXM4-80GB", 14, "datacenter-sxm", 7),
    ("NVIDIA GH200 480GB", None, "datacenter-sxm", 9),
    ("NVIDIA B200", None, "datacenter-sxm", 10),
    ("Tesla V100-PCIE-32GB", 2, "datacenter-pcie", 5),
    ("Tesla V100-SXM2-32GB", 2, "datacenter-sxm", 5),
    ("Tesla T4", 2, "datacenter-pcie", 6),
    ("NVIDIA L40S", 14, "datacenter-pcie", 8),
    ("NVIDIA GeForce RTX 4090", 5, "geforce", 8),
    ("NVIDIA TITAN RTX", 6, "geforce", 6),
    ("GRID A100-40C", 9, "vgpu", 7),
    ("NVIDIA A40-48Q", None, "vgpu", 7),
    ("NVIDIA L40S", 8, "vgpu", 8),  # the brand of a vGPU guest wins over the physical board's name
    ("NVIDIA Z9000", 0, "unknown", None),
])
def test_families_from_what_the_gpu_reports(name: str, brand: int | None, family: str, arch: int | None) -> None:
    from agent.core.gpu_family import classify

    got = classify(name, brand)
    assert (got.family, got.architecture) == (family, arch)


def test_nvml_architecture_wins_and_nvswitches_tell_the_form_factor() -> None:
    from agent.core.gpu_family import classify

    assert classify("NVIDIA H800", 14, 9).family == "datacenter-pcie"  # a bare name says a board
    assert classify("NVIDIA H800", 14, 9, nvswitch=True).family == "datacenter-sxm"
    assert classify("NVIDIA RTX A6000", 13, 7, pci_class=0x0300).evidence[-1] == "PCI class VGA (display-capable)"
    told = classify(pci_class=0x0302)
    assert told.family == "unknown"
    assert "the product name" in told.untold and "PCI class 3D controller (compute)" in told.evidence


def test_a_node_of_mixed_families_is_unknown_and_says_why() -> None:
    from agent.core.gpu_family import classify, node_family

    mixed = node_family([classify("NVIDIA RTX 2000 Ada Generation"), classify("NVIDIA GeForce RTX 4090")])
    assert mixed is not None and mixed.family == "unknown"
    assert "geforce, workstation" in mixed.untold[0]


# --- profiles by family, and the two false criticals -------------------------------------------------------

@pytest.mark.parametrize(("name", "device", "arch"), [
    ("NVIDIA RTX 2000 Ada Generation", "28B010DE", "Ada Lovelace"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "2BB410DE", "Blackwell"),
    ("NVIDIA RTX PRO 4500 Blackwell", "2C3110DE", "Blackwell"),  # an id no profile lists
])
def test_workstation_boards_with_ecc_off_are_not_critical(run_cli: RunCli, tmp_path: Path, name: str, device: str,
                                                          arch: str) -> None:
    report = audit_dump(run_cli, tmp_path, dump_as(RTX_4000, **{
        "NVIDIA RTX 4000 SFF Ada Generation": name, "27B010DE": device, "Ada Lovelace": arch}))
    assert report["profile"] == "nvidia-workstation"
    assert criticals(report) == []
    ecc = finding(report, "gpu.ecc.mode")
    assert (ecc["status"], ecc["severity"], ecc["observed"]) == ("pass", "info", "disabled")


def test_a_generation_no_profile_lists_gives_no_critical(run_cli: RunCli, tmp_path: Path) -> None:
    """A future GPU neither brand nor name places: the fallback judges settings at warning at most and says
    what it could not tell."""
    report = audit_dump(run_cli, tmp_path, dump_as(RTX_4000, **{
        "NVIDIA RTX 4000 SFF Ada Generation": "NVIDIA Z9000", "27B010DE": "2FFF10DE",
        "<product_brand>NVIDIA RTX": "<product_brand>Unknown", "Ada Lovelace": "Rubin"}))
    assert report["profile"] == "generic-nvidia"
    assert criticals(report) == []
    assert finding(report, "gpu.ecc.mode")["severity"] == "warning"
    match = finding(report, "profile.match", "node")
    assert "could not tell the GPU's family" in match["message"] and "'NVIDIA Z9000'" in match["message"]


def test_an_unlisted_sxm_module_keeps_ecc_critical(run_cli: RunCli, tmp_path: Path) -> None:
    """Positive evidence (a data-center SXM module by its name) keeps ECC off critical."""
    text = dump_as("thamada-gls/H100SXMx8.q.txt", **{"NVIDIA H100 80GB HBM3": "NVIDIA B300 SXM6 AC",
                                                     "0x233010DE": "0x31FF10DE"})
    enabled = "ECC Mode\n        Current                           : Enabled\n        Pending                           : Enabled"
    assert enabled in text
    text = text.replace(enabled, enabled.replace("Enabled", "Disabled"))
    report = audit_dump(run_cli, tmp_path, text)
    assert report["profile"] == "nvidia-datacenter-sxm"
    ecc = finding(report, "gpu.ecc.mode")
    assert (ecc["status"], ecc["severity"]) == ("fail", "critical")


# --- driver advice within the branch (item 2) ----------------------------------------------------------------

DRIVER_MIN = {"driver": {"version": {"version_min": "535.104.05", "severity": "warning", "reason": "r"}}}


DRIVER_CASES = [  # architecture, driver, status, what is expected
    (2, "470.256.02", "pass", "the latest R470 driver (the last branch that supports Kepler)"),
    (2, "460.91.03", "warn", "the latest R470 driver (the last branch that supports Kepler)"),
    (4, "580.65.06", "pass", "535.104.05"),  # R580 runs Pascal and meets the minimum
    (5, "470.256.02", "fail", "535.104.05"),  # R580 runs Volta: the minimum stands
    (9, "525.60.13", "fail", "535.104.05"),
]


def test_an_old_gpu_is_advised_within_its_branch() -> None:
    from checks.gpu_firmware import DRIVER

    for arch, driver, status, expected in DRIVER_CASES:
        facts = nvml_node([gpu_facts(architecture=arch)])
        assert isinstance(facts.nvml, NvmlFacts)
        facts.nvml = facts.nvml._replace(driver_version=driver)
        facts.host.nvidia_driver = driver  # the loaded module agrees with the library
        (got,) = DRIVER.run(facts, profile(DRIVER_MIN))
        assert (arch, got.status.value) == (arch, status)
        assert expected in str(got.expected) or status == "pass"
        if arch == 2:
            assert "R470" in got.message and "Kepler" in got.message


# --- MIG is configuration (item 3) -------------------------------------------------------------------------

def test_mig_is_recorded_with_its_layout_and_judged_only_where_pinned(run_cli: RunCli, tmp_path: Path) -> None:
    report = audit_dump(run_cli, tmp_path,
                        (DUMPS / "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt").read_text())
    mig = finding(report, "gpu.mig_mode")
    assert (mig["status"], mig["severity"]) == ("pass", "info")
    assert "MIG layout: enabled on GPU 0" in mig["message"]
    remap = finding(report, "gpu.row_remap")
    assert remap["status"] == "skip" and "while MIG is enabled" in remap["message"]
    pinned = profile({"gpu": {"mig_mode": {"equals": "disabled", "severity": "warning", "reason": "whole GPUs"}}})
    from checks.gpu_modes import MIG

    (judged,) = MIG.run(nvml_node([gpu_facts(mig_mode="enabled", mig_pending="enabled")]), pinned)
    assert (judged.status.value, judged.severity.value) == ("fail", "warning")
