"""Drives and volumes from a Redfish walk (issue 22 item 7): Systems/*/Storage/*, its Drives and
Volumes, and Chassis/*/Drives.

A drive is reported with its slot, the name a technician finds on the chassis: the
`PhysicalLocation.PartLocation.ServiceLabel` (Redfish 2018+; HPE: "Slot=18:Port=1:Box=1:Bay=6"),
else `PhysicalLocation.Info`, the older `Location[].Info` ("Slot 3"), `LocationOrdinalValue` as
"Bay N", and last the resource's Id. Each drive once, by resource path: a Storage lists the same
Chassis drive its Chassis lists. Bounded: at most MAX_DRIVES drives and MAX_VOLUMES volumes are
kept (the walk reads no more anyway), and every text field is cut to TEXT_CHARS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.facts import BmcDrive, BmcVolume
from agent.sources.redfish_fields import Problems, Res

MAX_DRIVES = 512
MAX_VOLUMES = 256
TEXT_CHARS = 80  # a slot or model name longer than this is cut: a BMC's answer is untrusted input


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:TEXT_CHARS]


def _slot(drive: Res) -> str:
    physical = drive.obj("PhysicalLocation")
    part = physical.obj("PartLocation")
    label = part.text("ServiceLabel") or physical.text("Info")
    if not label:
        for location in drive.items("Location"):
            label = location.text("Info")
            if label:
                break
    if not label:
        ordinal = part.integer("LocationOrdinalValue")
        label = f"Bay {ordinal}" if ordinal is not None else None
    return _cut(label or drive.text("Id") or drive.path.rsplit("/", 1)[-1]) or "?"


def _types(resources: Mapping[str, dict[str, Any]], marker: str, problems: Problems) -> list[Res]:
    out = []
    for path, body in sorted(resources.items()):
        kind = body.get("@odata.type")
        if isinstance(kind, str) and marker in kind and "Collection" not in kind:
            out.append(Res(path, body, problems))
    return out


def _drive(res: Res) -> BmcDrive:
    state, health, _ = res.status()
    life = res.num("PredictedMediaLifeLeftPercent")
    return BmcDrive(
        name=_cut(res.name("Name", "Id")) or "?", slot=_slot(res), state=_cut(state), health=_cut(health),
        failure_predicted=res.boolean("FailurePredicted"),
        life_left_pct=life if life is not None and 0 <= life <= 100 else None,
        media=_cut(res.text("MediaType")), model=_cut(res.text("Model")), serial=_cut(res.text("SerialNumber")),
        capacity_bytes=res.num("CapacityBytes"), where=res.path)


def _volume(res: Res) -> BmcVolume:
    state, health, _ = res.status()
    drives = tuple(res.obj("Links").links("Drives")[:64])
    return BmcVolume(name=_cut(res.name("Name", "Id")) or "?", state=_cut(state), health=_cut(health),
                     raid=_cut(res.text("RAIDType") or res.text("VolumeType")), drives=drives, where=res.path)


def parse_storage(resources: Mapping[str, dict[str, Any]], problems: Problems
                  ) -> tuple[tuple[BmcDrive, ...], tuple[BmcVolume, ...], bool]:
    """The drives and volumes the walk read, and whether the BMC exposes storage at all (a Storage
    resource or a drive was read)."""
    drives = tuple(_drive(r) for r in _types(resources, "#Drive.", problems)[:MAX_DRIVES])
    volumes = tuple(_volume(r) for r in _types(resources, "#Volume.", problems)[:MAX_VOLUMES])
    storage = bool(drives) or bool(_types(resources, "#Storage.", problems))
    return drives, volumes, storage
