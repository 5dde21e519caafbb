"""Issue 31.2: voltage rails, from every layout a BMC uses (Power.Voltages, Voltage `#Sensor`s, IPMI voltage
sensors), judged against each rail's own thresholds both ways. A critical needs the reading past a critical
threshold the BMC itself does not contradict; 0 V thresholds, echoes, absent rails, a powered-off host's low
rails are not evidence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.core.facts import BmcFacts, BmcVoltage
from agent.core.model import Severity, Status
from agent.policy.profiles import ProfileStore
from agent.sources.ipmi import read_ipmi_live
from agent.sources.redfish import LiveRedfish, RecordedRedfish, read_redfish
from agent.sources.redfish_sensors import chassis_of
from checks.bmc_voltages import VOLTAGES
from tests.factories import node_of, parse_resources
from tests.oracle.test_bmc_evidence import TREES
from tests.peers.ipmi_sim import IpmiSim, StartSim, ipmi_sim_factory_fixture  # noqa: F401 - the fixture
from tests.peers.redfish import sushy_static

BLADE = "cray-ex425-amd-milan-blade"  # node chassis with Power.Voltages and Voltage Sensors
RAIL = "Mezz0/Sensors/Board0SystemBoard2Voltage/index.json"  # 0.885 V; lower 0.855/0.81/0.781, upper 0.945/0.99/1.057
PROFILE = ProfileStore().profile("generic-nvidia")


def judged(bmc: BmcFacts) -> dict[str, tuple[Status, Severity, str]]:
    return {f.subject: (f.status, f.severity, f.message) for f in VOLTAGES.run(node_of(bmc), PROFILE)}


def rail(reading: float | None, **kw: object) -> BmcVoltage:
    base: dict[str, object] = dict(lower_caution=11.4, lower_critical=10.8, lower_fatal=10.2, upper_caution=12.6,
                                   upper_critical=13.2, upper_fatal=13.8, state="Enabled", health=None)
    return BmcVoltage("P12V", reading, **{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("reading", "extra", "status", "severity", "words"), [
    (12.0, {}, Status.PASS, Severity.CRITICAL, "1 voltage rail(s) within"),
    (11.2, {}, Status.WARN, Severity.WARNING, "at or below its lower caution threshold 11.4 V"),
    (10.5, {}, Status.FAIL, Severity.CRITICAL, "at or below its lower critical threshold 10.8 V"),
    (14.0, {}, Status.FAIL, Severity.CRITICAL, "at or above its upper fatal threshold 13.8 V"),
    (13.3, {"health": "OK"}, Status.WARN, Severity.WARNING, "thresholds and its health disagree"),
    (10.5, {"power": "Off"}, Status.SKIP, Severity.INFO, "host powered off"),
    (14.0, {"power": "Off"}, Status.FAIL, Severity.CRITICAL, "upper fatal"),  # over-voltage is never expected
    (10.8, {}, Status.SKIP, Severity.INFO, "a placeholder"),  # exactly its threshold, no health: an echo
    (0.0, {"state": "Absent"}, Status.SKIP, Severity.INFO, "Absent"),
    (None, {}, Status.SKIP, Severity.INFO, "no reading"),
    (5.0, {"lower_caution": 0, "lower_critical": 0, "lower_fatal": 0, "upper_caution": 0, "upper_critical": 0,
           "upper_fatal": 0}, Status.SKIP, Severity.INFO, "no thresholds"),  # Supermicro's 0 V = not set
    (5.0, {"lower_caution": None, "lower_critical": None, "lower_fatal": None, "upper_caution": None,
           "upper_critical": None, "upper_fatal": None, "health": "Critical"}, Status.WARN, Severity.WARNING,
     "no threshold to tell why"),
])
def test_a_rail_is_judged_by_its_own_thresholds(reading: float | None, extra: dict[str, object], status: Status,
                                                severity: Severity, words: str) -> None:
    power = str(extra.pop("power", "On"))
    bmc = BmcFacts(protocol="redfish", power_state=power, voltages=(rail(reading, **extra),))
    findings = list(judged(bmc).values())
    assert len(findings) == 1, findings
    assert findings[0][:2] == (status, severity) and words in findings[0][2], findings[0]


def test_no_rails_no_findings() -> None:
    assert judged(BmcFacts(protocol="redfish", voltages=())) == {}


def test_power_voltages_are_read_with_both_thresholds() -> None:
    bmc = parse_resources({"/redfish/v1/Chassis/1": {"@odata.type": "#Chassis.v1_9_0.Chassis", "Id": "1"},
                           "/redfish/v1/Chassis/1/Power": {
        "@odata.type": "#Power.v1_5_0.Power", "Voltages": [{
            "@odata.id": "/redfish/v1/Chassis/1/Power#/Voltages/0", "Name": "CPU1 VCORE", "MemberId": "0",
            "ReadingVolts": 0.71, "LowerThresholdCritical": 0.75, "UpperThresholdCritical": 1.5,
            "Status": {"State": "Enabled", "Health": "Critical"}}]}})
    assert isinstance(bmc.voltages, tuple)
    (vcore,) = bmc.voltages
    assert (vcore.reading, vcore.lower_critical, vcore.upper_critical, vcore.health) == (0.71, 0.75, 1.5, "Critical")
    status, severity, message = judged(bmc)["CPU1 VCORE"]
    assert (status, severity) == (Status.FAIL, Severity.CRITICAL) and "0.71 V" in message


def test_a_chassis_with_both_layouts_has_its_rails_once_from_its_sensors() -> None:
    bmc, _, _ = read_redfish(lambda: RecordedRedfish(TREES / BLADE), deadline_s=60)
    assert isinstance(bmc, BmcFacts) and isinstance(bmc.voltages, tuple)
    node0 = [v for v in bmc.voltages if chassis_of(v.where) == "/redfish/v1/Chassis/Node0"]
    sensors = [p for p in (TREES / BLADE / "redfish/v1/Chassis/Node0/Sensors").glob("*/index.json")
               if json.loads(p.read_text()).get("ReadingType") == "Voltage"]
    legacy = json.loads((TREES / BLADE / "redfish/v1/Chassis/Node0/Power/index.json").read_text())["Voltages"]
    assert legacy and sensors and len(node0) == len(sensors)  # Node0 has both: its Sensors alone
    assert all("/Sensors/" in v.where for v in node0)
    enclosure = [v for v in bmc.voltages if chassis_of(v.where) == "/redfish/v1/Chassis/Enclosure"]
    assert enclosure  # a chassis with only the legacy Power.Voltages keeps them
    assert ("Voltage", 0) not in bmc.sensors_not_judged and "Voltage" not in dict(bmc.sensors_not_judged)


def test_a_rail_past_its_lower_critical_over_http_is_critical(tmp_path: Path) -> None:
    tree = tmp_path / BLADE
    shutil.copytree(TREES / BLADE, tree)
    sensor = tree / "redfish/v1/Chassis" / RAIL
    body = json.loads(sensor.read_text())
    body["Reading"] = 0.79  # below LowerCritical 0.81, above LowerFatal 0.781
    sensor.write_text(json.dumps(body))
    with sushy_static(tree) as peer:
        live, _, _ = read_redfish(lambda: LiveRedfish(peer.url, "admin", "pw", timeout_s=5.0, backoff_s=0.05),
                                  deadline_s=60)
    assert isinstance(live, BmcFacts)
    findings = judged(live)
    status, severity, message = findings[body["Name"]]
    assert (status, severity) == (Status.FAIL, Severity.CRITICAL), message
    assert "0.79 V, at or below its lower critical threshold 0.81 V" in message
    others = [v for k, v in findings.items() if k not in (body["Name"], "rails", "not compared")]
    assert others == []  # every other rail of the real blade is within its thresholds


@pytest.mark.parametrize("tree", sorted(p.name for p in TREES.iterdir() if p.is_dir() and p.name != "single"))
def test_no_real_tree_has_a_rail_out_of_range(tree: str) -> None:
    """Read as an SRE: every capture here is of working hardware; none of its rails is past a threshold (the
    EX425's EventLog under-voltage was cleared before the capture)."""
    bmc, _, _ = read_redfish(lambda: RecordedRedfish(TREES / tree), deadline_s=60)
    assert isinstance(bmc, BmcFacts)
    bad = {k: v for k, v in judged(bmc).items() if v[0] not in (Status.PASS, Status.SKIP)}
    assert bad == {}


def test_an_ipmi_rail_below_its_lower_critical_is_critical(ipmi_sim_factory: StartSim) -> None:
    sim: IpmiSim = ipmi_sim_factory()
    sim.set_sensor("P12V", 175)  # 10.5 V: below LC 10.8 (and LNC 11.4), above LNR 10.2
    facts, status, _ = read_ipmi_live(sim.host, sim.port, sim.user, sim.password, 10.0)
    assert isinstance(facts, BmcFacts) and status.ok, status
    status_, severity, message = judged(facts)["P12V"]
    assert (status_, severity) == (Status.FAIL, Severity.CRITICAL)
    assert message == "P12V reads 10.5 V, at or below its lower critical threshold 10.8 V"
