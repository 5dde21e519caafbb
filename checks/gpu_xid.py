"""gpu.xid: Xid errors in the kernel log since boot, with what to do about them.

Every code of NVIDIA's Xid catalogue maps to an action and a severity
(agent/core/xid_catalog.py, which names the catalogue version it transcribes). Some
are decoded from the text: NVLink5 Xids 144-150 by sub-code and error status
(NVIDIA's non-fatal ones warn, the fatal ones are `reset_gpu`), Xid 154 by the
recovery action it names, and Xid 48 with 63/64 on the same GPU is
drain-and-reset. A code the table does not know warns with `contact_support`.

Evidence is this boot's kernel log only: a log that concatenates boots is cut
at its last restart of the since-boot clock (parse_xids), and records with a
wall-clock stamp older than the boot (observation time minus /proc/uptime) are
dropped and counted, as Fabric Manager's entries are for `fabric.sxid`. A log that carries no time at
all (`dmesg -t`, bare message text) is what dmesg holds: the current boot, from its last boot banner
on (`kmsg.boot_start`, issue 31.4); its Xids are judged as this boot's.

Application Xids (action `restart_app` or `ignore`: 13, 31, 43, 45, ...) are
faults in a program, not the GPU: they are reported (info for plain application
faults, warning where the catalogue suspects more) and never fail the audit.
Only a critical verdict with a hardware action fails. Repeats are de-duplicated
per GPU and Xid, with counts. Profiles can override any entry under `gpu.xid`
(e.g. to escalate Xid 94 on a fleet that sees it rarely).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent.core.facts import NodeFacts, XidEvent
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.core.xid_catalog import APPLICATION_ACTIONS, Verdict, classify, rank
from agent.policy.profiles import Profile
from agent.sources.kmsg import boot_time, predates_boot, timeless
from checks import Check

UNTIMED_NOTE = "the log carries no time stamps: what dmesg holds, the current boot from its last boot banner"

XID = Check("gpu.xid", "Xid errors since boot", source="kmsg",
            evidence=("Xid records of this boot's kernel log mapped through NVIDIA's catalogue; application Xids "
                      "never fail an audit"), parts=("kmsg",))
XidInfo = Verdict  # what one Xid asks of the operator (description, severity, action, bucket)


def lookup(code: int, overrides: Mapping[str, Any], message: str = "", companions: Collection[int] = ()) -> Verdict:
    """The catalogue's verdict for one Xid (decoded from `message` where needed), then the profile's override."""
    info = classify(code, message, companions)
    override = overrides.get(str(code))
    if isinstance(override, Mapping):
        info = Verdict(str(override.get("reason", info.description)),
                       Severity(override.get("severity", info.severity.value)),
                       str(override.get("action", info.action)), "profile")
    return info


def _since_boot(facts: NodeFacts, xids: tuple[XidEvent, ...]) -> tuple[list[XidEvent], int]:
    """The Xids not older than this boot, and how many were older (wall-clock stamped records only)."""
    uptime = facts.host.uptime_s
    boot = boot_time(facts.observed_at, uptime if isinstance(uptime, (int, float)) else None)
    kept: list[XidEvent] = []
    older = 0
    for event in xids:
        if predates_boot(event.wall, boot, facts.observed_at):
            older += 1
        else:
            kept.append(event)
    return kept, older


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
    events, older = _since_boot(facts, xids)
    note = f" ({older} Xid records in the log predate this boot)" if older else ""
    grouped: dict[str, dict[int, list[XidEvent]]] = {s: {} for s in subjects.values()}
    for event in events:
        # Lost GPUs may be unknown to NVML; fall back to the address itself.
        key = subjects.get(event.pci_bus_id, f"pci:{event.pci_bus_id}")
        grouped.setdefault(key, {}).setdefault(event.xid, []).append(event)
    findings = []
    span = _span(facts)
    for name in sorted(grouped, key=_natural):
        per_code = grouped[name]
        if not per_code:
            findings.append(XID.finding(name, Status.PASS, Severity.INFO, f"{name}: no Xid {span}{note}",
                                        observed={}, expected="no hardware Xid"))
            continue
        worst_of = {code: _worst(code, group, set(per_code) - {code}, overrides) for code, group in per_code.items()}
        worst_code = max(worst_of, key=lambda c: rank(worst_of[c][0], c))
        worst = worst_of[worst_code][0]
        parts = []
        for code in sorted(per_code):
            info, event = worst_of[code]
            times = f" x{len(per_code[code])}" if len(per_code[code]) > 1 else ""
            parts.append(f"Xid {code}{times} ({info.description}; {event.message[:80]!r})")
        failing = worst.severity is Severity.CRITICAL and worst.action not in APPLICATION_ACTIONS
        severity, text = worst.severity, f"{name}: " + "; ".join(parts) + note
        if span != "since boot":
            text = f"{text} ({UNTIMED_NOTE})"
        findings.append(XID.finding(
            name, Status.FAIL if failing else Status.WARN, severity, text,
            observed={str(code): len(group) for code, group in sorted(per_code.items())},
            expected="no hardware Xid", action=worst.action,
            reason=f"Xid {worst_code}: {worst.description}"))
    return findings


def _span(facts: NodeFacts) -> str:
    """"since boot", or what a log without any time can say instead."""
    kmsg = facts.kmsg
    if isinstance(kmsg, tuple) and kmsg and all(timeless(r) for r in kmsg):
        return f"in the log ({UNTIMED_NOTE})"
    return "since boot"


def _worst(code: int, events: list[XidEvent], companions: set[int],
           overrides: Mapping[str, Any]) -> tuple[Verdict, XidEvent]:
    """The most serious verdict among one GPU's events of one Xid (their texts may decode differently)."""
    verdicts: dict[str, Verdict] = {}
    best = (lookup(code, overrides, events[0].message, companions), events[0])
    for event in events:
        info = verdicts.get(event.message)
        if info is None:
            info = verdicts[event.message] = lookup(code, overrides, event.message, companions)
        if rank(info) > rank(best[0]):
            best = (info, event)
    return best


def _natural(subject: str) -> tuple[int, str]:
    digits = "".join(c for c in subject if c.isdigit())
    return (int(digits) if subject.startswith("gpu") and digits else 10**6, subject)
