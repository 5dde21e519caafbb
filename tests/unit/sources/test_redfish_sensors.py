"""Issue 31.2: Redfish as current BMCs lay it out. `Chassis/*/Sensors` (`#Sensor`: ReadingType, Reading,
Thresholds) is read into the same facts as the legacy Thermal/Power, chassis by chassis, the newer layout
winning where a chassis has both (never counted twice); a BMC with Sensors only is judged on them, over
HTTP (sushy-static) as from a recording; readings of types no check judges are said, not dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agent.core.facts import BmcFacts
from agent.core.model import Status
from agent.policy.profiles import ProfileStore
from agent.sources.redfish import LiveRedfish, RecordedRedfish, read_redfish
from agent.sources.redfish_sensors import chassis_of
from tests.oracle.test_bmc_evidence import TREES, _judge
from tests.peers.redfish import sushy_static

CMM = "cray-ex-cmm-chassis-controller"  # a cabinet controller: Sensors only, no Thermal
BLADE = "cray-ex425-amd-milan-blade"  # node chassis with both Thermal and Sensors
VR0 = "Enclosure/Sensors/VoltageRegulator0Temperature/index.json"


def recorded(tree: Path) -> BmcFacts:
    bmc, _, _ = read_redfish(lambda: RecordedRedfish(tree), deadline_s=60)
    assert isinstance(bmc, BmcFacts), bmc
    return bmc


def test_a_sensors_only_bmc_over_http_is_judged_on_its_sensors(tmp_path: Path) -> None:
    tree = tmp_path / CMM
    shutil.copytree(TREES / CMM, tree)
    sensor = tree / "redfish/v1/Chassis" / VR0
    body = json.loads(sensor.read_text())
    critical = body["Thresholds"]["UpperCritical"]["Reading"]
    body["Reading"] = critical + 3  # this regulator now runs past its own critical threshold
    sensor.write_text(json.dumps(body))
    with sushy_static(tree) as peer:
        live, status, _ = read_redfish(lambda: LiveRedfish(peer.url, "admin", "pw", timeout_s=5.0, backoff_s=0.05),
                                       deadline_s=60)
    assert isinstance(live, BmcFacts) and isinstance(live.temperatures, tuple)
    assert live.temperatures == recorded(tree).temperatures  # HTTP and the recording read the same
    named = {t.name: t for t in live.temperatures}
    hot = named[body["Name"]]
    assert (hot.reading, hot.upper_critical) == (critical + 3, critical) and hot.where.endswith(
        "/Sensors/VoltageRegulator0Temperature")
    findings = {(f.check, f.subject): f for f in _judge(live, status, ProfileStore().profile("generic-nvidia"))}
    finding = findings[("bmc.temperatures", body["Name"])]
    assert finding.status is Status.FAIL and "critical threshold" in finding.message, finding
    others = [f for (check, _), f in findings.items() if check == "bmc.temperatures" and f is not finding]
    assert all(f.status in (Status.PASS, Status.SKIP) for f in others), others
    said = findings[("bmc.temperatures", "other sensors")]
    assert said.status is Status.SKIP and "Current" in said.message and "Pressure" in said.message
    assert "Voltage" not in said.message  # voltages are judged now, by bmc.voltages


def test_a_chassis_with_both_layouts_is_counted_once_from_its_sensors() -> None:
    bmc = recorded(TREES / BLADE)
    assert isinstance(bmc.temperatures, tuple)
    by_chassis: dict[str | None, set[str]] = {}
    for sensor in bmc.temperatures:
        by_chassis.setdefault(chassis_of(sensor.where), set()).add(sensor.where.split("#")[0].rsplit("/", 2)[-2])
    node0 = "/redfish/v1/Chassis/Node0"
    assert by_chassis[node0] == {"Sensors"}  # Node0 has Thermal too: its Sensors alone, never both
    sensors_dir = TREES / BLADE / "redfish/v1/Chassis/Node0/Sensors"
    typed = [p for p in sensors_dir.glob("*/index.json") if json.loads(p.read_text()).get("ReadingType") == "Temperature"]
    assert len([t for t in bmc.temperatures if chassis_of(t.where) == node0]) == len(typed)
    mezz = [t for t in bmc.temperatures if chassis_of(t.where) == "/redfish/v1/Chassis/Mezz0"]
    assert mezz and all(t.upper_critical is not None for t in mezz)  # Sensors only: read with thresholds


def test_an_untyped_sensor_beside_a_legacy_thermal_is_left_to_it() -> None:
    """iLO 6 lists its 'sea of sensors' with no ReadingType or units; its Thermal carries the same readings."""
    bmc = recorded(TREES / "hpe-dl380a-gen11")
    assert isinstance(bmc.temperatures, tuple) and bmc.temperatures
    assert all("/Thermal" in t.where for t in bmc.temperatures)
    assert bmc.sensors_not_judged == ()


DMTF = "dmtf-public-rackmount1"  # DMTF's 1U example: Thermal, Power, Sensors, ThermalMetrics, EnvironmentMetrics


def test_a_chassis_with_only_thermal_and_environment_metrics_is_judged_on_them(tmp_path: Path) -> None:
    """A BMC that lays readings out only as ThermalSubsystem/ThermalMetrics and EnvironmentMetrics (no Thermal,
    no Power, no Sensors): its temperatures and power draw come from those excerpts, over HTTP."""
    tree = tmp_path / DMTF
    shutil.copytree(TREES / DMTF, tree)
    chassis = tree / "redfish/v1/Chassis/1U"
    for gone in ("Thermal", "Power", "Sensors"):
        shutil.rmtree(chassis / gone)
    body = json.loads((chassis / "index.json").read_text())
    for gone in ("Thermal", "Power", "Sensors"):
        body.pop(gone)
    (chassis / "index.json").write_text(json.dumps(body))
    with sushy_static(tree) as peer:
        live, status, _ = read_redfish(lambda: LiveRedfish(peer.url, "admin", "pw", timeout_s=5.0, backoff_s=0.05),
                                       deadline_s=60)
    assert isinstance(live, BmcFacts) and isinstance(live.temperatures, tuple), live
    by_name = {t.name: t for t in live.temperatures}
    # ThermalMetrics' two readings and EnvironmentMetrics' one (its CPU1Temp sensor is not read here)
    assert {name: t.reading for name, t in by_name.items()} == {"Intake": 24.8, "Exhaust": 40.5, "CPU1Temp": 39.0}
    assert by_name["Intake"].where.endswith("/ThermalSubsystem/ThermalMetrics#/TemperatureReadingsCelsius/0")
    assert live.power_consumed_w == 374.0  # EnvironmentMetrics.PowerWatts
    findings = {(f.check, f.subject): f for f in _judge(live, status, ProfileStore().profile("generic-nvidia"))}
    assert findings[("bmc.temperatures", "Exhaust")].status is Status.PASS


def test_metrics_excerpts_never_double_a_chassis_with_sensors() -> None:
    bmc = recorded(TREES / DMTF)
    assert isinstance(bmc.temperatures, tuple)
    assert all("/Sensors/" in t.where for t in bmc.temperatures)  # not Thermal, not ThermalMetrics, not both
    assert len(bmc.temperatures) == len({t.where for t in bmc.temperatures}) == 8
