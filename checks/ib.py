"""ib.*: RDMA HCAs and ports (InfiniBand or RoCE) from /sys/class/infiniband.

The profile's `rdma.hca_types` names the compute rails by family (ConnectX-7: its physical
function and its virtual functions, see checks/_rails.py) or exact hca_type (MT4129); count,
port state, rate and the firmware minimum are judged on them, so frontend or storage NICs of
another type do not fail a rail expectation. A cloud VM's rails are SR-IOV virtual functions and
are judged the same way. Error counters are judged on every port, and one firmware version per
HCA type on every HCA. The rail count is the board's: on a partial view of it (issue 13 rule 11,
`checks._gpu.partial_view`: a VM given one GPU and its rail) a count short of it is `skip`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from agent.core.expect import AtLeast, Expectation, saturated
from agent.core.facts import NodeFacts, RdmaDevice, RdmaPort
from agent.core.model import Finding, Severity, Status, Unknown
from agent.policy.profiles import Profile
from agent.sources.rdma import rate_gbps
from checks import Check
from checks._gpu import not_judged_on_partial_view, partial_view
from checks._rails import FIRMWARE_MAJOR, hca_kind, kind_label, matches_types

HCA_COUNT = Check("ib.hca.count", "RDMA rail HCAs present", source="host", action="contact_support",
                  evidence=("rail HCAs (the profile's hca_types families) in /sys/class/infiniband; a partial view is"
                            " skip"), parts=("rdma",))
PORT_STATE = Check("ib.port.state", "RDMA port state", source="host", action="check_link",
                   evidence=("each rail port's state/phys_state; without a profile rule, a port down beside two or "
                             "more active ports of its HCA type"), parts=("rdma",))
PORT_RATE = Check("ib.port.rate", "RDMA port rate", source="host", action="check_link",
                  evidence="each rail port's rate in Gb/s against the profile", parts=("rdma",))
PORT_ERRORS = Check("ib.port.errors", "RDMA port error counters", source="host", action="check_link",
                    evidence=("IB PortCounters error fields per port; a counter at its width's maximum counts as at "
                              "least that"), parts=("rdma",))
FIRMWARE = Check("ib.firmware", "HCA firmware", source="host", action="update_firmware",
                 evidence="each HCA's fw_ver against the profile's minimum per family, and one version per HCA type",
                 parts=("rdma",))

# Widths of the IB PortCounters error fields (IBA 1.4, 16.1.3.5): a field stops at its
# maximum ("saturates") instead of wrapping, so a counter at its maximum is a lower bound: it fails
# a limit below the maximum and is unknown against a limit at or above it (agent.core.expect.AtLeast).
COUNTER_BITS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}
_SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


class Rails(NamedTuple):
    """Which RDMA devices are the compute rails: by hca_type and, optionally, link layer."""

    types: tuple[str, ...] = ()
    link_layer: str | None = None

    def describe(self) -> str:
        parts = [*self.types, *([self.link_layer] if self.link_layer else [])]
        return ", ".join(parts)


def rail_types(profile: Profile) -> Rails:
    section = profile.section("rdma")
    layer = section.get("link_layer")
    return Rails(tuple(str(t) for t in section.get("hca_types") or ()), str(layer) if layer else None)


def is_rail(device: RdmaDevice, rails: Rails) -> bool:
    if rails.types and not matches_types(device, rails.types):
        return False
    if rails.link_layer and not isinstance(device.ports, Unknown):
        return any(p.link_layer == rails.link_layer for p in device.ports)
    return True


def port_subject(device: RdmaDevice, port: RdmaPort) -> str:
    return f"{device.name}/{port.port}"


def port_label(device: RdmaDevice, port: RdmaPort) -> str:
    kind = kind_label(device)
    netdev = f", {port.netdev}" if port.netdev else ""
    return f"{device.name} port {port.port} ({kind}{netdev})"


def _devices(facts: NodeFacts, check: Check, expectation: Expectation | None,
             what: str) -> tuple[RdmaDevice, ...] | list[Finding]:
    rdma = facts.host.rdma
    if isinstance(rdma, Unknown):
        return [check.missing("node", expectation, rdma, what)]
    return rdma


def _ports(devices: Iterable[RdmaDevice], check: Check, expectation: Expectation | None,
           findings: list[Finding]) -> list[tuple[RdmaDevice, RdmaPort]]:
    out: list[tuple[RdmaDevice, RdmaPort]] = []
    for device in devices:
        if isinstance(device.ports, Unknown):
            findings.append(check.missing(device.name, expectation, device.ports, f"ports of {device.name}"))
            continue
        out.extend((device, port) for port in device.ports)
    return out


def _rail_ports(check: Check, facts: NodeFacts, profile: Profile, key: str
                ) -> tuple[Expectation | None, list[tuple[RdmaDevice, RdmaPort]], list[Finding]]:
    """The profile's `rdma.KEY` and the rail ports to judge it on; (None, [], findings) when there is nothing
    to judge (no expectation, or no RDMA devices, said in the findings)."""
    expectation = profile.expectation("rdma", key)
    if expectation is None:
        return None, [], []
    devices = _devices(facts, check, expectation, "RDMA ports")
    if isinstance(devices, list):
        return None, [], devices
    findings: list[Finding] = []
    rails = rail_types(profile)
    return expectation, _ports((d for d in devices if is_rail(d, rails)), check, expectation, findings), findings


@HCA_COUNT.evaluator
def evaluate_count(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("rdma", "count")
    if expectation is None:
        return []
    devices = _devices(facts, HCA_COUNT, expectation, "RDMA devices")
    if isinstance(devices, list):
        return devices
    types = rail_types(profile)
    rails = sorted(d.name for d in devices if is_rail(d, types))
    what = f"RDMA rail HCAs ({types.describe()})" if types.describe() else "RDMA HCAs"
    finding = HCA_COUNT.compare("node", expectation, len(rails), what)
    if not devices:
        finding.message += " (no /sys/class/infiniband: the RDMA stack, ib_core and mlx5_ib, is not loaded)"
    elif rails:
        finding.message += f" ({', '.join(rails)})"
    vfs = [d.name for d in devices if is_rail(d, types) and hca_kind(d).virtual_function]
    if vfs:
        finding.message += f"; {len(vfs)} of them SR-IOV virtual functions (a virtual machine's rails)"
    partial = partial_view(profile, facts)
    if partial is not None and finding.status is not Status.PASS:
        # A VM given one GPU of the board gets the rails that go with it, if any: not the board's count.
        listed = f" ({', '.join(rails)})" if rails else ""
        return [not_judged_on_partial_view(HCA_COUNT, finding, partial, f"{len(rails)} {what}{listed}")]
    return [finding]


_ACTIVE = ("ACTIVE", "LinkUp")
SIBLINGS_ACTIVE = 2  # ports of one HCA type that must be Active for a Down one beside them to count


def _down_among_active_siblings(facts: NodeFacts, profile: Profile) -> list[Finding]:
    """Without a profile's port_state (the generic profile cannot tell rails from frontend NICs):
    a port that is not Active while at least two ports of its own HCA type are is a warning. On a
    GPU node ports of one type are one job (the rails); one down beside its running siblings is a
    cable, transceiver or switch port, and nothing else in a generic audit would show it."""
    rdma = facts.host.rdma
    if isinstance(rdma, Unknown):
        return []
    by_type: dict[str, list[tuple[RdmaDevice, RdmaPort]]] = {}
    for device in rdma:
        if isinstance(device.hca_type, Unknown) or isinstance(device.ports, Unknown) or device.physfn:
            continue  # a container's SR-IOV VF is not a rail
        by_type.setdefault(device.hca_type, []).extend((device, port) for port in device.ports)
    findings: list[Finding] = []
    for hca_type, ports in sorted(by_type.items()):
        known = [(d, p) for d, p in ports if not isinstance(p.state, Unknown) and not isinstance(p.phys_state, Unknown)]
        active = [(d, p) for d, p in known if p.state == _ACTIVE[0] and p.phys_state == _ACTIVE[1]]
        if len(active) < SIBLINGS_ACTIVE or len(active) == len(known):
            continue
        for device, port in known:
            if (device, port) in active:
                continue
            label = port_label(device, port)
            findings.append(PORT_STATE.finding(
                port_subject(device, port), Status.WARN, Severity.WARNING,
                f"state of {label} is {port.state}/{port.phys_state} while {len(active)} of its {len(known)} "
                f"{hca_type} ports are ACTIVE/LinkUp (no rail expectation in profile {profile.name}: "
                "judged against its siblings)", observed=f"{port.state}/{port.phys_state}",
                expected="ACTIVE/LinkUp, as its siblings"))
    return findings


@PORT_STATE.evaluator
def evaluate_state(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation, ports, findings = _rail_ports(PORT_STATE, facts, profile, "port_state")
    if expectation is None:
        return findings or _down_among_active_siblings(facts, profile)
    for device, port in ports:
        subject, label = port_subject(device, port), port_label(device, port)
        for value in (port.state, port.phys_state):
            if isinstance(value, Unknown):
                findings.append(PORT_STATE.missing(subject, expectation, value, f"state of {label}"))
                break
        else:
            findings.append(PORT_STATE.compare(subject, expectation, f"{port.state}/{port.phys_state}",
                                               f"state of {label}"))
    return findings


@PORT_RATE.evaluator
def evaluate_rate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation, ports, findings = _rail_ports(PORT_RATE, facts, profile, "rate")
    if expectation is None:
        return findings
    for device, port in ports:
        subject, label = port_subject(device, port), port_label(device, port)
        if isinstance(port.rate, Unknown):
            findings.append(PORT_RATE.missing(subject, expectation, port.rate, f"rate of {label}"))
            continue
        try:
            gbps = rate_gbps(port.rate)
        except ValueError:
            findings.append(PORT_RATE.unknown(subject, expectation, f"rate of {label}: unexpected {port.rate!r}"))
            continue
        value: float | int = int(gbps) if gbps.is_integer() else gbps
        finding = PORT_RATE.compare(subject, expectation, value, f"rate of {label} in Gb/s")
        finding.message += f" ({port.rate})"
        if finding.status is not Status.PASS and isinstance(port.state, str) and port.state != "ACTIVE":
            finding.message += f"; the port is {port.state} (see ib.port.state)"
        findings.append(finding)
    return findings


def counter_problem(name: str, value: int | str) -> str | None:
    """Why a counter has no usable number: it is not a number (the port's PMA did not answer)."""
    if isinstance(value, str):
        return f"{name} reads {value!r} (the port's PMA does not answer)"
    return None


def counter_text(name: str, value: int) -> str:
    """"link_downed 7", or "link_downed at least 255 (8-bit maximum)" for a saturated one."""
    bits = COUNTER_BITS.get(name)
    if isinstance(saturated(value, bits, name), AtLeast):
        return f"{name} at least {value} ({bits}-bit maximum, saturated)"
    return f"{name} {value}"


def judge_counters(expectations: Mapping[str, Expectation], counters: Mapping[str, int | str]
                   ) -> tuple[list[tuple[str, Expectation, int]], list[str], dict[str, int]]:
    """(counters over their limit, counters without a usable value, every value judged)."""
    over: list[tuple[str, Expectation, int]] = []
    problems: list[str] = []
    values: dict[str, int] = {}
    for name in sorted(expectations):
        if name not in counters:
            continue  # this HCA or link layer has no such counter
        value = counters[name]
        problem = counter_problem(name, value)
        if problem is not None:
            problems.append(problem)
            continue
        assert isinstance(value, int)
        reading = saturated(value, COUNTER_BITS.get(name), name)
        if isinstance(reading, AtLeast):
            verdict = expectations[name].evaluate_at_least(reading)
            if not verdict.comparable:
                problems.append(f"{verdict.detail}; `perfquery -R` clears it")
                continue
        else:
            verdict = expectations[name].evaluate(value)
        values[name] = value
        if not verdict.ok:
            over.append((name, expectations[name], value))
    over.sort(key=lambda item: _SEVERITY_RANK[item[1].severity])
    return over, problems, values


@PORT_ERRORS.evaluator
def evaluate_errors(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectations = profile.expectations_under("rdma", "errors")
    if not expectations:
        return []
    first = expectations[sorted(expectations)[0]]
    devices = _devices(facts, PORT_ERRORS, first, "RDMA port counters")
    if isinstance(devices, list):
        return devices
    findings: list[Finding] = []
    for device, port in _ports(devices, PORT_ERRORS, first, findings):
        subject, label = port_subject(device, port), port_label(device, port)
        if isinstance(port.counters, Unknown):
            findings.append(PORT_ERRORS.missing(subject, first, port.counters, f"error counters of {label}"))
            continue
        over, problems, values = judge_counters(expectations, port.counters)
        if over:
            expectation = over[0][1]
            listed = ", ".join(f"{counter_text(n, v)} (limit {e.describe()})" for n, e, v in over)
            findings.append(PORT_ERRORS.finding(
                subject, expectation.status_on_mismatch(), expectation.severity,
                f"error counters of {label} since boot: {listed}", observed={n: v for n, _, v in over},
                expected={n: e.expected for n, e, _ in over}, reason=expectation.reason))
        elif problems:
            findings.append(PORT_ERRORS.unknown(subject, first, f"error counters of {label}: {'; '.join(problems)}"))
        elif not values:
            findings.append(PORT_ERRORS.unknown(subject, first, f"error counters of {label}: none of "
                                                f"{', '.join(sorted(expectations))} is reported"))
        else:
            findings.append(PORT_ERRORS.finding(
                subject, Status.PASS, first.severity,
                f"error counters of {label} since boot within limits ({sum(values.values())} errors in total)",
                observed=values, expected={n: e.expected for n, e in expectations.items()}, reason=first.reason))
    return findings


@FIRMWARE.evaluator
def evaluate_firmware(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("rdma", "firmware")
    if expectation is None:
        return []
    devices = _devices(facts, FIRMWARE, expectation, "HCA firmware")
    if isinstance(devices, list):
        return devices
    types = rail_types(profile)
    findings: list[Finding] = []
    versions: dict[str, dict[str, list[str]]] = {}  # hca type -> version -> devices
    for device in devices:
        if isinstance(device.hca_type, str) and isinstance(device.fw_ver, str):
            # The shared VF id (MT4126) spans generations: group its VFs by the family their firmware tells.
            versions.setdefault(kind_label(device), {}).setdefault(device.fw_ver, []).append(device.name)
        if not is_rail(device, types):
            continue
        label = f"firmware of {device.name} ({kind_label(device)})"
        other = _other_silicon(device, expectation)
        if other is not None:
            findings.append(FIRMWARE.finding(device.name, Status.SKIP, expectation.severity, f"{label} is "
                                             f"{device.fw_ver}; {other}", observed=device.fw_ver,
                                             expected=expectation.expected, reason=expectation.reason))
            continue
        findings.append(FIRMWARE.compare(device.name, expectation, device.fw_ver, label))
    for hca_type, found in sorted(versions.items()):
        if len(found) <= 1:
            continue
        common = max(found, key=lambda v: len(found[v]))
        odd = "; ".join(f"{v} on {', '.join(sorted(names))}" for v, names in sorted(found.items()) if v != common)
        findings.append(FIRMWARE.finding(
            hca_type, Status.FAIL if expectation.severity is not Severity.INFO else Status.WARN,
            expectation.severity, f"{hca_type} HCAs run {len(found)} firmware versions: {common} on "
            f"{len(found[common])}, {odd}", observed=sorted(found), expected="one version per HCA type",
            reason="HCAs of one type on different firmware behave differently on the fabric and complicate "
                   "support cases"))
    return findings


def _other_silicon(device: RdmaDevice, expectation: Expectation) -> str | None:
    """Why the firmware minimum is not for this HCA: NVIDIA firmware's major number is the silicon's
    (20.x ConnectX-6, 28.x ConnectX-7), so a 28.x HCA is not "above" a 20.39 minimum."""
    bound = dict(expectation.comparators).get("version_min")
    if not isinstance(device.fw_ver, str) or bound is None:
        return None
    mine, theirs = device.fw_ver.split(".", 1)[0], str(bound).split(".", 1)[0]
    if not (mine.isdigit() and theirs.isdigit()) or int(mine) == int(theirs) or int(theirs) not in FIRMWARE_MAJOR:
        return None
    return (f"the profile's minimum {bound} is {FIRMWARE_MAJOR[int(theirs)]} firmware ({theirs}.x) and this HCA "
            f"runs {FIRMWARE_MAJOR.get(int(mine), 'another silicon')}'s ({mine}.x): not compared")


def rails_of(facts: NodeFacts, profile: Profile) -> list[RdmaDevice] | Unknown:
    """The rail HCAs (all RDMA devices when the profile names no types)."""
    rdma: Any = facts.host.rdma
    if isinstance(rdma, Unknown):
        return rdma
    types = rail_types(profile)
    return [d for d in rdma if is_rail(d, types)]
