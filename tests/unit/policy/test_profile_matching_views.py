"""Issue 23 item 2: profile matching from every view, and disagreement between views is a finding.

NVML's PCI ids (pciDeviceId) count when the PCI tree lists no GPU (a container, some VMs); the BMC's
GPU processors count for a BMC-only audit, by their names' family too; where the PCI tree, NVML and a
bound BMC disagree, crosscheck.gpu_views says so. On the code before this change the H100 recording
without GPUs in its PCI tree fell back to generic-nvidia (and failed the PCI and NVSwitch counts
critical), and no check compared the views' ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agent.core.facts import BmcBinding, BmcFacts, BmcGpu
from agent.core.model import SourceStatus, Status
from agent.policy.matching import identify, identify_bmc, select
from agent.policy.profiles import ProfileStore
from tests.conftest import REPO, RunCli
from tests.factories import gpu, gpu_facts, host, nvml_node, profile

HEALTHY_H100 = REPO / "fixtures" / "nodes" / "hgx-h100-healthy"


def without_nvidia_on_pci(tmp_path: Path) -> Path:
    """The recorded H100 node as a container sees it: the PCI tree holds no NVIDIA function (no GPU, no
    NVSwitch), NVML (nvml.json, recorded on the node) sees all 8 GPUs."""
    snap = tmp_path / "node"
    shutil.copytree(HEALTHY_H100, snap)
    devices = [v.parent for v in (snap / "fs" / "sys" / "devices").rglob("vendor")
               if v.read_text().strip() == "0x10de"]
    assert len(devices) >= 8
    names = {d.name for d in devices}
    links = json.loads((snap / "fs_links.json").read_text())
    (snap / "fs_links.json").write_text(json.dumps({k: v for k, v in links.items()
                                                    if k.rsplit("/", 1)[-1] not in names}))
    for device in sorted(devices, key=lambda d: -len(d.parts)):
        if device.exists():
            shutil.rmtree(device)
    return snap


def audit(run_cli: RunCli, tmp_path: Path, snap: Path) -> dict[str, Any]:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    result = run_cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", "json")
    assert result.stdout, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_an_h100_nvml_recording_without_gpus_on_pci_matches_its_board(run_cli: RunCli, tmp_path: Path) -> None:
    report = audit(run_cli, tmp_path, without_nvidia_on_pci(tmp_path))
    assert report["profile"] == "hgx-h100-sxm"
    found = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert "gpu_pci_ids=10de:2330" in found[("profile.match", "node")]["message"]
    views = found[("crosscheck.gpu_views", "node")]
    assert (views["status"], views["severity"]) == ("warn", "info")
    assert "NVML sees 8" in views["message"]
    # A PCI tree that shows no NVIDIA function is no evidence of GPUs or NVSwitches missing from the board.
    for check in ("host.gpu.pci_count", "fabric.nvswitch.count"):
        assert found[(check, "node")]["status"] == "skip", found[(check, "node")]
    assert [f["check"] for f in report["findings"]
            if f["severity"] == "critical" and f["status"] in ("fail", "warn")] == []


def test_identity_takes_nvml_ids_only_when_the_pci_tree_has_no_gpu() -> None:
    gpus = [gpu_facts(i) for i in range(8)]
    empty = identify(host(pci=()), nvml_node(gpus).nvml)
    assert (empty.source, set(empty.gpu_pci_ids), empty.gpu_count) == ("nvml", {"10de:2330"}, 8)
    on_pci = identify(host(pci=tuple(gpu(g.pci_bus_id, device=0x2335) for g in gpus)), nvml_node(gpus).nvml)
    assert (on_pci.source, set(on_pci.gpu_pci_ids)) == ("host", {"10de:2335"})  # PCI stays the first view


def test_pci_and_nvml_disagreeing_is_a_finding() -> None:
    from checks.crosscheck_views import VIEWS

    gpus = [gpu_facts(i) for i in range(2)]
    facts = nvml_node(gpus, host(pci=(gpu(gpus[0].pci_bus_id), gpu(gpus[1].pci_bus_id, device=0x2335))))
    facts.sources["host"] = SourceStatus("host", ok=True)
    (finding,) = VIEWS.run(facts, profile({}))
    assert (finding.status, finding.severity.value) == (Status.WARN, "warning")
    assert "10de:2335" in finding.message and "matched on the PCI tree" in finding.message
    agree = nvml_node(gpus)
    agree.sources["host"] = SourceStatus("host", ok=True)
    assert [f.status for f in VIEWS.run(agree, profile({}))] == [Status.PASS]


def test_a_bound_bmc_naming_other_gpus_is_a_finding() -> None:
    from checks.crosscheck_views import VIEWS

    facts = nvml_node([gpu_facts(0)])
    facts.bmc = BmcFacts(protocol="redfish", gpus=(BmcGpu("GPU 0", "NVIDIA H200"),))
    facts.binding = BmcBinding("bound", "bound by UUID")
    findings = VIEWS.run(facts, profile({}))
    assert any(f.status is Status.WARN and "BMC names GPUs of 1x 10de:2335" in f.message for f in findings)
    facts.binding = BmcBinding("remote", "another node")  # never compared with another node's BMC
    assert not any("BMC" in f.message for f in VIEWS.run(facts, profile({})))


def test_a_bmc_only_audit_matches_on_the_gpu_processors_family() -> None:
    store = ProfileStore()

    def selected(*models: str) -> str:
        bmc = BmcFacts(protocol="redfish", manufacturer="Acme", model="X1",
                       gpus=tuple(BmcGpu(f"GPU {i}", m) for i, m in enumerate(models)))
        return select(identify_bmc(bmc), store).profile.name

    assert selected(*["NVIDIA H100 80GB HBM3"] * 8) == "hgx-h100-sxm"  # exact ids first
    assert selected("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") == "nvidia-workstation"
    assert selected("NVIDIA L20") == "nvidia-pcie"
    assert selected("Mystery Accelerator") == "generic-nvidia"


def test_profiles_match_sees_what_the_audit_sees(run_cli: RunCli, tmp_path: Path) -> None:
    """`nodewarden profiles match` reads NVML too, so a container's node matches as in its audit."""
    result = run_cli("profiles", "match", "--snapshot", str(without_nvidia_on_pci(tmp_path)))
    assert result.code == 0, result.stderr
    assert "profile:  hgx-h100-sxm (auto)" in result.stdout
