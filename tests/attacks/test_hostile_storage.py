"""A hostile BMC's storage (issue 22 item 7): the walk and the parser stay bounded, odd values judge nothing.

The BMC lists 5,000 drives in one Storage, sends slot labels of 100,000 characters, media life of
1e308, NaN-as-text, -5 and 150 %, FailurePredicted as a string, and a Volume whose Links.Drives
holds 10,000 links. The audit must read at most MAX_DRIVES drives, keep short labels, judge no
nonsense number and never fail on an absent bay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.core.facts import BmcFacts
from agent.core.model import Status
from agent.policy.profiles import ProfileStore
from agent.sources.redfish import RecordedRedfish, read_redfish
from agent.sources.redfish_storage import TEXT_CHARS
from agent.sources.redfish_walk import MAX_DRIVES
from checks.bmc_storage import DRIVES, MEDIA_LIFE, VOLUMES
from tests.factories import node_of

STORAGE = "/redfish/v1/Systems/1/Storage/RAID"
LIVES: list[Any] = [1e308, "NaN", -5, 150, "99", None]


class HostileStorageBmc(RecordedRedfish):
    """Serves a minimal service whose storage is hostile; everything else is 404."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        self.requests += 1
        bodies: dict[str, dict[str, Any]] = {
            "/redfish/v1": {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                            "Systems": {"@odata.id": "/redfish/v1/Systems"}},
            "/redfish/v1/Systems": {"@odata.id": "/redfish/v1/Systems", "@odata.type": "#ComputerSystemCollection."
                                    "ComputerSystemCollection", "Members": [{"@odata.id": "/redfish/v1/Systems/1"}],
                                    "Members@odata.count": 1},
            "/redfish/v1/Systems/1": {"@odata.id": "/redfish/v1/Systems/1",
                                      "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
                                      "Storage": {"@odata.id": "/redfish/v1/Systems/1/Storage"}},
            "/redfish/v1/Systems/1/Storage": {"@odata.id": "/redfish/v1/Systems/1/Storage",
                                              "@odata.type": "#StorageCollection.StorageCollection",
                                              "Members": [{"@odata.id": STORAGE}], "Members@odata.count": 1},
            STORAGE: {"@odata.id": STORAGE, "@odata.type": "#Storage.v1_9_0.Storage",
                      "Drives": [{"@odata.id": f"{STORAGE}/Drives/{i}"} for i in range(5000)],
                      "Volumes": {"@odata.id": f"{STORAGE}/Volumes"}},
            f"{STORAGE}/Volumes": {"@odata.id": f"{STORAGE}/Volumes", "@odata.type": "#VolumeCollection."
                                   "VolumeCollection", "Members": [{"@odata.id": f"{STORAGE}/Volumes/0"}],
                                   "Members@odata.count": 1},
            f"{STORAGE}/Volumes/0": {"@odata.id": f"{STORAGE}/Volumes/0", "@odata.type": "#Volume.v1_9_0.Volume",
                                     "Name": "V" * 100_000, "Status": {"State": "Enabled", "Health": "OK"},
                                     "Links": {"Drives": [{"@odata.id": f"{STORAGE}/Drives/{i}"}
                                                          for i in range(10_000)]}},
        }
        if path in bodies:
            return bodies[path]
        if path.startswith(f"{STORAGE}/Drives/"):
            index = int(path.rsplit("/", 1)[-1])
            absent = index % 7 == 0
            return {"@odata.id": path, "@odata.type": "#Drive.v1_17_0.Drive", "Id": str(index),
                    "Name": "D" * 100_000,
                    "Status": {"State": "Absent" if absent else "Enabled", "Health": "Critical" if absent else "OK"},
                    "PhysicalLocation": {"PartLocation": {"ServiceLabel": f"Bay {index} " + "x" * 100_000}},
                    "FailurePredicted": "yes" if index % 5 == 0 else False,
                    "PredictedMediaLifeLeftPercent": LIVES[index % len(LIVES)]}
        return super().get(path, expand)


def test_a_hostile_storage_is_read_bounded_and_judges_nothing_absurd() -> None:
    transport = HostileStorageBmc()
    bmc, status, _ = read_redfish(lambda: transport, deadline_s=60)
    assert isinstance(bmc, BmcFacts) and isinstance(bmc.drives, tuple) and isinstance(bmc.volumes, tuple)
    assert len(bmc.drives) == MAX_DRIVES and transport.requests < MAX_DRIVES + 20
    assert all(len(d.slot) <= TEXT_CHARS and len(d.name) <= TEXT_CHARS for d in bmc.drives)
    assert len(bmc.volumes[0].name) <= TEXT_CHARS and len(bmc.volumes[0].drives) <= 64
    lives = {d.life_left_pct for d in bmc.drives}
    assert lives <= {None, 99.0}  # 1e308, NaN, -5 and 150 % are no media life
    assert any("FailurePredicted" in p for p in bmc.problems)  # "yes" is recorded as unusable, not believed
    facts = node_of(bmc, status)
    profile = ProfileStore().profile("generic-nvidia")
    findings = [f for check in (DRIVES, MEDIA_LIFE, VOLUMES) for f in check.run(facts, profile)]
    assert not any(f.status is Status.FAIL for f in findings)  # every Critical drive is an Absent bay
    assert all(f.status is Status.PASS for f in findings if f.check == "bmc.storage.media_life")


CHASSIS = "/redfish/v1/Chassis/1"


class HostileChassisBmc(RecordedRedfish):
    """A Chassis that lists 10,000 drives in `Links.Drives` and 10,000 more in its `Drives` collection,
    links outside the service, one non-list `Links.Drives` on a second chassis, and serial numbers that are
    placeholders ("N/A", "0000000000") shared by every drive."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        self.requests += 1
        bodies: dict[str, dict[str, Any]] = {
            "/redfish/v1": {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                            "Chassis": {"@odata.id": "/redfish/v1/Chassis"}},
            "/redfish/v1/Chassis": {"@odata.id": "/redfish/v1/Chassis", "@odata.type": "#ChassisCollection."
                                    "ChassisCollection", "Members@odata.count": 2,
                                    "Members": [{"@odata.id": CHASSIS}, {"@odata.id": "/redfish/v1/Chassis/2"}]},
            CHASSIS: {"@odata.id": CHASSIS, "@odata.type": "#Chassis.v1_14_0.Chassis",
                      "Drives": {"@odata.id": f"{CHASSIS}/Drives"},
                      "Links": {"Drives": [{"@odata.id": "/etc/passwd"}, {"@odata.id": 7}, "x",
                                           *({"@odata.id": f"{CHASSIS}/Drives/L{i}"} for i in range(10_000))]}},
            "/redfish/v1/Chassis/2": {"@odata.id": "/redfish/v1/Chassis/2", "@odata.type": "#Chassis.v1_14_0.Chassis",
                                      "Links": {"Drives": "all of them"}},
            f"{CHASSIS}/Drives": {"@odata.id": f"{CHASSIS}/Drives", "@odata.type": "#DriveCollection.DriveCollection",
                                  "Members": [{"@odata.id": f"{CHASSIS}/Drives/{i}"} for i in range(10_000)],
                                  "Members@odata.count": 10_000},
        }
        if path in bodies:
            return bodies[path]
        if path.startswith(f"{CHASSIS}/Drives/"):
            name = path.rsplit("/", 1)[-1]
            return {"@odata.id": path, "@odata.type": "#Drive.v1_17_0.Drive", "Id": name, "Model": "M",
                    "SerialNumber": "N/A" if name.startswith("L") else "0000000000",
                    "Status": {"State": "Enabled", "Health": "OK"}}
        return super().get(path, expand)


def test_a_hostile_chassis_drive_list_is_read_bounded_and_placeholder_serials_merge_nothing() -> None:
    transport = HostileChassisBmc()
    bmc, _status, _ = read_redfish(lambda: transport, deadline_s=60)
    assert isinstance(bmc, BmcFacts) and isinstance(bmc.drives, tuple)
    # at most MAX_DRIVES links from each list, each drive once; a placeholder serial is no identity: nothing merged
    assert len(bmc.drives) == 2 * MAX_DRIVES - 1 and not any(d.aliases for d in bmc.drives)
    assert transport.requests < 2 * MAX_DRIVES + 20
    assert any("/etc/passwd" in p for p in bmc.problems)  # refused, named, never fetched
