"""Drives a Redfish Chassis lists (issue 22 item 7): `Chassis/{id}/Drives` and `Chassis.Links.Drives`.

HPE iLO, Dell iDRAC, Supermicro, Lenovo XCC and Huawei iBMC list drives under Chassis, NVMe backplanes
often only there. Every tree here is served by sushy-static (tests/peers/redfish.py) and read over HTTP as
from a live BMC: the real HPE DL380a Gen11 tree (fixtures/redfish/hpe-dl380a-gen11, whose Storage links the
drives its backplane Chassis lists), real Supermicro bodies (fixtures/redfish/single/gofish) and DMTF's
public-localstorage drive listed twice (fixtures/redfish-chassis-drives, SOURCES.md there).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts, NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import LiveRedfish, RecordedRedfish, RecordingRedfish, Walk, parse_bmc, read_redfish
from checks.bmc_health import REACHABLE
from checks.bmc_storage import DRIVES, MEDIA_LIFE, VOLUMES
from tests.factories import node_of
from tests.peers.redfish import RedfishPeers, mockup, redfish_peers

__all__ = ["redfish_peers"]  # the fixture used below, imported from the harness

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
GOFISH = FIXTURES / "redfish" / "single" / "gofish"
DMTF = FIXTURES / "redfish-chassis-drives" / "dmtf-public-localstorage"
BAY6 = "Slot=18:Port=1:Box=1:Bay=6"  # HPE: Chassis/DE00B000/Drives/3
V1 = "/redfish/v1"
BACKPLANE = f"{V1}/Chassis/NVMeSSD.0.Group.0.StorageBackplane"
ENCLOSURE = f"{V1}/Chassis/HA-RAID.0.StorageEnclosure.0"
CHECKS = (DRIVES, MEDIA_LIFE, VOLUMES, REACHABLE)


@pytest.fixture(scope="module")
def base() -> Profile:
    return ProfileStore().profile("generic-nvidia")


def findings(bmc: BmcFacts, prof: Profile) -> list[Finding]:
    facts: NodeFacts = node_of(bmc)
    return [f for check in CHECKS for f in check.run(facts, prof)]


def by_key(found: list[Finding]) -> dict[tuple[str, str], Finding]:
    keys = [(f.check, f.subject) for f in found]
    assert len(keys) == len(set(keys)), "one finding per check and subject: each drive judged once"
    return {(f.check, f.subject): f for f in found}


def live(url: str) -> LiveRedfish:
    return LiveRedfish(url, "admin", "secret", timeout_s=5.0, backoff_s=0.05)


def read_live(peers: RedfishPeers, tree: Path) -> BmcFacts:
    bmc = peers.sushy(tree)
    facts, _status, _ = read_redfish(lambda: live(bmc.url), deadline_s=60)
    assert isinstance(facts, BmcFacts), facts
    return facts


def load(path: Path) -> dict[str, Any]:
    body = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(body, dict)
    return body


def put(root: Path, path: str, body: dict[str, Any]) -> None:
    """Serve `body` at the Redfish `path` of the tree at `root`."""
    folder = root / path.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").write_text(json.dumps(body), encoding="utf-8")


def edit(root: Path, path: str, **changes: Any) -> None:
    body = load(root / path.strip("/") / "index.json")
    body.update(changes)
    put(root, path, body)


def hpe_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "hpe"
    shutil.copytree(mockup("hpe-dl380a-gen11"), tree)
    return tree


def unlist_from_storage(tree: Path, storage: str, drive: str) -> None:
    """The Storage no longer links `drive`: only its backplane Chassis lists it."""
    body = load(tree / storage.strip("/") / "index.json")
    body["Drives"] = [d for d in body["Drives"] if d["@odata.id"] != drive]
    body["Drives@odata.count"] = len(body["Drives"])
    put(tree, storage, body)


def test_a_failed_drive_only_the_chassis_drives_collection_lists_fails_with_its_slot(
        tmp_path: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    tree = hpe_tree(tmp_path)
    drive = f"{V1}/Chassis/DE00B000/Drives/3"
    unlist_from_storage(tree, f"{V1}/Systems/1/Storage/DE00B000", drive)
    edit(tree, drive, Status={"State": "Enabled", "Health": "Critical"})
    found = by_key(findings(read_live(redfish_peers, tree), base))
    failed = found[("bmc.storage.drives", f"drive {BAY6}")]
    assert (failed.status, failed.severity, failed.action) == (Status.FAIL, Severity.CRITICAL, "replace_drive")
    assert f"replace the drive in {BAY6}" in failed.message and "MO001600KXVYH" in failed.message
    # the RAID1 set it belongs to names it by its slot too; the drives both lists hold are judged once each
    assert BAY6 in found[("bmc.storage.volumes", "volume MR Volume 239")].message
    drives = [s for c, s in found if c == "bmc.storage.drives" and s != "not compared"]
    assert len(drives) == 7  # 4 + 4 bays on the two backplanes, one of them Absent (skipped)


def supermicro_backplanes(tree: Path) -> None:
    """Add to the tree a Supermicro NVMe backplane and RAID enclosure, as X12/X13 firmware lists them."""
    chassis = load(tree / "redfish/v1/Chassis/index.json")
    chassis["Members"] += [{"@odata.id": BACKPLANE}, {"@odata.id": ENCLOSURE}]
    chassis["Members@odata.count"] = len(chassis["Members"])
    put(tree, f"{V1}/Chassis", chassis)
    nvme = load(GOFISH / "supermicro_drive.nvme-bay22.json")  # real body: no location, Id "22"
    nvme["Status"] = {"State": "Enabled", "Health": "Critical"}
    put(tree, nvme["@odata.id"], nvme)
    put(tree, BACKPLANE, {"@odata.id": BACKPLANE, "@odata.type": "#Chassis.v1_9_1.Chassis",
                          "Id": "NVMeSSD.0.Group.0.StorageBackplane", "Name": "NVMe SSD backplane",
                          "ChassisType": "StorageEnclosure", "Links": {"Drives": [{"@odata.id": nvme["@odata.id"]}]}})
    enclosure = load(GOFISH / "supermicro_chassis.raid-enclosure.json")  # real body: no Status, 4 bays linked
    put(tree, ENCLOSURE, enclosure)
    bays = [d["@odata.id"] for d in enclosure["Links"]["Drives"]]
    # Bay 0: a placeholder (the drive's type and name, nothing else); bay 1: empty, and Critical as some
    # BMCs mark an empty bay; bays 2 and 3: linked but not served (404).
    put(tree, bays[0], {"@odata.id": bays[0], "@odata.type": "#Drive.v1_6_2.Drive", "Id": "Disk.Bay.0",
                        "Name": "Disk.Bay.0"})
    put(tree, bays[1], {"@odata.id": bays[1], "@odata.type": "#Drive.v1_6_2.Drive", "Id": "Disk.Bay.1",
                        "Name": "Disk.Bay.1", "Status": {"State": "Absent", "Health": "Critical"}})


def test_a_backplane_drive_in_links_drives_fails_and_placeholders_and_404s_are_never_failures(
        tmp_path: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    tree = hpe_tree(tmp_path)
    supermicro_backplanes(tree)
    found = by_key(findings(read_live(redfish_peers, tree), base))
    nvme = found[("bmc.storage.drives", "drive NVMeSSD.0.Group.0.StorageBackplane/22")]
    assert (nvme.status, nvme.severity) == (Status.FAIL, Severity.CRITICAL)
    assert "INTEL SSDPE2KX080T8O" in nvme.message and "PHLWOOFMEOWIAMCATDOG" in nvme.message
    skipped = found[("bmc.storage.drives", "not compared")]
    assert skipped.status is Status.SKIP
    assert skipped.observed == {"empty bays (Absent)": 2,  # HPE's bay 8 and the enclosure's bay 1
                                "listed with no Status and nothing else (placeholders)": 1}
    for bay in ("Disk.Bay.2", "Disk.Bay.3"):  # not served: not read, unknown, never "fine" nor a failure
        assert found[("bmc.reachable", f"{ENCLOSURE}/Drives/{bay}")].status is Status.UNKNOWN
    failed = {key for key, f in found.items() if f.status is Status.FAIL or (
        f.severity is Severity.CRITICAL and f.status not in (Status.PASS, Status.SKIP))}
    assert failed == {("bmc.storage.drives", "drive NVMeSSD.0.Group.0.StorageBackplane/22")}


def test_one_drive_a_storage_and_a_chassis_list_at_two_paths_is_judged_once_on_the_worse_health(
        tmp_path: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    """DMTF's public-localstorage: serial 1234570 at Storage/1/Drives/X and Chassis/1U/Drives/X."""
    tree = tmp_path / "dmtf"
    shutil.copytree(DMTF, tree / "redfish" / "v1")
    system, storage = f"{V1}/Systems/437XR1138R2", f"{V1}/Systems/437XR1138R2/Storage/1"
    in_storage = load(tree / storage.strip("/") / "Drives/32ADF365C6C1B7BD/index.json")["@odata.id"]
    put(tree, V1, {"@odata.id": V1, "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot", "Id": "RootService",
                   "Systems": {"@odata.id": f"{V1}/Systems"}, "Chassis": {"@odata.id": f"{V1}/Chassis"}})
    put(tree, f"{V1}/Systems", {"@odata.id": f"{V1}/Systems", "@odata.type": "#ComputerSystemCollection."
                                "ComputerSystemCollection", "Members": [{"@odata.id": system}],
                                "Members@odata.count": 1})
    put(tree, system, {"@odata.id": system, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
                       "Id": "437XR1138R2", "Status": {"State": "Enabled", "Health": "OK"},
                       "Storage": {"@odata.id": f"{system}/Storage"}})
    put(tree, f"{system}/Storage", {"@odata.id": f"{system}/Storage", "@odata.type": "#StorageCollection."
                                    "StorageCollection", "Members": [{"@odata.id": storage}],
                                    "Members@odata.count": 1})
    put(tree, storage, {"@odata.id": storage, "@odata.type": "#Storage.v1_18_0.Storage", "Id": "1",
                        "Drives": [{"@odata.id": in_storage}]})
    put(tree, f"{V1}/Chassis", {"@odata.id": f"{V1}/Chassis", "@odata.type": "#ChassisCollection."
                                "ChassisCollection", "Members": [{"@odata.id": f"{V1}/Chassis/1U"}],
                                "Members@odata.count": 1})
    put(tree, f"{V1}/Chassis/1U", {"@odata.id": f"{V1}/Chassis/1U", "@odata.type": "#Chassis.v1_26_0.Chassis",
                                   "Id": "1U", "ChassisType": "RackMount",
                                   "Drives": {"@odata.id": f"{V1}/Chassis/1U/Drives"}})
    # The copies disagree (a BMC answering one from a stale cache): the Critical one is the evidence.
    edit(tree, f"{V1}/Chassis/1U/Drives/32ADF365C6C1B7BD", Status={"State": "Enabled", "Health": "Critical"})
    bmc = read_live(redfish_peers, tree)
    assert isinstance(bmc.drives, tuple)
    assert [(d.serial, d.where) for d in bmc.drives] == [("1234570", f"{V1}/Chassis/1U/Drives/32ADF365C6C1B7BD")]
    assert bmc.drives[0].aliases == (in_storage,)  # a volume naming the other copy still finds the slot
    found = by_key(findings(bmc, base))
    drives = {key: f.status for key, f in found.items() if key[0] == "bmc.storage.drives"}
    assert drives == {("bmc.storage.drives", "drive 1U/32ADF365C6C1B7BD"): Status.FAIL}


def test_a_chassis_drives_collection_that_404s_is_not_exposed_never_a_failure(
        tmp_path: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    tree = hpe_tree(tmp_path)
    (tree / "redfish/v1/Chassis/DE00A000/Drives/index.json").unlink()  # linked, not served; its drives still are
    bmc = redfish_peers.sushy(tree)
    walk = Walk(live(bmc.url), deadline_s=60)
    walk.run()
    assert f"{V1}/Chassis/DE00A000/Drives" in walk.not_exposed and f"{V1}/Chassis/DE00B000/Drives" in walk.resources
    assert not any(path.startswith(f"{V1}/Chassis/DE00A000/Drives") for path in walk.errors)
    found = by_key(findings(parse_bmc(walk), base))
    storage = {key: f.status for key, f in found.items() if key[0].startswith("bmc.storage.")}
    assert storage and set(storage.values()) <= {Status.PASS, Status.SKIP}
    assert found[("bmc.storage.drives", "drive Slot=17:Port=2:Box=1:Bay=4")].status is Status.PASS


def test_a_capture_records_the_chassis_drives_and_replays_them(
        tmp_path: Path, redfish_peers: RedfishPeers, base: Profile) -> None:
    """`snapshot capture` records what the walk read (RecordingRedfish): a recorded BMC replays its
    Chassis-only drive."""
    tree = hpe_tree(tmp_path)
    drive = f"{V1}/Chassis/DE00B000/Drives/3"
    unlist_from_storage(tree, f"{V1}/Systems/1/Storage/DE00B000", drive)
    edit(tree, drive, Status={"State": "Enabled", "Health": "Critical"})
    bmc = redfish_peers.sushy(tree)
    recorders: list[RecordingRedfish] = []

    def make() -> RecordingRedfish:
        recorders.append(RecordingRedfish(live(bmc.url)))
        return recorders[-1]

    read_redfish(make, deadline_s=60)
    snapshot = tmp_path / "snapshot"
    recorders[-1].write(snapshot)
    assert (snapshot / "redfish/v1/Chassis/DE00B000/Drives/index.json").is_file()
    replayed, _status, _ = read_redfish(lambda: RecordedRedfish(snapshot), deadline_s=60)
    assert isinstance(replayed, BmcFacts)
    failed = by_key(findings(replayed, base))[("bmc.storage.drives", f"drive {BAY6}")]
    assert (failed.status, failed.severity) == (Status.FAIL, Severity.CRITICAL)
