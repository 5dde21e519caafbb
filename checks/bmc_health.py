"""BMC reachability, health rollup, power supplies, fans, temperatures and leak detectors."""

from __future__ import annotations

from agent.facts import NodeFacts
from agent.model import Finding, Severity, Status
from agent.profiles import Profile
from checks import Check
from checks._bmc import PRESENT_STATES_SKIPPED, bmc_facts, with_source

REACHABLE = Check("bmc.reachable", "BMC reachable and authenticated", source="bmc", action="check_bmc")
ROLLUP = Check("bmc.health_rollup", "BMC system health rollup", source="bmc", action="check_bmc_events")
PSU = Check("bmc.psu", "Power supplies and redundancy", source="bmc", action="replace_psu")
FANS = Check("bmc.fans", "Fans", source="bmc", action="replace_fan")
TEMPERATURES = Check("bmc.temperatures", "BMC temperature sensors", source="bmc", action="check_cooling")
LEAK = Check("bmc.leak", "Liquid leak detectors", source="bmc", action="drain")
SWITCHES = Check("bmc.switches", "Fabric switches (NVSwitch) health", source="bmc", action="reset_fabric")


@REACHABLE.evaluator
def evaluate_reachable(facts: NodeFacts, profile: Profile) -> list[Finding]:
    findings = []
    for name in ("redfish", "ipmi"):
        status = facts.sources.get(name)
        if status is None or not status.configured:
            continue
        if status.detail.get("auth_failed"):
            finding = REACHABLE.finding(name, Status.FAIL, Severity.CRITICAL,
                                        f"{name}: {status.error} (not retried, to avoid locking the account)",
                                        observed="auth failed", expected="authenticated", action="check_credentials",
                                        reason="Without BMC access, PSU, fan, firmware and BIOS drift go unseen")
        elif status.detail.get("pending"):  # the daemon's first read of it has not returned yet
            finding = REACHABLE.finding(name, Status.UNKNOWN, Severity.WARNING, f"{name}: {status.error}",
                                        observed="pending", expected="up")
        elif not status.ok and status.error and not status.detail.get("resources"):
            finding = REACHABLE.finding(name, Status.FAIL, Severity.WARNING, f"{name}: {status.error}",
                                        observed="down", expected="up",
                                        reason="Without BMC access, PSU, fan, firmware and BIOS drift go unseen")
        elif status.error:
            finding = REACHABLE.finding(name, Status.WARN, Severity.WARNING, f"{name}: {status.error}",
                                        observed="partial", expected="up")
        else:
            finding = REACHABLE.finding(name, Status.PASS, Severity.WARNING,
                                        f"{name} answered {status.detail.get('requests', '?')} request(s) in "
                                        f"{status.duration_s:.2f} s", observed="up", expected="up")
        finding.source = name
        findings.append(finding)
    bmc = facts.bmc
    if getattr(bmc, "insecure", False):
        findings.append(with_source(REACHABLE.finding(
            "tls", Status.WARN, Severity.WARNING,
            "TLS certificate verification is switched off (--bmc-insecure): the BMC could be impersonated",
            observed="unverified", expected="verified", action="install_bmc_certificate",
            reason="BMC credentials travel to whoever answers"), facts))
    for problem in getattr(bmc, "problems", ())[:20]:
        path = problem.split(":", 1)[0]
        findings.append(with_source(REACHABLE.finding(
            path, Status.UNKNOWN, Severity.WARNING, f"resource not read: {problem}",
            observed="failed", expected="read"), facts))
    return findings


@ROLLUP.evaluator
def evaluate_rollup(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "health_rollup")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(ROLLUP, facts, expectation)
    if bmc is None:
        return findings
    finding = with_source(ROLLUP.compare("system", expectation, bmc.health_rollup, "system health rollup"), facts)
    if finding.status is not Status.PASS and bmc.health_causes:
        finding.message += "; reported causes: " + "; ".join(bmc.health_causes[:5])
    return [finding]


@PSU.evaluator
def evaluate_psu(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """Present PSUs healthy; absent bays and standby units are not failures; redundancy kept."""
    health = profile.expectation("bmc", "psu", "health")
    redundancy = profile.expectation("bmc", "psu", "redundancy")
    if health is None and redundancy is None:
        return []
    bmc, findings = bmc_facts(PSU, facts, health or redundancy, "psus")
    if bmc is None:
        return findings
    assert isinstance(bmc.psus, tuple)
    for psu in bmc.psus:
        if psu.state in PRESENT_STATES_SKIPPED:
            findings.append(with_source(PSU.finding(psu.name, Status.SKIP, Severity.INFO,
                                                    f"{psu.name} is {psu.state} (empty bay or standby, not a fault)",
                                                    observed=psu.state), facts))
        elif health is not None:
            findings.append(with_source(PSU.compare(psu.name, health, psu.health or "not reported",
                                                    f"{psu.name} health"), facts))
    if redundancy is not None and isinstance(bmc.redundancy, tuple):
        for group in bmc.redundancy:
            finding = PSU.compare(group.name, redundancy, group.health or "not reported",
                                  f"power redundancy {group.name!r} ({group.mode or 'mode not reported'})")
            if finding.status is Status.FAIL:
                finding.message += ": redundancy lost, one more PSU failure takes the node down"
            findings.append(with_source(finding, facts))
    return findings


@FANS.evaluator
def evaluate_fans(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "fans")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(FANS, facts, expectation, "fans")
    if bmc is None:
        return findings
    assert isinstance(bmc.fans, tuple)
    for fan in bmc.fans:
        if fan.state in PRESENT_STATES_SKIPPED:
            continue
        finding = FANS.compare(fan.name, expectation, fan.health or "not reported", f"{fan.name} health")
        if (fan.reading is not None and fan.lower_critical is not None and fan.reading < fan.lower_critical
                and finding.status is Status.PASS):
            finding.status = expectation.status_on_mismatch()
            finding.message = (f"{fan.name} turns at {fan.reading:g} {fan.units or ''} below its lower critical "
                               f"threshold {fan.lower_critical:g}")
        findings.append(with_source(finding, facts))
    return findings


@TEMPERATURES.evaluator
def evaluate_temperatures(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """Each present sensor against its own thresholds; an Absent sensor is an empty bay."""
    expectation = profile.expectation("bmc", "temperatures")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(TEMPERATURES, facts, expectation, "temperatures")
    if bmc is None:
        return findings
    assert isinstance(bmc.temperatures, tuple)
    for sensor in bmc.temperatures:
        if sensor.state == "Absent" or sensor.reading is None:
            continue  # e.g. an empty DIMM or PSU bay, even when its Health says Critical
        level, limit = "normal", None
        if sensor.upper_fatal is not None and sensor.reading >= sensor.upper_fatal:
            level, limit = "fatal", sensor.upper_fatal
        elif sensor.upper_critical is not None and sensor.reading >= sensor.upper_critical:
            level, limit = "critical", sensor.upper_critical
        elif sensor.upper_caution is not None and sensor.reading >= sensor.upper_caution:
            level, limit = "caution", sensor.upper_caution
        finding = TEMPERATURES.compare(sensor.name, expectation, level, f"{sensor.name} ({sensor.reading:g} C)")
        if limit is not None:
            finding.message = f"{sensor.name} reads {sensor.reading:g} C, at or above its {level} threshold {limit:g} C"
            finding.severity = Severity.CRITICAL if level in ("critical", "fatal") else Severity.WARNING
        finding.observed = {"reading": sensor.reading, "level": level}
        findings.append(with_source(finding, facts))
    return findings


@LEAK.evaluator
def evaluate_leak(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("bmc", "leak")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(LEAK, facts, expectation, "leak_detectors")
    if bmc is None:
        return findings
    assert isinstance(bmc.leak_detectors, tuple)
    for detector in bmc.leak_detectors:
        state = detector.detector_state or detector.health or "not reported"
        findings.append(with_source(LEAK.compare(detector.name, expectation, state, f"leak detector {detector.name}"),
                                    facts))
    return findings


@SWITCHES.evaluator
def evaluate_switches(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """NVSwitches (and other fabric switches) the BMC reports: a failed one degrades every GPU."""
    expectation = profile.expectation("bmc", "switches")
    if expectation is None:
        return []
    bmc, findings = bmc_facts(SWITCHES, facts, expectation, "switches")
    if bmc is None:
        return findings
    assert isinstance(bmc.switches, tuple)
    for switch in bmc.switches:
        if switch.state in PRESENT_STATES_SKIPPED:
            continue
        kind = f"{switch.switch_type or 'fabric'} switch {switch.name}"
        findings.append(with_source(SWITCHES.compare(switch.name, expectation, switch.health or "not reported",
                                                     f"{kind} health"), facts))
    return findings
