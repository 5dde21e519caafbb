"""The shipped history rules (profiles/base.yaml expect.history) judged by checks/history.py.

Pure: hand-built incidents and facts in, findings out. Each case is one an operator meets: a burst of
fatal Xids on one board, the same count spread too thin, a board swapped in the same slot, the same
Xid across reboots, Xid 31 on one GPU against on several, a node fixed again and again (sticky until
cleared).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.core.facts import NodeFacts
from agent.core.facts_nvml import GpuFacts, NvmlFacts
from agent.core.history import GpuRef, History, Incident, digest
from agent.core.history_rules import evaluate_rules, parse_rules
from agent.core.model import Finding, Severity, Status
from agent.core.windows import window_seconds
from agent.policy.profiles import ProfileStore
from agent.sources.host import absent_host_facts
from checks.history import evaluate_gpus, evaluate_node, rules_of

NOW = 1_800_000_000.0
H = 3600.0
D = 86400.0
BOARD_A = GpuRef(3, "GPU-aaaa", "1650924000001")
BOARD_B = GpuRef(3, "GPU-bbbb", "1650924000002")  # the replacement in the same slot
OTHER = GpuRef(4, "GPU-cccc", "1650924000003")


@pytest.fixture(scope="module")
def profile() -> Any:
    return ProfileStore().profile("hgx-h100-sxm")


def _xid(code: int, at: float, gpu: GpuRef = BOARD_A, *, boot: str = "b1", severity: str = "critical") -> Incident:
    return Incident(ts=at, kind="xid", source="kmsg", code=str(code), gpu=gpu, subject=f"0000:{gpu.index}:00.0",
                    severity=severity, boot_id=boot, detail=f"NVRM: Xid {code}", digest=digest(code, at, gpu, boot))


def _action(kind: str, at: float, n: int) -> Incident:
    return Incident(ts=at, kind=kind, source="health-check", code="gpu.lost", subject="node",
                    digest=digest(kind, at, n))


def _facts(incidents: list[Incident], *gpus: GpuRef, until: float = NOW) -> NodeFacts:
    nvml = NvmlFacts(driver_version="570.124.06", cuda_driver_version="12.8", nvml_version="12.570.124.06",
                     device_count=len(gpus),
                     gpus=tuple(GpuFacts(index=g.index, name="NVIDIA H100 80GB HBM3", uuid=g.uuid, serial=g.serial,
                                         pci_bus_id=f"0000:{g.index:02x}:00.0") for g in gpus))
    facts = NodeFacts(host=absent_host_facts("not read in this test"), kmsg=(), nvml=nvml)
    facts.history = History(tuple(sorted(incidents, key=lambda i: i.ts)), until - 30 * D, until, "b1")
    return facts


def _by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def test_five_fatal_xids_in_a_day_on_one_gpu_is_critical_four_is_not(profile: Any) -> None:
    five = [_xid(79, NOW - n * H) for n in range(5)]
    found = _by_subject(evaluate_gpus(_facts(five, BOARD_A, OTHER), profile))
    assert found["gpu3"].status is Status.FAIL and found["gpu3"].severity is Severity.CRITICAL
    assert found["gpu3"].action == "contact_support"
    assert "fatal_xid_burst: xid 79 5 times in 24h (limit 5)" in found["gpu3"].message.replace("xid (79)", "xid 79")
    assert "first 2027-01-15T04:00:00Z, last 2027-01-15T08:00:00Z" in found["gpu3"].message
    burst = next(o for o in found["gpu3"].observed if o["rule"] == "fatal_xid_burst")
    assert burst["count"] == 5 and burst["window"] == "24h" and burst["key"] == BOARD_A.serial
    assert burst["first"] < burst["last"]
    assert found["gpu4"].status is Status.PASS  # the other board is not blamed
    four = _by_subject(evaluate_gpus(_facts(five[:4], BOARD_A), profile))
    assert four["gpu3"].status is Status.PASS


def test_the_same_count_spread_over_more_than_a_day_is_not_a_burst(profile: Any) -> None:
    spread = [_xid(79, NOW - n * 7 * H) for n in range(5)]  # 28 h from first to last
    found = _by_subject(evaluate_gpus(_facts(spread, BOARD_A), profile))
    assert "fatal_xid_burst" not in found["gpu3"].message


def test_non_fatal_xids_do_not_count_as_a_fatal_burst(profile: Any) -> None:
    app = [_xid(13, NOW - n * H, severity="warning") for n in range(20)]
    found = _by_subject(evaluate_gpus(_facts(app, BOARD_A), profile))
    assert found["gpu3"].status is Status.PASS


def test_a_swapped_board_starts_clean_and_the_old_serial_keeps_its_history(profile: Any) -> None:
    old = [_xid(79, NOW - n * H) for n in range(6)]
    found = _by_subject(evaluate_gpus(_facts(old, BOARD_B), profile))  # board B now in slot 3
    assert found["gpu3"].status is Status.PASS
    rules = [r for r in rules_of(profile) if r.scope == "gpu"]
    firings = evaluate_rules(rules, old, NOW)
    assert {f.key for f in firings} == {BOARD_A.serial}
    assert all(i.gpu.matches(BOARD_A.serial) and not i.gpu.matches(BOARD_B.serial) for i in old)


def test_history_follows_the_board_when_its_index_changes(profile: Any) -> None:
    moved = GpuRef(6, BOARD_A.uuid, BOARD_A.serial)  # re-enumerated after a reboot
    incidents = [_xid(79, NOW - n * H, gpu=BOARD_A if n % 2 else moved) for n in range(5)]
    found = _by_subject(evaluate_gpus(_facts(incidents, moved), profile))
    assert found["gpu6"].severity is Severity.CRITICAL


def test_the_same_fatal_xid_after_two_reboots_is_a_hardware_inspection(profile: Any) -> None:
    three_boots = [_xid(48, NOW - n * 5 * D, boot=f"boot-{n}") for n in range(3)]
    found = _by_subject(evaluate_gpus(_facts(three_boots, BOARD_A), profile))
    rule = next(o for o in found["gpu3"].observed if o["rule"] == "xid_across_reboots")
    assert rule["count"] == 3 and rule["counted"] == "boots" and "inspect_hardware" in (
        found["gpu3"].action, *[o.get("action", "") for o in found["gpu3"].observed])
    # twice (one reboot), or three different Xids over three boots, is not the pattern
    two = _by_subject(evaluate_gpus(_facts(three_boots[:2], BOARD_A), profile))
    assert two["gpu3"].status is Status.PASS
    different = [_xid(code, NOW - n * 5 * D, boot=f"boot-{n}") for n, code in enumerate((48, 79, 94))]
    assert "xid_across_reboots" not in _by_subject(evaluate_gpus(_facts(different, BOARD_A), profile))["gpu3"].message
    # many in one boot is one boot
    one_boot = [_xid(48, NOW - n * H) for n in range(3)]
    assert "xid_across_reboots" not in _by_subject(evaluate_gpus(_facts(one_boot, BOARD_A), profile))["gpu3"].message


def test_xid31_twice_on_one_gpu_asks_for_field_diagnostics_on_two_gpus_nothing(profile: Any) -> None:
    same = [_xid(31, NOW - 3 * D, severity="warning"), _xid(31, NOW - D, severity="warning")]
    found = _by_subject(evaluate_gpus(_facts(same, BOARD_A, OTHER), profile))
    assert found["gpu3"].status is Status.FAIL and found["gpu3"].severity is Severity.WARNING
    assert found["gpu3"].action == "field_diagnostics"
    apart = [_xid(31, NOW - 3 * D, severity="warning"), _xid(31, NOW - D, OTHER, severity="warning")]
    found = _by_subject(evaluate_gpus(_facts(apart, BOARD_A, OTHER), profile))
    assert found["gpu3"].status is Status.PASS and found["gpu4"].status is Status.PASS


def test_a_node_fixed_five_times_a_week_stays_flagged_until_cleared(profile: Any) -> None:
    churn = [_action("drain" if n % 2 else "remediation", NOW - n * D, n) for n in range(5)]
    found = _by_subject(evaluate_node(_facts(churn), profile))
    assert found["node_churn"].status is Status.FAIL and found["node_churn"].severity is Severity.WARNING
    assert found["node_churn"].observed[0]["sticky"] is True and "since" not in found["node_churn"].observed[0]
    # the engine remembers the firing; a month on, the drains are out of the window but the rule holds
    memory = Incident(ts=NOW, kind="rule", source="ledger", code="node_churn", subject="|",
                      digest=digest("rule", "node_churn"))
    later = NOW + 30 * D
    held = _by_subject(evaluate_node(_facts([*churn, memory], until=later), profile))["node_churn"]
    assert held.status is Status.FAIL and "held since" in held.message and "ledger clear --rule node_churn" in held.message
    # an operator's clear ends it; the rule counts again from the clear
    clear = Incident(ts=later - H, kind="clear", source="cli", code="node_churn", subject="*",
                     digest=digest("clear", "node_churn"))
    cleared = _by_subject(evaluate_node(_facts([*churn, memory, clear], until=later), profile))["node_churn"]
    assert cleared.status is Status.PASS
    assert _by_subject(evaluate_node(_facts(churn[:4]), profile))["node_churn"].status is Status.PASS


def test_a_clear_starts_a_non_sticky_count_again(profile: Any) -> None:
    five = [_xid(79, NOW - n * H) for n in range(5)]
    clear = Incident(ts=NOW - 2.5 * H, kind="clear", source="cli", code="fatal_xid_burst", subject=BOARD_A.serial,
                     digest=digest("clear", 1))
    found = _by_subject(evaluate_gpus(_facts([*five, clear], BOARD_A), profile))
    assert "fatal_xid_burst" not in found["gpu3"].message
    other_clear = clear._replace(subject=OTHER.serial)
    found = _by_subject(evaluate_gpus(_facts([*five, other_clear], BOARD_A), profile))
    assert "fatal_xid_burst" in found["gpu3"].message


def test_without_a_ledger_or_without_nvml_history_says_nothing(profile: Any) -> None:
    facts = _facts([_xid(79, NOW - n * H) for n in range(5)], BOARD_A)
    facts.history = None
    assert evaluate_gpus(facts, profile) == [] and evaluate_node(facts, profile) == []
    bare = _facts([_xid(79, NOW - n * H) for n in range(5)], BOARD_A)
    from agent.core.model import Unknown

    bare.nvml = Unknown("NVML not read")
    assert evaluate_gpus(bare, profile) == []  # an unnamed slot is never judged


def test_an_xid_on_a_gpu_nobody_named_is_not_counted_against_a_board(profile: Any) -> None:
    anonymous = [_xid(79, NOW - n * H, gpu=GpuRef()) for n in range(8)]
    found = _by_subject(evaluate_gpus(_facts(anonymous, BOARD_A), profile))
    assert found["gpu3"].status is Status.PASS


def test_rule_grammar() -> None:
    assert window_seconds("24h") == D and window_seconds("7d") == 7 * D and window_seconds("2w") == 14 * D
    for bad in ("0h", "24", "1y", "-3d", "400d", "1.5h", ""):
        with pytest.raises(ValueError):
            window_seconds(bad)
    rules = parse_rules({"a": {"kind": "xid", "window": "1h", "count": 2, "severity": "warning", "reason": "r"},
                         "gone": None, "b": {"kinds": ["drain", "nope"], "window": "1d", "count": 1,
                                             "severity": "info", "reason": "r"}})
    assert [r.name for r in rules] == ["a", "b"] and rules[1].kinds == ("drain",) and rules[0].action == "review"


def test_a_profile_can_remove_or_tighten_a_shipped_rule(profile: Any) -> None:
    section = copy.deepcopy(dict(profile.section("history")))
    section["fatal_xid_burst"] = None
    section["xid31_same_gpu"] = {**section["xid31_same_gpu"], "count": 3}
    names = {r.name: r for r in parse_rules(section)}
    assert "fatal_xid_burst" not in names and names["xid31_same_gpu"].limit == 3
