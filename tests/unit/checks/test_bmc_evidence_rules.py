"""Issue 13's rules, one focused test each, on hand-made Redfish resources and BMC facts.

* rule 1: a critical finding needs positive evidence (sensors that do not measure, placeholder
  thresholds and parts, absence kept as absence);
* issue 12: a wrong-typed Redfish field is an unknown for that resource only;
* rule 3: event logs are open problems, not history (resolved, repaired, cleared, undated entries;
  which logs are hardware event logs);
* rule 4: firmware consistency compares like with like (part families, HPE's numbered inventory).

The real trees these rules were found on: tests/oracle/test_bmc_evidence.py.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts, BmcFan, BmcPsu, BmcSwitch, BmcTemperature, FirmwareItem
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import RecordedRedfish, read_redfish
from checks import Check
from checks.bmc_events import EVENTS
from checks.bmc_firmware import CONSISTENCY, component_model
from checks.bmc_health import FANS, LEAK, PSU, REACHABLE, ROLLUP, SWITCHES, TEMPERATURES
from tests.factories import NOW, by_subject, node_of, parse_resources


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


# --- helpers for the focused tests --------------------------------------------------------------------


def bmc(**parts: Any) -> BmcFacts:
    values: dict[str, Any] = dict(protocol="redfish", vendor="Test", health="OK", health_rollup="OK",
                                  temperatures=(), fans=(), psus=(), redundancy=(), leak_detectors=(), events=(),
                                  firmware=(), gpus=(), switches=())
    values.update(parts)
    return BmcFacts(**values)


def run(check: Check, facts: BmcFacts, profile: Profile, now: dt.datetime | None = NOW) -> dict[str, Finding]:
    return by_subject(check.run(node_of(facts, now=now), profile))


def entry(log: str, entry_id: str, severity: str, message: str, created: str | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"@odata.id": f"/redfish/v1/Systems/1/LogServices/{log}/Entries/{entry_id}",
                            "@odata.type": "#LogEntry.v1_15_0.LogEntry", "Id": entry_id, "Severity": severity,
                            "Message": message, "EntryType": "Event", **extra}
    if created is not None:
        body["Created"] = created
    return body


def logs(services: dict[str, dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A LogServices tree: {service id: service body} plus the entries (inline in each Entries collection)."""
    out: dict[str, Any] = {}
    for service, body in services.items():
        base = f"/redfish/v1/Systems/1/LogServices/{service}"
        out[base] = {"@odata.id": base, "@odata.type": "#LogService.v1_2_0.LogService", "Id": service,
                     "Entries": {"@odata.id": f"{base}/Entries"}, **body}
        out[f"{base}/Entries"] = {"@odata.type": "#LogEntryCollection.LogEntryCollection",
                                  "Members": [e for e in entries if e["@odata.id"].startswith(f"{base}/")]}
    return out


# --- rule 1: a critical finding needs positive evidence ------------------------------------------------


def test_sensors_that_do_not_measure_are_not_compared(generic: Profile) -> None:
    """Fails on the old code: UnavailableOffline/Disabled/StandbyOffline sensors above their thresholds failed."""
    hot = dict(reading=120.0, upper_caution=80.0, upper_critical=90.0, upper_fatal=100.0, health="Critical")
    sensors = tuple(BmcTemperature(f"T {state}", state=state, **hot)  # type: ignore[arg-type]
                    for state in ("Absent", "UnavailableOffline", "Disabled", "StandbyOffline"))
    sensors += (BmcTemperature("T null", None, 80.0, 90.0, 100.0, "Enabled", "Critical"),)
    result = run(TEMPERATURES, bmc(temperatures=sensors), generic)
    assert set(result) == {"not compared"}  # one skip that names them, not five failures
    skipped = result["not compared"]
    assert skipped.status is Status.SKIP and "5 sensor(s) not compared" in skipped.message
    assert skipped.observed == {"Absent": 1, "UnavailableOffline": 1, "Disabled": 1, "StandbyOffline": 1,
                                "no reading": 1}


def test_placeholder_thresholds_are_ignored(generic: Profile) -> None:
    """Fails on the old code: a 0 C threshold made every reading 'fatal'."""
    zero = BmcTemperature("VR Temp", 41.0, 0.0, 0.0, 0.0, "Enabled", "OK")
    (finding,) = run(TEMPERATURES, bmc(temperatures=(zero,)), generic).values()
    assert finding.status is Status.PASS and finding.observed == {"reading": 41.0, "level": "normal"}


def test_a_reading_that_echoes_its_threshold_without_health_is_a_placeholder(generic: Profile) -> None:
    """Fails on the old code: Slingshot's 24 cable sensors at exactly 60/60 C each failed."""
    echo = BmcTemperature("j1 Temperature", 60.0, 60.0, 70.0, 80.0, None, None, "NetworkingDevice")
    assert set(run(TEMPERATURES, bmc(temperatures=(echo,)), generic)) == {"not compared"}
    reported = echo._replace(name="j2 Temperature", health="Warning")  # the BMC itself says so: evidence
    finding = run(TEMPERATURES, bmc(temperatures=(reported,)), generic)["j2 Temperature"]
    assert finding.status is Status.FAIL and finding.severity is Severity.WARNING


def test_psus_fans_switches_without_status_or_readings_are_placeholders(generic: Profile) -> None:
    """Fails on the old code: each was a critical 'health is not reported' fail."""
    facts = bmc(psus=(BmcPsu("PSU9"), BmcPsu("PS1", "StandbyOffline", "OK"), BmcPsu("PS2", "StandbySpare"),
                      BmcPsu("Rectifier 0", "Enabled", None), BmcPsu("PS3", "Enabled", "Critical")),
                fans=(BmcFan("Fan9", None),), switches=(BmcSwitch("Direct Attached", "MultiProtocol"),))
    psus = run(PSU, facts, generic)
    assert psus["PSU9"].status is Status.SKIP and "placeholder" in psus["PSU9"].message
    assert psus["PS1"].status is psus["PS2"].status is Status.SKIP  # standby, not failed
    assert psus["Rectifier 0"].status is Status.UNKNOWN  # present, health not reported: unknown
    assert psus["PS3"].status is Status.FAIL and psus["PS3"].severity is Severity.CRITICAL  # reported Critical
    assert run(FANS, facts, generic)["not compared"].status is Status.SKIP
    (switch,) = run(SWITCHES, facts, generic).values()
    assert switch.status is Status.SKIP and "no Status" in switch.message


def test_parser_keeps_absence_as_absence() -> None:
    """HPE Gen11 style: an empty bay is Absent, an entry without Status stays without health."""
    facts = parse_resources({"/redfish/v1/Chassis/1/Power": {
        "@odata.type": "#Power.v1_7_0.Power",
        "PowerSupplies": [{"Name": "PS1", "Status": {"State": "Enabled", "Health": "OK"}, "LastPowerOutputWatts": 310},
                          {"Name": "PS2", "Status": {"State": "Absent"}}, {"Name": "PS3"}]}})
    assert isinstance(facts.psus, tuple)
    assert [(p.name, p.state, p.health, p.output_w) for p in facts.psus] == [
        ("PS1", "Enabled", "OK", 310.0), ("PS2", "Absent", None, None), ("PS3", None, None, None)]


# --- issue 12: wrong-typed fields are an unknown for that resource only ---------------------------------


def test_wrong_typed_fields_become_unknown_for_that_resource(generic: Profile, tmp_path: Path) -> None:
    """Fails on the old code: `"Members": 1` raised TypeError in the walk, so nothing at all was judged."""
    tree = {
        "": {"@odata.id": "/redfish/v1", "RedfishVersion": "1.15.0", "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
             "Fabrics": {"@odata.id": "/redfish/v1/Fabrics"}, "Systems": {"@odata.id": "/redfish/v1/Systems"}},
        "Systems": {"@odata.type": "#ComputerSystemCollection.ComputerSystemCollection", "Members": 1,
                    "Members@odata.count": 1},
        "Chassis": {"@odata.type": "#ChassisCollection.ChassisCollection", "Members@odata.count": 1,
                    "Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
        "Chassis/1": {"@odata.type": "#Chassis.v1_20_0.Chassis", "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"}},
        "Chassis/1/Power": {"@odata.type": "#Power.v1_7_0.Power", "PowerSupplies": [
            {"Name": "PS1", "Status": {"State": "Enabled", "Health": "OK"}, "FirmwareVersion": {"major": 1}},
            {"Name": "PS2", "Status": "broken"}]},
        "Fabrics": {"@odata.type": "#FabricCollection.FabricCollection", "Members@odata.count": 1,
                    "Members": [{"@odata.id": "/redfish/v1/Fabrics/NVLink"}]},
        "Fabrics/NVLink": {"@odata.type": "#Fabric.v1_3_0.Fabric",
                           "Switches": {"@odata.id": "/redfish/v1/Fabrics/NVLink/Switches"}},
        "Fabrics/NVLink/Switches": {"@odata.type": "#SwitchCollection.SwitchCollection", "Members@odata.count": 2,
                                    "Members": [{"@odata.id": "/redfish/v1/Fabrics/NVLink/Switches/0"},
                                                {"@odata.id": "/redfish/v1/Fabrics/NVLink/Switches/1"}]},
        "Fabrics/NVLink/Switches/0": {"@odata.type": "#Switch.v1_9_0.Switch", "Name": "NVSwitch_0", "Model": "NVSwitch",
                                      "FirmwareVersion": {"Version": "96.10"}, "Status": {"State": "Enabled",
                                                                                          "Health": "OK"}},
        "Fabrics/NVLink/Switches/1": {"@odata.type": "#Switch.v1_9_0.Switch", "Name": "NVSwitch_1", "Model": "NVSwitch",
                                      "FirmwareVersion": "96.10", "Status": {"State": "Enabled", "Health": "OK"}},
    }
    for rel, body in tree.items():
        folder = tmp_path / "redfish" / "v1" / rel
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.json").write_text(json.dumps(body))
    facts, _status, _ = read_redfish(lambda: RecordedRedfish(tmp_path))
    assert isinstance(facts, BmcFacts)
    unusable = [p for p in facts.problems if "unusable field" in p]
    assert any(p.startswith("/redfish/v1/Systems: unusable field Members (a number") for p in unusable), unusable
    assert "/redfish/v1/Chassis/1/Power: unusable field PowerSupplies/0.FirmwareVersion (an object, expected text)" in (
        unusable)
    assert "/redfish/v1/Chassis/1/Power: unusable field PowerSupplies/1.Status (text, expected an object)" in unusable
    assert any("Switches/0: unusable field FirmwareVersion (an object" in p for p in unusable), unusable
    node = node_of(facts)
    reach = by_subject(REACHABLE.run(node, generic))
    assert reach["/redfish/v1/Systems"].status is Status.UNKNOWN and "not usable" in reach["/redfish/v1/Systems"].message
    psus = by_subject(PSU.run(node, generic))
    assert psus["PS1"].status is Status.PASS  # the rest of the resource stands
    assert psus["PS2"].status is Status.UNKNOWN  # its Status was unusable: unknown, not a critical fail
    assert "PowerSupplies/1.Status" in psus["PS2"].message
    switches = by_subject(SWITCHES.run(node, generic))
    assert {f.status for f in switches.values()} == {Status.PASS}
    assert isinstance(facts.switches, tuple) and [s.firmware for s in facts.switches] == [None, "96.10"]
    assert CONSISTENCY.run(node, generic) is not None  # no crash on the unusable version


# --- rule 3: event logs are open problems, not history -------------------------------------------------


OLD = "2024-01-02T03:04:05Z"  # years before NOW
RECENT = "2026-11-19T10:00:00Z"


def test_resolved_and_unresolved_entries() -> None:
    """Fails on the old code: Resolved/Repaired were ignored (an old open fault vanished, a repaired one stayed)."""
    entries = [entry("SEL", "1", "Critical", "PSU 2 failed", OLD, Resolved=False),
               entry("SEL", "2", "Critical", "Fan 3 failed", RECENT, Resolved=True),
               entry("IML", "7", "Critical", "DIMM 4 uncorrectable", OLD, Oem={"Hpe": {"Repaired": False}}),
               entry("IML", "8", "Warning", "Fan 1 degraded", RECENT, Oem={"Hpe": {"Repaired": True}}),
               entry("IML", "9", "Warning", "Battery low", RECENT)]
    facts = parse_resources(logs({"SEL": {"LogEntryType": "SEL"}, "IML": {}}, entries))
    assert isinstance(facts.events, tuple)
    state = {e.message: e.resolved for e in facts.events}
    assert state == {"PSU 2 failed": False, "Fan 3 failed": True, "DIMM 4 uncorrectable": False,
                     "Fan 1 degraded": True, "Battery low": None}


def test_open_entries_are_findings_whatever_their_age(generic: Profile) -> None:
    """Fails on the old code: a two-year-old unresolved PSU failure fell out of the 7-day window."""
    facts = parse_resources(logs({"SEL": {}}, [
        entry("SEL", "1", "Critical", "PSU 2 failed", OLD, MessageId="PSU0002", Resolved=False),
        entry("SEL", "2", "Critical", "Fan 3 failed", RECENT, MessageId="FAN0003", Resolved=True),
        entry("SEL", "3", "Warning", "Battery low", OLD, MessageId="BAT0001"),
        entry("SEL", "4", "Warning", "Fan 1 slow", RECENT, MessageId="FAN0001")]))
    result = run(EVENTS, facts, generic)
    assert set(result) == {"SEL:PSU0002", "SEL:FAN0001"}
    assert result["SEL:PSU0002"].status is Status.FAIL and "not marked resolved" in result["SEL:PSU0002"].message
    assert result["SEL:FAN0001"].status is Status.WARN


def test_undated_entries_are_not_recent(generic: Profile) -> None:
    """Fails on the old code: an entry without a date (or 0000-00-00) counted as recent: a critical fail."""
    facts = parse_resources(logs({"SEL": {}}, [
        entry("SEL", "1", "Critical", "CPU 1 IERR", None), entry("SEL", "2", "Critical", "CPU 2 IERR",
                                                                  "0000-00-00T00:00:00Z")]))
    assert isinstance(facts.events, tuple) and [e.created for e in facts.events] == [None, None]
    result = run(EVENTS, facts, generic)
    assert result["undated"].status is Status.UNKNOWN and "no usable date" in result["undated"].message
    assert result["log"].status is Status.PASS
    assert not [f for f in result.values() if f.status is Status.FAIL]


def test_only_hardware_event_logs_count() -> None:
    """Fails on the old code: the BMC's journal, dumps, FDR, post codes and audit logs were read as events."""
    services = {"Journal": {"LogEntryType": "OEM"}, "Dump": {"LogEntryType": "Multiple", "DiagnosticDataType": "Manager"},
                "FDR": {}, "PostCodes": {}, "AuditLog": {}, "IEL": {}, "SL": {}, "DebugToken": {},
                "CrashDump": {"DiagnosticDataType": "OEM"}, "Diag": {"LogEntryType": "Multiple",
                                                                     "OEMDiagnosticDataType": "FDR"},
                "EventLog": {"LogEntryType": "Event"}, "Lclog": {}, "FaultLog": {}, "Log1": {"Name": "Health Event Log"}}
    entries = [entry(s, "1", "Critical", f"{s} entry", RECENT) for s in services]
    facts = parse_resources(logs(services, entries))
    assert isinstance(facts.events, tuple)
    assert sorted(e.log for e in facts.events) == ["EventLog", "FaultLog", "Lclog", "Log1"]


def test_a_log_service_not_read_is_judged_by_its_id() -> None:
    from agent.sources.redfish_logs import is_hardware_log  # new in issue 13

    assert is_hardware_log("SEL", None) and is_hardware_log("IML", None)
    assert not is_hardware_log("BMCSyslog", None) and not is_hardware_log("Dump", None)


def test_vendor_open_and_cleared_markers() -> None:
    """Dell FaultList and Lenovo ActiveLog hold active faults; deassertions and later clears resolve."""
    entries = [entry("FaultList", "1", "Critical", "PSU 1 lost input", OLD),
               entry("ActiveLog", "1", "Warning", "DIMM 3 PFA", OLD),
               # Supermicro SEL: an assertion, then its deassertion (IPMI direction bit 0x80)
               entry("Log1", "1", "Warning", "CPU1 Temp upper critical", RECENT, SensorType="Temperature",
                     SensorNumber=1, EntryCode="Assert"),
               entry("Log1", "2", "Warning", "CPU1 Temp upper critical", "2026-11-19T11:00:00Z",
                     SensorType="Temperature", SensorNumber=1,
                     Oem={"Supermicro": {"RawEventData": {"EventDirAndType": "0x81"}}}),
               # Cray / DMTF ResourceEvent: detected, then cleared for the same resource (arguments in any order)
               entry("EventLog", "1", "Critical", "12V fatal fault", RECENT, MessageId="CrayAlerts.HardwareFatalFaultDetected",
                     MessageArgs=["above", "12V_HSS ECB Temperature"]),
               entry("EventLog", "2", "OK", "12V fault cleared", "2026-11-19T12:00:00Z",
                     MessageId="CrayAlerts.HardwareFatalFaultCleared", MessageArgs=["12V_HSS ECB Temperature"]),
               entry("EventLog", "3", "Warning", "CPU0 read error", RECENT, MessageId="ResourceEvent.1.0.ResourceErrorsDetected",
                     MessageArgs=["CPU0 Temperature", "SensorReadError"]),
               entry("EventLog", "4", "Warning", "VRM mismatch", RECENT, MessageId="HPENodeAlarms.1.0.VRMMismatchFailure")]
    facts = parse_resources(logs({"FaultList": {}, "ActiveLog": {}, "Log1": {"Name": "Health Event Log Service"},
                                  "EventLog": {}}, entries))
    assert isinstance(facts.events, tuple)
    state = {(e.log, e.entry_id): e.resolved for e in facts.events}
    assert state == {("FaultList", "1"): False, ("ActiveLog", "1"): False, ("Log1", "1"): True, ("Log1", "2"): True,
                     ("EventLog", "1"): True, ("EventLog", "2"): None, ("EventLog", "3"): None,
                     ("EventLog", "4"): None}


def test_security_posture_entries_are_not_hardware_events() -> None:
    facts = parse_resources(logs({"Event": {}}, [
        entry("Event", "1", "Critical", "", RECENT, MessageId="iLOSecurityEvents.1.1.OverallSecAtRisk"),
        entry("Event", "2", "Critical", "", RECENT, MessageId="iLOEvents.3.15.DrvArrPhysDrvFailed",
              MessageArgs=["Port=1I:Box=1:Bay=3", "Slot 12"])]))
    assert isinstance(facts.events, tuple)
    assert [e.message for e in facts.events] == ["DrvArrPhysDrvFailed(Port=1I:Box=1:Bay=3, Slot 12)"]


def test_the_rollup_names_what_explains_it(generic: Profile) -> None:
    """Fails on the old code: only '<name>: Warning', never the open log entries nor the kind of part."""
    facts = parse_resources({
        "/redfish/v1/Systems/1": {"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "Id": "1",
                                  "BiosVersion": "2.1", "Status": {"State": "Enabled", "Health": "Warning",
                                                                   "HealthRollup": "Critical"}},
        "/redfish/v1/Systems/1/Storage/1/Drives/3": {"@odata.type": "#Drive.v1_17_0.Drive", "Name": "Bay 3",
                                                     "Status": {"State": "Enabled", "Health": "Critical"}},
        "/redfish/v1/Systems/1/Memory/DIMM7": {"@odata.type": "#Memory.v1_17_0.Memory", "Name": "DIMM 7",
                                               "Status": {"State": "Enabled", "Health": "Warning"}},
        "/redfish/v1/Systems/1/Memory/DIMM8": {"@odata.type": "#Memory.v1_17_0.Memory", "Name": "DIMM 8",
                                               "Status": {"State": "Absent", "Health": "Critical"}},
        "/redfish/v1/UpdateService/FirmwareInventory/NIC": {
            "@odata.type": "#SoftwareInventory.v1_9_0.SoftwareInventory", "Version": "undefined",
            "Status": {"State": "UnavailableOffline", "Health": "Warning"}},
        **logs({"SEL": {}}, [entry("SEL", "5", "Critical", "Drive Bay 3 predictive failure", OLD, Resolved=False)]),
    })
    (rollup,) = ROLLUP.run(node_of(facts), generic)
    assert rollup.status is Status.FAIL
    assert "drive Bay 3: Critical" in rollup.message and "memory DIMM 7: Warning" in rollup.message
    assert "open SEL entry (Critical) 'Drive Bay 3 predictive failure'" in rollup.message
    assert "DIMM 8" not in rollup.message and "NIC" not in rollup.message  # an empty slot; an inventory image


def test_the_walk_reads_what_explains_an_unhealthy_system() -> None:
    from agent.sources.redfish import _children

    system = {"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "Status": {"Health": "OK"},
              "Storage": {"@odata.id": "/redfish/v1/Systems/1/Storage"},
              "Memory": {"@odata.id": "/redfish/v1/Systems/1/Memory"}}
    assert "/redfish/v1/Systems/1/Memory" not in _children("/redfish/v1/Systems/1", system)  # no cost when healthy
    system["Status"] = {"Health": "OK", "HealthRollup": "Warning"}
    assert {"/redfish/v1/Systems/1/Memory", "/redfish/v1/Systems/1/Storage"} <= set(
        _children("/redfish/v1/Systems/1", system))


# --- rule 4: firmware consistency compares like with like -----------------------------------------------


def hpe_item(ident: str, name: str, version: str, description: str) -> FirmwareItem:
    return FirmwareItem(name, version, ident, description=description)


def test_hpe_numbered_inventory_is_grouped_by_what_it_is(generic: Profile) -> None:
    """Fails on the old code: HPE's ids 1..34 all became one component "#" with a dozen 'mixed' versions."""
    items = (hpe_item("1", "iLO 6", "1.66 Dec 13 2024", "SystemBMC"),
             hpe_item("2", "System ROM", "U58 v2.44 (01/17/2025)", "SystemRomActive"),
             *(hpe_item(str(i), "Power Supply Firmware", "1.02", "PowerSupplies") for i in range(5, 9)),
             hpe_item("13", "Processor 1 S3M Firmware", "0x20", "IntelCFR"),
             hpe_item("14", "Processor 1 PUcode Firmware", "0x31000030", "IntelCFR"),
             hpe_item("15", "Processor 2 S3M Firmware", "0x20", "IntelCFR"),
             hpe_item("16", "Processor 2 PUcode Firmware", "0x31000030", "IntelCFR"),
             hpe_item("24", "6.40TB 64G NVMe SSD", "HPK5", "MO006400KYDND"),
             hpe_item("27", "1.60TB 64G NVMe SSD", "HPK1", "MO001600KXVYH"))
    result = run(CONSISTENCY, bmc(firmware=items), generic)
    assert {s: f.status for s, f in result.items()} == {
        "power supply firmware|powersupplies": Status.PASS, "processor # s3m firmware|intelcfr": Status.PASS,
        "processor # pucode firmware|intelcfr": Status.PASS}
    assert component_model(items[0]) != component_model(items[1])


def test_different_part_families_are_not_a_mismatch(generic: Profile) -> None:
    """Fails on the old code: Cray ids FPGA0..FPGA5 made nFPGA (management) and mFPGA (network) one component."""
    items = (FirmwareItem("nFPGA0", "4.0a", "FPGA0"), FirmwareItem("nFPGA1", "4.0a", "FPGA1"),
             *(FirmwareItem(f"mFPGA{i}", "2.02", f"FPGA{i + 2}") for i in range(4)),
             FirmwareItem("Node0.PowerSupply0", "0.00", "Node0.PowerSupply0"),
             FirmwareItem("Node2.PowerSupply0", "1.19", "Node2.PowerSupply0"),
             FirmwareItem("Node3.PowerSupply0", "1.19", "Node3.PowerSupply0"),
             FirmwareItem("Node1.ManagementEthernet", "undefined", "Node1.ManagementEthernet",
                          state="UnavailableOffline"),
             FirmwareItem("Node0.ManagementEthernet", "wnc.i210-p2sn01", "Node0.ManagementEthernet"))
    result = run(CONSISTENCY, bmc(firmware=items), generic)
    assert {s: f.status for s, f in result.items()} == {"nfpga#": Status.PASS, "mfpga#": Status.PASS,
                                                        "node#.powersupply#": Status.PASS}
    assert "not readable: Node0.PowerSupply0 '0.00'" in result["node#.powersupply#"].message
    mixed = (*(FirmwareItem("Power Supply Firmware", "1.02", str(i)) for i in (5, 6)),
             FirmwareItem("Power Supply Firmware", "1.00", "7"))
    (odd,) = run(CONSISTENCY, bmc(firmware=mixed), generic).values()  # same part family, two versions: a finding
    assert odd.status is Status.FAIL and "Power Supply Firmware 1.00" in odd.message


def test_related_item_model_separates_families() -> None:
    facts = parse_resources({
        "/redfish/v1/UpdateService/FirmwareInventory/24": {
            "@odata.type": "#SoftwareInventory.v1_9_0.SoftwareInventory", "Id": "24", "Name": "NVMe SSD",
            "Version": "HPK5", "RelatedItem": [{"@odata.id": "/redfish/v1/Chassis/1/Drives/4"}]},
        "/redfish/v1/Chassis/1/Drives/4": {"@odata.type": "#Drive.v1_17_0.Drive", "Model": "MO006400KYDND"}})
    assert isinstance(facts.firmware, tuple)
    (item,) = facts.firmware
    assert item.model == "MO006400KYDND" and component_model(item) == "nvme ssd|mo006400kydnd"


def test_leak_alarm_that_failed_is_unknown_never_dry(generic: Profile) -> None:
    facts = bmc(leak_detectors=Unknown("leak alarm LeakIndicatorEarly did not answer (HTTP 500 when recorded)"))
    (leak,) = LEAK.run(node_of(facts), generic)
    assert leak.status is Status.UNKNOWN
    assert isinstance(Unsupported("x"), Unknown)  # a BMC without leak detection is a skip, not a pass


def test_a_log_is_told_by_what_its_entries_are() -> None:
    """Issue 31.2: DMTF's "System Log Service" (id Log1) says neither SEL nor event in its id or name; its
    entries are EntryType SEL, so it is a hardware log. A service of OEM entries with such a name is not."""
    sel = [entry("Log1", "1", "Critical", "Temperature threshold exceeded", RECENT, EntryType="SEL"),
           entry("Notes", "1", "Critical", "operator note", RECENT, EntryType="Oem")]
    facts = parse_resources(logs({"Log1": {"Name": "System Log Service"}, "Notes": {"Name": "System Log Service"}},
                                 sel))
    assert isinstance(facts.events, tuple)
    assert [(e.log, e.message) for e in facts.events] == [("Log1", "Temperature threshold exceeded")]


def test_a_part_the_bmc_rates_warning_is_a_warning_not_a_failed_part(generic: Profile) -> None:
    """The BMC's own rating bounds ours: Health Warning (a PSU's fan, a predictive fault) is a warning;
    Critical stays a critical failure."""
    facts = bmc(psus=(BmcPsu("PSU1", "Enabled", "Warning", capacity_w=2700.0),
                      BmcPsu("PSU2", "Enabled", "Critical", capacity_w=2700.0)),
                fans=(BmcFan("Fan1", 5000.0, "RPM", state="Enabled", health="Warning"),))
    psus = run(PSU, facts, generic)
    assert (psus["PSU1"].status, psus["PSU1"].severity) == (Status.WARN, Severity.WARNING)
    assert "rates it Warning" in psus["PSU1"].message
    assert (psus["PSU2"].status, psus["PSU2"].severity) == (Status.FAIL, Severity.CRITICAL)
    fan = run(FANS, facts, generic)["Fan1"]
    assert fan.severity is Severity.WARNING  # the profile rates fans warning already: unchanged


def test_a_power_subsystem_battery_is_judged_with_the_supplies(generic: Profile) -> None:
    """Issue 31.2: PowerSubsystem/Batteries (a tray's backup battery) are read; a Critical one is a failure."""
    base = "/redfish/v1/Chassis/1/PowerSubsystem"
    facts = parse_resources({
        base: {"@odata.id": base, "@odata.type": "#PowerSubsystem.v1_1_0.PowerSubsystem"},
        f"{base}/Batteries/BBU": {"@odata.id": f"{base}/Batteries/BBU", "@odata.type": "#Battery.v1_2_0.Battery",
                                  "Id": "BBU", "Name": "Battery 1", "Model": "BBU-9",
                                  "Status": {"State": "Enabled", "Health": "Critical"}}})
    assert isinstance(facts.psus, tuple)
    (battery,) = facts.psus
    assert (battery.name, battery.health, battery.model) == ("Battery 1", "Critical", "BBU-9")
    finding = run(PSU, facts, generic)["Battery 1"]
    assert (finding.status, finding.severity) == (Status.FAIL, Severity.CRITICAL)
