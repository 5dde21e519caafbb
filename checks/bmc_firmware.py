"""Firmware versions (per component, with per-vendor names) and consistency inside one node."""

from __future__ import annotations

import re
from collections import defaultdict

from agent.facts import FirmwareItem, NodeFacts
from agent.model import Finding, Severity, Status, Unknown
from agent.profiles import Profile
from checks import Check
from checks._bmc import NOT_MEASURING, bmc_facts, with_source

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


# Words after which a number is an instance (slot, bay, socket), not part of a model name.
_INSTANCE = (r"processor|cpu|socket|node|pack|bay|slot|port|psu|ps|supply|fan|gpu|drive|disk|dimm|module|riser|"
             r"card|box|blade|sled|tray|battery|controller|nic|adapter|mezz|switch|hpcnet|fpga|enclosure|"
             r"backplane|cage|channel|unit|retimer")
_INSTANCE_RE = re.compile(rf"({_INSTANCE})([\s._-]*)\d+\b")
_TRAILING_INDEX_RE = re.compile(r"([\s._-])\d+$")
_MAC_RE = re.compile(r"\s+-\s+([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$")
_ZERO_VERSION_RE = re.compile(r"^[0.\s]+$")
_GENERIC_WORDS = frozenset({"firmware", "software", "device", "component", "version", "image", "bios", "fw"})
_PLACEHOLDER_VERSIONS = frozenset({"", "n/a", "na", "none", "null", "unknown", "undefined", "not available"})


def _without_instance(text: str) -> str:
    text = re.sub(r"\s+#\d+$", "", _MAC_RE.sub("", text.strip())).lower()
    return _TRAILING_INDEX_RE.sub(r"\1#", _INSTANCE_RE.sub(r"\1\2#", text))


def component_model(item: FirmwareItem) -> str:
    """Group key: what the component is (kind and model), never its numeric or positional id.

    From the name with instance numbers taken out ("Processor 2 S3M Firmware" -> "processor #
    s3m firmware", "nFPGA1" -> "nfpga#", "HGX_FW_GPU_SXM_3" -> "hgx_fw_gpu_sxm_#"), plus the
    model the inventory gives: the Model of its RelatedItem, its SoftwareId, or a part code in its
    Description (HPE: "MO006400KYDND"). HPE numbers its inventory "1", "2", ...: those ids say
    nothing. Dell's ids embed the version ("Installed-25227-7.10.50.00__iDRAC.Embedded.1-1"), so
    for them the device part after "__" joins the name, which keeps a ConnectX-6 apart from a
    ConnectX-7 in the next slot.
    """
    ident = item.component_id or ""
    name = item.name or ident
    key = _without_instance(name)
    if "__" in ident:  # the device part names the kind; Dell's SoftwareId is the update package's id
        key = f"{re.sub(r'[0-9]+', '#', ident.split('__', 1)[1]).lower()}|{key}"
        return f"{key}|{item.model.strip().lower()}" if item.model and item.model.strip() else key
    model = item.model or item.software_id
    description = (item.description or "").strip()
    if not model and description and " " not in description and description.lower() not in _GENERIC_WORDS and (
            description.lower() != name.strip().lower()):
        model = description  # a part code, not a sentence ("MO006400KYDND", "PowerSupplies", not "Firmware")
    return f"{key}|{model.strip().lower()}" if model and model.strip() else key


def readable_version(item: FirmwareItem) -> bool:
    """False for an image the BMC could not read: UnavailableOffline, "undefined", all zeros."""
    version = item.version.strip()
    return (item.state not in NOT_MEASURING and version.lower() not in _PLACEHOLDER_VERSIONS
            and not _ZERO_VERSION_RE.match(version))


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
    unreadable: dict[str, list[FirmwareItem]] = defaultdict(list)
    for item in bmc.firmware:
        if item.installed:  # Dell also lists the previous and the staged image of a component
            (groups if readable_version(item) else unreadable)[component_model(item)].append(item)
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
        gaps = unreadable.get(key, [])
        note = (f" ({len(gaps)} more not readable: {', '.join(f'{i.name} {i.version!r}' for i in gaps[:3])})"
                if gaps else "")
        if len(versions) == 1:
            findings.append(with_source(CONSISTENCY.finding(key, Status.PASS, expectation.severity,
                                                            f"{len(items)} x {items[0].name}: all {versions[0]}{note}",
                                                            observed=versions, expected="one version"), facts))
            continue
        counts = {v: sum(1 for i in items if i.version == v) for v in versions}
        common = max(counts, key=lambda v: counts[v])
        odd = [f"{i.name} {i.version}" for i in items if i.version != common]
        findings.append(with_source(CONSISTENCY.finding(
            key, expectation.status_on_mismatch(), expectation.severity,
            f"{len(items)} x {key}: mixed firmware; {counts[common]} run {common}, odd ones: {', '.join(odd)}{note}",
            observed=counts, expected="one version", reason=expectation.reason), facts))
    return findings


__all__ = ["CONSISTENCY", "FIRMWARE", "Severity", "component_model"]
