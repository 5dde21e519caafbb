"""bios.attribute: BIOS settings per vendor, read through Redfish (never changed here)."""

from __future__ import annotations

from agent.facts import NodeFacts
from agent.model import Finding, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, with_source

BIOS = Check("bios.attribute", "BIOS attributes", source="bmc", remediation="bios_attribute", action="reboot")

# Profiles key BIOS attributes by vendor: the names differ completely between them.
VENDOR_KEYS = {"dell": "Dell", "hpe": "HPE", "hewlett": "HPE", "lenovo": "Lenovo", "supermicro": "Supermicro",
               "nvidia": "NVIDIA", "ami": "AMI", "gigabyte": "Gigabyte", "quanta": "Quanta", "asrock": "ASRockRack"}


def vendor_key(*names: object) -> str | None:
    for name in names:
        if isinstance(name, str):
            lowered = name.lower()
            for needle, key in VENDOR_KEYS.items():
                if lowered.startswith(needle) or f" {needle}" in lowered:
                    return key
    return None


@BIOS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    bmc = facts.bmc
    vendor = vendor_key(getattr(bmc, "manufacturer", None), getattr(bmc, "vendor", None))
    if vendor is None:
        return []
    expectations = profile.expectations_under("bios", "attributes", vendor)
    if not expectations:
        return []
    bmc_found, findings = bmc_facts(BIOS, facts, next(iter(expectations.values())), "bios_attributes")
    if bmc_found is None:
        return findings
    attributes = bmc_found.bios_attributes
    assert not isinstance(attributes, Unknown)
    for name, expectation in sorted(expectations.items()):
        if name not in attributes:
            findings.append(with_source(BIOS.finding(name, Status.SKIP, expectation.severity,
                                                     f"this {vendor} BIOS has no attribute {name}",
                                                     expected=expectation.expected), facts))
            continue
        findings.append(with_source(BIOS.compare(name, expectation, attributes[name], f"BIOS {name}"), facts))
    return findings
