"""source.available: every source that was asked for answered.

A source that is down is itself a finding, so `unknown` never hides: the
checks that depend on it say `unknown` and this one says why.
"""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check

SOURCE = Check("source.available", "Data sources", source="host",
               evidence=("each configured or implied source answered; one that did not is the reason its checks are "
                         "unknown"), parts=("subject",))

_DEFAULT_SEVERITY = {"host": Severity.CRITICAL, "nvml": Severity.CRITICAL, "kmsg": Severity.WARNING}


def _gpu_node(facts: NodeFacts) -> bool:
    match = facts.profile_match
    return match is None or match.how != "no_gpu"


@SOURCE.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings: list[Finding] = []
    gpus = facts.host.nvidia_gpus
    gpus_on_pci = None if isinstance(gpus, Unknown) else len(gpus)
    for name, status in sorted(facts.sources.items()):
        severity = _DEFAULT_SEVERITY.get(name, Severity.WARNING)
        if name in ("redfish", "ipmi") and status.configured:
            continue  # bmc.reachable reports it, with authentication and TLS detail
        if not status.configured:
            findings.append(SOURCE.finding(name, Status.SKIP, Severity.INFO,
                                           f"{name}: {status.error or 'not configured'}"))
        elif status.detail.get("pending"):  # the daemon's first read has not returned yet
            findings.append(SOURCE.finding(name, Status.UNKNOWN, Severity.INFO, f"{name}: {status.error}",
                                           observed="pending", expected="up"))
        elif status.ok:
            findings.append(SOURCE.finding(name, Status.PASS, severity, f"{name} answered in "
                                           f"{status.duration_s:.3f} s", observed="up", expected="up"))
        elif name == "nvml" and gpus_on_pci == 0 and not _gpu_node(facts):
            # Positively not a GPU node (no GPU on PCI, no driver): NVML has nothing to say.
            findings.append(SOURCE.finding(
                name, Status.SKIP, Severity.INFO,
                f"nvml: no NVIDIA GPU on PCI and no NVIDIA driver: not needed ({status.error})"))
        elif name == "nvml" and gpus_on_pci == 0:
            # A driver but no GPU on PCI: GPUs may have fallen off the bus, or a profile mismatch.
            findings.append(SOURCE.finding(name, Status.WARN, Severity.WARNING,
                                           f"nvml unavailable ({status.error}); no NVIDIA GPU on PCI either",
                                           observed="down", expected="up", action="check_driver"))
        elif name == "kmsg":
            # The kernel log is evidence for Xid checks; not being able to read it proves nothing
            # about the node, so it is unknown with the fix, never a failure.
            findings.append(SOURCE.finding(name, Status.UNKNOWN, Severity.WARNING,
                                           f"kernel log not read: {status.error}", observed="down",
                                           expected="up", action="check_source"))
        else:
            findings.append(SOURCE.finding(name, Status.FAIL, severity, f"{name} unavailable: {status.error}",
                                           observed="down", expected="up",
                                           action="check_driver" if name == "nvml" else "check_source"))
        findings[-1].source = name
    return findings
