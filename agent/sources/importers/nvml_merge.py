"""NVML facts from partial captures, merged into one nvml.json (`snapshot import`).

An `nvidia-smi -q` dump gives a whole recording; `nvidia-smi nvlink -s` and
`nvidia-smi --query-gpu=... --format=csv` give a few facts per GPU. Each partial
capture hands over `GpuPart`s (the GPU's index, UUID and PCI bus id as far as it
shows them, and the NVML answers it holds); they are merged GPU by GPU: matched
by UUID, then bus id, then index (only where neither side names another GPU).
The first input to give a fact keeps it; a later different value is named as
skipped with the input that gave the kept one. A full dump that arrives after
partial ones fixes the GPUs' order (NVML's index) and adds everything else.

Plain dictionaries only (no Builder): `agent.sources.importers.base` calls these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

RECORD_FORMAT = "nodewarden.nvml/v1"  # agent.sources.nvml.RECORD_FORMAT
FIELDS_KEY = "nvmlDeviceGetFieldValues"
PCI_KEY = "nvmlDeviceGetPciInfo"
MAX_GPUS = 64  # the most GPUs one recording may hold through partial captures (an NVL72 tray has 4)
_BUS_RE = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


@dataclass
class GpuPart:
    """One GPU as a partial capture shows it, and the NVML answers it holds."""

    label: str  # "GPU 3", for messages
    index: int | None = None
    uuid: str | None = None
    bus_id: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def bus_key(text: object) -> str | None:
    """"00000000:19:00.0" and "0000:19:00.0" -> "0000:19:00.0"; None if not a bus id."""
    if not isinstance(text, str):
        return None
    found = _BUS_RE.match(text.strip())
    if found is None:
        return None
    domain, bus, device, function = found.groups()
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def new_document() -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "system": {}, "devices": []}


def _identity(device: dict[str, Any]) -> tuple[str | None, str | None]:
    uuid = device.get("nvmlDeviceGetUUID")
    pci = device.get(PCI_KEY)
    return (uuid if isinstance(uuid, str) else None,
            bus_key(pci.get("busId")) if isinstance(pci, dict) else None)


def _conflicts(device: dict[str, Any], uuid: str | None, bus: str | None) -> bool:
    have_uuid, have_bus = _identity(device)
    return bool((uuid and have_uuid and uuid != have_uuid) or (bus and have_bus and bus != have_bus))


def _find(devices: list[dict[str, Any]], index: int | None, uuid: str | None, bus: str | None) -> int | None:
    for position, device in enumerate(devices):
        have_uuid, have_bus = _identity(device)
        if (uuid and have_uuid == uuid) or (bus and have_bus == bus):
            return position if not _conflicts(device, uuid, bus) else None
    if index is not None and 0 <= index < len(devices) and not _conflicts(devices[index], uuid, bus):
        return index
    return None


def _merge_device(device: dict[str, Any], facts: dict[str, Any], owner_of: Any, label: str,
                  skipped: list[str]) -> int:
    """Add `facts` to `device` where it has none; a different value already there is named. Returns #added."""
    added = 0
    for key, value in facts.items():
        if key in (FIELDS_KEY, PCI_KEY) and isinstance(value, dict):
            have = device.get(key)
            if have is None:
                have = device[key] = {}
            if not isinstance(have, dict) or ("error" in have and key == FIELDS_KEY):
                skipped.append(f"{label} {key}: already recorded as failed by {owner_of(key)}")
                continue
            for member, member_value in value.items():
                if member not in have:
                    have[member] = member_value
                    added += 1
                elif have[member] != member_value and not (
                        member == "busId" and bus_key(have[member]) == bus_key(member_value)):
                    skipped.append(f"{label} {member}: already given by {owner_of(f'{key}/{member}')}")
            continue
        if key not in device:
            device[key] = value
            added += 1
        elif device[key] != value:
            skipped.append(f"{label} {key}: already given by {owner_of(key)}")
    return added


def merge_parts(document: dict[str, Any], owners: dict[str, str], first: str, parts: list[GpuPart],
                system: dict[str, Any], source: str) -> tuple[int, list[str]]:
    """Merge a partial capture's GPUs and system answers into `document`; (facts added, skipped)."""
    skipped: list[str] = []
    devices: list[dict[str, Any]] = document["devices"]
    added = _merge_device(document["system"], system, lambda k: owners.get(f"system/{k}", first), "system",
                          skipped)
    for key in system:
        owners.setdefault(f"system/{key}", source)
    for part in parts:
        uuid, bus = part.uuid, bus_key(part.bus_id)
        position = _find(devices, part.index, uuid, bus)
        if position is None:
            wanted = part.index if part.index is not None and part.index >= len(devices) else len(devices)
            if wanted >= MAX_GPUS:
                skipped.append(f"{part.label}: past {MAX_GPUS} GPUs, not recorded")
                continue
            while len(devices) < wanted:  # GPUs this capture does not show: nothing recorded for them
                devices.append({})
            devices.append({})
            position = wanted
        device = devices[position]
        identity: dict[str, Any] = {}
        if uuid:
            identity["nvmlDeviceGetUUID"] = uuid
        if bus:
            identity[PCI_KEY] = {"busId": part.bus_id, **_bus_members(bus)}
        facts = {**identity, **part.facts}
        if PCI_KEY in part.facts and PCI_KEY in identity:
            facts[PCI_KEY] = {**identity[PCI_KEY], **part.facts[PCI_KEY]}
        added += _merge_device(device, facts, lambda k, p=position: owners.get(
            f"{p}/{k}", owners.get(f"{p}/{k.split('/')[0]}", first)), part.label, skipped)
        for key, value in facts.items():
            owners.setdefault(f"{position}/{key}", source)
            if key in (FIELDS_KEY, PCI_KEY) and isinstance(value, dict):
                for member in value:
                    owners.setdefault(f"{position}/{key}/{member}", source)
    document["system"]["nvmlDeviceGetCount"] = max(len(devices), _count(document))
    return added, skipped


def _count(document: dict[str, Any]) -> int:
    count = document["system"].get("nvmlDeviceGetCount")
    return count if isinstance(count, int) else 0


def _bus_members(bus: str) -> dict[str, int]:
    domain, rest = bus.split(":", 1)
    number, device = rest.split(":")
    return {"domain": int(domain, 16), "bus": int(number, 16), "device": int(device.split(".")[0], 16)}


def adopt_full(partial: dict[str, Any], owners: dict[str, str], first: str, full: dict[str, Any],
               source: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """A full recording arriving after partial ones: its GPU order wins; the earlier facts are kept."""
    skipped: list[str] = []
    document = {**full, "system": dict(full.get("system", {})),
                "devices": [dict(d) if isinstance(d, dict) else {} for d in full.get("devices", [])]}
    new_owners: dict[str, str] = {f"system/{k}": source for k in document["system"]}
    devices: list[dict[str, Any]] = document["devices"]
    for position, device in enumerate(devices):
        for key in device:
            new_owners[f"{position}/{key}"] = source
    # The earlier facts win: merge the full dump's answers into the partial ones, GPU by GPU.
    for key, value in partial["system"].items():
        if key == "nvmlDeviceGetCount":
            continue
        if key in document["system"] and document["system"][key] != value:
            skipped.append(f"system {key}: already given by {owners.get(f'system/{key}', first)}")
        document["system"][key] = value
        new_owners[f"system/{key}"] = owners.get(f"system/{key}", first)
    for old, device in enumerate(partial["devices"]):
        if not device:
            continue
        uuid, bus = _identity(device)
        found = _find(devices, old, uuid, bus)
        if found is None:
            skipped.append(f"GPU {old} from {owners.get(f'{old}/nvmlDeviceGetUUID', first)}: not among the "
                           f"{len(devices)} GPU(s) of this dump; its facts are dropped")
            continue
        position = found
        target = devices[position]
        for key, value in device.items():
            earlier = owners.get(f"{old}/{key}", first)
            if isinstance(value, dict) and key in (FIELDS_KEY, PCI_KEY) and isinstance(target.get(key), dict):
                merged = dict(target[key])
                for member, member_value in value.items():
                    if member in merged and merged[member] != member_value and not (
                            member == "busId" and bus_key(merged[member]) == bus_key(member_value)):
                        skipped.append(f"GPU {position} {member}: already given by "
                                       f"{owners.get(f'{old}/{key}/{member}', earlier)}")
                    if member != "busId" or member not in merged:
                        merged[member] = member_value
                target[key] = merged
                continue
            if key in target and target[key] != value:
                skipped.append(f"GPU {position} {key}: already given by {earlier}")
            target[key] = value
            new_owners[f"{position}/{key}"] = earlier
    return document, new_owners, skipped
