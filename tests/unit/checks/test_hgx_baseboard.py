"""Issue 13 rule 9: the HGX baseboard's view of each GPU against the host system's own.

The real trees are LambdaLabs redfish_exporter fixtures (fixtures/redfish/SOURCES.md): an HGX B200 on a
Supermicro SYS-A21GE (`gpu_info_unknown_multi`, baseboard GPUs GPU_SXM_1/2 in slots SXM1/SXM2, the host
system `Systems/1` lists CPUs only) and a GB200 NVL tray (`gathergpus_happypath`, whose host system
`System_0` leaves BiosVersion empty). The second view is added to a copy of the real tree the way a
Supermicro HGX BMC lists GPUs under the host (`Systems/1/Processors/GPU1`): those resources are ours.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts, BmcGpu, NodeFacts
from agent.core.model import Finding, Severity, SourceStatus, Status
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import RecordedRedfish, read_redfish
from checks.crosscheck import COUNT
from checks.crosscheck_hgx import HGX_HEALTH, pair_views
from tests.conftest import REPO, RunCli
from tests.factories import gpu_facts, nvml_node

TREES = REPO / "fixtures" / "redfish"
MULTI = "gpu_info_unknown_multi"
BOARD = "/redfish/v1/Systems/HGX_Baseboard_0/Processors"
HOST = "/redfish/v1/Systems/1/Processors"


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


def read_tree(base: Path) -> BmcFacts:
    bmc, status, _ = read_redfish(lambda: RecordedRedfish(base), deadline_s=60)
    assert isinstance(bmc, BmcFacts), bmc
    assert status.ok
    return bmc


def judge(bmc: BmcFacts, profile: Profile) -> dict[str, Finding]:
    facts: NodeFacts = nvml_node()
    facts.bmc = bmc
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    return {f.subject: f for f in HGX_HEALTH.run(facts, profile)}


def edit(path: Path, **changes: Any) -> None:
    body = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        body[key] = value
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")


def two_views(tmp_path: Path, host_status: dict[str, dict[str, str]] | None = None,
              board_status: dict[str, dict[str, str]] | None = None, serials: dict[str, str] | None = None) -> Path:
    """A copy of the real HGX B200 tree whose host system also lists the two GPUs."""
    base = tmp_path / MULTI
    shutil.copytree(TREES / MULTI, base)
    v1 = base / "redfish" / "v1"
    members = [{"@odata.id": f"{HOST}/1"}, {"@odata.id": f"{HOST}/2"}]
    for n in (1, 2):
        name = f"GPU{n}"
        body = {"@odata.id": f"{HOST}/{name}", "@odata.type": "#Processor.v1_13_0.Processor", "Id": name,
                "Name": name, "ProcessorType": "GPU", "Manufacturer": "NVIDIA", "Model": "B200 180GB HBM3e",
                "Location": {"PartLocation": {"ServiceLabel": name}},
                "Status": (host_status or {}).get(name, {"State": "Enabled", "Health": "OK"})}
        if serials and name in serials:
            body["SerialNumber"] = serials[name]
        (v1 / "Systems" / "1" / "Processors" / name).mkdir()
        (v1 / "Systems" / "1" / "Processors" / name / "index.json").write_text(json.dumps(body), encoding="utf-8")
        members.append({"@odata.id": f"{HOST}/{name}"})
    edit(v1 / "Systems" / "1" / "Processors" / "index.json", Members=members)
    for name, status in (board_status or {}).items():
        edit(v1 / "Systems" / "HGX_Baseboard_0" / "Processors" / name / "index.json", Status=status)
    for name, serial in (serials or {}).items():
        if name.startswith("GPU_SXM"):
            edit(v1 / "Systems" / "HGX_Baseboard_0" / "Processors" / name / "index.json", SerialNumber=serial)
    return base


# --- the real trees ----------------------------------------------------------------------------------


def test_real_baseboard_gpus_carry_their_view(generic: Profile) -> None:
    bmc = read_tree(TREES / MULTI)
    assert isinstance(bmc.gpus, tuple) and bmc.gpus == bmc.gpu_views
    assert [(g.where, g.system, g.baseboard, g.slot) for g in bmc.gpus] == [
        (f"{BOARD}/GPU_SXM_1", "HGX_Baseboard_0", True, "SXM1"), (f"{BOARD}/GPU_SXM_2", "HGX_Baseboard_0", True, "SXM2")]
    assert bmc.manufacturer == "Supermicro"  # the host system, not the baseboard
    only = judge(bmc, generic)
    assert list(only) == ["node"] and only["node"].status is Status.SKIP
    assert "only the HGX baseboard lists GPU processors (2)" in only["node"].message


def test_a_host_without_bios_version_is_still_the_host_not_the_baseboard() -> None:
    bmc = read_tree(TREES / "gathergpus_happypath")
    assert (bmc.manufacturer, bmc.model, bmc.system_uuid) == ("Supermicro", "GB NVL", "sys0-uuid")
    assert isinstance(bmc.gpus, tuple) and [(g.system, g.baseboard, g.uuid) for g in bmc.gpus] == [
        ("HGX_Baseboard_0", True, "uuid-here")]


# --- two views -------------------------------------------------------------------------------------------


def test_each_gpu_is_counted_once_when_both_views_list_it(tmp_path: Path, generic: Profile) -> None:
    bmc = read_tree(two_views(tmp_path))
    assert isinstance(bmc.gpus, tuple) and isinstance(bmc.gpu_views, tuple)
    assert [g.where.rsplit("/", 1)[-1] for g in bmc.gpus] == ["GPU_SXM_1", "GPU_SXM_2"]
    assert sorted(g.where.rsplit("/", 1)[-1] for g in bmc.gpu_views) == ["GPU1", "GPU2", "GPU_SXM_1", "GPU_SXM_2"]
    facts = nvml_node([gpu_facts(0), gpu_facts(1)])
    facts.bmc = bmc
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    (count,) = COUNT.run(facts, generic)
    assert count.status is Status.PASS and count.observed["bmc"] == count.observed["nvml"] == 2  # not 4 BMC GPUs
    agree = judge(bmc, generic)
    assert {s: f.status for s, f in agree.items()} == {"GPU_SXM_1": Status.PASS, "GPU_SXM_2": Status.PASS}
    assert "paired by position" in agree["GPU_SXM_1"].message


def test_warning_on_the_baseboard_while_the_host_says_ok_names_the_gpu(tmp_path: Path, generic: Profile) -> None:
    bmc = read_tree(two_views(tmp_path, board_status={"GPU_SXM_2": {"State": "Enabled", "Health": "Warning"}}))
    findings = judge(bmc, generic)
    assert findings["GPU_SXM_1"].status is Status.PASS
    bad = findings["GPU_SXM_2"]
    assert (bad.status, bad.severity, bad.action) == (Status.FAIL, Severity.WARNING, "check_bmc_events")
    assert "GPU GPU_SXM_2 (slot SXM2): the HGX baseboard reports Warning/Enabled" in bad.message
    assert "the host system (1) says OK" in bad.message and f"{HOST}/GPU2" in bad.message
    assert bad.observed == {"baseboard": "Warning/Enabled", "host": "OK/Enabled", "paired_by": "position"}


def test_in_test_on_the_host_view_warns(tmp_path: Path, generic: Profile) -> None:
    bmc = read_tree(two_views(tmp_path, host_status={"GPU1": {"State": "InTest", "Health": "OK"}}))
    finding = judge(bmc, generic)["GPU_SXM_1"]
    assert (finding.status, finding.severity) == (Status.WARN, Severity.WARNING)
    assert "the host system (1) reports OK/InTest while the HGX baseboard says OK" in finding.message
    assert "in-system test" in finding.message


def test_critical_in_one_view_is_critical_and_drains(tmp_path: Path, generic: Profile) -> None:
    bmc = read_tree(two_views(tmp_path, board_status={"GPU_SXM_1": {"State": "Enabled", "Health": "Critical"}}))
    finding = judge(bmc, generic)["GPU_SXM_1"]
    assert (finding.status, finding.severity, finding.action) == (Status.FAIL, Severity.CRITICAL, "drain")


def test_views_are_paired_by_serial_before_position(tmp_path: Path, generic: Profile) -> None:
    # The host lists the GPUs in the other order than the slots: GPU1 is the board's SXM2.
    serials = {"GPU1": "1654923000222", "GPU2": "1654923000111", "GPU_SXM_1": "1654923000111",
               "GPU_SXM_2": "1654923000222"}
    bmc = read_tree(two_views(tmp_path, host_status={"GPU1": {"State": "Enabled", "Health": "Critical"}},
                              serials=serials))
    findings = judge(bmc, generic)
    assert findings["GPU_SXM_1"].status is Status.PASS and findings["GPU_SXM_1"].observed["paired_by"] == "serial"
    assert findings["GPU_SXM_2"].status is Status.FAIL and f"{HOST}/GPU1" in findings["GPU_SXM_2"].message


def test_bmc_only_audit_reports_the_discrepancy(tmp_path: Path, run_cli: RunCli, empty_config: Path) -> None:
    tree = two_views(tmp_path, board_status={"GPU_SXM_2": {"State": "Enabled", "Health": "Warning"}})
    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.move(str(tree / "redfish"), snap / "redfish")
    (snap / "meta.yaml").write_text("hostname: hgx\ncaptured_at: '2026-01-01T00:00:00+00:00'\ncaptured: [redfish]\n",
                                    encoding="utf-8")
    result = run_cli("audit", "--config", str(empty_config), "--snapshot", str(snap), "--format", "json")
    assert result.code == 1, result.stderr
    found = {(f["check"], f["subject"]): f for f in result.json()["findings"]}
    assert found[("crosscheck.hgx_gpu_health", "GPU_SXM_2")]["status"] == "fail"
    assert found[("crosscheck.hgx_gpu_health", "GPU_SXM_1")]["status"] == "pass"


# --- the rules on hand-built views --------------------------------------------------------------------------


def view(name: str, baseboard: bool, health: str | None = "OK", state: str | None = "Enabled",
         serial: str | None = None) -> BmcGpu:
    system = "HGX_Baseboard_0" if baseboard else "1"
    return BmcGpu(name="Processor", health=health, state=state, serial=serial, system=system, baseboard=baseboard,
                  where=f"/redfish/v1/Systems/{system}/Processors/{name}")


def test_agreeing_bad_views_and_views_without_health(generic: Profile) -> None:
    bmc = BmcFacts(protocol="redfish", gpus=(view("GPU_SXM_1", True),), gpu_views=(
        view("GPU_SXM_1", True, "Warning"), view("GPU1", False, "Warning"),
        view("GPU_SXM_2", True), view("GPU2", False, None),
        view("GPU_SXM_3", True, "OK", "Absent"), view("GPU3", False, "Critical")))
    findings = judge(bmc, generic)
    assert findings["GPU_SXM_1"].status is Status.PASS  # both say Warning: bmc.health_rollup reports the fault
    assert findings["GPU_SXM_2"].status is Status.SKIP and "reports no health" in findings["GPU_SXM_2"].message
    assert findings["GPU_SXM_3"].status is Status.SKIP  # the baseboard does not see it (Absent): not a verdict


def test_placeholder_serials_do_not_pair_and_uneven_views_are_not_guessed() -> None:
    host = [view("GPU1", False, serial="NA"), view("GPU2", False, serial="NA")]
    board = [view("GPU_SXM_2", True, serial="NA"), view("GPU_SXM_1", True, serial="NA")]
    pairs, host_left, board_left = pair_views(host, board)
    assert [(h.where[-4:], b.where[-9:], how) for h, b, how in pairs] == [
        ("GPU1", "GPU_SXM_1", "position"), ("GPU2", "GPU_SXM_2", "position")]
    assert (host_left, board_left) == (0, 0)
    pairs, host_left, board_left = pair_views(host[:1], board)
    assert (pairs, host_left, board_left) == ([], 1, 2)
