"""BIOS attributes through the BMC's Redfish `@Redfish.Settings` object (`reboot` class).

One action per node covers every attribute that differs: BMCs queue one BIOS
configuration job per PATCH, and iDRAC refuses a second job while one is
pending. The change is staged; the BIOS applies it at the next boot, so the
finding stays until then and the plan reports `reboot_required`. Attributes
already staged with the right value are left alone (a second run changes
nothing); attributes the BIOS does not have are refused.
"""

from __future__ import annotations

from typing import Any

from agent.core.expect import Expectation
from agent.core.facts import BiosSettings, BmcFacts
from agent.core.model import Finding, Status
from checks.bios import BIOS, bios_vendor, meets
from remediations import (
    Action,
    ActionClass,
    PlanContext,
    RedfishPatch,
    actuator,
    refused,
    target_value,
    unsafe_for_config,
)

# Preferred when the BMC lists it: apply at the next host reset, not "Immediate" (which some BMCs
# take as "reboot the host now") and not a maintenance window we know nothing about.
APPLY_TIME = "OnReset"


def _bmc(ctx: PlanContext) -> BmcFacts | str:
    bmc = ctx.facts.bmc if ctx.facts is not None else None
    if not isinstance(bmc, BmcFacts):
        return f"the BMC was not read: {getattr(bmc, 'reason', 'no BMC configured')}"
    if bmc.protocol != "redfish":
        return "BIOS attributes are changed over Redfish; this BMC was read over IPMI"
    return bmc


@actuator("bios_attribute", writes=("redfish:/redfish/v1/**",))
def plan_bios(finding: Finding, ctx: PlanContext) -> list[Action]:
    if finding.status is Status.SKIP:  # the check says: the BIOS has no such attribute
        return [refused(f"bios_attribute:{finding.subject}", finding, ActionClass.REBOOT, None,
                        f"the BIOS has no attribute {finding.subject}: the profile names one this model lacks")]
    if "bios" in ctx.cache:
        return []  # the node's one BIOS action was planned with the first finding
    ctx.cache["bios"] = True
    action_id = "bios_attribute:bios"
    bmc = _bmc(ctx)
    if isinstance(bmc, str):
        return [refused(action_id, finding, ActionClass.REBOOT, finding.observed, bmc)]
    settings, current = bmc.bios_settings, bmc.bios_attributes
    if not isinstance(settings, BiosSettings) or not isinstance(current, dict):
        reason = str(getattr(settings, "reason", None) or getattr(current, "reason", "no BIOS resource"))
        return [refused(action_id, finding, ActionClass.REBOOT, finding.observed, reason)]
    if not isinstance(settings.pending, dict):
        return [refused(action_id, finding, ActionClass.REBOOT, finding.observed,
                        f"cannot read the pending settings: {settings.pending.reason}")]
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    problems: list[str] = []
    for name, expectation in sorted(_expectations(ctx, bmc).items()):
        if name not in current:
            continue  # refused through its own (skipped) finding
        effective = settings.pending.get(name, current[name])
        # Judged as the check judges it, however the BMC spells the value (checks.bios.meets).
        if meets(name, effective, expectation, bmc.bios_registry):
            continue  # right now, or already staged: the reboot applies it
        value = target_value(expectation)
        if value is None:
            problems.append(f"{name}: the profile allows {expectation.describe()} but names no single value")
            continue
        unsafe = unsafe_for_config(name, value)
        if unsafe is not None:
            problems.append(f"{name}: {unsafe}")
            continue
        before[name] = current[name]
        after[name] = _typed(value, current[name])
    if problems:
        # Refuse the whole action: the BIOS job must not go out half of what the profile wants.
        return [refused(action_id, finding, ActionClass.REBOOT, before or finding.observed, "; ".join(problems))]
    if not after:
        return []
    apply_time = APPLY_TIME if APPLY_TIME in settings.apply_times else None
    return [Action(action_id, "bios_attribute", ActionClass.REBOOT, "BIOS", BIOS.id, before, after,
                   notes=[f"staged in {settings.settings_path}; the BIOS applies it at the next boot"
                          + (f" (ApplyTime {apply_time})" if apply_time else "")],
                   changes=(RedfishPatch(settings.bios_path, settings.settings_path, tuple(after.items()),
                                         apply_time, settings.etag),))]


def _expectations(ctx: PlanContext, bmc: BmcFacts) -> dict[str, Expectation]:
    vendor = bios_vendor(bmc)
    return ctx.profile.expectations_under("bios", "attributes", vendor) if vendor else {}


def _typed(value: str, like: Any) -> Any:
    """The profile's value in the attribute's JSON type (integers stay integers)."""
    if isinstance(like, bool):
        return value.lower() in ("true", "1", "yes", "enabled")
    if isinstance(like, int):
        try:
            return int(value)
        except ValueError:
            return value
    return value
