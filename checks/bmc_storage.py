"""bmc.storage.*: drives and volumes as the BMC reports them (issue 22 item 7).

A GPU node that loses its scratch RAID loses the job as surely as one that loses a GPU. From Redfish
Systems/*/Storage/*, its Drives and Volumes, and the drives a Chassis lists (`Chassis/*/Drives`,
`Links.Drives`: NVMe backplanes, often only there), each physical drive once
(agent/sources/redfish_storage.py):

* `bmc.storage.drives`: per present drive, its Status.Health (Critical fails, Warning warns) and the
  drive's own `FailurePredicted` (warns: replace it before it fails);
* `bmc.storage.media_life`: per drive that reports it, `PredictedMediaLifeLeftPercent` against the
  profile's floor (`expect.bmc.storage.media_life_left_pct`, `min`); below it warns (or fails when a
  profile makes it critical);
* `bmc.storage.volumes`: per volume, its Status.Health: Warning is a degraded set (still serving, no
  redundancy left) and warns, Critical is a failed set and fails.

Every finding names the slot (PhysicalLocation / Location / Id) so the technician pulls the right
drive. Positive evidence only: an Absent bay, and a drive entry with no Status and nothing else (a
placeholder), is never judged (one `skip` names them); a present drive whose health the BMC does
not report is `unknown`. A BMC that exposes no storage: one `skip` (bmc.storage.drives) for the family.
"""

from __future__ import annotations

from typing import NamedTuple

from agent.core.expect import Expectation
from agent.core.facts import NOT_READ, BmcDrive, BmcFacts, BmcVolume, NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile
from checks import Check
from checks._bmc import bmc_facts, not_judged_summary, unusable, with_source

_ITEM = {"$ref": "#/$defs/expectation_or_drop"}
SCHEMA = {
    "type": ["object", "null"], "additionalProperties": False,
    "description": "Storage as the BMC reports it (Redfish Storage, Drives, Volumes).",
    "properties": {
        "drives": {**_ITEM, "description": "Health of every present drive (equals OK); absent bays and "
                                          "placeholders are skipped; FailurePredicted true warns."},
        "media_life_left_pct": {**_ITEM, "description": "Floor (min) of each drive's PredictedMediaLifeLeftPercent."},
        "volumes": {**_ITEM, "description": "Health of every volume (equals OK): Warning is degraded, Critical "
                                           "is failed."},
    },
}

DRIVES = Check("bmc.storage.drives", "Drive health and predicted failures (BMC)", source="bmc",
               action="replace_drive", expect_path=("bmc", "storage"), schema=SCHEMA,
               evidence=("Redfish Drive Status.Health (Critical fails, Warning warns) and FailurePredicted (warns), "
                         "per slot; Absent bays and entries with no Status are placeholders (skip)"))
MEDIA_LIFE = Check("bmc.storage.media_life", "SSD media life left (BMC)", source="bmc", action="replace_drive",
                   evidence="Redfish Drive PredictedMediaLifeLeftPercent against the profile's floor, per slot")
VOLUMES = Check("bmc.storage.volumes", "Volume (RAID set) health (BMC)", source="bmc", action="replace_drive",
                evidence=("Redfish Volume Status.Health: Warning is degraded (warns), Critical is failed (fails); "
                          "the drives it is built on are named"))

NOT_PRESENT = ("Absent",)


def _placeholder(drive: BmcDrive) -> str | None:
    """Why a drive entry is not judged: an empty bay, or a listing with nothing in it."""
    if drive.state in NOT_PRESENT:
        return "empty bays (Absent)"
    if drive.state is None and drive.health is None and drive.failure_predicted is None and (
            drive.life_left_pct is None and drive.model is None and drive.serial is None
            and drive.capacity_bytes is None):
        return "listed with no Status and nothing else (placeholders)"
    return None


def _label(drive: BmcDrive) -> str:
    parts = [p for p in (drive.media, drive.model, drive.serial and f"serial {drive.serial}") if p]
    return f"drive in {drive.slot}" + (f" ({', '.join(parts)})" if parts else "")


class _Storage(NamedTuple):
    bmc: BmcFacts
    drives: tuple[BmcDrive, ...]
    expectation: Expectation


def _storage(check: Check, facts: NodeFacts, profile: Profile, key: str, *, announce: bool
             ) -> tuple[_Storage | None, list[Finding]]:
    """The BMC's storage when the profile judges `key` and the BMC exposes it; otherwise why not, said
    once for the family (`announce`).

    IPMI has no storage view (NOT_READ): nothing to say. A Redfish BMC without Storage: `skip`; one whose
    Storage could not be read: `unknown`.
    """
    expectation = profile.expectation("bmc", "storage", key)
    if expectation is None:
        return None, []
    bmc, findings = bmc_facts(check, facts, expectation)
    if bmc is None:
        return None, findings if announce else []
    if bmc.drives is NOT_READ:
        return None, []
    if not isinstance(bmc.drives, tuple):
        return None, [with_source(check.missing("bmc", expectation, bmc.drives, "storage"), facts)] if announce \
            else []
    return _Storage(bmc, bmc.drives, expectation), []


@DRIVES.evaluator
def evaluate_drives(facts: NodeFacts, profile: Profile) -> list[Finding]:
    storage, findings = _storage(DRIVES, facts, profile, "drives", announce=True)
    if storage is None:
        return findings
    bmc, drives, expectation = storage
    skipped: dict[str, list[str]] = {}
    for drive in drives:
        why = _placeholder(drive)
        if why is not None:
            skipped.setdefault(why, []).append(drive.slot)
            continue
        findings.append(with_source(_judge_drive(drive, expectation, bmc), facts))
    if skipped:
        findings.append(not_judged_summary(DRIVES, expectation, skipped, "drive bays", facts))
    return findings


def _judge_drive(drive: BmcDrive, expectation: Expectation, bmc: BmcFacts) -> Finding:
    subject, what = f"drive {drive.slot}", _label(drive)
    predicted = " and its own SMART data predicts a failure (FailurePredicted)" if drive.failure_predicted else ""
    if drive.health is None:
        problem = unusable(bmc, drive.where)
        if drive.failure_predicted:
            return DRIVES.finding(subject, Status.WARN, Severity.WARNING,
                                  f"{what}: failure predicted by the drive (FailurePredicted); health not reported",
                                  observed={"failure_predicted": True}, expected=expectation.expected,
                                  reason="A drive that predicts its own failure fails soon: replace it at the next "
                                         "window")
        return DRIVES.unknown(subject, expectation, f"{what}: health not reported by the BMC"
                              + (f" ({problem})" if problem else ""))
    verdict = DRIVES.compare(subject, expectation, drive.health, f"{what} health")
    observed = {"health": drive.health, "state": drive.state, "failure_predicted": drive.failure_predicted}
    verdict.observed = observed
    if verdict.status is Status.FAIL:
        if drive.health != "Critical":  # Warning: degraded, still serving
            verdict.status, verdict.severity = Status.WARN, Severity.WARNING
        verdict.message += f"{predicted}: replace the drive in {drive.slot}"
    elif drive.failure_predicted and verdict.status is Status.PASS:
        verdict.status, verdict.severity = Status.WARN, Severity.WARNING
        verdict.action = DRIVES.action
        verdict.message = f"{what}: health {drive.health}{predicted}: replace it at the next window"
        verdict.reason = "A drive that predicts its own failure fails soon: replace it at the next window"
    return verdict


@MEDIA_LIFE.evaluator
def evaluate_media_life(facts: NodeFacts, profile: Profile) -> list[Finding]:
    storage, findings = _storage(MEDIA_LIFE, facts, profile, "media_life_left_pct", announce=False)
    if storage is None:
        return findings
    _bmc, drives, expectation = storage
    for drive in drives:
        if drive.life_left_pct is None or _placeholder(drive) is not None:
            continue
        finding = MEDIA_LIFE.compare(f"drive {drive.slot}", expectation, drive.life_left_pct,
                                     f"{_label(drive)} media life left (%)")
        if finding.status is Status.FAIL and expectation.severity is not Severity.CRITICAL:
            finding.status = Status.WARN  # worn, still working: plan the replacement
        findings.append(with_source(finding, facts))
    return findings


@VOLUMES.evaluator
def evaluate_volumes(facts: NodeFacts, profile: Profile) -> list[Finding]:
    storage, findings = _storage(VOLUMES, facts, profile, "volumes", announce=False)
    if storage is None:
        return findings
    bmc, drives, expectation = storage
    slots = {where: d.slot for d in drives for where in (d.where, *d.aliases)}
    for volume in bmc.volumes if isinstance(bmc.volumes, tuple) else ():
        findings.append(with_source(_judge_volume(volume, expectation, slots), facts))
    return findings


def _judge_volume(volume: BmcVolume, expectation: Expectation, slots: dict[str, str]) -> Finding:
    members = ", ".join(slots.get(d, d.rsplit("/", 1)[-1]) for d in volume.drives[:8])
    what = f"volume {volume.name!r}" + (f" ({volume.raid})" if volume.raid else "") + (
        f" on {members}" if members else "")
    subject = f"volume {volume.name}"
    if volume.state in NOT_PRESENT:
        return VOLUMES.finding(subject, Status.SKIP, Severity.INFO, f"{what}: {volume.state}", observed=volume.state)
    if volume.health is None:
        return VOLUMES.unknown(subject, expectation, f"{what}: health not reported by the BMC")
    verdict = VOLUMES.compare(subject, expectation, volume.health, f"{what} health")
    if verdict.status is Status.FAIL:
        if volume.health == "Critical":
            verdict.message += ": the set has failed; its data is unavailable: drain the node and rebuild"
            verdict.action = "drain"
        else:
            verdict.status, verdict.severity = Status.WARN, Severity.WARNING
            verdict.message += ": degraded (no redundancy left): replace the failed member and let it rebuild"
    return verdict
