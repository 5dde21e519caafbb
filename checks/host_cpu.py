"""host.cpu.*: frequency governor and idle (C-) states."""

from __future__ import annotations

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from checks import Check, expectation_schema

GOVERNOR = Check("host.cpu.governor", "CPU frequency governor", source="host", remediation="cpu_governor",
                 expect_path=("cpu", "governor"), schema=expectation_schema(),
                 evidence="every online CPU's cpufreq scaling_governor; a mix names the CPUs", parts=("cpu",))
OFFLINE = Check("host.cpu.offline", "CPUs offline", source="host",
                evidence="/sys/devices/system/cpu/offline, and smt/control where SMT was switched off")
SMT_OFF = ("off", "forceoff")
CSTATES = Check("host.cpu.cstates", "CPU idle states", source="host", expect_path=("cpu", "cstates"),
                schema=expectation_schema("Compared with the exit latency (us) of the deepest idle state "
                                          "enabled on any online CPU."),
                evidence="exit latency (us) of the deepest cpuidle state enabled on any online CPU", parts=("cpu",))


def cpu_ranges(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2,5' (the kernel's cpulist format)."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out) if ordered else ""


@GOVERNOR.evaluator
def evaluate_governor(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = GOVERNOR.expectation(profile)
    if expectation is None:
        return []
    governors = facts.host.cpu.governors
    if isinstance(governors, Unknown):
        return [GOVERNOR.missing("node", expectation, governors, "CPU governor")]
    if len(governors) == 1:
        (only,) = governors
        what = f"scaling_governor of all {len(governors[only])} CPUs"
        return [GOVERNOR.compare("node", expectation, only, what)]
    bad = {g: cpus for g, cpus in governors.items() if not expectation.evaluate(g).ok}
    observed = {g: cpu_ranges(c) for g, c in sorted(governors.items())}
    if not bad:
        return [GOVERNOR.finding("node", Status.PASS, expectation.severity,
                                 f"scaling_governor is {', '.join(governors)} (all allowed)",
                                 observed=observed, expected=expectation.expected, reason=expectation.reason)]
    detail = "; ".join(f"{g} on CPUs {cpu_ranges(c)}" for g, c in sorted(bad.items()))
    return [GOVERNOR.finding("node", expectation.status_on_mismatch(), expectation.severity,
                             f"scaling_governor is {detail}, expected {expectation.describe()}",
                             observed=observed, expected=expectation.expected, reason=expectation.reason)]


@CSTATES.evaluator
def evaluate_cstates(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = CSTATES.expectation(profile)
    if expectation is None:
        return []
    states = facts.host.cpu.idle_states
    if isinstance(states, Unknown):
        return [CSTATES.missing("node", expectation, states, "CPU idle states")]
    enabled = [s for s in states if s.enabled_anywhere]  # None (not counted) is shallower: skip
    if not enabled:
        return [CSTATES.finding("node", Status.PASS, expectation.severity, "no idle state is enabled",
                                observed=0, expected=expectation.expected, reason=expectation.reason)]
    deepest = max(enabled, key=lambda s: s.latency_us)
    finding = CSTATES.compare("node", expectation, deepest.latency_us,
                              f"exit latency (us) of the deepest enabled idle state {deepest.name}")
    on = deepest.total_cpus - (deepest.disabled_cpus or 0)
    finding.message += f" (enabled on {on} of {deepest.total_cpus} CPUs)"
    return [finding]


@OFFLINE.evaluator
def evaluate_offline(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """CPUs the kernel holds offline: capacity the scheduler believes the node has and it does not (a
    `maxcpus=`, a CPU taken down by hand or by a machine check). Not recorded: nothing to judge (older
    snapshots lack the file); SMT switched off (`nosmt`, smt/control off) explains up to half of them."""
    cpu = facts.host.cpu
    offline, online = cpu.offline, cpu.online
    if isinstance(offline, Unknown) or not isinstance(online, tuple):
        return []
    if not offline:
        return [OFFLINE.finding("node", Status.PASS, Severity.WARNING, f"all {len(online)} CPUs online",
                                observed={"offline": ""}, expected="no CPU offline")]
    smt = cpu.smt_control if isinstance(cpu.smt_control, str) else None
    observed = {"offline": cpu_ranges(offline), "online": len(online), **({"smt": smt} if smt else {})}
    if smt in SMT_OFF and len(offline) <= len(online):
        return [OFFLINE.finding("node", Status.PASS, Severity.WARNING,
                                f"{len(offline)} CPUs offline ({cpu_ranges(offline)}): the SMT siblings, SMT is {smt}",
                                observed=observed, expected="no CPU offline but SMT siblings")]
    return [OFFLINE.finding("node", Status.WARN, Severity.WARNING,
                            f"{len(offline)} of {len(offline) + len(online)} CPUs offline ({cpu_ranges(offline)}): "
                            "the node runs on fewer cores than it has (maxcpus=, a CPU taken offline by hand "
                            "or after a machine check)", observed=observed, expected="no CPU offline",
                            action="check_mechanicals")]
