"""Issue 13 rule 5: vendor version formats for `version_min`, "no minimum", and BIOS enumeration values
judged by what they mean (the BMC's AttributeRegistry, else the profile's aliases), not how they are spelled.

Real strings come from the Redfish copies in fixtures/redfish/ (see its SOURCES.md); where a format is
quoted from vendor documentation rather than a fixture, the comment says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.core import versions
from agent.core.expect import Expectation
from agent.core.facts import BmcFacts, FirmwareItem, NodeFacts
from agent.core.model import SourceStatus, Status
from agent.policy.profiles import Profile, ProfileStore, profile_validator
from agent.sources.bios_registry import parse_attribute_registry
from checks.bios import BIOS, enumeration_value, meets
from checks.bmc_firmware import FIRMWARE
from tests.factories import exp, nvml_node, profile

REDFISH = Path(__file__).resolve().parents[3] / "fixtures" / "redfish"


def body(rel: str) -> dict[str, Any]:
    data = json.loads((REDFISH / rel).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def e(**comparators: Any) -> Expectation:
    return Expectation.from_mapping(exp(**comparators))


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


@pytest.fixture(scope="module")
def h100() -> Profile:
    return ProfileStore().profile("hgx-h100-sxm")


def bmc_node(**values: Any) -> NodeFacts:
    facts = nvml_node()
    facts.bmc = BmcFacts(protocol="redfish", **values)
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    return facts


def by_subject(findings: list[Any]) -> dict[str, Any]:
    return {f.subject: f for f in findings}


# --- the formats -----------------------------------------------------------------------------------

ORDERED = [
    # HPE System ROM: fixtures/redfish/hpe-dl380a-gen11 "U58 v2.44 (01/17/2025)", hpe-ilo5-dl360-gen10plus
    # "U46 v1.80 (07/05/2023)" (Redundant System ROM) and "U46 v2.34 (03/11/2025)"
    ("U46 v1.80 (07/05/2023)", "U46 v2.34 (03/11/2025)"),
    ("U58 v2.40 (10/01/2024)", "U58 v2.44 (01/17/2025)"),
    ("U58 v2.44 (01/17/2025)", "U58 v2.44 (02/28/2025)"),  # the same release rebuilt
    # iLO with its build date (FirmwareInventory "3.11 Feb 25 2025", "1.66 Dec 13 2024"; "2.81 Feb 06 2023")
    ("2.78 Dec 01 2022", "2.81 Feb 06 2023"),
    ("3.10 Jan 10 2025", "3.11 Feb 25 2025"),
    ("iLO 5 v2.81", "iLO 5 v3.11"),  # Manager.FirmwareVersion (hpe-ilo5-dl360-gen10plus: "iLO 5 v3.11")
    ("iLO 6 v1.59", "iLO 6 v1.66"),
    # Lenovo XCC / UEFI: build id and release (bmclib lenovo fixture "TEE142M-2.41"; "TEI334L 2.10")
    ("TEI334L 2.10", "TEI338M 2.12"),
    ("TEE140K-2.30", "TEE142M-2.41"),
    ("TEI334L 2.10", "TEI336N 2.10"),  # one release, a later build
    # Supermicro BIOS respins (gofish supermicro-sys-821ge-tnhr BiosVersion "2.1"; "2.1b" as Supermicro numbers)
    ("2.1", "2.1a"), ("2.1a", "2.1b"), ("2.1b", "2.2"), ("2.1b", "2.10"),
    # Dell
    ("2.9.3", "2.19.1"), ("6.10.80.00", "7.10.50.00"),
]


@pytest.mark.parametrize(("older", "newer"), ORDERED)
def test_vendor_versions_are_ordered(older: str, newer: str) -> None:
    """Fails on the old code for the HPE ROM, `iLO N vX`, Lenovo and `2.1b` < `2.10` rows (not versions, or
    text compared after numbers)."""
    assert e(version_min=older).evaluate(newer).ok
    assert not e(version_min=newer).evaluate(older).ok
    assert versions.compare(older, newer) == -1 and versions.compare(newer, older) == 1


@pytest.mark.parametrize(("observed", "bound", "families"), [
    ("U46 v2.34 (03/11/2025)", "U58 v2.30 (01/01/2025)", ("U46", "U58")),  # another platform's ROM
    ("iLO 5 v3.11", "iLO 6 v1.55", ("iLO 5", "iLO 6")),
    ("TEE142M-2.41", "TEI334L 2.10", ("TEE", "TEI")),  # Lenovo UEFI against an XCC minimum
])
def test_family_mismatch_is_not_compared_as_numbers(observed: str, bound: str, families: tuple[str, str]) -> None:
    """Fails on the old code: the reason did not say why (and 'iLO 5 v3.11' >= 'iLO 6 v1.55' was not even read)."""
    verdict = e(version_min=bound).evaluate(observed)
    assert not verdict.ok and not verdict.comparable
    assert "different firmware families" in verdict.detail and all(f in verdict.detail for f in families)
    finding = FIRMWARE.compare("bios", e(version_min=bound), observed, "System ROM firmware")
    assert finding.status is Status.UNKNOWN and families[0] in finding.message


def test_a_bound_without_family_compares_with_any_family() -> None:
    assert e(version_min="2.40").evaluate("U58 v2.44 (01/17/2025)").ok
    assert not e(version_min="2.50").evaluate("U58 v2.44 (01/17/2025)").ok


@pytest.mark.parametrize("observed", ["U58 v2.44 (01/17/2025)", "iLO 5 v3.11", "TEE142M-2.41", "1.66 Dec 13 2024",
                                      "2.1b", "HPK5", "0x20"])
@pytest.mark.parametrize("bound", ["0", 0, "0.0", ""])
def test_no_minimum_passes_with_the_version_shown(observed: str, bound: Any) -> None:
    """Fails on the old code for the HPE ROM, iLO and Lenovo strings: `unknown` instead of pass."""
    verdict = e(version_min=bound).evaluate(observed)
    assert verdict.ok and observed in verdict.detail and "no minimum" in verdict.detail
    finding = FIRMWARE.compare("bmc", e(version_min=bound), observed, "BMC firmware")
    assert finding.status is Status.PASS and finding.observed == observed and observed in finding.message
    assert versions.is_no_minimum(None) and not versions.is_no_minimum("0.1")


def test_placeholders_are_still_not_versions() -> None:
    for placeholder in ("N/A", "Unknown", "", None, True):
        assert versions.parse(placeholder) is None
        assert not e(version_min="0").evaluate(placeholder).comparable


def hpe_inventory(tree: str) -> tuple[FirmwareItem, ...]:
    folder = REDFISH / tree / "redfish/v1/UpdateService/FirmwareInventory"
    items = []
    for member in sorted(folder.iterdir()):
        if (member / "index.json").is_file() and member.name.isdigit():
            data = body(str((member / "index.json").relative_to(REDFISH)))
            items.append(FirmwareItem(data["Name"], data["Version"], data["Id"]))
    return tuple(items)


def test_recorded_hpe_firmware_passes_base_profile(generic: Profile) -> None:
    """The HPE mockups' System ROM and iLO against base's `version_min: "0"` (recorded for the fleet).
    Fails on the old code: 'U58 v2.44 (01/17/2025)' and 'U46 v2.34 (03/11/2025)' were unknown."""
    for tree, rom, ilo in (("hpe-dl380a-gen11", "U58 v2.44 (01/17/2025)", "1.66 Dec 13 2024"),
                           ("hpe-ilo5-dl360-gen10plus", "U46 v2.34 (03/11/2025)", "3.11 Feb 25 2025")):
        system = body(f"{tree}/redfish/v1/Systems/1/index.json")
        manager = body(f"{tree}/redfish/v1/Managers/1/index.json")
        facts = bmc_node(manufacturer=system["Manufacturer"], bios_version=system["BiosVersion"],
                         manager_firmware=manager["FirmwareVersion"], firmware=hpe_inventory(tree))
        result = by_subject(FIRMWARE.run(facts, generic))
        assert (result["bios"].status, result["bios"].observed) == (Status.PASS, rom)
        assert (result["bmc"].status, result["bmc"].observed) == (Status.PASS, ilo)


def test_lenovo_and_supermicro_manager_versions_pass_base(generic: Profile) -> None:
    """bmclib's Lenovo manager ("TEE142M-2.41") and gofish's Supermicro manager ("01.01.06") and system
    ("2.1"), with no inventory: the manager's and system's versions are recorded. Fails on the old code
    for Lenovo (unknown)."""
    lenovo = body("single/bmclib/providers_lenovo__v1_manager.1.json")["FirmwareVersion"]
    smc_bmc = body("single/gofish/supermicro_manager.json")["FirmwareVersion"]
    smc_bios = body("single/gofish/supermicro-sys-821ge-tnhr_system.json")["BiosVersion"]
    for manufacturer, manager, bios in (("Lenovo", lenovo, lenovo), ("Supermicro", smc_bmc, smc_bios)):
        facts = bmc_node(manufacturer=manufacturer, manager_firmware=manager, bios_version=bios, firmware=())
        result = by_subject(FIRMWARE.run(facts, generic))
        assert (result["bmc"].status, result["bmc"].observed) == (Status.PASS, manager), result["bmc"].message
        assert (result["bios"].status, result["bios"].observed) == (Status.PASS, bios)


def test_an_idrac_minimum_does_not_fail_other_vendors(h100: Profile) -> None:
    """hgx-common's BMC minimum is iDRAC's numbering (7.00.00.00): an HGX with iLO 6 1.66 or a Supermicro
    BMC 01.01.06 is recorded as skip with its version, not failed as "below 7". Fails on the old code (fail)."""
    hpe = bmc_node(manufacturer="HPE", manager_firmware="iLO 6 v1.66",
                   firmware=(FirmwareItem("iLO 6", "1.66 Dec 13 2024", "1"),))
    finding = by_subject(FIRMWARE.run(hpe, h100))["bmc"]
    assert finding.status is Status.SKIP and finding.observed == "1.66 Dec 13 2024" and "Dell" in finding.message
    smc = bmc_node(manufacturer="Supermicro", manager_firmware="01.01.06", firmware=())
    assert by_subject(FIRMWARE.run(smc, h100))["bmc"].status is Status.SKIP
    dell = bmc_node(manufacturer="Dell Inc.", manager_firmware="6.10.80.00", firmware=())
    assert by_subject(FIRMWARE.run(dell, h100))["bmc"].status is Status.FAIL  # still judged where it applies


# --- BIOS enumerations ----------------------------------------------------------------------------------

# An AttributeRegistry body in DMTF's schema, with Lenovo's operating-mode values. (The BMC's registry is not in
# the fixtures: bmclib's Lenovo Bios resource names "BiosAttributeRegistry.1.0.0" but the registry was not
# recorded.) Its display names are the ones XCC's setup shows.
LENOVO_REGISTRY = {"RegistryEntries": {"Attributes": [
    {"AttributeName": "OperatingModes_ChooseOperatingMode", "Type": "Enumeration", "Value": [
        {"ValueName": "MaximumEfficiency", "ValueDisplayName": "Maximum Efficiency"},
        {"ValueName": "MaximumPerformance", "ValueDisplayName": "Maximum Performance"},
        {"ValueName": "Efficiency_FavorPerformance", "ValueDisplayName": "Efficiency - Favor Performance"},
        {"ValueName": "Custom", "ValueDisplayName": "Custom Mode"}]},
    {"AttributeName": "BootMode", "Type": "String"},  # no enumeration: left out
    "not an attribute", {"AttributeName": 7, "Value": []},  # hostile entries: left out
]}}
MODE = "OperatingModes_ChooseOperatingMode"


def lenovo_bios(value: str, registry: Any = None) -> NodeFacts:
    attributes = dict(body("single/bmclib/providers_lenovo__v1_bios.json")["Attributes"])
    attributes[MODE] = value
    extra = {} if registry is None else {"bios_registry": registry}
    return bmc_node(manufacturer="Lenovo", bios_attributes=attributes, **extra)


def test_registry_parser_is_bounded_and_typed() -> None:
    assert parse_attribute_registry(LENOVO_REGISTRY) == {MODE: {
        "MaximumEfficiency": "Maximum Efficiency", "MaximumPerformance": "Maximum Performance",
        "Efficiency_FavorPerformance": "Efficiency - Favor Performance", "Custom": "Custom Mode"}}
    assert parse_attribute_registry({"RegistryEntries": []}) == {}


def test_real_lenovo_setting_is_a_finding(generic: Profile) -> None:
    """bmclib's Lenovo BIOS runs Efficiency_FavorPerformance: not MaximumPerformance, with or without a registry."""
    for registry in (None, parse_attribute_registry(LENOVO_REGISTRY)):
        (finding,) = BIOS.run(lenovo_bios("Efficiency_FavorPerformance", registry), generic)
        assert finding.status is Status.FAIL


def test_decorated_tuned_value_passes_by_registry(generic: Profile) -> None:
    """'Maximum Performance (Default)' is MaximumPerformance by the registry's display name.
    Fails on the old code (BmcFacts had no registry; the value was compared as spelled: fail)."""
    registry = parse_attribute_registry(LENOVO_REGISTRY)
    (finding,) = BIOS.run(lenovo_bios("Maximum Performance (Default)", registry), generic)
    assert finding.status is Status.PASS and finding.observed == "Maximum Performance (Default)"
    assert "attribute registry" in finding.message
    # A decorated value the registry names as another value is still that other value.
    (finding,) = BIOS.run(lenovo_bios("Efficiency - Favor Performance (Default)", registry), generic)
    assert finding.status is Status.FAIL


def test_decorated_tuned_value_passes_by_profile_alias() -> None:
    """Without a registry, the expectation's aliases name the other spellings. Fails on the old code (fail, and
    the schema refused `aliases`)."""
    tuned = profile({"bios": {"attributes": {"Lenovo": {MODE: exp(
        equals="MaximumPerformance", aliases={"MaximumPerformance": ["Maximum Performance"]})}}}})
    (finding,) = BIOS.run(lenovo_bios("Maximum Performance (Default)"), tuned)
    assert finding.status is Status.PASS and "alias" in finding.message
    plain = profile({"bios": {"attributes": {"Lenovo": {MODE: exp(equals="MaximumPerformance")}}}})
    (finding,) = BIOS.run(lenovo_bios("MaximumPerformance (Default)"), plain)  # a note, nothing else
    assert finding.status is Status.PASS
    (finding,) = BIOS.run(lenovo_bios("Maximum Performance"), plain)  # another spelling needs an alias
    assert finding.status is Status.FAIL


def test_schema_takes_aliases_and_firmware_vendors() -> None:
    """Fails on the old code: the schema refused both keys."""
    document: dict[str, Any] = {"name": "site", "description": "site profile", "expect": {
        "bios": {"attributes": {"Lenovo": {MODE: exp(equals="MaximumPerformance",
                                                      aliases={"MaximumPerformance": ["Maximum Performance"]})}}},
        "bmc": {"firmware": {"bmc": {**exp(version_min="iLO 6 v1.60"), "names": ["iLO 6"], "vendors": ["HPE"]}}}}}
    validator = profile_validator()
    assert validator.errors(document) == []
    document["expect"]["bios"]["attributes"]["Lenovo"][MODE]["aliases"] = {"MaximumPerformance": "one string"}
    assert validator.errors(document)


def test_hpe_gen11_power_saving_bios_is_still_a_finding(generic: Profile) -> None:
    """fixtures/redfish/hpe-dl380a-gen11: WorkloadProfile I/OThroughput, PowerRegulator DynamicPowerSavings,
    MinProcIdlePower C6 - a real tuning finding, also when the BMC's registry (display names as iLO shows
    them) is read. Fails on the old code only because BmcFacts had no `bios_registry`."""
    attributes = body("hpe-dl380a-gen11/redfish/v1/Systems/1/bios/index.json")["Attributes"]
    registry = parse_attribute_registry({"RegistryEntries": {"Attributes": [
        {"AttributeName": "PowerRegulator", "Value": [
            {"ValueName": "DynamicPowerSavings", "ValueDisplayName": "Dynamic Power Savings Mode"},
            {"ValueName": "StaticHighPerf", "ValueDisplayName": "Static High Performance Mode"}]}]}})
    facts = bmc_node(manufacturer="HPE", bios_attributes=attributes, bios_registry=registry)
    result = by_subject(BIOS.run(facts, generic))
    assert {name: f.status for name, f in result.items()} == {
        "WorkloadProfile": Status.FAIL, "PowerRegulator": Status.FAIL, "MinProcIdlePower": Status.FAIL}
    assert result["PowerRegulator"].observed == "DynamicPowerSavings"


def test_dell_balanced_profile_is_still_a_finding(generic: Profile) -> None:
    """bmclib's Dell BIOS (the R6515 of ironlib's racadm SCP export): SysProfile PerfPerWattOptimizedOs."""
    attributes = body("single/bmclib/internal_redfishwrapper__dell_bios.json")["Attributes"]
    result = by_subject(BIOS.run(bmc_node(manufacturer="Dell Inc.", bios_attributes=attributes), generic))
    assert result["SysProfile"].status is Status.FAIL


def test_remediation_judges_like_the_check() -> None:
    """The actuator asks `meets` (checks/bios.py), so a decorated tuned value is not re-staged."""
    expectation = e(equals="MaximumPerformance")
    registry = parse_attribute_registry(LENOVO_REGISTRY)
    assert meets(MODE, "Maximum Performance (Default)", expectation, registry)
    assert not meets(MODE, "Efficiency_FavorPerformance", expectation, registry)
    assert enumeration_value(MODE, 3, expectation, registry) == (3, None)  # numbers are taken as read
