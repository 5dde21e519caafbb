"""Firmware versions (per component, with per-vendor names) and consistency inside one node.

`firmware.consistency` leaves the GPUs' own firmware (VBIOS) to `gpu.firmware.vbios`, which judges
one VBIOS across the node's GPUs of a model from NVML or the BMC and names the odd GPU: the GPU
Processors' FirmwareVersion and the inventory's GPU images (`is_gpu_vbios_image`) are not grouped
here, so one mixed VBIOS is one fault and one set of findings. Other images on a GPU's board (its
ERoT, its InfoROM) and NVSwitch firmware stay here: nothing else compares them across the node.
"""

from __future__ import annotations

import re
from collections import defaultdict

from agent.core.facts import FirmwareItem, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import NOT_MEASURING, bmc_facts, with_source
from checks._gpu import gpu_vbios_image
from checks.bios import bios_vendor

FIRMWARE = Check("bmc.firmware", "Firmware versions", source="bmc", action="update_firmware",
                 evidence=("FirmwareInventory versions against the profile's `version_min`, vendor formats parsed; an"
                           " absent or 0 minimum means no minimum"), parts=("redfish", "ipmi.device_id"))
CONSISTENCY = Check("firmware.consistency", "One firmware version per component model", source="bmc",
                    action="update_firmware",
                    evidence=("FirmwareInventory items grouped by what they are (kind and model from Name, "
                              "Description, SoftwareId, RelatedItem), never by positional id; one version per group; "
                              "GPU VBIOS is gpu.firmware.vbios's"), parts=("redfish", "ipmi.device_id"))

def is_gpu_vbios_image(item: FirmwareItem) -> bool:
    """Whether an inventory entry is a GPU's VBIOS, which gpu.firmware.vbios judges (not this module)."""
    return gpu_vbios_image(item) is not None


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
        vendors = [str(v) for v in expectation.option("vendors", None) or ()]
        vendor = bios_vendor(bmc)
        for item in items:
            subject = component if len(items) == 1 else f"{component}:{item.stable_id}"
            if vendors and vendor not in vendors:
                # A minimum written for one vendor's numbering (iDRAC 7.x) says nothing about another's.
                findings.append(with_source(FIRMWARE.finding(
                    subject, Status.SKIP, expectation.severity,
                    f"{item.name} firmware is {item.version}; the profile's minimum is for {', '.join(vendors)} "
                    f"BMCs and this one is {vendor or 'of an unknown vendor'}", observed=item.version,
                    expected=expectation.expected, reason=expectation.reason), facts))
                continue
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


def _id_kind(item: FirmwareItem) -> str | None:
    """What the member id says the component is ("DPU_NIC", "HGX_FW_GPU_SXM_3" -> "hgx_fw_gpu_sxm_#"),
    or None when the id says nothing (HPE's "1", "2", ...; no id)."""
    kind = _without_instance(item.component_id or "")
    return kind if re.search(r"[a-z]", kind) else None


def component_models(items: list[FirmwareItem]) -> list[str]:
    """Each item's group key (`component_model`), except where one display name covers components the
    member ids tell apart (a BlueField BMC names all 11 members "Software Inventory": BMC, ATF, UEFI,
    NIC, OFED...): the name does not identify them, so the id does, with the model (SoftwareId, the
    RelatedItem's Model) as before. Display name last (issue 31.3)."""
    keys = [component_model(item) for item in items]
    kinds: dict[str, set[str | None]] = defaultdict(set)
    for key, item in zip(keys, items, strict=True):
        kinds[key].add(_id_kind(item))
    out = []
    for key, item in zip(keys, items, strict=True):
        told_apart = len(kinds[key]) > 1 and None not in kinds[key] and "__" not in (item.component_id or "")
        if not told_apart:
            out.append(key)
            continue
        model, kind = item.model or item.software_id, f"id:{_id_kind(item)}"
        out.append(f"{kind}|{model.strip().lower()}" if model and model.strip() else kind)
    return out


def readable_version(item: FirmwareItem) -> bool:
    """False for an image the BMC could not read: UnavailableOffline, "undefined", all zeros."""
    version = item.version.strip()
    return (item.state not in NOT_MEASURING and version.lower() not in _PLACEHOLDER_VERSIONS
            and not _ZERO_VERSION_RE.match(version))


def group_label(items: list[FirmwareItem], model: str | None = None) -> str:
    """What a group is, for people: `Power Supply.Slot.1-6`, `GPU 1-8 (NVIDIA H100 80GB HBM3)`.

    The group key (`psu.slot.#|power supply.slot.#`) stays the finding's subject: waivers and
    metrics name it; this is what the table and the message show.
    """
    from agent.core.names import compress, natural_key

    names = [_MAC_RE.sub("", i.name.strip()) or i.component_id for i in items]
    label = compress(names) or ", ".join(sorted(set(names), key=natural_key))
    models = {i.model.strip() for i in items if i.model and i.model.strip()}
    model = model or (models.pop() if len(models) == 1 else None)
    return f"{label} ({model})" if model and model.lower() not in label.lower() else label


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
    models: dict[str, str] = {}
    unreadable: dict[str, list[FirmwareItem]] = defaultdict(list)
    # Dell also lists the previous and the staged image of a component; GPU VBIOS (the inventory's
    # images and the GPU Processors' FirmwareVersion) is gpu.firmware.vbios's to judge.
    judged = [item for item in bmc.firmware if item.installed and not is_gpu_vbios_image(item)]
    for item, key in zip(judged, component_models(judged), strict=True):
        (groups if readable_version(item) else unreadable)[key].append(item)
    if isinstance(bmc.switches, tuple):
        for switch in bmc.switches:
            if switch.firmware:
                groups[f"switch:{switch.model or '?'}"].append(FirmwareItem(switch.name, switch.firmware,
                                                                            switch.name))
                models[f"switch:{switch.model or '?'}"] = switch.model or "switch"
    for key, grouped in sorted(groups.items()):
        if len(grouped) < 2:
            continue
        # told apart by id, not by the name they share: shown by id
        items = [i._replace(name=i.component_id) for i in grouped] if key.startswith("id:") else grouped
        versions = sorted({i.version for i in items})
        label = group_label(items, models.get(key))
        gaps = unreadable.get(key, [])
        note = (f" ({len(gaps)} more not readable: {', '.join(f'{i.name} {i.version!r}' for i in gaps[:3])})"
                if gaps else "")
        if len(versions) == 1:
            findings.append(with_source(CONSISTENCY.finding(key, Status.PASS, expectation.severity,
                                                            f"{len(items)} x {label}: all {versions[0]}{note}",
                                                            observed=versions, expected="one version",
                                                            label=label), facts))
            continue
        counts = {v: sum(1 for i in items if i.version == v) for v in versions}
        common = max(counts, key=lambda v: counts[v])
        odd = [f"{i.name} {i.version}" for i in items if i.version != common]
        findings.append(with_source(CONSISTENCY.finding(
            key, expectation.status_on_mismatch(), expectation.severity,
            f"{len(items)} x {label}: mixed firmware; {counts[common]} run {common}, odd ones: {', '.join(odd)}{note}",
            observed=counts, expected="one version", reason=expectation.reason, label=label), facts))
    return findings


__all__ = ["CONSISTENCY", "FIRMWARE", "Severity", "component_model", "component_models", "is_gpu_vbios_image"]
