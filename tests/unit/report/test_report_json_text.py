"""agent.report.json_text writes exactly what `json.dumps(clean_value(doc), indent=2)` writes, except that
NaN and infinities become null: the report is strict JSON (issue 21, 5)."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.sanitise import clean_value
from agent.report.json_text import dumps_indented, report_text


def strict(value: Any) -> Any:
    """`value` with every non-finite float (value or key) as None: what the report writes."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {strict(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value

# Characters agent.core.sanitise replaces, their neighbours (which it keeps), quotes and backslashes.
TRICKY = "\x00\x01\t\n\r\x1b\x1f\x7f\x80\x9f\xa0\u061b\u061c\u200d\u200e\u200f\u2027\u2028\u202e\u202f" \
         "\u2065\u2066\u2069\u206a\ufefe\ufeff\ufffd\ufffe\uffff\ud800\udc80\udfff\U0001f600\u00e9\u2013\"\\/ au"
tricky_text = st.text(alphabet=st.sampled_from(TRICKY), max_size=8) | st.text(max_size=12)
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | tricky_text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(tricky_text, inner, max_size=4), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_text_is_json_dumps_with_indent(value: Any) -> None:
    assert dumps_indented(value) == json.dumps(strict(value), indent=2)


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_report_text_is_the_cleaned_dump(value: Any) -> None:
    assert report_text(value) == json.dumps(clean_value(strict(value)), indent=2)


@pytest.mark.parametrize("char", sorted(set(TRICKY)))
def test_every_unsafe_character_is_cleaned_in_keys_and_values(char: str) -> None:
    doc = {f"key{char}": [f"a{char}b", {"x": char}], "plain": "text"}
    assert report_text(doc) == json.dumps(clean_value(doc), indent=2)


class Level(enum.IntEnum):
    HIGH = 3


class Name(str, enum.Enum):
    ONE = "one\u200e"


class Mapping(dict[str, Any]):
    pass


def test_subclasses_and_other_keys_are_written_as_json_writes_them() -> None:
    doc = {"level": Level.HIGH, "name": Name.ONE, "map": Mapping(a=1), 7: "int", 2.5: "float", True: "bool",
           None: "null", "empty": {}, "none": [], "t": (1, 2.0), "nan": float("nan"), "inf": float("-inf")}
    assert dumps_indented(doc) == json.dumps(strict(doc), indent=2)
    assert report_text(doc) == json.dumps(clean_value(strict(doc)), indent=2)


def test_what_json_refuses_is_refused() -> None:
    with pytest.raises(TypeError):
        dumps_indented({"a": {1, 2}})
    with pytest.raises(TypeError):
        dumps_indented({(1, 2): "tuple key"})
