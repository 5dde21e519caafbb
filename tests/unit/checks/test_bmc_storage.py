"""bmc.storage.* (issue 22 item 7): drives and volumes from the BMC, reported with the slot.

The real HPE iLO trees (fixtures/redfish/hpe-*) are the negative oracle: healthy NVMe/SAS SSDs at
99-100 % media life, a healthy RAID1 volume, empty bays that are `Absent`. The faults are the same
real tree with a failed drive, a drive predicting its failure at 4 % life left and a degraded volume,
served by sushy-static (tests/peers/redfish.py) and read over HTTP as from a live BMC.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcDrive, BmcFacts, BmcVolume, NodeFacts
from agent.core.model import Finding, Severity, Status, Unsupported
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import LiveRedfish, read_redfish
from checks.bmc_storage import DRIVES, MEDIA_LIFE, VOLUMES
from tests.factories import exp, node_of, profile
from tests.oracle.test_bmc_evidence import CompletedRecording
from tests.peers.redfish import RedfishPeers, mockup, redfish_peers

__all__ = ["redfish_peers"]  # the fixture used below, imported from the harness

HPE = "hpe-dl380a-gen11"
NODES = Path(__file__).resolve().parents[3] / "fixtures" / "nodes"
BAY6, BAY7, BAY8 = ("Slot=18:Port=1:Box=1:Bay=6", "Slot=18:Port=2:Box=1:Bay=7", "Slot=18:Port=2:Box=1:Bay=8")
CHECKS = (DRIVES, MEDIA_LIFE, VOLUMES)


@pytest.fixture(scope="module")
def base() -> Profile:
    return ProfileStore().profile("generic-nvidia")


def run(bmc: BmcFacts, prof: Profile) -> dict[tuple[str, str], Finding]:
    facts: NodeFacts = node_of(bmc)
    return {(f.check, f.subject): f for check in CHECKS for f in check.run(facts, prof)}


def recorded(name: str) -> BmcFacts:
    """The tree as its BMC answered it (collections the mockup held back rebuilt from their members)."""
    facts, _status, _ = read_redfish(lambda: CompletedRecording(mockup(name)))
    assert isinstance(facts, BmcFacts)
    return facts


# --- the real trees: healthy drives pass, empty bays are skipped, every drive is named by its slot ------


@pytest.mark.parametrize(("name", "absent"), [(HPE, 1), ("hpe-ilo5-dl360-gen10plus", 6)])
def test_real_hpe_storage_is_healthy_and_named_by_slot(name: str, absent: int, base: Profile) -> None:
    found = run(recorded(name), base)
    not_pass = {key: f.status for key, f in found.items() if f.status is not Status.PASS}
    # The Absent bays are skipped: the DL380a's Storage lists one, the iLO 5's Storage lists only its two
    # present drives and its backplane Chassis (Chassis/DE00A000/Drives) all eight bays, six Absent.
    assert not_pass == {("bmc.storage.drives", "not compared"): Status.SKIP}
    assert found[("bmc.storage.drives", "not compared")].observed == {"empty bays (Absent)": absent}
    drives = [f for (check, _), f in found.items() if check == "bmc.storage.drives" and f.status is Status.PASS]
    assert drives and all(f.subject.startswith("drive Slot=") for f in drives)
    lives = [f for (check, _), f in found.items() if check == "bmc.storage.media_life"]
    assert lives and all(f.status is Status.PASS and f.observed in (99.0, 100.0) for f in lives)


def test_real_raid1_volume_names_its_drives_by_slot(base: Profile) -> None:
    volume = run(recorded(HPE), base)[("bmc.storage.volumes", "volume MR Volume 239")]
    assert volume.status is Status.PASS
    assert "(RAID1)" in volume.message and BAY6 in volume.message and BAY7 in volume.message


def test_a_bmc_without_storage_is_one_skip_for_the_family(base: Profile) -> None:
    found = run(recorded("cray-ex425-amd-milan-blade"), base)
    assert {key: f.status for key, f in found.items()} == {("bmc.storage.drives", "bmc"): Status.SKIP}


def test_the_simulated_nodes_boot_pair_is_judged_over_http(redfish_peers: RedfishPeers, base: Profile) -> None:
    """fixtures/tools/redfishgen's iDRAC tree (hgx-h100-healthy) served by sushy-static: the BOSS-N1 pair."""
    bmc = redfish_peers.sushy(NODES / "hgx-h100-healthy")
    facts, _status, _ = read_redfish(
        lambda: LiveRedfish(bmc.url, "admin", "secret", timeout_s=5.0, backoff_s=0.05), deadline_s=60)
    assert isinstance(facts, BmcFacts), facts
    found = run(facts, base)
    assert {key: f.status for key, f in found.items()} == {
        ("bmc.storage.drives", "drive Bay 0"): Status.PASS, ("bmc.storage.drives", "drive Bay 1"): Status.PASS,
        ("bmc.storage.media_life", "drive Bay 0"): Status.PASS, ("bmc.storage.media_life", "drive Bay 1"): Status.PASS,
        ("bmc.storage.volumes", "volume BOSS volume"): Status.PASS}
    assert "(RAID1) on Bay 0, Bay 1" in found[("bmc.storage.volumes", "volume BOSS volume")].message


# --- faults, read from a live (sushy-static) BMC --------------------------------------------------------


def _edit(path: Path, **changes: Any) -> None:
    body = json.loads(path.read_text(encoding="utf-8"))
    body.update(changes)
    path.write_text(json.dumps(body), encoding="utf-8")


@pytest.fixture
def faulty_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "hpe-faulty"
    shutil.copytree(mockup(HPE), tree)
    v1 = tree / "redfish" / "v1"
    _edit(v1 / "Chassis/DE00B000/Drives/3/index.json", Status={"State": "Enabled", "Health": "Critical"})
    _edit(v1 / "Chassis/DE00B000/Drives/4/index.json", FailurePredicted=True, PredictedMediaLifeLeftPercent=4.0)
    _edit(v1 / "Systems/1/Storage/DE00B000/Volumes/239/index.json", Status={"State": "Enabled", "Health": "Warning"})
    # An empty bay some BMCs mark Critical: still an empty bay, never a failure.
    _edit(v1 / "Chassis/DE00B000/Drives/64520/index.json", Status={"State": "Absent", "Health": "Critical"})
    return tree


def test_failed_predicted_worn_drives_and_a_degraded_volume_from_a_live_bmc(
        faulty_tree: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    bmc = redfish_peers.sushy(faulty_tree)
    facts, _status, _ = read_redfish(
        lambda: LiveRedfish(bmc.url, "admin", "secret", timeout_s=5.0, backoff_s=0.05), deadline_s=60)
    assert isinstance(facts, BmcFacts), facts
    found = run(facts, base)
    failed = found[("bmc.storage.drives", f"drive {BAY6}")]
    assert (failed.status, failed.severity, failed.action) == (Status.FAIL, Severity.CRITICAL, "replace_drive")
    assert f"replace the drive in {BAY6}" in failed.message and "MO001600KXVYH" in failed.message
    predicted = found[("bmc.storage.drives", f"drive {BAY7}")]
    assert (predicted.status, predicted.severity) == (Status.WARN, Severity.WARNING)
    assert "FailurePredicted" in predicted.message
    worn = found[("bmc.storage.media_life", f"drive {BAY7}")]
    assert (worn.status, worn.severity, worn.observed) == (Status.WARN, Severity.WARNING, 4.0)
    volume = found[("bmc.storage.volumes", "volume MR Volume 239")]
    assert (volume.status, volume.severity) == (Status.WARN, Severity.WARNING)
    assert "degraded" in volume.message and BAY6 in volume.message
    skipped = found[("bmc.storage.drives", "not compared")]
    assert skipped.status is Status.SKIP and BAY8 in skipped.message
    assert not any(BAY8 in subject for _check, subject in found)


# --- rules, on facts ------------------------------------------------------------------------------------


def drive(slot: str = "Bay 1", **kw: Any) -> BmcDrive:
    fields: dict[str, Any] = {"state": "Enabled", "health": "OK", "model": "X", "where": f"/redfish/v1/d/{slot}"}
    fields.update(kw)
    return BmcDrive(name=slot, slot=slot, **fields)


def bmc_with(drives: tuple[BmcDrive, ...], volumes: tuple[BmcVolume, ...] = ()) -> BmcFacts:
    return BmcFacts(protocol="redfish", drives=drives, volumes=volumes)


def test_placeholders_and_absent_bays_are_never_failures(base: Profile) -> None:
    placeholder = BmcDrive(name="Drive 9", slot="9", where="/redfish/v1/d/9")
    absent = drive("Bay 2", state="Absent", health="Critical", failure_predicted=True, life_left_pct=0.0)
    found = run(bmc_with((placeholder, absent)), base)
    assert {k: f.status for k, f in found.items()} == {("bmc.storage.drives", "not compared"): Status.SKIP}


def test_a_present_drive_without_health_is_unknown_not_a_pass(base: Profile) -> None:
    found = run(bmc_with((drive("Bay 3", health=None),)), base)
    assert found[("bmc.storage.drives", "drive Bay 3")].status is Status.UNKNOWN


def test_a_warning_drive_warns_and_a_failed_volume_fails_with_drain(base: Profile) -> None:
    volumes = (BmcVolume("Scratch", "Enabled", "Critical", "RAID0", ("/redfish/v1/d/Bay 4",), "/v"),)
    found = run(bmc_with((drive("Bay 4", health="Warning"),), volumes), base)
    assert found[("bmc.storage.drives", "drive Bay 4")].status is Status.WARN
    failed = found[("bmc.storage.volumes", "volume Scratch")]
    assert (failed.status, failed.severity, failed.action) == (Status.FAIL, Severity.CRITICAL, "drain")
    assert "Bay 4" in failed.message


def test_the_media_life_floor_is_the_profiles() -> None:
    strict = profile({"bmc": {"storage": {"media_life_left_pct": exp("critical", min=50)}}})
    found = run(bmc_with((drive("Bay 5", life_left_pct=40.0), drive("Bay 6", life_left_pct=60.0))), strict)
    assert found[("bmc.storage.media_life", "drive Bay 5")].status is Status.FAIL
    assert found[("bmc.storage.media_life", "drive Bay 6")].status is Status.PASS


def test_out_of_range_life_and_no_storage_view_are_not_judged(base: Profile) -> None:
    bogus = run(bmc_with((drive("Bay 7", life_left_pct=None),)), base)
    assert ("bmc.storage.media_life", "drive Bay 7") not in bogus
    ipmi = run(BmcFacts(protocol="ipmi"), base)  # IPMI has no storage view: nothing said
    assert ipmi == {}
    none = run(BmcFacts(protocol="redfish", drives=Unsupported("this BMC does not expose storage"),
                        volumes=Unsupported("this BMC does not expose storage")), base)
    assert [f.status for f in none.values()] == [Status.SKIP]
