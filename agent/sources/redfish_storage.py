"""Drives and volumes from a Redfish walk (issue 22 item 7): Systems/*/Storage/*, its Drives and
Volumes, and Chassis/*/Drives.

A drive is reported with its slot, the name a technician finds on the chassis: the
`PhysicalLocation.PartLocation.ServiceLabel` (Redfish 2018+; HPE: "Slot=18:Port=1:Box=1:Bay=6"),
else `PhysicalLocation.Info`, the older `Location[].Info` ("Slot 3"), `LocationOrdinalValue` as
"Bay N", and last the resource's Id (under a Chassis: "<chassis>/<Id>", Supermicro's NVMe backplane drives
carry no location). Each drive once: by resource path (HPE and Dell: a Storage
links the drive resource its Chassis lists), then by serial number (DMTF's public-localstorage mockup,
some iBMC/XCC trees: the same drive at `Systems/*/Storage/*/Drives/X` and `Chassis/*/Drives/X`); of two
copies the one in worse health is kept (positive evidence wins), else the one a Storage links. Drives
only a Chassis lists (NVMe backplanes) are judged like the rest. Bounded: at most MAX_DRIVES drives
and MAX_VOLUMES volumes are kept (the walk reads no more anyway), and every text field is cut to
TEXT_CHARS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.facts import BmcDrive, BmcVolume
from agent.sources.redfish_fields import PLACEHOLDER_TEXT, Problems, Res

MAX_DRIVES = 512
MAX_VOLUMES = 256
TEXT_CHARS = 80  # a slot or model name longer than this is cut: a BMC's answer is untrusted input
_WORSE = {"Critical": 3, "Warning": 2, "OK": 1}  # which copy of a drive listed twice is kept


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
    if label:
        return _cut(label) or "?"
    ident = drive.text("Id") or drive.path.rsplit("/", 1)[-1]
    parts = drive.path.split("/")  # /redfish/v1/Chassis/{backplane}/Drives/{id}: the backplane names the place
    chassis = parts[4] if len(parts) == 7 and parts[3] == "Chassis" and parts[5] == "Drives" else None
    return _cut(f"{chassis}/{ident}" if chassis else ident) or "?"


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


def _serial_key(drive: BmcDrive) -> str | None:
    """The serial number that identifies a drive across its copies; None for a placeholder ("N/A", "0000")."""
    serial = (drive.serial or "").strip().lower()
    if serial in PLACEHOLDER_TEXT or len(serial) < 4 or len(set(serial)) == 1:
        return None
    return serial


def _same_drive(a: BmcDrive, b: BmcDrive) -> bool:
    return a.model is None or b.model is None or a.model.strip().lower() == b.model.strip().lower()


def _once(drives: list[BmcDrive], linked: set[str]) -> tuple[BmcDrive, ...]:
    """Each physical drive once (`drives` are distinct resources): copies with one serial number merged."""
    groups: list[list[BmcDrive]] = []
    by_serial: dict[str, list[list[BmcDrive]]] = {}
    for drive in drives:
        key = _serial_key(drive)
        group = next((g for g in by_serial.get(key, []) if _same_drive(g[0], drive)), None) if key else None
        if group is None:
            group = []
            groups.append(group)
            if key:
                by_serial.setdefault(key, []).append(group)
        group.append(drive)
    out = []
    for group in groups:
        kept = max(group, key=lambda d: (_WORSE.get(d.health or "", 0), d.where.lower() in linked))
        out.append(kept._replace(aliases=tuple(d.where for d in group if d is not kept)))
    return tuple(out)


def parse_storage(resources: Mapping[str, dict[str, Any]], problems: Problems
                  ) -> tuple[tuple[BmcDrive, ...], tuple[BmcVolume, ...], bool]:
    """The drives and volumes the walk read, and whether the BMC exposes storage at all (a Storage
    resource or a drive was read)."""
    storages = _types(resources, "#Storage.", problems)
    linked = {d.lower() for s in storages for d in s.links("Drives")}
    drives = _once([_drive(r) for r in _types(resources, "#Drive.", problems)[:MAX_DRIVES]], linked)
    simple = _types(resources, "#SimpleStorage.", problems)
    if not drives:  # the older schema's devices, judged like drives (issue 31.6); never both: no serial to merge by
        drives = tuple(_drive(device) for s in simple for device in s.items("Devices"))[:MAX_DRIVES]
    volumes = tuple(_volume(r) for r in _types(resources, "#Volume.", problems)[:MAX_VOLUMES])
    return drives, volumes, bool(drives) or bool(storages) or bool(simple)
