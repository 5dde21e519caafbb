"""Issue 13 rule 11: the dump's "Attached GPUs" is evidence of the board; HGX A100 4-GPU boards get their profile.

`nvidia-smi -q -i 0` on an 8-GPU node prints "Attached GPUs : 8" (NVML's device count on the node) and
the one selected GPU. That is not a node that lost seven GPUs, nor a partial view that cannot tell: the
dump says the node has all 8 of the board's GPUs, the other seven are only not in this dump. The importer
records the attached count (`attached_gpus` in nvml.json, `NvmlFacts.attached`), and `board_fit` counts it
as evidence of the whole board. A dump cut inside a GPU section is still refused.

The 4x A100 SXM4 dump (thamada-gls/A100SXMx4.q.txt) is an HGX A100 4-GPU (Redstone) board: 4 GPUs in an
NVLink mesh, no NVSwitch. It is judged by hgx-a100-4gpu, 4 of 4, not skipped as a partial view of dgx-a100.

Everything goes through the CLI (`snapshot import-nvidia-smi`, `audit --snapshot`) on real dumps from
fixtures/nvidia-smi, or on a selection derived from a real 8-GPU dump by keeping its first GPU section.
On the code before this change the text selection was refused ("dump says 8 attached GPUs but holds 1 GPU
section"), nvml.json had no attached count, NvmlFacts no `attached`, and the 4x A100 dump was judged by
dgx-a100 with gpu.count skipped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import NvmlFacts, PciFunction
from agent.policy.matching import Identity, board_fit, select
from agent.policy.profiles import ProfileStore
from agent.sources.nvml import RecordedNvml, read_nvml
from checks.fabric import NVSWITCH_COUNT
from checks.gpu_inventory import COUNT
from tests.conftest import REPO, RunCli
from tests.factories import gpu, gpu_facts, host, nvml_node

DUMPS = REPO / "fixtures" / "nvidia-smi"
H100X8 = DUMPS / "thamada-gls" / "H100SXMx8.q.txt"
A100X4 = DUMPS / "thamada-gls" / "A100SXMx4.q.txt"
TELEGRAF_A100 = DUMPS / "telegraf" / "a100-sxm4-v12.xml"  # <attached_gpus>4</attached_gpus>, one <gpu>


def selection(tmp_path: Path, keep_lines: int | None = None) -> Path:
    """H100SXMx8.q.txt with only its first GPU section, as `nvidia-smi -q -i 0` prints it (or cut inside it)."""
    lines = H100X8.read_text(encoding="utf-8").split("\n")
    headers = [i for i, line in enumerate(lines) if line.startswith("GPU 00000000:")]
    assert len(headers) == 8 and "Attached GPUs                             : 8" in lines
    kept = lines[:headers[1]] if keep_lines is None else lines[:headers[0] + keep_lines]
    path = tmp_path / "h100-i0.txt"
    path.write_text("\n".join(kept).rstrip("\n") + "\n", encoding="utf-8")
    return path


def imported(run_cli: RunCli, source: Path, out: Path) -> dict[str, Any]:
    result = run_cli("snapshot", "import-nvidia-smi", str(source), "--out", str(out))
    assert result.code == 0, result.stderr
    return json.loads((out / "nvml.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def facts_of(out: Path) -> NvmlFacts:
    facts, status = read_nvml(RecordedNvml.from_file(out / "nvml.json"), initialized=True)
    assert status.ok and isinstance(facts, NvmlFacts), status.error
    return facts


def audited(run_cli: RunCli, snapshot: Path, config: Path) -> tuple[int, dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(snapshot), "--config", str(config), "--format", "json")
    assert result.stdout, result.stderr
    return result.code, result.json()


def finding(report: dict[str, Any], check: str, subject: str = "node") -> dict[str, Any]:
    return next(f for f in report["findings"] if f["check"] == check and f["subject"] == subject)


# --- the attached count is recorded -------------------------------------------------------------------


def test_a_selection_of_one_of_eight_imports_with_the_attached_count(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import-nvidia-smi", str(selection(tmp_path)), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "imported 1 GPU(s), driver 565.57.01" in result.stdout
    assert "dump says 8 attached GPUs but holds 1 GPU section, each whole (a dump of selected GPUs" in result.stderr
    document = json.loads((out / "nvml.json").read_text(encoding="utf-8"))
    assert (document["attached_gpus"], document["system"]["nvmlDeviceGetCount"], len(document["devices"])) == (8, 1, 1)
    facts = facts_of(out)
    assert (facts.attached, facts.device_count, len(facts.gpus)) == (8, 1, 1)
    assert facts.gpus[0].pci_bus_id == "0000:18:00.0" and facts.gpus[0].lost is None


def test_an_xml_selection_records_its_attached_gpus(run_cli: RunCli, tmp_path: Path) -> None:
    document = imported(run_cli, TELEGRAF_A100, tmp_path / "snap")
    assert (document["attached_gpus"], document["system"]["nvmlDeviceGetCount"]) == (4, 1)
    assert facts_of(tmp_path / "snap").attached == 4


@pytest.mark.parametrize("source", [H100X8, A100X4])
def test_a_dump_of_every_gpu_records_no_attached_count(run_cli: RunCli, tmp_path: Path, source: Path) -> None:
    assert "attached_gpus" not in imported(run_cli, source, tmp_path / "snap")
    assert facts_of(tmp_path / "snap").attached is None


def test_a_selection_cut_inside_its_gpu_section_is_still_refused(run_cli: RunCli, tmp_path: Path) -> None:
    cut = selection(tmp_path, keep_lines=120)  # the section stops before its "Processes" line
    result = run_cli("snapshot", "import-nvidia-smi", str(cut), "--out", str(tmp_path / "snap"))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "dump says 8 attached GPUs but holds 1 GPU section (truncated or corrupted?)" in result.stderr
    assert not (tmp_path / "snap").exists()


# --- what the audit concludes from a selection ------------------------------------------------------------


def test_a_selection_of_one_of_eight_is_judged_as_the_whole_board(run_cli: RunCli, tmp_path: Path,
                                                                   empty_config: Path) -> None:
    """The dump says 8 attached: board_fit sees the whole board, so the visible GPU's board-level facts count."""
    out = tmp_path / "snap"
    imported(run_cli, selection(tmp_path), out)
    _code, report = audited(run_cli, out, empty_config)
    assert report["profile"] == "hgx-h100-sxm"
    match = finding(report, "profile.match")
    assert match["status"] == "pass" and "partial view" not in match["message"], match
    fabric = finding(report, "gpu.fabric", "gpu0")  # judged, not skipped as a partial view
    assert fabric["status"] == "pass" and "completed" in fabric["message"]
    assert finding(report, "gpu.lost", "gpu0")["status"] == "pass"


def test_a_selection_of_one_of_eight_passes_the_board_count(run_cli: RunCli, tmp_path: Path,
                                                            empty_config: Path) -> None:
    """SRE reading: not a fault. NVML on the node counted the board's 8 GPUs; 7 are only not in this dump."""
    out = tmp_path / "snap"
    imported(run_cli, selection(tmp_path), out)
    code, report = audited(run_cli, out, empty_config)
    count = finding(report, "gpu.count")
    assert (count["status"], count["observed"], count["expected"]) == ("pass", 8, 8), count
    assert "not in this dump" in count["message"], count
    criticals = [f for f in report["findings"] if f["status"] == "fail" and f["severity"] == "critical"]
    assert criticals == [] and code == (1 if report["summary"]["fail"] else 0)


def test_a_selection_of_one_of_four_attached_is_still_a_partial_view_of_an_eight_gpu_board(
        run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    """telegraf kept 1 of 4 attached A100s: 4 is not dgx-a100's 8, so the count is not judged (no false fail)."""
    out = tmp_path / "snap"
    imported(run_cli, TELEGRAF_A100, out)
    _code, report = audited(run_cli, out, empty_config)
    assert report["profile"] == "dgx-a100"
    count = finding(report, "gpu.count")
    assert count["status"] == "skip" and "partial view" in count["message"] and "of 4 attached" in count["message"]


def test_board_fit_names_the_attached_count_as_its_evidence() -> None:
    h100 = ProfileStore().profile("hgx-h100-sxm")
    facts = nvml_node([gpu_facts(0)], host_facts=host(pci=(gpu("0000:19:00.0"),),
                                                      dmi={"sys_vendor": "QEMU", "product_name": "Standard PC"}))
    assert isinstance(facts.nvml, NvmlFacts)
    assert not board_fit(h100, facts).full  # one GPU, nothing else: a partial view
    selected = dataclasses.replace(facts, nvml=facts.nvml._replace(attached=8))
    fit = board_fit(h100, selected)
    assert fit.full and "'Attached GPUs : 8'" in fit.why, fit
    assert not board_fit(h100, dataclasses.replace(facts, nvml=facts.nvml._replace(attached=4))).full


# --- HGX A100 4-GPU --------------------------------------------------------------------------------------


def test_the_4x_a100_dump_is_judged_by_the_4_gpu_board(run_cli: RunCli, tmp_path: Path,
                                                       empty_config: Path) -> None:
    out = tmp_path / "snap"
    imported(run_cli, A100X4, out)
    code, report = audited(run_cli, out, empty_config)
    assert report["profile"] == "hgx-a100-4gpu" and code == 0
    count = finding(report, "gpu.count")
    assert (count["status"], count["severity"], count["observed"], count["expected"]) == ("pass", "critical", 4, 4)
    match = finding(report, "profile.match")
    assert "gpu_count=4" in match["message"] and "partial view" not in match["message"]
    remap = finding(report, "gpu.row_remap", "gpu1")  # what the dump shows is still concluded
    assert remap["status"] == "warn" and remap["action"] == "reset_gpu"


def a100(address: str) -> PciFunction:
    return gpu(address, device=0x20B2)


A100_NVSWITCH = 0x1AF1  # the second-generation NVSwitch of the HGX/DGX A100 8-GPU baseboard


@pytest.mark.parametrize(("ids", "count", "expected"), [
    (["10de:20b2"] * 4, 4, "hgx-a100-4gpu"),
    (["10de:20b0"] * 4, 4, "hgx-a100-4gpu"),
    (["10de:20b2"] * 8, 8, "dgx-a100"),
    (["10de:20b2"] * 2, 2, "dgx-a100"),  # two of a board: which board is not known, the 8-GPU one judges
    (["10de:20b5"] * 4, 4, "nvidia-pcie"),  # A100 80GB PCIe cards are not an SXM board
])
def test_four_a100_sxm_gpus_choose_the_4_gpu_profile(ids: list[str], count: int, expected: str) -> None:
    chosen = select(Identity(tuple(ids), count, {"sys_vendor": "Supermicro", "product_name": "AS -2124GQ-NART"},
                             nvidia_driver=True), ProfileStore())
    assert chosen.profile.name == expected


def test_the_4_gpu_board_has_no_nvswitch_and_no_fabric_manager() -> None:
    profile = ProfileStore().profile("hgx-a100-4gpu")
    assert profile.section("board")["gpus"] == 4
    assert profile.expectation("fabric", "manager") is None
    nvswitch = profile.expectation("fabric", "nvswitch", "count")
    assert nvswitch is not None and nvswitch.expected == 0 and nvswitch.severity.value == "critical"
    links = profile.expectation("gpu", "nvlink", "active_links")
    assert links is not None and links.expected == 12  # 4 NVLink3 links to each of the other three GPUs


def test_an_8_gpu_a100_board_with_four_gpus_gone_is_not_hidden_by_the_4_gpu_profile() -> None:
    """Four A100s on PCI with the 8-GPU board's six NVSwitches: the match picks the 4-GPU profile (match rules
    cannot see switches), and fabric.nvswitch.count fails critical, naming the 8-GPU baseboard."""
    gpus = [gpu_facts(i, pci_id="10de:20b2", name="NVIDIA A100-SXM4-80GB", architecture=7,
                      compute_capability="8.0") for i in range(4)]
    switches = tuple(PciFunction(address=f"0000:{b}:00.0", vendor=0x10DE, device=A100_NVSWITCH, class_code=0x068000)
                     for b in ("c1", "c2", "c3", "c4", "c5", "c6"))
    facts = nvml_node(gpus, host_facts=host(pci=(*(a100(g.pci_bus_id) for g in gpus), *switches),
                                            dmi={"sys_vendor": "NVIDIA", "product_name": "DGXA100"}))
    store = ProfileStore()
    from agent.policy.matching import identify

    assert isinstance(facts.nvml, NvmlFacts)
    profile = select(identify(facts.host, facts.nvml), store).profile
    assert profile.name == "hgx-a100-4gpu"
    (found,) = NVSWITCH_COUNT.run(facts, profile)
    assert (found.status.value, found.severity.value, found.observed, found.expected) == ("fail", "critical", 6, 0)
    assert "8-GPU HGX/DGX A100" in (found.reason or "")
    (count,) = [f for f in COUNT.run(facts, profile) if f.subject == "node"]
    assert count.status.value == "pass"  # 4 of the profile's 4: the NVSwitch finding is what tells the SRE
