"""bios.attribute: BIOS settings per vendor, read through Redfish; the `bios_attribute` actuator stages fixes."""

from __future__ import annotations

from agent.facts import BiosSettings, NodeFacts
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


def bios_vendor(bmc: object) -> str | None:
    """The profile key for this BMC's BIOS: a known vendor's canonical key, or (OEM boxes)
    the system's Manufacturer exactly as reported."""
    manufacturer = getattr(bmc, "manufacturer", None)
    return vendor_key(manufacturer, getattr(bmc, "vendor", None)) or (
        manufacturer if isinstance(manufacturer, str) else None)


@BIOS.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    bmc = facts.bmc
    vendor = bios_vendor(bmc)
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
    settings = bmc_found.bios_settings
    pending = settings.pending if isinstance(settings, BiosSettings) and isinstance(settings.pending, dict) else {}
    for name, expectation in sorted(expectations.items()):
        if name not in attributes:
            # Skipped in an audit (one vendor key covers many models), but remediation must refuse it.
            findings.append(with_source(BIOS.finding(name, Status.SKIP, expectation.severity,
                                                     f"this {vendor} BIOS has no attribute {name}",
                                                     expected=expectation.expected, remediation=BIOS.remediation),
                                        facts))
            continue
        finding = BIOS.compare(name, expectation, attributes[name], f"BIOS {name}")
        staged = pending.get(name, attributes[name])
        if staged != attributes[name]:
            if finding.status in (Status.FAIL, Status.WARN) and expectation.evaluate(staged).ok:
                finding.status = Status.WARN  # fixed, waiting for the reboot (as ECC pending)
                finding.message += f"; {staged} is staged in the BMC: reboot to apply"
                finding.action = "reboot"
            elif finding.status is Status.PASS and not expectation.evaluate(staged).ok:
                finding.status = Status.WARN
                finding.message += f"; but {staged} is staged and takes effect at the next reboot"
                finding.action = "review_pending_change"
        findings.append(with_source(finding, facts))
    return findings
