"""Expectations: a comparator set plus severity and reason, from a profile.

An expectation may combine comparators (`min` and `max`, `version_min` and
`one_of` for a pinned allow-list); all must hold. Comparators are chosen so a
tuned OS that already holds a *better* value passes (`min` not `equals` for
buffer sizes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agent.core import versions
from agent.core.model import Severity, Status

COMPARATORS = ("equals", "one_of", "min", "max", "range", "version_min", "version_max")


def version_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key for dotted versions: '96.00.74.00.01', '535.129.03', '2.3.5'.

    `version_min`/`version_max` compare through `agent.core.versions`, which knows the vendor formats
    (HPE ROM families, iLO and Lenovo build ids, Supermicro respin letters); this plain key stays
    for callers that only sort.

    Numeric parts compare as numbers (leading zeros ignored); other parts
    compare as text and sort after numbers, so '1.2a' > '1.2'.
    """
    parts = re.split(r"[.\-_]", str(text).strip().lstrip("vV"))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts if p != "")


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            try:
                return float(value.strip())
            except ValueError:
                return None
    return None


def _numbers(value: Any) -> list[float] | None:
    """A value as a list of numbers: '4096 87380 6291456' -> three numbers."""
    if isinstance(value, list):
        nums = [_as_number(v) for v in value]
    elif isinstance(value, str) and len(value.split()) > 1:
        nums = [_as_number(v) for v in value.split()]
    else:
        nums = [_as_number(value)]
    return None if any(n is None for n in nums) else nums  # type: ignore[return-value]


def _same(observed: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(observed, bool):
        # Booleans never equal numbers: `equals: 0` must not pass on False.
        return type(observed) is type(expected) and observed == expected
    obs_n, exp_n = _numbers(observed), _numbers(expected)
    if obs_n is not None and exp_n is not None:
        return obs_n == exp_n
    return " ".join(str(observed).split()) == " ".join(str(expected).split())


def _at_least(observed: Any, bound: Any) -> bool | None:
    obs, lim = _numbers(observed), _numbers(bound)
    if obs is None or lim is None or len(obs) != len(lim):
        return None
    return all(o >= b for o, b in zip(obs, lim, strict=True))


def _at_most(observed: Any, bound: Any) -> bool | None:
    obs, lim = _numbers(observed), _numbers(bound)
    if obs is None or lim is None or len(obs) != len(lim):
        return None
    return all(o <= b for o, b in zip(obs, lim, strict=True))


class Verdict(NamedTuple):
    ok: bool
    detail: str  # the comparison that failed, or why it could not be made
    comparable: bool = True  # False: the values could not be compared at all


# --- fixed-width hardware counters -------------------------------------------------------------
# A counter field stops at its maximum (IB PMA PortCounters saturate; NVML reports a field of its
# declared width), so a reading at the maximum says only that the true count is at least that.
COUNTER_MAXIMA = {bits: (1 << bits) - 1 for bits in (4, 8, 16, 32, 64)}


class AtLeast(NamedTuple):
    """A lower bound instead of a value: a counter at its field's maximum, or a total or rate made from one."""

    value: int | float
    why: str  # "link_downed is at its 8-bit maximum 255"


def saturated(value: Any, bits: int | None, name: str) -> Any:
    """`value`, or AtLeast(value) when it sits at the maximum of its `bits`-wide field."""
    if bits is None or isinstance(value, bool) or not isinstance(value, int):
        return value
    if value >= COUNTER_MAXIMA.get(bits, (1 << bits) - 1):
        return AtLeast(value, f"{name} is at its {bits}-bit maximum {value}: it saturated")
    return value


def counter_total(parts: list[Any]) -> Any:
    """The sum of counter readings: AtLeast when any part is one; the first non-number as is."""
    for part in parts:
        if not isinstance(part, (int, float, AtLeast)) or isinstance(part, bool):
            return part
    total = sum(p.value if isinstance(p, AtLeast) else p for p in parts)
    bounds = [p.why for p in parts if isinstance(p, AtLeast)]
    return AtLeast(total, "; ".join(bounds)) if bounds else total


def _at_least_verdict(op: str, bound: float, value: Any) -> bool | None:  # bound: exact int or float
    """Whether `op value` holds for every number >= bound (True), for none (False), or it depends (None)."""
    if op in ("min", "max", "equals"):
        limit = _as_number(value)
        if limit is None:
            return None
        if op == "min":
            return True if bound >= limit else None
        return False if bound > limit else None
    if op == "range":
        high = _as_number(value[1])
        return None if high is None or bound <= high else False
    if op == "one_of":
        limits = [_as_number(v) for v in value]
        return False if all(v is not None and bound > v for v in limits) else None
    return None  # version comparators: a count is no version


# A comparator value relative to what the device reports: "@slowdown_c - 10".
REF_RE = re.compile(r"^@([a-z_][a-z0-9_]*)\s*(?:([-+*])\s*([0-9]+(?:\.[0-9]+)?))?$")


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("@")


def resolve_reference(value: str, refs: Mapping[str, Any]) -> float | str:
    """The number a reference stands for, or a string saying why it has none."""
    match = REF_RE.match(value.strip())
    if not match:
        return f"{value!r} is not a reference like '@slowdown_c - 10'"
    name, op, operand = match.groups()
    if name not in refs:
        return f"the device reports no {name}"
    base = refs[name]
    reason = getattr(base, "reason", None)
    if reason is not None:
        return f"{name} is unknown ({reason})"
    number = _as_number(base)
    if number is None:
        return f"{name} is not a number ({base!r})"
    if op is None:
        return number
    amount = float(operand)
    result = number - amount if op == "-" else number + amount if op == "+" else number * amount
    return int(result) if float(result).is_integer() else round(result, 3)


@dataclass(frozen=True)
class Expectation:
    """One compiled expectation from a profile."""

    comparators: tuple[tuple[str, Any], ...]
    severity: Severity
    reason: str
    options: tuple[tuple[str, Any], ...] = ()  # check-specific settings

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Expectation:
        comparators = tuple((k, data[k]) for k in COMPARATORS if k in data)
        options = tuple(sorted(
            (k, v) for k, v in data.items() if k not in COMPARATORS and k not in ("severity", "reason")
        ))
        return cls(comparators, Severity(data["severity"]), str(data["reason"]), options)

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    def references(self) -> list[str]:
        """Names of the device values this expectation refers to ("@slowdown_c - 10")."""
        names = []
        for _, value in self.comparators:
            match = REF_RE.match(value.strip()) if is_reference(value) else None
            if match:
                names.append(match.group(1))
        return names

    @property
    def relative(self) -> bool:
        return any(is_reference(v) for _, v in self.comparators)

    def resolve(self, refs: Mapping[str, Any]) -> Expectation | str:
        """This expectation with `@name` references replaced by the device's values.

        Returns a string saying why when a reference cannot be resolved.
        """
        if not self.relative:
            return self
        resolved: list[tuple[str, Any]] = []
        notes: list[str] = []
        for op, value in self.comparators:
            if is_reference(value):
                number = resolve_reference(value, refs)
                if isinstance(number, str):
                    return number
                notes.append(f"{value[1:]} = {number}")
                resolved.append((op, number))
            else:
                resolved.append((op, value))
        options = (*self.options, ("_resolved_from", "; ".join(
            f"{v}" for _, v in self.comparators if is_reference(v))))
        return Expectation(tuple(resolved), self.severity, self.reason, options)

    @property
    def expected(self) -> Any:
        """What the report shows under `expected`."""
        if len(self.comparators) == 1:
            op, value = self.comparators[0]
            return value if op == "equals" else {op: value}
        return dict(self.comparators)

    def describe(self) -> str:
        parts = []
        for op, value in self.comparators:
            if op == "equals":
                parts.append(f"= {value}")
            elif op == "one_of":
                parts.append("one of " + ", ".join(str(v) for v in value))
            elif op == "version_min" and versions.is_no_minimum(value):
                parts.append("any version (no minimum)")
            elif op in ("min", "version_min"):
                parts.append(f">= {value}")
            elif op in ("max", "version_max"):
                parts.append(f"<= {value}")
            elif op == "range":
                parts.append(f"in [{value[0]}, {value[1]}]")
        text = " and ".join(parts) or "(no comparison)"
        origin = self.option("_resolved_from")
        return f"{text} ({origin})" if origin else text

    def evaluate(self, observed: Any) -> Verdict:
        for op, value in self.comparators:
            ok = _compare(op, observed, value)
            if ok is None or isinstance(ok, str):
                why = f": {ok}" if isinstance(ok, str) else ""
                return Verdict(False, f"cannot compare {observed!r} with {op} {value!r}{why}", comparable=False)
            if not ok:
                return Verdict(False, f"{observed} is not {self.describe()}")
        return Verdict(True, f"{observed} is {self.describe()}")

    def evaluate_at_least(self, observed: AtLeast) -> Verdict:
        """A lower bound against the comparators: fails when no count at or above it can pass, holds when
        every one does, else not comparable (`unknown`: the limit is at or above what the counter can show)."""
        outcomes = [_at_least_verdict(op, observed.value, value) for op, value in self.comparators]
        if False in outcomes:
            return Verdict(False, f"at least {observed.value}, not {self.describe()}")
        if all(outcomes):
            return Verdict(True, f"at least {observed.value}, {self.describe()}")
        return Verdict(False, f"{observed.why}; whether it is {self.describe()} cannot be told "
                              "(clear the counter and read it again)", comparable=False)

    def status_on_mismatch(self) -> Status:
        # An informational expectation never fails the audit; it warns.
        return Status.WARN if self.severity is Severity.INFO else Status.FAIL


def _compare(op: str, observed: Any, value: Any) -> bool | str | None:
    """Whether `observed` meets `op value`; None (or the reason, as text) when they cannot be compared."""
    if op == "equals":
        return _same(observed, value)
    if op == "one_of":
        return any(_same(observed, v) for v in value)
    if op == "min":
        return _at_least(observed, value)
    if op == "max":
        return _at_most(observed, value)
    if op == "range":
        low, high = _at_least(observed, value[0]), _at_most(observed, value[1])
        return None if low is None or high is None else low and high
    if op in ("version_min", "version_max"):
        if versions.parse(observed) is None:
            return None  # "N/A", "unknown", None: not a version, so not comparable
        if op == "version_min" and versions.is_no_minimum(value):
            return True  # `version_min: "0"`: recorded, any version passes
        order = versions.compare(observed, value)  # vendor formats, families (agent/core/versions.py)
        if isinstance(order, str):
            return order
        return order >= 0 if op == "version_min" else order <= 0
    raise ValueError(f"unknown comparator {op}")
