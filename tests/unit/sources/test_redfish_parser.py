"""The Redfish parser on real single resources from vendors, and on malformed ones.

Vendor quirks are the normal case: none may crash the parse; unknown shapes
become unknowns naming the resource.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts
from agent.core.model import Unknown, Unsupported
from agent.sources.redfish import RecordedRedfish, RedfishError, Walk, _children, parse_bmc, read_redfish, valid_path

SINGLE = Path(__file__).resolve().parents[3] / "fixtures" / "redfish" / "single"


def load(rel: str) -> dict[str, Any]:
    return json.loads((SINGLE / rel).read_text())  # type: ignore[no-any-return]


def parse(resources: dict[str, dict[str, Any]]) -> BmcFacts:
    walk = Walk(RecordedRedfish(Path("/nonexistent")))
    walk.resources = {"/redfish/v1": {"RedfishVersion": "1.6.0", "Vendor": "Test"}, **resources}
    return parse_bmc(walk)


def test_dell_thermal_and_power() -> None:
    facts = parse({"/redfish/v1/Chassis/System.Embedded.1/Thermal": load("telegraf/dell/dell_thermal.json"),
                   "/redfish/v1/Chassis/System.Embedded.1/Power": load("telegraf/dell/dell_power.json")})
    assert isinstance(facts.temperatures, tuple) and facts.temperatures
    cpu = facts.temperatures[0]
    assert cpu.name == "CPU1 Temp" and cpu.reading is not None and cpu.upper_critical is not None
    assert isinstance(facts.psus, tuple) and facts.psus and isinstance(facts.fans, tuple) and facts.fans
    assert len({p.name for p in facts.psus}) == len(facts.psus)  # unique subjects


def test_hpe_power_and_thermal_subsystems() -> None:
    facts = parse({
        "/redfish/v1/Chassis/1/PowerSubsystem": load("telegraf/hp/power_subsys/hp_power_subsys.json"),
        "/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/1":
            load("telegraf/hp/power_subsys/hp_power_subsys_psu_1.json"),
        "/redfish/v1/Chassis/1/ThermalSubsystem": load("telegraf/hp/thermal_subsys/hp_thermal_subsys.json"),
        "/redfish/v1/Chassis/1/ThermalSubsystem/Fans/0": load("telegraf/hp/thermal_subsys/hp_thermal_subsys_fans_0.json"),
    })
    assert isinstance(facts.psus, tuple) and len(facts.psus) == 1
    assert isinstance(facts.fans, tuple) and len(facts.fans) == 1


def test_lenovo_power_and_bios() -> None:
    facts = parse({"/redfish/v1/Chassis/1/Power": load("bmclib/providers_lenovo__v1_power.json"),
                   "/redfish/v1/Systems/1/Bios": load("bmclib/providers_lenovo__v1_bios.json")})
    assert isinstance(facts.bios_attributes, dict) and facts.bios_attributes
    assert isinstance(facts.psus, tuple)


def test_dell_sel_entries_and_reused_ids() -> None:
    entries = load("bmclib/providers_redfish__v1_dell_entries.json")
    facts = parse({"/redfish/v1/Managers/iDRAC.Embedded.1/LogServices/Sel":
                   load("bmclib/providers_redfish__v1_dell_logservices.sel.json"),
                   "/redfish/v1/Managers/iDRAC.Embedded.1/LogServices/Sel/Entries": entries})
    assert isinstance(facts.events, tuple) and len(facts.events) == len(entries["Members"])


def test_leak_detector_and_unsupported_parts() -> None:
    facts = parse({"/redfish/v1/Chassis/1/ThermalSubsystem/LeakDetection/LeakDetectors/0":
                   load("lambdalabs/leak_detector_ok.json")})
    assert isinstance(facts.leak_detectors, tuple) and facts.leak_detectors[0].detector_state == "OK"
    assert isinstance(facts.psus, Unsupported) and "does not expose" in facts.psus.reason


def test_malformed_resources_never_crash() -> None:
    weird = {
        "/redfish/v1/Chassis/1/Thermal": {"@odata.type": "#Thermal.v1_0_0.Thermal",
                                          "Temperatures": [None, 5, {"Name": None, "ReadingCelsius": "hot",
                                                                     "Status": "broken"}],
                                          "Fans": "none"},
        "/redfish/v1/Chassis/1/Power": {"@odata.type": "#Power.v1_0_0.Power", "PowerSupplies": [{}, []],
                                        "Redundancy": [{"MinNumNeeded": "two"}], "PowerControl": [{}]},
        "/redfish/v1/Systems/1": {"@odata.type": "#ComputerSystem.v1_0_0.ComputerSystem", "Status": None,
                                  "Manufacturer": None, "BiosVersion": ""},
        "/redfish/v1/UpdateService/FirmwareInventory/x": {"@odata.type": "#SoftwareInventory.v1_0_0.SoftwareInventory",
                                                          "Version": None},
    }
    facts = parse(weird)
    assert isinstance(facts.temperatures, tuple) and facts.temperatures[0].reading is None
    assert isinstance(facts.bios_version, Unknown) and "BiosVersion is empty" in facts.bios_version.reason
    assert isinstance(facts.firmware, Unsupported)


def test_duplicated_members_and_odd_links_are_handled() -> None:
    collection = {"@odata.type": "#ChassisCollection.ChassisCollection", "Members@odata.count": 3,
                  "Members": [{"@odata.id": "/redfish/v1/Chassis/1"}, {"@odata.id": "/redfish/v1/Chassis/1"},
                              {"@odata.id": "/etc/passwd"}, "junk"]}
    assert _children("/redfish/v1/Chassis", collection) == ["/redfish/v1/Chassis/1", "/etc/passwd"]
    with pytest.raises(RedfishError):
        valid_path("/etc/passwd")
    with pytest.raises(RedfishError):
        valid_path("/redfish/v1/../../etc/passwd")
    assert valid_path("/redfish/v1/Chassis/1/Thermal#/Fans/0") == "/redfish/v1/Chassis/1/Thermal"


def test_a_recording_with_a_path_outside_the_tree_is_refused(tmp_path: Path) -> None:
    (tmp_path / "redfish" / "v1").mkdir(parents=True)
    (tmp_path / "redfish" / "v1" / "index.json").write_text(json.dumps(
        {"@odata.id": "/redfish/v1", "RedfishVersion": "1.0.0", "Systems": {"@odata.id": "/redfish/v1/../../secret"}}))
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "index.json").write_text("{}")
    facts, _status, _ = read_redfish(lambda: RecordedRedfish(tmp_path))
    assert isinstance(facts, BmcFacts)
    assert any("refusing an unexpected resource path" in p for p in facts.problems)


def test_fabric_switches_are_read_from_a_real_mockup() -> None:
    facts, _status, _ = read_redfish(lambda: RecordedRedfish(SINGLE.parent / "hpe-dl380a-gen11"))
    assert isinstance(facts, BmcFacts) and isinstance(facts.switches, tuple)
    # Two fabrics, each with one "Direct Attached" switch: subjects are made unique.
    assert sorted((s.name, s.switch_type, s.firmware) for s in facts.switches) == [
        ("Direct Attached #1", "MultiProtocol", "1.04"), ("Direct Attached #2", "MultiProtocol", "1.04")]
