"""Issue 13 (rules 1, 3, 4) against real BMC data.

Every Redfish tree in fixtures/redfish is walked through the real recorded transport and parser and
judged by the BMC checks; the non-pass findings of each tree are written out below, each with the
reason an SRE would give. No tree may raise a critical `fail` unless the data positively shows a
fault, and no single real resource (fixtures/redfish/single) may either. The focused tests, one per
rule, and issue 12 (wrong-typed Redfish fields): tests/unit/checks/test_bmc_evidence_rules.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts
from agent.core.model import Finding, Severity, SourceStatus, Status
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import RecordedRedfish, RedfishError, read_redfish
from checks import Check
from checks.bmc_events import EVENTS
from checks.bmc_firmware import CONSISTENCY
from checks.bmc_health import FANS, LEAK, PSU, REACHABLE, ROLLUP, SWITCHES, TEMPERATURES
from checks.bmc_voltages import VOLTAGES
from tests.factories import by_subject, node_of, parse_resources

TREES = Path(__file__).resolve().parents[2] / "fixtures" / "redfish"
TREES_UNDER_TEST = ("hpe-dl380a-gen11", "hpe-ilo5-dl360-gen10plus", "supermicro-x10", "cray-ex-cmm-chassis-controller",
                    "cray-ex420-intel-blade", "cray-ex425-amd-milan-blade", "cray-ex4252-amd-genoa-blade",
                    "cray-slingshot-switch-blade", "gathergpus_happypath", "gpu_info_unknown_multi",
                    "manager_happypath", "powershelf_delta", "powershelf_liteon", "dmtf-public-rackmount1")
BMC_CHECKS: tuple[Check, ...] = (REACHABLE, ROLLUP, PSU, FANS, TEMPERATURES, VOLTAGES, LEAK, SWITCHES, EVENTS,
                                 CONSISTENCY)


class CompletedRecording(RecordedRedfish):
    """A recording whose held-back collection documents are rebuilt from their members.

    The reference copies of some mockups left out a few collection documents (listed in
    `_omitted_paths.txt`: "not captured here", not missing on the BMC), e.g. the iLO 5's
    `Systems` and `FirmwareInventory`; a BMC would have answered them with their members.
    """

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        listed = base / "_omitted_paths.txt"
        lines = listed.read_text(encoding="utf-8").splitlines() if listed.is_file() else []
        self.omitted = {line.split("\t", 1)[0] for line in lines if line and not line.startswith("#")}

    def get(self, path: str, expand: str | None = None) -> dict[str, Any]:
        try:
            return super().get(path, expand)
        except RedfishError as exc:
            folder = self.base / path.strip("/")
            if exc.status != 404 or f"{path.strip('/')}/index.json" not in self.omitted or not folder.is_dir():
                raise
            members = [{"@odata.id": f"{path}/{d.name}"} for d in sorted(folder.iterdir())
                       if (d / "index.json").is_file()]
            return {"@odata.id": path, "@odata.type": "#Collection.Collection", "Members": members,
                    "Members@odata.count": len(members)}


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


def captured_at(bmc: BmcFacts) -> dt.datetime | None:
    """When a mockup was captured: its newest log entry (an audit run then would have seen this)."""
    stamps = []
    for entry in bmc.events if isinstance(bmc.events, tuple) else ():
        try:
            stamps.append(dt.datetime.fromisoformat((entry.created or "").replace("Z", "+00:00")))
        except ValueError:
            continue
    return max(stamps) if stamps else None


def audit_tree(name: str, profile: Profile | None = None) -> list[Finding]:
    """The BMC findings of one tree, walked as a live BMC would be, judged as of its capture."""
    return list(_audit(name)) if profile is None else _judge(*_read(name), profile)


@functools.cache
def _read(name: str) -> tuple[BmcFacts, SourceStatus]:
    bmc, status, _ = read_redfish(lambda: CompletedRecording(TREES / name), deadline_s=60)
    assert isinstance(bmc, BmcFacts), bmc
    return bmc, status


def _judge(bmc: BmcFacts, status: SourceStatus, profile: Profile) -> list[Finding]:
    facts = node_of(bmc, status, captured_at(bmc))
    return [finding for check in BMC_CHECKS for finding in check.run(facts, profile)]


@functools.cache
def _audit(name: str) -> tuple[Finding, ...]:
    return tuple(_judge(*_read(name), ProfileStore().profile("generic-nvidia")))


# --- every real tree: the findings that are not a pass, and why -----------------------------------------

RESOURCE_404 = "unknown"  # a link the capture did not hold: "not read", never "fine"
EXPECTED: dict[str, dict[tuple[str, str], str]] = {
    # DMTF's published 1U example, both layouts in one chassis (its Sensors are read, nothing twice).
    "dmtf-public-rackmount1": {
        ("bmc.reachable", "redfish"): "warn",  # its Bios links a Settings object the mockup does not hold
        ("bmc.reachable", "/redfish/v1/Systems/437XR1138R2/Bios/Settings"): RESOURCE_404,
        # PSU Bay 1 reports Health Warning (and Bay 2 is empty): the BMC's own rating, a warning, not a failure
        ("bmc.psu", "Power Supply Bay 1"): "warn",
        ("bmc.psu", "Power Supply Bay 2"): "skip",
        ("bmc.temperatures", "other sensors"): "skip",  # 10 currents, 3 energy, 2 frequency sensors: said
        ("bmc.voltages", "not compared"): "skip",  # the 4 rails of the empty PSU bay 2
        ("bmc.leak", "bmc"): "skip",
        ("bmc.switches", "bmc"): "skip",
        # "System Log Service" is a log of EntryType SEL entries (told by what it holds): two Critical
        # temperature-threshold events, and the Manager's Critical "System May be Melting", all open as of
        # the capture (its newest entry).
        ("bmc.events", "Log:Event.1.0.TempWayTooHot"): "fail",
        ("bmc.events", "Log1:0x592A28"): "fail",
        ("bmc.events", "Log1:0x592E28"): "fail",
    },
    "hpe-dl380a-gen11": {
        ("bmc.reachable", "redfish"): "warn",  # 4 log Entries collections were dropped upstream of this copy
        ("bmc.reachable", "/redfish/v1/Managers/1/LogServices/IEL/Entries"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Systems/1/LogServices/Event/Entries"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Systems/1/LogServices/IML/Entries"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Systems/1/LogServices/SL/Entries"): RESOURCE_404,
        ("bmc.events", "bmc"): "unknown",  # no hardware log's entries were read: unknown, never "no events"
        ("bmc.temperatures", "not compared"): "skip",  # 24 Absent sensors (empty PMM/DIMM bays), not faults
        ("bmc.leak", "bmc"): "skip",  # an air-cooled DL380a has no leak detection
        ("bmc.switches", "Direct Attached #1"): "skip",  # PCIe "switches" listed with no Status: placeholders
        ("bmc.switches", "Direct Attached #2"): "skip",
    },
    "hpe-ilo5-dl360-gen10plus": {
        ("bmc.reachable", "redfish"): "warn",  # the root links Fabrics, the capture has none
        ("bmc.reachable", "/redfish/v1/Fabrics"): RESOURCE_404,
        ("bmc.switches", "bmc"): "unknown",  # fabrics not read: unknown, not "no switch failed"
        ("bmc.temperatures", "not compared"): "skip",  # 10 Absent PMM sensors: empty bays
        ("bmc.leak", "bmc"): "skip",  # air-cooled: no leak detection
        # Critical IML "Drive ... status changed to Erasing" x6, Repaired false: a secure erase an operator
        # ran (three times, two drives), not a drive failure: shown (open), but informational.
        ("bmc.events", "IML:19.20"): "warn",
        ("bmc.events", "Event:iLOEvents.3.15.DrvArrPhysDrvErasing"): "warn",  # the same erase in the Event log
        ("bmc.events", "Event:iLOEvents.3.15.ServerResetDetected"): "warn",  # 14 resets in two days: worth a look
        # Both slot-1 25GbE ports "Connectivity status changed to OK" 25 times each in the week (OK,
        # repaired): a flapping link, one warning per log (tests/oracle/test_sre_judgements.py).
        ("bmc.events", "IML:17.10"): "warn",
        ("bmc.events", "Event:iLOEvents.3.15.NicConnectivityRestored"): "warn",
    },
    "supermicro-x10": {
        ("bmc.voltages", "not compared"): "skip",  # all 8 Power.Voltages Absent with 0 V thresholds (the X10's unused rails)
        ("bmc.reachable", "redfish"): "warn",  # UpdateService is linked but 404 on this Redfish 1.0.1 BMC
        ("bmc.reachable", "/redfish/v1/UpdateService"): RESOURCE_404,
        ("bmc.fans", "not compared"): "skip",  # every fan Absent over Redfish (IPMI has the readings)
        ("bmc.temperatures", "not compared"): "skip",  # every sensor Absent over Redfish
        ("bmc.leak", "bmc"): "skip",
        ("bmc.switches", "bmc"): "skip",
        ("firmware.consistency", "bmc"): "skip",  # no firmware inventory on this BMC
    },
    "cray-ex-cmm-chassis-controller": {
        ("bmc.voltages", "not compared"): "skip",  # 22 ADC inputs with no thresholds (leak detect lines read as volts), 4 IVOC rails with no reading
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.health_rollup", "system"): "skip",  # a cabinet controller has no ComputerSystem
        # Rectifiers report State Enabled and no Health: not reported is unknown, never a critical fail.
        ("bmc.psu", "Rectifier 0"): "unknown",
        ("bmc.psu", "Rectifier 1"): "unknown",
        ("bmc.psu", "Rectifier 2"): "unknown",
        ("bmc.psu", "Rectifier 3"): "unknown",
        ("bmc.fans", "bmc"): "skip",  # no fan of its own, in any layout
        # No Thermal: its Sensors (issue 31.2) give 12 temperatures, 10 in range and two (IVOC12_0/1) with
        # no reading, which are not compared.
        ("bmc.temperatures", "not compared"): "skip",
        ("bmc.switches", "bmc"): "skip",
        # (the front-zone leak episodes were each followed by "all sensors dry": resolved; alarms Armed = dry)
    },
    "cray-ex420-intel-blade": {
        ("bmc.voltages", "not compared"): "skip",  # 55 rails with no thresholds; the 37 with thresholds are within them
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.reachable", "redfish"): "warn",  # three Mezz Power/Thermal documents were held back upstream
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz2/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz3/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz3/Thermal"): RESOURCE_404,
        ("bmc.temperatures", "not compared"): "skip",  # 38 DIMM sensors with a null reading (empty slots)
        ("bmc.switches", "bmc"): "skip",
        # NBM TSNS ADC SensorReadError x4, never corrected (the CPU temperature ones were): a sensor-read warning
        ("bmc.events", "EventLog:ResourceEvent.ResourceErrorsDetected"): "warn",
    },
    "cray-ex425-amd-milan-blade": {
        ("bmc.voltages", "not compared"): "skip",  # one 12V_HSS ECB rail with no thresholds; 79 within theirs
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.reachable", "redfish"): "warn",
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz0/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Managers/MCU0"): RESOURCE_404,
        # Its node chassis' Sensors replace their Thermal (the newer layout, issue 31.2): the CPU temperatures
        # Thermal listed with a null reading are not among them, so nothing is "not compared" any more.
        ("bmc.switches", "bmc"): "skip",
        # (the fatal 12V_HSS over-temperature and CPU1 VDR under-voltage were each cleared later: history)
    },
    "cray-ex4252-amd-genoa-blade": {
        ("bmc.voltages", "not compared"): "skip",  # 122 rails with no thresholds, 3 SIVOC rails with no reading; 65 within theirs
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.reachable", "redfish"): "warn",
        # The three LeakIndicator alarms answered HTTP 500 (a Lua stack trace): unknown, never "dry".
        ("bmc.reachable", "/redfish/v1/Chassis/Enclosure/Oem/Alarms/LeakIndicatorEarly"): "unknown",
        ("bmc.reachable", "/redfish/v1/Chassis/Enclosure/Oem/Alarms/LeakIndicatorFatal"): "unknown",
        ("bmc.reachable", "/redfish/v1/Chassis/Enclosure/Oem/Alarms/LeakIndicatorSustained"): "unknown",
        ("bmc.leak", "bmc"): "unknown",
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz0/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz0/Thermal"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz1/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz2/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz3/Power"): RESOURCE_404,
        ("bmc.reachable", "/redfish/v1/Chassis/Mezz3/Thermal"): RESOURCE_404,
        # Health=Warning with Status.Conditions "There were 6 VRM configuration mismatches": a real warning.
        ("bmc.health_rollup", "system"): "fail",
        # 109 null readings, and 8 NBM TSNS ADC sensors reading exactly their 85 C caution threshold with no
        # health (the same ADC the EventLog says cannot be read): placeholders, not an over-temperature.
        ("bmc.temperatures", "not compared"): "skip",
        ("bmc.switches", "bmc"): "skip",
    },
    "cray-slingshot-switch-blade": {
        ("bmc.voltages", "not compared"): "skip",  # 24 cable rails with no reading, 9 ASIC rails with no thresholds
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.health_rollup", "system"): "skip",  # a switch controller has no ComputerSystem
        # 24 cable sensors reading exactly their 60 C caution threshold with no health while the ASIC is at
        # 40 C and 18 of the cables are Absent: the BMC echoing the threshold, not 24 hot cables.
        ("bmc.temperatures", "not compared"): "skip",
        ("bmc.leak", "bmc"): "skip",
        ("bmc.switches", "bmc"): "skip",
        # 40 ports flapped within 2 s after a controller restart: one switch event, one finding
        ("bmc.events", "EventLog:CrayAlerts.HsnLinkFlapDetected"): "warn",
        ("bmc.events", "EventLog:CrayAlerts.UncleanShutdownDetected"): "warn",  # the restart itself
    },
    "gathergpus_happypath": {  # an exporter's partial test tree: most links dangle
        ("bmc.reachable", "redfish"): "warn",
        **{("bmc.reachable", f"/redfish/v1/{p}"): RESOURCE_404 for p in (
            "Chassis", "Fabrics", "Managers", "Systems/HGX_Baseboard_0/LogServices", "Systems/System_0/Bios",
            "Systems/System_0/LogServices", "Systems/System_0/Processors", "UpdateService")},
        ("bmc.psu", "bmc"): "skip", ("bmc.fans", "bmc"): "skip", ("bmc.temperatures", "bmc"): "skip",
        ("bmc.leak", "bmc"): "skip", ("firmware.consistency", "bmc"): "skip",
        ("bmc.switches", "bmc"): "unknown",  # Fabrics linked, not read
        ("bmc.events", "bmc"): "unknown",  # LogServices linked, not read
    },
    "gpu_info_unknown_multi": {
        ("bmc.reachable", "redfish"): "warn",
        **{("bmc.reachable", f"/redfish/v1/{p}"): RESOURCE_404 for p in (
            "Chassis", "Managers", "Systems/1/Bios", "Systems/1/LogServices", "Systems/HGX_Baseboard_0/LogServices",
            "UpdateService")},
        ("bmc.psu", "bmc"): "skip", ("bmc.fans", "bmc"): "skip", ("bmc.temperatures", "bmc"): "skip",
        ("bmc.leak", "bmc"): "skip", ("bmc.switches", "bmc"): "skip", ("firmware.consistency", "bmc"): "skip",
        ("bmc.events", "bmc"): "unknown",
    },
    "manager_happypath": {  # only a Manager: everything else is not exposed
        **{(check, "bmc"): "skip" for check in ("bmc.psu", "bmc.fans", "bmc.temperatures", "bmc.leak", "bmc.switches",
                                                "bmc.events", "firmware.consistency")},
        ("bmc.health_rollup", "system"): "skip",
    },
    "powershelf_delta": {
        ("bmc.voltages", "not compared"): "skip",  # 24 rectifier voltages with no thresholds; 2 within theirs
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.reachable", "redfish"): "warn",
        **{("bmc.reachable", f"/redfish/v1/{p}"): RESOURCE_404 for p in (
            "Chassis/PowerShelf_0/ThermalSubsystem", "Managers", "UpdateService",
            "Chassis/PowerShelf_0/PowerSubsystem/Batteries")},  # linked, not captured: the shelf's BBUs unseen
        ("bmc.health_rollup", "system"): "skip",
        # ThermalSubsystem not read, but the shelf's Sensors (issue 31.2) hold its 32 temperatures and 12 fan
        # speeds, all in range: judged (pass), no longer unknown.
        ("bmc.leak", "bmc"): "skip", ("bmc.switches", "bmc"): "skip", ("bmc.events", "bmc"): "skip",
        ("firmware.consistency", "bmc"): "skip",
    },
    "powershelf_liteon": {
        ("bmc.voltages", "not compared"): "skip",  # 14 shelf voltages with no thresholds
        ("bmc.temperatures", "other sensors"): "skip",  # currents, energy, ...: no check reads them (said)
        ("bmc.reachable", "redfish"): "warn",
        **{("bmc.reachable", f"/redfish/v1/{p}"): RESOURCE_404 for p in (
            "Chassis/PowerShelf_0/PowerSubsystem", "Chassis/PowerShelf_0/Thermal", "Chassis/powershelf/Thermal",
            "Managers", "UpdateService")},
        ("bmc.health_rollup", "system"): "skip",
        # every PSU of the shelf is in Standby: standby, not failed
        **{("bmc.psu", f"Power Supply {i}"): "skip" for i in range(6)},
        # No Thermal, but its Sensors (issue 31.2): 21 temperatures and 6 fan speeds, all in range (pass).
        ("bmc.leak", "bmc"): "skip", ("bmc.switches", "bmc"): "skip", ("bmc.events", "bmc"): "skip",
        ("firmware.consistency", "bmc"): "skip",
    },
}


def test_every_tree_is_under_test() -> None:
    served = {p.name for p in TREES.iterdir() if (p / "redfish" / "v1" / "index.json").is_file()}
    assert served == set(TREES_UNDER_TEST) == set(EXPECTED)


@pytest.mark.parametrize("name", TREES_UNDER_TEST)
def test_real_tree_findings_are_only_the_evidenced_ones(name: str, generic: Profile) -> None:
    findings = audit_tree(name, generic)
    subjects = [(f.check, f.subject) for f in findings]
    assert len(subjects) == len(set(subjects)), "subjects must be unique per check"
    not_pass = {(f.check, f.subject): f.status.value for f in findings if f.status is not Status.PASS}
    assert not_pass == EXPECTED[name]
    critical = {(f.check, f.subject) for f in findings if f.status is Status.FAIL and f.severity is Severity.CRITICAL}
    assert critical == CRITICAL_BY_THE_DATA.get(name, set())  # the real captures show no critical fault


# The one tree whose data reports critical faults: DMTF's example, with its three open Critical log entries
# (the SEL's temperature threshold events, the Manager's "System May be Melting").
CRITICAL_BY_THE_DATA = {"dmtf-public-rackmount1": {
    ("bmc.events", "Log:Event.1.0.TempWayTooHot"), ("bmc.events", "Log1:0x592A28"), ("bmc.events", "Log1:0x592E28")}}


def test_what_the_real_trees_say_in_words(generic: Profile) -> None:
    ilo5 = by_subject(audit_tree("hpe-ilo5-dl360-gen10plus", generic))
    erase = ilo5["IML:19.20"]
    assert erase.severity is Severity.INFO and "secure erase" in erase.message and "x6" in erase.message
    assert "not marked resolved" in erase.message  # Oem.Hpe.Repaired false keeps it open
    ex4252 = by_subject(audit_tree("cray-ex4252-amd-genoa-blade", generic))
    assert "VRM configuration mismatches" in ex4252["system"].message
    assert "system Node1: Warning" in ex4252["system"].message  # the other nodes it can reach, by kind
    assert "HTTP 500" in ex4252["bmc"].message or "HTTP 500" in next(
        f.message for f in audit_tree("cray-ex4252-amd-genoa-blade", generic) if f.check == "bmc.leak")
    flaps = by_subject(audit_tree("cray-slingshot-switch-blade", generic))["EventLog:CrayAlerts.HsnLinkFlapDetected"]
    assert flaps.observed == 40 and "39 more like it" in flaps.message
    cmm = [f for f in audit_tree("cray-ex-cmm-chassis-controller", generic) if f.check == "bmc.leak"]
    assert {f.status for f in cmm} == {Status.PASS} and len(cmm) == 2  # both cabinet leak alarms Armed: dry now
    ex425 = [f for f in audit_tree("cray-ex425-amd-milan-blade", generic) if f.check == "bmc.events"]
    assert [f.status for f in ex425] == [Status.PASS] and "resolved" in ex425[0].message  # faults cleared later
    consistency = {f.subject: f for f in audit_tree("hpe-dl380a-gen11", generic) if f.check == "firmware.consistency"}
    assert {f.status for f in consistency.values()} == {Status.PASS}
    assert "processor # s3m firmware|intelcfr" in consistency and "processor # pucode firmware|intelcfr" in consistency


def test_real_single_resources_never_crash_and_never_fail(generic: Profile) -> None:
    for path in sorted((TREES / "single").rglob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        link = body.get("@odata.id") if isinstance(body, dict) else None
        where = link.rstrip("/") if isinstance(link, str) and link.rstrip("/") else "/redfish/v1/Chassis/1/Thermal"
        facts = parse_resources({where: body})
        node = node_of(facts)
        for check in BMC_CHECKS:
            for finding in check.run(node, generic):
                assert not (finding.status is Status.FAIL and finding.severity is Severity.CRITICAL), (path, finding)
