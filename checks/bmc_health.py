"""BMC reachability, health rollup, power supplies, fans, temperatures and leak detectors."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from agent.core.facts import NodeFacts
from agent.core.model import Finding, Severity, Status
from agent.core.numbers import finite
from agent.policy.profiles import Profile
from agent.sources.ipmi_parse import NON_RECOVERABLE
from checks import Check
from checks._bmc import (
    NOT_MEASURING,
    bmc_facts,
    compare_health,
    event_window,
    judge_part,
    not_judged_summary,
    open_entries,
    part_not_judged,
    temperature_not_compared,
    unusable,
    usable_threshold,
    with_source,
)

REACHABLE = Check("bmc.reachable", "BMC reachable and authenticated", source="bmc", action="check_bmc",
                  evidence="a Redfish (or IPMI) session that logged in and answered within the deadline")
ROLLUP = Check("bmc.health_rollup", "BMC system health rollup", source="bmc", action="check_bmc_events",
               evidence=("Status.HealthRollup of the system and chassis, named by the unresolved entries and non-OK "
                         "members that explain it"))
PSU = Check("bmc.psu", "Power supplies and redundancy", source="bmc", action="replace_psu",
            evidence=("PSU Status.Health and redundancy sets; StandbyOffline/StandbySpare is standby, a PSU with no "
                      "Status and no readings is a placeholder"), parts=("redfish", "ipmi.sensors"))
FANS = Check("bmc.fans", "Fans", source="bmc", action="replace_fan",
             evidence=("fans the BMC reports Enabled with a reading or a Status; Absent/offline fans and entries with"
                       " neither are placeholders (skip)"), parts=("redfish", "ipmi.sensors"))
TEMPERATURES = Check("bmc.temperatures", "BMC temperature sensors", source="bmc", action="check_cooling",
                     evidence=("Enabled sensors with a reading against their own non-placeholder thresholds; "
                               "Absent/Disabled/offline, null readings and thresholds <= 0 C are not compared"),
                     parts=("redfish", "ipmi.sensors"))
LEAK = Check("bmc.leak", "Liquid leak detectors", source="bmc", action="drain",
             evidence="leak detectors the BMC reports present with a state; absent detectors are not evidence",
             parts=("redfish",))
SWITCHES = Check("bmc.switches", "Fabric switches (NVSwitch) health", source="bmc", action="reset_fabric",
                 evidence="NVSwitch/fabric switch Status.Health from the BMC; switches with no Status are placeholders",
                 parts=("redfish",))


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
    redfish = facts.sources.get("redfish")
    if redfish is not None and redfish.configured and redfish.detail.get("cleartext"):
        findings.append(with_source(REACHABLE.finding(
            "cleartext", Status.WARN, Severity.WARNING,
            "credentials sent in clear: the BMC URL is http://, so the password and session token cross "
            "the network unencrypted", observed="http", expected="https", action="use_https_bmc_url",
            reason="Anyone on the management network can take over the BMC"), facts))
    bmc = facts.bmc
    if getattr(bmc, "insecure", False):
        findings.append(with_source(REACHABLE.finding(
            "tls", Status.WARN, Severity.WARNING,
            "TLS certificate verification is switched off (--bmc-insecure): the BMC could be impersonated",
            observed="unverified", expected="verified", action="install_bmc_certificate",
            reason="BMC credentials travel to whoever answers"), facts))
    for problem in getattr(bmc, "problems", ())[:20]:
        path = problem.split(":", 1)[0]
        unusable = ": unusable field " in problem  # read, but a field has the wrong type: judged without it
        findings.append(with_source(REACHABLE.finding(
            path, Status.UNKNOWN, Severity.WARNING, f"resource {'not usable' if unusable else 'not read'}: {problem}",
            observed="unusable" if unusable else "failed", expected="read"), facts))
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
    if finding.status not in (Status.FAIL, Status.WARN):
        return [finding]
    causes = list(bmc.health_causes)
    if isinstance(bmc.events, tuple):  # what the event logs hold open explains a rollup too
        events = profile.expectation("bmc", "events")
        window = event_window(events)
        entries, _older, _undated = open_entries(bmc.events, facts.observed_at or dt.datetime.now(dt.timezone.utc),
                                                 window)
        counts = Counter((e.log, e.severity, e.message) for e in entries)
        for (log, severity, message), count in sorted(counts.items(), key=lambda kv: (kv[0][1] != "Critical",
                                                                                      -kv[1])):
            causes.append(f"open {log} entry ({severity}) {message!r}" + (f" x{count}" if count > 1 else ""))
    if causes:
        finding.message += "; causes: " + "; ".join(causes[:6]) + (f"; {len(causes) - 6} more" if len(causes) > 6
                                                                  else "")
        finding.observed = {"rollup": bmc.health_rollup, "causes": causes}
    else:
        finding.message += "; the BMC names no cause (no non-OK part or open log entry was read)"
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
        judged = judge_part(PSU, psu, health, f"{psu.name} health", bmc, facts) if health is not None else None
        why = part_not_judged(psu)
        if judged is not None:
            findings.append(judged)
        elif why is not None:
            findings.append(with_source(PSU.finding(psu.name, Status.SKIP, Severity.INFO, f"{psu.name}: {why}",
                                                    observed=psu.state), facts))
    if redundancy is not None and isinstance(bmc.redundancy, tuple):
        for group in bmc.redundancy:
            finding = compare_health(PSU, group.name, redundancy, group.health,
                                     f"power redundancy {group.name!r} ({group.mode or 'mode not reported'})", facts)
            if finding.status is Status.FAIL:
                finding.message += ": redundancy lost, one more PSU failure takes the node down"
            findings.append(finding)
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
    skipped: dict[str, list[str]] = {}
    for fan in bmc.fans:
        judged = judge_part(FANS, fan, expectation, f"{fan.name} health", bmc, facts)
        if judged is None:
            skipped.setdefault(part_not_judged(fan) or "not judged", []).append(fan.name)
            continue
        slow = (fan.reading is not None and fan.lower_critical is not None and fan.lower_critical > 0
                and fan.reading < fan.lower_critical)
        finding = judged
        if slow and finding.status in (Status.PASS, Status.UNKNOWN):
            finding.status = expectation.status_on_mismatch()
            finding.message = (f"{fan.name} turns at {fan.reading:g} {fan.units or ''} below its lower critical "
                               f"threshold {fan.lower_critical:g}")
        if fan.state == NON_RECOVERABLE and finding.status is not Status.PASS:
            # The BMC's own verdict that the fan is past recovery: positive evidence, so critical whatever the
            # profile rates a fan's health (an 8-GPU tray loses cooling).
            finding.status, finding.severity = Status.FAIL, Severity.CRITICAL
            reading = f" (reading {fan.reading:g} {fan.units or ''})".replace(" )", ")") \
                if fan.reading is not None else ""
            finding.message = f"{fan.name} is non-recoverable per the BMC (ipmitool `nr`){reading}: replace the fan"
        findings.append(finding)
    if skipped:
        findings.append(not_judged_summary(FANS, expectation, skipped, "fan(s)", facts))
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
    skipped: dict[str, list[str]] = {}
    for sensor in bmc.temperatures:
        why = temperature_not_compared(sensor)
        problem = unusable(bmc, sensor.where)
        # The parsers bound every number; facts built elsewhere may not: NaN is never judged (NaN >= x is False).
        not_finite = sensor.reading is not None and finite(sensor.reading) is None
        if not_finite:
            problem = problem or f"reading {sensor.reading!r} is not a finite number"
        unjudged = sensor.state not in NOT_MEASURING and (sensor.reading is None or why)
        if problem is not None and (not_finite or unjudged):
            findings.append(with_source(TEMPERATURES.unknown(
                sensor.name, expectation, f"{sensor.name} not compared: the BMC's answer is unusable ({problem})"),
                facts))
            continue
        if why is not None or sensor.reading is None:  # e.g. an empty DIMM bay, even when its Health says Critical
            skipped.setdefault(why or "no reading", []).append(sensor.name)
            continue
        level, limit = "normal", None
        fatal, critical = usable_threshold(sensor.upper_fatal), usable_threshold(sensor.upper_critical)
        caution = usable_threshold(sensor.upper_caution)
        if fatal is not None and sensor.reading >= fatal:
            level, limit = "fatal", fatal
        elif critical is not None and sensor.reading >= critical:
            level, limit = "critical", critical
        elif caution is not None and sensor.reading >= caution:
            level, limit = "caution", caution
        finding = TEMPERATURES.compare(sensor.name, expectation, level, f"{sensor.name} ({sensor.reading:g} C)")
        if limit is not None:
            finding.message = f"{sensor.name} reads {sensor.reading:g} C, at or above its {level} threshold {limit:g} C"
            finding.severity = Severity.CRITICAL if level in ("critical", "fatal") else Severity.WARNING
        finding.observed = {"reading": sensor.reading, "level": level}
        findings.append(with_source(finding, facts))
    if skipped:
        findings.append(not_judged_summary(TEMPERATURES, expectation, skipped, "sensor(s)", facts))
    if bmc.sensors_not_judged:  # readings nodewarden cannot place: said, so silence is never mistaken for health
        kinds = ", ".join(f"{count} {kind}" for kind, count in bmc.sensors_not_judged)
        total = sum(count for _, count in bmc.sensors_not_judged)
        findings.append(with_source(TEMPERATURES.finding(
            "other sensors", Status.SKIP, expectation.severity,
            f"{total} BMC sensor(s) of types no check judges: {kinds}",
            observed=dict(bmc.sensors_not_judged)), facts))
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
        state = detector.detector_state or detector.health  # not reported: unknown, never "dry"
        findings.append(compare_health(LEAK, detector.name, expectation, state, f"leak detector {detector.name}",
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
        kind = f"{switch.switch_type or 'fabric'} switch {switch.name}"
        judged = judge_part(SWITCHES, switch, expectation, f"{kind} health", bmc, facts)
        findings.append(judged or with_source(SWITCHES.finding(
            switch.name, Status.SKIP, Severity.INFO, f"{kind}: {part_not_judged(switch)}", observed=switch.state),
            facts))
    return findings
