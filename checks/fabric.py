"""NVSwitch fabric: Fabric Manager running, NVSwitches on PCI, NVSwitch errors (SXid).

* `fabric.manager`: where the profile requires Fabric Manager (`fabric.manager`),
  the nvidia-fabricmanager service must be active. Without it the NVSwitches
  are never programmed and CUDA peer-to-peer over NVLink is unavailable. On a
  partial view of the board (issue 13 rule 11, `checks._gpu.partial_view`: one
  SXM GPU in a VM) the hypervisor's Fabric Manager programs the switches, so a
  service that is not active there is `skip` with the reason.
* `fabric.nvswitch.count`: NVSwitch functions on PCI (NVIDIA, class 0x0680)
  against `fabric.nvswitch.count`, with each switch's PCIe link in the message.
* `fabric.sxid`: SXid errors since boot from the kernel log, plus those in Fabric
  Manager's log that the kernel log does not hold (it wrapped, or the driver
  logged them at another level) and that are not older than this boot. They are
  de-duplicated per switch, port and SXid, with a count. Fatal errors are critical
  (`reset_fabric`: reset the fabric, i.e. the GPUs and NVSwitches, or reboot);
  non-fatal ones warn. Profiles set severities and reasons under `fabric.sxid`.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from agent.core.expect import Expectation
from agent.core.facts import NOT_READ, NodeFacts, NvSwitchError, PciFunction
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.core.numbers import MAX_UPTIME_S, finite, sane_time
from agent.policy.matching import board_fit
from agent.policy.profiles import Profile
from agent.sources.fabric import FM_LOG, fm_log_time
from checks import Check
from checks._gpu import not_judged_on_partial_view, partial_view, pci_without_gpus

MANAGER = Check("fabric.manager", "Fabric Manager service", source="host", action="start_fabric_manager",
                evidence=("nvidia-fabricmanager's systemd cgroup (or a process) on NVSwitch systems; on a partial "
                          "view of the board a non-pass is skip"), parts=("fabric_manager",))
NVSWITCH_COUNT = Check("fabric.nvswitch.count", "NVSwitches on PCI", source="host", action="contact_support",
                       evidence="NVSwitch PCI functions against the board's count; a partial view is skip",
                       parts=("pci",))
SXID = Check("fabric.sxid", "NVSwitch errors (SXid)", source="kmsg",  # action per finding: fatal or not
             evidence=("SXid records of this boot's kernel log and the tail of Fabric Manager's log, decoded "
                       "fatal or non-fatal"), parts=("kmsg", "fabric_log"))

START_FM = "start nvidia-fabricmanager: without it NVLink P2P across the NVSwitch fabric is down"
TZ_SLACK = dt.timedelta(hours=14)  # Fabric Manager logs local time; no zone is more than 14 h from UTC

# Used when SXids appear on a node whose profile sets no `fabric.sxid` expectations.
DEFAULT_FATAL = Expectation((("max", 0),), Severity.CRITICAL,
                            "A fatal NVSwitch error stops NVLink traffic through the switch until the fabric is reset")
DEFAULT_NON_FATAL = Expectation((("max", 0),), Severity.WARNING,
                                "Repeated non-fatal NVSwitch errors on a port point at a degrading NVLink or switch")


@MANAGER.evaluator
def evaluate_manager(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("fabric", "manager")
    if expectation is None:
        return []
    fabric = facts.host.fabric
    subject = "nvidia-fabricmanager"
    if isinstance(fabric.manager, Unknown):
        finding = MANAGER.missing(subject, expectation, fabric.manager, "Fabric Manager service")
    else:
        finding = MANAGER.compare(subject, expectation, fabric.manager, "nvidia-fabricmanager service")
        if finding.status in (Status.FAIL, Status.WARN):
            finding.message = (f"nvidia-fabricmanager is {fabric.manager} ({fabric.manager_how}), expected "
                               f"{expectation.describe()}: {START_FM}")
        elif fabric.manager_how:
            finding.message += f" ({fabric.manager_how})"
    partial = partial_view(profile, facts)
    if partial is not None and finding.status is not Status.PASS:
        # A VM given one SXM GPU runs no Fabric Manager of its own: the hypervisor's programs the switches.
        state = fabric.manager.reason if isinstance(fabric.manager, Unknown) else fabric.manager
        return [not_judged_on_partial_view(MANAGER, finding, partial, f"nvidia-fabricmanager is {state}")]
    return [finding]


def nvswitches(facts: NodeFacts) -> tuple[PciFunction, ...] | Unknown:
    pci = facts.host.pci
    if isinstance(pci, Unknown):
        return pci
    return tuple(sorted((f for f in pci if f.is_nvswitch), key=lambda f: f.address))


def _link(fn: PciFunction) -> str:
    if fn.current_link_width is None or fn.current_link_speed is None:
        return f"{fn.address} (link not reported)"
    text = f"{fn.address} x{fn.current_link_width} {fn.current_link_speed.replace(' PCIe', '')}"
    if fn.max_link_width and fn.current_link_width < fn.max_link_width:
        text += f" (degraded from x{fn.max_link_width})"
    return text


@NVSWITCH_COUNT.evaluator
def evaluate_count(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("fabric", "nvswitch", "count")
    if expectation is None:
        return []
    switches = nvswitches(facts)
    if isinstance(switches, Unknown):
        return [NVSWITCH_COUNT.missing("node", expectation, switches, "NVSwitches on PCI")]
    blind = pci_without_gpus(facts)
    if blind is not None:
        return [NVSWITCH_COUNT.finding("node", Status.SKIP, Severity.INFO, f"NVSwitches on PCI not judged: {blind}",
                                       observed=0, expected=expectation.expected, reason=expectation.reason)]
    fit = board_fit(profile, facts)
    if not switches and not fit.full:  # a VM given one SXM GPU sees none of the board's switches
        return [NVSWITCH_COUNT.finding("node", Status.SKIP, Severity.INFO, f"no NVSwitch on PCI, not judged by "
                                       f"the board's count: {fit.why}", observed=0, expected=expectation.expected,
                                       reason=expectation.reason)]
    finding = NVSWITCH_COUNT.compare("node", expectation, len(switches), "NVSwitches on PCI")
    if switches:
        finding.message += " (" + ", ".join(_link(f) for f in switches) + ")"
    return [finding]


class _Group(NamedTuple):
    subject: str
    errors: list[NvSwitchError]


def _boot_time(facts: NodeFacts) -> dt.datetime | None:
    """When the node booted (naive UTC), from the observation time and /proc/uptime."""
    uptime = facts.host.uptime_s
    observed_at = sane_time(facts.observed_at)
    if observed_at is None or isinstance(uptime, Unknown) or finite(uptime, low=0, high=MAX_UPTIME_S) is None:
        return None  # year 1 minus an uptime, or an uptime of 1e308 s, overflows: no boot time
    observed = observed_at.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return observed - dt.timedelta(seconds=uptime)


def _switch_names(facts: NodeFacts, kernel: tuple[NvSwitchError, ...]) -> dict[str, str]:
    """PCI address -> nvswitchN: from SXid lines, else PCI order (the driver probes in that order)."""
    names: dict[str, str] = {}
    switches = nvswitches(facts)
    if not isinstance(switches, Unknown):
        names.update({f.address: f"nvswitch{i}" for i, f in enumerate(switches)})
    names.update({e.pci_address: e.switch for e in kernel if e.pci_address and e.switch})
    return names


def _fm_errors_since_boot(facts: NodeFacts, errors: tuple[NvSwitchError, ...],
                          kernel: tuple[NvSwitchError, ...]) -> tuple[list[NvSwitchError], int]:
    """Fabric Manager's errors the kernel log does not hold, not older than this boot; and how many were older."""
    boot = _boot_time(facts)
    seen = {(e.pci_address, e.link, e.sxid) for e in kernel}
    kept, older = [], 0
    for error in errors:
        if (error.pci_address, error.link, error.sxid) in seen:
            continue
        when = fm_log_time(error.when)
        if boot is not None and when is not None and when < boot - TZ_SLACK:
            older += 1
            continue
        kept.append(error)
    return kept, older


def _subject(error: NvSwitchError, names: dict[str, str]) -> str:
    switch = error.switch or names.get(error.pci_address or "") or f"nvswitch@{error.pci_address or '?'}"
    return f"{switch}:link{error.link}" if error.link is not None else switch


def _sort_key(subject: str) -> tuple[int, int, str]:
    switch, _, link = subject.partition(":link")
    digits = "".join(c for c in switch if c.isdigit())
    return (int(digits) if digits else 10**6, int(link) if link.isdigit() else -1, subject)


@SXID.evaluator
def evaluate_sxid(facts: NodeFacts, profile: Profile) -> list[Finding]:
    fatal_exp = profile.expectation("fabric", "sxid", "fatal")
    non_fatal_exp = profile.expectation("fabric", "sxid", "non_fatal")
    expected = fatal_exp is not None or non_fatal_exp is not None
    findings: list[Finding] = []
    kmsg = facts.kmsg
    kernel: tuple[NvSwitchError, ...] = ()
    if isinstance(kmsg, Unknown):
        if expected and not isinstance(kmsg, Unsupported):  # Unsupported: source.available says so
            findings.append(SXID.finding("node", Status.UNKNOWN, Severity.WARNING,
                                         f"NVSwitch errors in the kernel log: {kmsg.reason}"))
    elif not isinstance(facts.sxids, Unknown):
        kernel = facts.sxids  # parsed with the log (agent.sources.kernel_log), never here
    log = facts.host.fabric.log_errors
    from_log: list[NvSwitchError] = []
    older = 0
    if isinstance(log, Unknown):
        if expected and log is not NOT_READ and not isinstance(log, Unsupported):
            unread = SXID.finding(
                "fabricmanager.log", Status.UNKNOWN, Severity.INFO,
                f"NVSwitch errors Fabric Manager saw are not checked: {log.reason} (kernel SXids are)",
                expected="no SXid", reason=f"Fabric Manager logs NVSwitch errors to {FM_LOG}")
            partial = partial_view(profile, facts)
            # A VM's Fabric Manager is the hypervisor's: its log is not in this view to read.
            findings.append(unread if partial is None else not_judged_on_partial_view(
                SXID, unread, partial, f"Fabric Manager's log: {log.reason}"))
    else:
        from_log, older = _fm_errors_since_boot(facts, log, kernel)
    names = _switch_names(facts, kernel)
    groups: dict[str, _Group] = {}
    for error in (*kernel, *from_log):
        subject = _subject(error, names)
        groups.setdefault(subject, _Group(subject, [])).errors.append(error)
    for subject in sorted(groups, key=_sort_key):
        findings.extend(_judge(groups[subject], fatal_exp or DEFAULT_FATAL, non_fatal_exp or DEFAULT_NON_FATAL))
    if expected and not groups and not any(f.subject == "node" for f in findings):
        note = f"; {older} older entries in Fabric Manager's log predate this boot" if older else ""
        findings.append(SXID.finding(
            "node", Status.PASS, Severity.INFO,
            f"no NVSwitch error (SXid) in the kernel log since boot or in Fabric Manager's log{note}",
            observed={}, expected="no SXid", reason=(fatal_exp or DEFAULT_FATAL).reason))
    return findings


def _judge(group: _Group, fatal_exp: Expectation, non_fatal_exp: Expectation) -> list[Finding]:
    """One finding per switch port: its SXids de-duplicated, each with its count."""
    fatal = [e for e in group.errors if e.fatal]
    other = [e for e in group.errors if not e.fatal]
    expectation = fatal_exp if fatal else non_fatal_exp
    count = len(fatal) if fatal else len(other)
    verdict = expectation.evaluate(count)
    per_code: dict[tuple[int, bool | None], list[NvSwitchError]] = {}
    for error in group.errors:
        per_code.setdefault((error.sxid, error.fatal), []).append(error)
    parts = []
    for (code, is_fatal), errors in sorted(per_code.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
        kind = "fatal" if is_fatal else ("non-fatal" if is_fatal is False else "severity not stated")
        times = f" x{len(errors)}" if len(errors) > 1 else ""
        where = "Fabric Manager log" if all(e.source == "fmlog" for e in errors) else "kernel log"
        parts.append(f"SXid {code}{times} ({kind}, {where}; {errors[-1].message[:80]!r})")
    address = next((e.pci_address for e in group.errors if e.pci_address), None)
    at = f" (PCI {address})" if address else ""
    observed = {f"{code}{'' if is_fatal is not False else ' non-fatal'}": len(errors)
                for (code, is_fatal), errors in sorted(per_code.items())}
    if verdict.ok:
        return [SXID.finding(group.subject, Status.PASS, expectation.severity,
                             f"{group.subject}{at}: " + "; ".join(parts) + f" (within {expectation.describe()})",
                             observed=observed, expected=expectation.expected, reason=expectation.reason)]
    status = Status.FAIL if expectation.severity is Severity.CRITICAL else Status.WARN
    if fatal:
        action, advice = "reset_fabric", "reset the fabric (GPUs and NVSwitches) or reboot"
    else:
        action, advice = "monitor", "watch the port; reset the fabric at the next drain if the errors keep coming"
    return [SXID.finding(group.subject, status, expectation.severity,
                         f"{group.subject}{at}: " + "; ".join(parts) + f": {advice}",
                         observed=observed, expected=expectation.expected, reason=expectation.reason,
                         action=action)]
