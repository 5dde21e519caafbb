"""BMC and cross-check checks as pure functions."""

from __future__ import annotations

import datetime as dt

import pytest

from agent.core.facts import (
    BmcFacts,
    BmcFan,
    BmcGpu,
    BmcLeakDetector,
    BmcLogEntry,
    BmcPsu,
    BmcRedundancy,
    BmcTemperature,
    FirmwareItem,
    NodeFacts,
)
from agent.core.model import Finding, Severity, SourceStatus, Status, Unknown, Unsupported
from agent.policy.profiles import Profile, ProfileStore
from checks.bios import BIOS, vendor_key
from checks.bmc_events import EVENTS
from checks.bmc_firmware import CONSISTENCY, FIRMWARE, component_model
from checks.bmc_health import FANS, LEAK, PSU, REACHABLE, ROLLUP, TEMPERATURES
from checks.crosscheck import COUNT, HEALTH, TEMPERATURE
from tests.factories import nvml_node

NOW = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def h100() -> Profile:
    return ProfileStore().profile("hgx-h100-sxm")


def healthy_bmc(**overrides: object) -> BmcFacts:
    values: dict[str, object] = dict(
        protocol="redfish", vendor="Dell", redfish_version="1.17.0", manufacturer="Dell Inc.",
        model="PowerEdge XE9680", bios_version="2.3.5", health="OK", health_rollup="OK",
        manager_model="16G Monolithic", manager_firmware="7.10.50.00", power_state="On",
        firmware=(FirmwareItem("Integrated Dell Remote Access Controller", "7.10.50.00", "iDRAC.Embedded.1"),
                  *(FirmwareItem(f"PSU {i}", "00.1D.2A", f"PSU.Slot.{i}") for i in range(1, 7))),
        temperatures=(BmcTemperature("System Board Inlet Temp", 22.0, 37.0, 42.0, None, "Enabled", "OK", "Intake"),
                      *(BmcTemperature(f"GPU{i + 1} Temp", 34.0, None, 87.0, 92.0, "Enabled", "OK", "GPU")
                        for i in range(8)),
                      BmcTemperature("DIMM Bay 9", None, None, 85.0, None, "Absent", "Critical", "Memory")),
        fans=tuple(BmcFan(f"Fan{i}", 9000.0, "RPM", 600.0, "Enabled", "OK") for i in range(1, 7)),
        psus=(*(BmcPsu(f"PS{i}", "Enabled", "OK") for i in range(1, 7)), BmcPsu("PS7", "Absent", "Critical")),
        redundancy=(BmcRedundancy("PSU Redundancy", "N+m", "Enabled", "OK", 4, 6),),
        leak_detectors=(), power_consumed_w=3000.0,
        bios_attributes={"SysProfile": "PerfOptimized", "ProcCStates": "Disabled"},
        events=(BmcLogEntry("Sel", "1", "OK", "Log cleared", "2026-11-19T10:00:00Z"),),
        gpus=tuple(BmcGpu(f"GPU{i + 1}", "NVIDIA H100 80GB HBM3", "96.00.74.00.0D", None, "Enabled", "OK")
                   for i in range(8)))
    values.update(overrides)
    return BmcFacts(**values)  # type: ignore[arg-type]


def node(bmc: BmcFacts | Unknown | None = None, **kw: object) -> NodeFacts:
    facts = nvml_node(**kw)  # type: ignore[arg-type]
    facts.bmc = healthy_bmc() if bmc is None else bmc
    facts.sources["redfish"] = SourceStatus("redfish", ok=True, detail={"requests": 60})
    facts.sources["ipmi"] = SourceStatus("ipmi", ok=False, configured=False)
    facts.observed_at = NOW
    return facts


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def test_healthy_dell_passes_every_bmc_check(h100: Profile) -> None:
    facts = node()
    for check in (REACHABLE, ROLLUP, PSU, FANS, TEMPERATURES, FIRMWARE, CONSISTENCY, EVENTS, BIOS, COUNT,
                  TEMPERATURE, HEALTH):
        findings = check.run(facts, h100)
        assert findings, check.id
        bad = [f.message for f in findings if f.status not in (Status.PASS, Status.SKIP)]
        assert bad == [], check.id
    assert by_subject(PSU.run(facts, h100))["PS7"].status is Status.SKIP  # an empty bay is not a failure
    assert "DIMM Bay 9" not in by_subject(TEMPERATURES.run(facts, h100))  # Absent with Critical health: skipped
    assert {f.source for f in PSU.run(facts, h100)} == {"redfish"}


def test_psu_failure_and_lost_redundancy(h100: Profile) -> None:
    bmc = healthy_bmc(psus=(BmcPsu("PS1", "Enabled", "OK"), BmcPsu("PS3", "Enabled", "Critical"),
                            BmcPsu("PS4", "StandbySpare", "OK")),
                      redundancy=(BmcRedundancy("PSU Redundancy", "N+m", "Enabled", "Critical", 4, 6),))
    result = by_subject(PSU.run(node(bmc), h100))
    assert result["PS3"].status is Status.FAIL and result["PS3"].severity is Severity.CRITICAL
    assert result["PS4"].status is Status.SKIP  # standby is not a failure
    assert result["PSU Redundancy"].status is Status.FAIL and "redundancy lost" in result["PSU Redundancy"].message


def test_temperatures_against_their_own_thresholds(h100: Profile) -> None:
    sensors = (BmcTemperature("Inlet", 39.0, 37.0, 42.0, None, "Enabled", "OK"),
               BmcTemperature("GPU3 Temp", 88.0, None, 87.0, 92.0, "Enabled", "Warning", "GPU"),
               BmcTemperature("GPU4 Temp", 93.0, None, 87.0, 92.0, "Enabled", "Critical", "GPU"))
    result = by_subject(TEMPERATURES.run(node(healthy_bmc(temperatures=sensors)), h100))
    assert result["Inlet"].status is Status.FAIL and result["Inlet"].severity is Severity.WARNING
    assert result["GPU3 Temp"].severity is Severity.CRITICAL and "critical threshold 87" in result["GPU3 Temp"].message
    assert result["GPU4 Temp"].observed == {"reading": 93.0, "level": "fatal"}


def test_fans_and_leaks(h100: Profile) -> None:
    fans = (BmcFan("Fan1", 300.0, "RPM", 600.0, "Enabled", "OK"), BmcFan("Fan2", 9000.0, "RPM", 600.0, "Enabled", "OK"))
    result = by_subject(FANS.run(node(healthy_bmc(fans=fans)), h100))
    assert result["Fan1"].status is Status.FAIL and "below its lower critical threshold" in result["Fan1"].message
    assert result["Fan2"].status is Status.PASS
    leaks = (BmcLeakDetector("Chassis leak", "Critical", "Enabled", "Critical"),)
    (leak,) = LEAK.run(node(healthy_bmc(leak_detectors=leaks)), h100)
    assert leak.status is Status.FAIL and leak.severity is Severity.CRITICAL and leak.action == "drain"


def test_rollup_names_the_causes(h100: Profile) -> None:
    bmc = healthy_bmc(health_rollup="Critical", health_causes=("PS3 Status: Critical",))
    (finding,) = ROLLUP.run(node(bmc), h100)
    assert finding.status is Status.FAIL and "PS3 Status: Critical" in finding.message


def test_firmware_minimum_with_vendor_names(h100: Profile) -> None:
    old = healthy_bmc(firmware=(FirmwareItem("Integrated Dell Remote Access Controller", "6.10.80.00",
                                             "iDRAC.Embedded.1"),))
    result = by_subject(FIRMWARE.run(node(old), h100))
    assert result["bmc"].status is Status.FAIL and result["bmc"].observed == "6.10.80.00"
    no_inventory = healthy_bmc(firmware=Unsupported("no inventory"), manager_firmware="7.10.50.00")
    assert by_subject(FIRMWARE.run(node(no_inventory), h100))["bmc"].status is Status.PASS  # manager's version


def test_firmware_consistency_names_the_odd_one(h100: Profile) -> None:
    items = (*(FirmwareItem(f"PSU {i}", "00.1D.2A", f"PSU.Slot.{i}") for i in range(1, 6)),
             FirmwareItem("PSU 6", "00.1A.1B", "PSU.Slot.6"))
    assert component_model(items[0]) == "psu #"  # the name without its instance number, not the slot id
    result = by_subject(CONSISTENCY.run(node(healthy_bmc(firmware=items)), h100))
    finding = result["psu #"]
    assert finding.status is Status.FAIL and "PSU 6 00.1A.1B" in finding.message
    assert finding.observed == {"00.1A.1B": 1, "00.1D.2A": 5}


# A BlueField-3 BMC's FirmwareInventory as NVIDIA's BMC documents it: every member's Name is "Software Inventory";
# the member ids say what each image is (ids and versions written for this test, after that layout).
BLUEFIELD = (("BMC_Firmware", "BF-24.04-5"), ("Bluefield_FW_ERoT", "00.02.0182.0000_n02"), ("DPU_ATF", "v2.2(release)"),
             ("DPU_BOARD", "MBF3M332A-AENOT"), ("DPU_BSP", "4.7.0.13127"), ("DPU_NIC", "32.41.1000"),
             ("DPU_NODE", "bluefield"), ("DPU_OFED", "24.04-0.6.6"), ("DPU_OS", "DOCA_2.7.0_BSP_4.7.0"),
             ("DPU_SYS_IMAGE", "b83e:0003:0079:2c2b"), ("DPU_UEFI", "4.7.0-42-g13081ae"))


def test_one_display_name_over_different_components_is_no_mixed_firmware(h100: Profile) -> None:
    """Issue 31.3: grouping by display name called 11 different images one component with mixed firmware."""
    items = tuple(FirmwareItem("Software Inventory", version, ident) for ident, version in BLUEFIELD)
    findings = CONSISTENCY.run(node(healthy_bmc(firmware=items)), h100)
    assert [f for f in findings if f.status is not Status.PASS] == [], [f.message for f in findings]
    # The same component on several devices is still compared: four NVSwitches' images, one odd, told by id.
    switches = tuple(FirmwareItem("Software Inventory", "2.0.4" if i != 2 else "1.9.8", f"HGX_FW_NVSwitch_{i}")
                     for i in range(4))
    result = by_subject(CONSISTENCY.run(node(healthy_bmc(firmware=items + switches)), h100))
    odd = [f for f in result.values() if f.status is Status.FAIL]
    assert len(odd) == 1 and "HGX_FW_NVSwitch_2 1.9.8" in odd[0].message, [f.message for f in result.values()]
    assert odd[0].observed == {"1.9.8": 1, "2.0.4": 3}


def test_events_in_the_window_deduplicated(h100: Profile) -> None:
    entries = (BmcLogEntry("Sel", "10", "Critical", "PS3 failure detected", "2026-11-19T22:00:00Z", "PSU0003"),
               BmcLogEntry("Sel", "11", "Critical", "PS3 failure detected", "2026-11-19T23:00:00Z", "PSU0003"),
               BmcLogEntry("Sel", "12", "Warning", "Fan1 RPM low", "2026-11-18T00:00:00Z", "FAN0001"),
               BmcLogEntry("Sel", "2", "Critical", "Old failure", "2026-01-01T00:00:00Z", "X"),
               BmcLogEntry("Sel", "3", "OK", "Log cleared", "2026-11-19T00:00:00Z"))
    result = by_subject(EVENTS.run(node(healthy_bmc(events=entries)), h100))
    assert set(result) == {"Sel:PSU0003", "Sel:FAN0001"}  # the old one is outside the 7-day window
    psu = result["Sel:PSU0003"]
    assert psu.status is Status.FAIL and psu.severity is Severity.CRITICAL and psu.observed == 2
    assert "'PS3 failure detected'" in psu.message and "x2" in psu.message
    assert result["Sel:FAN0001"].status is Status.WARN


def test_bios_attributes_per_vendor(h100: Profile) -> None:
    assert vendor_key("Dell Inc.") == "Dell" and vendor_key("HPE") == "HPE" and vendor_key("Acme") is None
    balanced = healthy_bmc(bios_attributes={"SysProfile": "PerfPerWattOptimizedOs", "ProcCStates": "Enabled"})
    result = by_subject(BIOS.run(node(balanced), h100))
    assert result["SysProfile"].status is Status.FAIL and result["ProcCStates"].status is Status.FAIL
    assert result["SysProfile"].remediation == "bios_attribute" and result["SysProfile"].action == "reboot"
    missing = healthy_bmc(bios_attributes={"SysProfile": "PerfOptimized"})
    assert by_subject(BIOS.run(node(missing), h100))["ProcCStates"].status is Status.SKIP
    hpe = healthy_bmc(manufacturer="HPE", vendor="HPE",
                      bios_attributes={"WorkloadProfile": "I/OThroughput", "PowerRegulator": "DynamicPowerSavings",
                                       "MinProcIdlePower": "C6"})
    assert {f.status for f in BIOS.run(node(hpe), h100)} == {Status.FAIL}


def test_crosschecks(h100: Profile) -> None:
    seven = healthy_bmc(gpus=healthy_bmc().gpus[:7])  # type: ignore[index]
    (count,) = COUNT.run(node(seven), h100)
    assert count.status is Status.FAIL and count.observed == {"bmc": 7, "nvml": 8, "pci": 8}
    temps = tuple(BmcTemperature(f"GPU{i + 1} Temp", 34.0 if i != 5 else 45.0, None, 87.0, 92.0, "Enabled", "OK", "GPU")
                  for i in range(8))
    result = by_subject(TEMPERATURE.run(node(healthy_bmc(temperatures=temps)), h100))
    assert result["gpu5"].status is Status.FAIL and result["gpu5"].observed == 11.0
    assert result["gpu0"].status is Status.PASS
    failed = healthy_bmc(gpus=(*healthy_bmc().gpus[:7],  # type: ignore[index]
                               BmcGpu("GPU8", "H100", None, None, "UnavailableOffline", "Critical")))
    health = by_subject(HEALTH.run(node(failed), h100))
    assert health["gpu7"].status is Status.FAIL and "the BMC reports a fault" in health["gpu7"].message
    assert health["gpu0"].status is Status.PASS


def test_bmc_down_or_auth_failed(h100: Profile) -> None:
    facts = node(Unknown("authentication failed (HTTP 401)"))
    facts.sources["redfish"] = SourceStatus("redfish", ok=False, error="authentication failed (HTTP 401)",
                                            detail={"auth_failed": True})
    (reach,) = REACHABLE.run(facts, h100)
    assert reach.status is Status.FAIL and "not retried" in reach.message and reach.action == "check_credentials"
    (psu,) = PSU.run(facts, h100)
    assert psu.status is Status.UNKNOWN and "authentication failed" in psu.message
    insecure = node(healthy_bmc(insecure=True))
    assert by_subject(REACHABLE.run(insecure, h100))["tls"].status is Status.WARN


def test_nvswitch_health_and_firmware(h100: Profile) -> None:
    from agent.core.facts import BmcSwitch
    from checks.bmc_health import SWITCHES

    switches = tuple(BmcSwitch(f"NVSwitch_{i}", "NVLink", "NVSwitch 3", "96.10.6D.00.01" if i else "96.10.55.00.01",
                               "Enabled", "Critical" if i == 2 else "OK") for i in range(4))
    facts = node(healthy_bmc(switches=switches))
    result = by_subject(SWITCHES.run(facts, h100))
    assert result["NVSwitch_2"].status is Status.FAIL and result["NVSwitch_2"].severity is Severity.CRITICAL
    assert result["NVSwitch_0"].status is Status.PASS
    mixed = by_subject(CONSISTENCY.run(facts, h100))["switch:NVSwitch 3"]
    assert mixed.status is Status.FAIL and "NVSwitch_0 96.10.55.00.01" in mixed.message


def test_an_event_without_message_id_keeps_its_subject_when_it_repeats(h100: Profile) -> None:
    # Subjects are metric series: a repeat of the same event must not make a new one per entry id.
    first = (BmcLogEntry("Sel", "41", "Warning", "Voltage 3 out of range", "2026-11-19T22:00:00Z"),)
    later = (*first, BmcLogEntry("Sel", "97", "Warning", "Voltage 3 out of range", "2026-11-19T23:30:00Z"))
    before = set(by_subject(EVENTS.run(node(healthy_bmc(events=first)), h100)))
    after = set(by_subject(EVENTS.run(node(healthy_bmc(events=later)), h100)))
    assert before == after and len(after) == 1 and not any(s.endswith((":41", ":97")) for s in after)
