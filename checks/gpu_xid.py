"""gpu.xid: Xid errors in the kernel log since boot, with what to do about them.

Each Xid maps to a severity and the operator action NVIDIA's Xid catalog
recommends. Application Xids (13, 31, 43, 45) are faults in a program, not
the GPU: they are reported as informational and never fail the audit.
Repeats are de-duplicated per GPU and Xid. Profiles can override any entry
under `gpu.xid` (e.g. to escalate Xid 94 on a fleet that sees it rarely).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from agent.facts import NodeFacts, XidEvent
from agent.model import Finding, Severity, Status, Unknown, Unsupported
from agent.profiles import Profile
from checks import Check

XID = Check("gpu.xid", "Xid errors since boot", source="kmsg")


class XidInfo(NamedTuple):
    description: str
    severity: Severity
    action: str  # restart_app | reset_gpu | reboot | drain | contact_support | ...
    hardware: bool = True


_I, _W, _C = Severity.INFO, Severity.WARNING, Severity.CRITICAL
XID_TABLE: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (timeout)", _W, "restart_app"),
    13: XidInfo("graphics engine exception (application fault)", _I, "restart_app", hardware=False),
    31: XidInfo("GPU memory page fault (application fault)", _I, "restart_app", hardware=False),
    32: XidInfo("invalid or corrupted push buffer stream", _W, "restart_app"),
    43: XidInfo("GPU stopped processing a channel (application fault)", _I, "restart_app", hardware=False),
    45: XidInfo("preemptive cleanup after earlier errors", _I, "restart_app", hardware=False),
    48: XidInfo("double-bit ECC error (DBE)", _C, "reset_gpu"),
    61: XidInfo("internal micro-controller breakpoint", _W, "reset_gpu"),
    62: XidInfo("internal micro-controller halt", _C, "reset_gpu"),
    63: XidInfo("row remapping / page retirement recorded: reset to apply", _W, "reset_gpu"),
    64: XidInfo("row remapping / page retirement FAILED to record", _C, "contact_support"),
    68: XidInfo("video decoder exception", _W, "restart_app"),
    69: XidInfo("graphics engine class error", _W, "restart_app"),
    74: XidInfo("NVLink error", _C, "reset_gpu"),
    79: XidInfo("GPU has fallen off the bus", _C, "drain"),
    92: XidInfo("high single-bit ECC error rate", _W, "contact_support"),
    94: XidInfo("contained ECC error (only the affected application stopped)", _W, "restart_app"),
    95: XidInfo("uncontained ECC error (all applications on the GPU affected)", _C, "reset_gpu"),
    109: XidInfo("context switch timeout", _W, "restart_app"),
    119: XidInfo("GSP RPC timeout", _C, "reset_gpu"),
    120: XidInfo("GSP error", _C, "reset_gpu"),
    121: XidInfo("C2C link error", _C, "reset_gpu"),
    140: XidInfo("unrecovered ECC error", _C, "reset_gpu"),
    154: XidInfo("GPU recovery action changed: see gpu.recovery_action", _W, "follow_recovery_action"),
}
# NVLink5 (Blackwell) link errors: reset the GPU; contact support if they repeat.
for _code in range(144, 151):
    XID_TABLE[_code] = XidInfo(f"NVLink5 error (Xid {_code})", _C, "reset_gpu")

_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def lookup(code: int, overrides: Mapping[str, Any]) -> XidInfo:
    info = XID_TABLE.get(code) or XidInfo(f"Xid {code} (not in nodewarden's table: see NVIDIA's Xid catalog)",
                                          _W, "contact_support")
    override = overrides.get(str(code))
    if isinstance(override, Mapping):
        info = XidInfo(str(override.get("reason", info.description)),
                       Severity(override.get("severity", info.severity.value)),
                       str(override.get("action", info.action)), info.hardware)
    return info


def _gpu_subjects(facts: NodeFacts) -> dict[str, str]:
    """PCI address -> subject, from NVML (incl. lost GPUs, by index) or PCI order."""
    nvml = facts.nvml
    if not isinstance(nvml, Unknown):
        subjects = {g.pci_bus_id: f"gpu{g.index}" for g in nvml.gpus if isinstance(g.pci_bus_id, str)}
        if len(subjects) == len(nvml.gpus):
            return subjects
    pci = facts.host.nvidia_gpus
    if isinstance(pci, Unknown):
        return {}
    return {g.address: f"gpu{i}" for i, g in enumerate(sorted(pci, key=lambda g: g.address))}


@XID.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    xids = facts.xids
    if isinstance(xids, Unsupported):
        return []  # no kernel log in this snapshot: source.available says so
    if isinstance(xids, Unknown):
        return [XID.finding("node", Status.UNKNOWN, Severity.WARNING, f"kernel log: {xids.reason}")]
    overrides = profile.section("gpu", "xid")
    subjects = _gpu_subjects(facts)
    grouped: dict[str, dict[int, list[XidEvent]]] = {s: {} for s in subjects.values()}
    for event in xids:
        # Lost GPUs may be unknown to NVML; fall back to the address itself.
        key = subjects.get(event.pci_bus_id, f"pci:{event.pci_bus_id}")
        grouped.setdefault(key, {}).setdefault(event.xid, []).append(event)
    findings = []
    for name in sorted(grouped, key=_natural):
        per_code = grouped[name]
        if not per_code:
            findings.append(XID.finding(name, Status.PASS, Severity.INFO, f"{name}: no Xid since boot",
                                        observed={}, expected="no hardware Xid"))
            continue
        infos = {code: lookup(code, overrides) for code in per_code}
        worst_code = max(infos, key=lambda c: (_RANK[infos[c].severity], infos[c].hardware, c))
        worst = infos[worst_code]
        parts = []
        for code in sorted(per_code):
            events = per_code[code]
            times = f" x{len(events)}" if len(events) > 1 else ""
            parts.append(f"Xid {code}{times} ({infos[code].description}; {events[-1].message[:80]!r})")
        status = Status.WARN if worst.severity is Severity.INFO or not worst.hardware else Status.FAIL
        findings.append(XID.finding(
            name, status, worst.severity, f"{name}: " + "; ".join(parts),
            observed={str(code): len(events) for code, events in sorted(per_code.items())},
            expected="no hardware Xid", action=worst.action,
            reason=f"Xid {worst_code}: {worst.description}"))
    return findings


def _natural(subject: str) -> tuple[int, str]:
    digits = "".join(c for c in subject if c.isdigit())
    return (int(digits) if subject.startswith("gpu") and digits else 10**6, subject)
