"""Firmware versions (per component, with per-vendor names) and consistency inside one node."""

from __future__ import annotations

import re
from collections import defaultdict

from agent.facts import FirmwareItem, NodeFacts
from agent.model import Finding, Severity, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, with_source

FIRMWARE = Check("bmc.firmware", "Firmware versions", source="bmc", action="update_firmware")
CONSISTENCY = Check("firmware.consistency", "One firmware version per component model", source="bmc",
                    action="update_firmware")


def _matches(item: FirmwareItem, names: list[str]) -> bool:
    """Exact (case-insensitive) name or id, or a `re:` pattern for vendors that number components."""
    for name in names:
        if name.startswith("re:"):
            if re.fullmatch(name[3:], item.name, re.IGNORECASE) or re.fullmatch(name[3:], item.component_id,
                                                                               re.IGNORECASE):
                return True
        elif name.lower() in (item.name.lower(), item.component_id.lower()):
            return True
    return False


@FIRMWARE.evaluator
def evaluate_firmware(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectations = profile.expectations_under("bmc", "firmware")
    if not expectations:
        return []
    bmc, findings = bmc_facts(FIRMWARE, facts, next(iter(expectations.values())))
    if bmc is None:
        return findings
    inventory = bmc.firmware if isinstance(bmc.firmware, tuple) else ()
    for component, expectation in sorted(expectations.items()):
        names = list(expectation.option("names", []))
        items = [i for i in inventory if _matches(i, names)]
        if component == "bmc" and not items and isinstance(bmc.manager_firmware, str):
            items = [FirmwareItem("BMC", bmc.manager_firmware, "Manager")]
        if component == "bios" and not items and isinstance(bmc.bios_version, str):
            items = [FirmwareItem("BIOS", bmc.bios_version, "System")]
        if not items:
            reason = bmc.firmware.reason if isinstance(bmc.firmware, Unknown) else (
                f"no inventory entry named {', '.join(names) or component}")
            findings.append(with_source(FIRMWARE.finding(component, Status.SKIP, expectation.severity,
                                                         f"{component} firmware: {reason}",
                                                         expected=expectation.expected), facts))
            continue
        for item in items:
            subject = component if len(items) == 1 else f"{component}:{item.stable_id}"
            findings.append(with_source(FIRMWARE.compare(subject, expectation, item.version,
                                                         f"{item.name} firmware"), facts))
    return findings


def component_model(item: FirmwareItem) -> str:
    """Group key: the component without slot or instance numbers.

    'PSU.Slot.3' -> 'psu.slot.#'. Dell's inventory ids embed the version
    ("Installed-25227-7.10.50.00__iDRAC.Embedded.1-1"), so for them the key is
    the device part after "__" plus the name without a MAC suffix, which keeps
    a ConnectX-6 apart from a ConnectX-7 in the next slot.
    """
    ident = item.component_id or item.name
    if "__" in ident:
        device = re.sub(r"\d+", "#", ident.split("__", 1)[1]).lower()
        name = re.sub(r"\s+-\s+([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$", "", item.name)
        return f"{device}|{re.sub(r'[0-9]+', '#', name).lower()}"
    return re.sub(r"\d+", "#", ident).lower()


@CONSISTENCY.evaluator
def evaluate_consistency(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "firmware_consistency")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(CONSISTENCY, facts, expectation, "firmware")
    if bmc is None:
        return findings
    assert isinstance(bmc.firmware, tuple)
    groups: dict[str, list[FirmwareItem]] = defaultdict(list)
    for item in bmc.firmware:
        groups[component_model(item)].append(item)
    if isinstance(bmc.gpus, tuple):
        for gpu in bmc.gpus:
            if gpu.firmware:
                groups[f"gpu:{gpu.model or '?'}"].append(FirmwareItem(gpu.name, gpu.firmware, gpu.name))
    if isinstance(bmc.switches, tuple):
        for switch in bmc.switches:
            if switch.firmware:
                groups[f"switch:{switch.model or '?'}"].append(FirmwareItem(switch.name, switch.firmware,
                                                                            switch.name))
    for key, items in sorted(groups.items()):
        if len(items) < 2:
            continue
        versions = sorted({i.version for i in items})
        if len(versions) == 1:
            findings.append(with_source(CONSISTENCY.finding(key, Status.PASS, expectation.severity,
                                                            f"{len(items)} x {items[0].name}: all {versions[0]}",
                                                            observed=versions, expected="one version"), facts))
            continue
        counts = {v: sum(1 for i in items if i.version == v) for v in versions}
        common = max(counts, key=lambda v: counts[v])
        odd = [f"{i.name} {i.version}" for i in items if i.version != common]
        findings.append(with_source(CONSISTENCY.finding(
            key, expectation.status_on_mismatch(), expectation.severity,
            f"{len(items)} x {key}: mixed firmware; {counts[common]} run {common}, odd ones: {', '.join(odd)}",
            observed=counts, expected="one version", reason=expectation.reason), facts))
    return findings


__all__ = ["CONSISTENCY", "FIRMWARE", "Severity", "component_model"]
