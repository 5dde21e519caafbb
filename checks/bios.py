"""bios.attribute: BIOS settings per vendor, read through Redfish; the `bios_attribute` actuator stages fixes.

Enumeration values are judged by what they mean, not how the BMC spells them: a value is first
taken as read, then through the BMC's BIOS AttributeRegistry when it offers one (a display name
or a decorated value -> its ValueName), then through the expectation's `aliases` (value -> other
spellings). A value decorated with a parenthesised note ("Maximum Performance (Default)") is also
tried without it: the note does not change the setting. A finding on a value not spelled as the
profile wants says which basis judged it: the registry, or the aliases and why there was no registry.
"""

from __future__ import annotations

import re
from typing import Any

from agent.core.expect import Expectation
from agent.core.facts import BiosSettings, NodeFacts
from agent.core.model import Finding, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, with_source

BIOS = Check("bios.attribute", "BIOS attributes", source="bmc", remediation="bios_attribute", action="reboot",
             evidence=("BIOS Attributes from the BMC against the vendor's expected values; enumerations by the BMC's "
                       "AttributeRegistry name, else the profile's aliases; an attribute the BIOS lacks is skip"),
             parts=("redfish",))

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


_DECORATION = re.compile(r"^(?P<value>.*?\S)\s*\([^()]*\)$")


def _wanted(expectation: Expectation) -> list[str]:
    values: list[Any] = []
    for op, value in expectation.comparators:
        if op == "equals":
            values.append(value)
        elif op == "one_of":
            values.extend(value)
    return [v for v in values if isinstance(v, str)]


def _spellings(aliases: Any, canonical: str) -> list[str]:
    listed = aliases.get(canonical) if isinstance(aliases, dict) else None
    return [listed] if isinstance(listed, str) else [a for a in listed or () if isinstance(a, str)]


def enumeration_value(name: str, value: Any, expectation: Expectation, registry: Any) -> tuple[Any, str | None]:
    """The enumeration value `value` stands for, and how that was told (None: taken as read).

    `registry` is the BMC's attribute -> {ValueName: ValueDisplayName} (or Unknown when it offers none).
    """
    wanted = _wanted(expectation)
    if not isinstance(value, str) or value in wanted:
        return value, None
    decoration = _DECORATION.match(value)
    candidates = [value, *([decoration.group("value")] if decoration else [])]
    entries = registry.get(name) if isinstance(registry, dict) else None
    if isinstance(entries, dict) and entries:
        for candidate in candidates:
            if candidate in entries:
                return candidate, None if candidate == value else "its value name in the BMC's attribute registry"
            named = [n for n, shown in entries.items() if shown == candidate]
            if len(named) == 1:
                return named[0], f"the BMC's attribute registry names {candidate!r} {named[0]}"
    aliases = expectation.option("aliases", {})
    for candidate in candidates:
        for canonical in wanted + [str(k) for k in (aliases if isinstance(aliases, dict) else {})]:
            if candidate == canonical and candidate != value:
                return canonical, "its note in parentheses does not change the setting"
            if candidate in _spellings(aliases, canonical):
                return canonical, f"{candidate!r} is an alias of {canonical} in the profile"
    return value, None


def basis(name: str, registry: Any) -> str:
    """What an enumeration value of attribute `name` was judged by (said in every finding that needed it)."""
    if isinstance(registry, dict) and registry.get(name):
        return "judged by the BMC's attribute registry"
    if isinstance(registry, dict):
        return f"judged by the profile's aliases: the BMC's attribute registry does not list {name}"
    reason = registry.reason if isinstance(registry, Unknown) else "none was read"
    return f"judged by the profile's aliases: no attribute registry ({reason})"


def meets(name: str, value: Any, expectation: Expectation, registry: Any) -> bool:
    """Whether a BIOS attribute's value meets the expectation, however the BMC spells it."""
    return expectation.evaluate(enumeration_value(name, value, expectation, registry)[0]).ok


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
    registry = bmc_found.bios_registry
    for name, expectation in sorted(expectations.items()):
        if name not in attributes:
            # Skipped in an audit (one vendor key covers many models), but remediation must refuse it.
            findings.append(with_source(BIOS.finding(name, Status.SKIP, expectation.severity,
                                                     f"this {vendor} BIOS has no attribute {name}",
                                                     expected=expectation.expected, remediation=BIOS.remediation),
                                        facts))
            continue
        raw = attributes[name]
        value, how = enumeration_value(name, raw, expectation, registry)
        finding = BIOS.compare(name, expectation, value, f"BIOS {name}")
        if how is not None:
            finding.observed = raw
            by_registry = isinstance(registry, dict) and bool(registry.get(name))  # `how` says so already
            finding.message += f" (the BMC reports {raw!r}: {how}{'' if by_registry else '; ' + basis(name, registry)})"
        elif isinstance(raw, str) and raw not in _wanted(expectation):
            finding.message += f" ({basis(name, registry)})"
        staged = pending.get(name, raw)
        if staged != raw:
            staged_ok = meets(name, staged, expectation, registry)
            if finding.status in (Status.FAIL, Status.WARN) and staged_ok:
                finding.status = Status.WARN  # fixed, waiting for the reboot (as ECC pending)
                finding.message += f"; {staged} is staged in the BMC: reboot to apply"
                finding.action = "reboot"
            elif finding.status is Status.PASS and not staged_ok:
                finding.status = Status.WARN
                finding.message += f"; but {staged} is staged and takes effect at the next reboot"
                finding.action = "review_pending_change"
        findings.append(with_source(finding, facts))
    return findings
