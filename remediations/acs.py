"""acs: clear ACS P2P request/completion redirect on a switch port between a GPU and its NIC.

What `setpci -s BRIDGE ECAP_ACS+6.w=VALUE` does: one 16-bit write of the ACS
Control register in the bridge's sysfs `config` file, at the offset found by
walking the extended capability list (the audit's own parser). Source
Validation and the other bits are kept; only redirect (bits 2 and 3) is
cleared. It needs root, takes effect at once and is `disruptive`: P2P traffic
in flight through that port changes path, so drain GPU jobs first. It lasts
until the next boot (the kernel or firmware sets ACS again while
enumerating); make it permanent in the BIOS (PCIe ACS setting) or by not
enabling the IOMMU in translated mode, which is what makes Linux turn ACS on.
"""

from __future__ import annotations

import struct

from agent.core.facts import PCI_ADDRESS_RE
from agent.core.model import Finding
from agent.sources.pcie import ACS_CTRL_OFFSET, ACS_REDIRECT_BITS, ConfigSpaceError, config_path, parse_acs
from remediations import Action, ActionClass, ByteWrite, PlanContext, actuator, refused


def acs_state(raw: bytes) -> str:
    """'enabled' | 'disabled' from config-space bytes (what pcie.acs compares); never raises."""
    try:
        acs = parse_acs(raw)
    except ConfigSpaceError as exc:
        return f"unknown ({exc})"
    return "enabled" if acs is not None and acs.redirects else "disabled"


@actuator("acs", writes=("/sys/bus/pci/devices/*/config",))
def plan_acs(finding: Finding, ctx: PlanContext) -> list[Action]:
    bridge = finding.subject
    action_id = f"acs:{bridge}"
    if not PCI_ADDRESS_RE.match(bridge):
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, finding.observed,
                        f"not a PCI address: {bridge!r}")]
    path = config_path(bridge)
    raw = ctx.target.read(path)
    if raw is None:
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, finding.observed, f"{path} does not exist")]
    try:
        acs = parse_acs(raw)
    except ConfigSpaceError as exc:
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, finding.observed, f"{path}: {exc}")]
    expectation = ctx.profile.expectation("pcie", "acs")
    if acs is None:
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, "disabled", f"{bridge} has no ACS capability")]
    if expectation is None or expectation.evaluate("disabled").ok is False:
        return [refused(action_id, finding, ActionClass.DISRUPTIVE, finding.observed,
                        "the profile does not ask for ACS redirect to be off")]
    if not acs.redirects:
        return []
    control = acs.control & ~ACS_REDIRECT_BITS & 0xFFFF
    offset = acs.offset + ACS_CTRL_OFFSET
    notes = [f"ACS Control 0x{acs.control:04x} -> 0x{control:04x} at config offset 0x{offset:03x} "
             f"(setpci -s {bridge} ECAP_ACS+6.w=0x{control:04x})",
             "runtime only: the kernel or firmware sets ACS again at the next boot; disable it in the BIOS "
             "(PCIe ACS) or keep the IOMMU off or in pass-through"]
    if ctx.target.live:
        notes.append("drain GPU jobs first: P2P traffic through this port changes path")
    return [Action(action_id, "acs", ActionClass.DISRUPTIVE, bridge, finding.check, "enabled", "disabled",
                   changes=(ByteWrite(path, offset, struct.pack("<H", control), acs_state),),
                   expectation=expectation, notes=notes)]
