"""Expectations: comparators, version ordering, verdict text and severity mapping."""

from __future__ import annotations

from typing import Any

import pytest

from agent.core.expect import COMPARATORS, Expectation, version_key
from agent.core.model import Severity, Status


def exp(severity: str = "warning", **comparators: Any) -> Expectation:
    """An expectation as a profile would write it."""
    return Expectation.from_mapping({**comparators, "severity": severity, "reason": "because"})


# ---------------------------------------------------------------------------------------------
# equals / one_of
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("observed", "expected", "ok"), [
    ("0", 0, True),  # sysctl text vs YAML integer
    (0, "0", True),
    ("1", 0, False),
    ("0x10", 16, True),
    ("1.0", 1, True),
    ("madvise", "madvise", True),
    ("madvise", "never", False),
    ("4096\t87380\t6291456", "4096 87380 6291456", True),  # tabs in multi-value sysctls
    ("4096 87380 6291456", "4096 87380 6291457", False),
    ("a  b\tc", "a b c", True),  # non-numeric words: whitespace-normalised text
    ("ab c", "a bc", False),
    (True, True, True),
    ("true", True, False),  # a boolean expectation is never met by text
    (False, False, True),
    ("0", False, False),  # nor is a boolean expectation met by a number in text
])
def test_equals(observed: Any, expected: Any, ok: bool) -> None:
    assert exp(equals=expected).evaluate(observed).ok is ok


def test_one_of() -> None:
    e = exp(one_of=["performance", "schedutil"])
    assert e.evaluate("performance").ok
    assert not e.evaluate("powersave").ok
    assert exp(one_of=[0, 2]).evaluate("2").ok
    assert not exp(one_of=[0, 2]).evaluate("1").ok


# ---------------------------------------------------------------------------------------------
# min / max / range
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("observed", "bound", "ok"), [
    ("262144", 262144, True),
    ("262143", 262144, False),
    ("4096 87380 134217728", [4096, 87380, 134217728], True),
    ("4096\t87380\t134217728", "4096 87380 134217728", True),
    ("4096 87380 134217727", [4096, 87380, 134217728], False),  # only the third is short
    ("8192 65536 268435456", [4096, 87380, 134217728], False),  # elementwise, not any/sum
    ("8192 87380 268435456", [4096, 87380, 134217728], True),
    (2.5, 2, True),
])
def test_min(observed: Any, bound: Any, ok: bool) -> None:
    verdict = exp(min=bound).evaluate(observed)
    assert verdict.ok is ok
    assert "cannot compare" not in verdict.detail


@pytest.mark.parametrize(("observed", "bound", "ok"), [
    ("10", 10, True),
    ("11", 10, False),
    ("0 0", [0, 1], True),
    ("0 2", [0, 1], False),
])
def test_max(observed: Any, bound: Any, ok: bool) -> None:
    assert exp(max=bound).evaluate(observed).ok is ok


@pytest.mark.parametrize(("observed", "ok"), [("1", True), ("5", True), ("10", True), ("0", False), ("11", False)])
def test_range_is_inclusive(observed: str, ok: bool) -> None:
    assert exp(range=[1, 10]).evaluate(observed).ok is ok


@pytest.mark.parametrize(("comparator", "observed", "value"), [
    ("min", "madvise", 1),
    ("min", "4096 87380", [4096, 87380, 134217728]),  # different number of values
    ("max", "1 2 3", 5),
    ("min", True, 0),  # a boolean is not a number
    ("range", "n/a", [0, 10]),
    ("min", None, 1),
])
def test_incomparable_values(comparator: str, observed: Any, value: Any) -> None:
    verdict = exp(**{comparator: value}).evaluate(observed)
    assert verdict.ok is False
    assert verdict.detail.startswith("cannot compare ")
    assert comparator in verdict.detail


# ---------------------------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------------------------


def test_version_key_orders_driver_versions_numerically() -> None:
    ordered = ["470.256.02", "535.129.03", "535.161.08", "550.54.15", "550.90.07", "560.35.03"]
    assert sorted(ordered[::-1], key=version_key) == ordered
    assert version_key("535.129.03") < version_key("535.161.08") < version_key("550.54.15")
    assert version_key("1.10") > version_key("1.9")  # not text order


def test_version_key_rules() -> None:
    """Numbers compare as numbers (leading zeros ignored); text parts sort after numbers."""
    assert version_key("96.00.74.00.01") == version_key("96.0.74.0.1")
    assert version_key("96.00.5a.00.01") > version_key("96.00.74.00.01")  # '5a' is text: after any number
    assert version_key("1.2a") > version_key("1.2")
    assert version_key("1.2") > version_key("1")
    assert version_key("2.3-5_1") == version_key("2.3.5.1")  # '-' and '_' separate parts too
    assert version_key(" 550.54.15\n") == ((0, 550), (0, 54), (0, 15))


@pytest.mark.parametrize(("observed", "ok"), [
    ("550.54.15", True), ("550.90.07", True), ("560.35.03", True), ("550.54.14", False), ("535.161.08", False),
])
def test_version_min(observed: str, ok: bool) -> None:
    assert exp(version_min="550.54.15").evaluate(observed).ok is ok


@pytest.mark.parametrize(("observed", "ok"), [("96.00.74.00.01", True), ("96.00.74.00.02", False)])
def test_version_max(observed: str, ok: bool) -> None:
    assert exp(version_max="96.00.74.00.01").evaluate(observed).ok is ok


def test_version_min_with_a_numeric_bound() -> None:
    """YAML turns `version_min: 12.4` into a float; it still compares as a version."""
    assert exp(version_min=12.4).evaluate("12.10").ok
    assert not exp(version_min=12.4).evaluate("12.3").ok


@pytest.mark.parametrize("observed", ["N/A", "unknown", None])
def test_version_min_with_non_version_text_cannot_compare(observed: Any) -> None:
    """'N/A' (what NVML and nvidia-smi print) must not pass a minimum driver version."""
    verdict = exp(version_min="550.54.15").evaluate(observed)
    assert verdict.ok is False
    assert "cannot compare" in verdict.detail


def test_version_min_combined_with_a_pin() -> None:
    """version_min plus one_of: both must hold."""
    e = exp(version_min="550.54.15", one_of=["550.90.07", "560.35.03"])
    assert e.evaluate("560.35.03").ok
    assert not e.evaluate("550.127.05").ok  # new enough but not pinned
    assert not e.evaluate("535.161.08").ok


# ---------------------------------------------------------------------------------------------
# verdict text, expected, describe, severity
# ---------------------------------------------------------------------------------------------


def test_verdict_detail_text() -> None:
    e = exp(min=4096)
    assert e.evaluate("8192").detail == "8192 is >= 4096"
    assert e.evaluate("1024").detail == "1024 is not >= 4096"
    assert exp(min=1).evaluate("x").detail == "cannot compare 'x' with min 1"


@pytest.mark.parametrize(("comparators", "text"), [
    ({"equals": 1}, "= 1"),
    ({"one_of": ["performance", "schedutil"]}, "one of performance, schedutil"),
    ({"min": 4096}, ">= 4096"),
    ({"max": 10}, "<= 10"),
    ({"range": [1, 10]}, "in [1, 10]"),
    ({"version_min": "550.54.15"}, ">= 550.54.15"),
    ({"version_max": "96.00.74.00.01"}, "<= 96.00.74.00.01"),
    ({"max": 20, "min": 10}, ">= 10 and <= 20"),  # COMPARATORS order, not mapping order
    ({}, "(no comparison)"),
])
def test_describe(comparators: dict[str, Any], text: str) -> None:
    assert exp(**comparators).describe() == text


def test_expected_property() -> None:
    assert exp(equals="madvise").expected == "madvise"
    assert exp(min=4096).expected == {"min": 4096}
    assert exp(range=[1, 2]).expected == {"range": [1, 2]}
    assert exp(version_min="550.54.15", one_of=["550.90.07"]).expected == {
        "one_of": ["550.90.07"], "version_min": "550.54.15"}


@pytest.mark.parametrize(("severity", "status"), [
    ("info", Status.WARN), ("warning", Status.FAIL), ("critical", Status.FAIL),
])
def test_status_on_mismatch(severity: str, status: Status) -> None:
    assert exp(severity, equals=1).status_on_mismatch() is status


def test_from_mapping_with_options() -> None:
    """Non-comparator keys become sorted options; severity and reason are not options."""
    e = Expectation.from_mapping({
        "severity": "critical", "reason": "jumbo frames", "min": 9000, "names": ["ens*"],
        "bond_members": False, "equals": 9000,
    })
    assert e.comparators == (("equals", 9000), ("min", 9000))
    assert e.options == (("bond_members", False), ("names", ["ens*"]))
    assert (e.severity, e.reason) == (Severity.CRITICAL, "jumbo frames")
    assert e.option("names") == ["ens*"]
    assert e.option("bond_members", True) is False
    assert e.option("absent", 7) == 7
    assert COMPARATORS == ("equals", "one_of", "min", "max", "range", "version_min", "version_max")


def test_from_mapping_rejects_a_bad_severity_and_coerces_reason() -> None:
    with pytest.raises(ValueError, match="fatal"):
        Expectation.from_mapping({"severity": "fatal", "reason": "x", "equals": 1})
    assert Expectation.from_mapping({"severity": "info", "reason": 42}).reason == "42"


def test_unknown_comparator_is_a_programming_error() -> None:
    e = Expectation((("at_least", 1),), Severity.INFO, "r")
    with pytest.raises(ValueError, match="unknown comparator at_least"):
        e.evaluate(1)


def test_first_failing_comparator_decides() -> None:
    e = exp(min=10, max=20)
    assert e.evaluate("15").ok
    assert e.evaluate("25").detail == "25 is not >= 10 and <= 20"
    assert exp(min=10, max=20).evaluate("x").detail == "cannot compare 'x' with min 10"
