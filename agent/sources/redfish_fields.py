"""Typed access to one Redfish resource: a field of the wrong type is a problem, never a crash.

A BMC answers JSON that follows the schema most of the time. When a field has the wrong type
(`"Members": 1`, a `FirmwareVersion` that is an object, `"Status": "broken"`), the parser treats
it as not reported and records one problem naming the resource and the field; the problems
become `unknown` findings for that resource (`bmc.reachable`), and everything else is judged.
`null` is not a problem: Redfish uses it for "not available".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agent.core.numbers import MAGNITUDE, finite, is_number_text

ROOT = "/redfish/v1"
PLACEHOLDER_TEXT = frozenset({"", "n/a", "na", "none", "null", "unknown", "undefined", "not available"})


def _shown(value: int | float) -> str:
    """A hostile number, short: a 4,000-digit integer is named by its length, never printed."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value))) if value.bit_length() < 14000 else 'over 4,000'} digits"
    return repr(value)


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class Problems:
    """Per-resource problems, in order, without duplicates."""

    def __init__(self) -> None:
        self._items: dict[str, None] = {}

    def add(self, path: str, text: str) -> None:
        self._items.setdefault(f"{path.split('#', 1)[0]}: {text}", None)

    def wrong(self, path: str, field: str, value: Any, expected: str) -> None:
        _base, _, fragment = path.partition("#")  # an object inside an array: name it (PowerSupplies/1.Status)
        where = f"{fragment.strip('/')}.{field}" if fragment.strip("/") else field
        self.add(path, f"unusable field {where} ({kind_of(value)}, expected {expected})")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)


class Res:
    """One resource (or an object inside one) with typed getters that record wrong types."""

    __slots__ = ("body", "path", "prefix", "problems")

    def __init__(self, path: str, body: Any, problems: Problems, prefix: str = "") -> None:
        self.path, self.problems, self.prefix = path, problems, prefix
        self.body: dict[str, Any] = body if isinstance(body, dict) else {}

    def _wrong(self, key: str, value: Any, expected: str) -> None:
        self.problems.wrong(self.path, self.prefix + key, value, expected)

    def has(self, key: str) -> bool:
        return self.body.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.body.get(key)

    def text(self, key: str) -> str | None:
        value = self.body.get(key)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # a version or model given as a number: usable as it is
        self._wrong(key, value, "text")
        return None

    def num(self, key: str) -> float | None:
        value = self.body.get(key)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = finite(value)
            if number is None:  # NaN, 1e999 (inf), a 4,000-digit integer: no sensor reads that
                self.problems.add(self.path, f"unusable field {self._where(key)} ({_shown(value)}, "
                                             f"expected a finite number within +-{MAGNITUDE:g})")
            return number
        if isinstance(value, str):
            if is_number_text(value):
                number = finite(value)  # numbers sent as text (Cisco): usable when in bounds
                if number is not None:
                    return number
            elif value.strip().lower() in PLACEHOLDER_TEXT:
                return None
        self._wrong(key, value, "a number")
        return None

    def _where(self, key: str) -> str:
        _base, _, fragment = self.path.partition("#")
        return f"{fragment.strip('/')}.{self.prefix}{key}" if fragment.strip("/") else self.prefix + key

    def integer(self, key: str) -> int | None:
        value = self.num(key)
        return int(value) if value is not None and value == int(value) else None

    def boolean(self, key: str) -> bool | None:
        value = self.body.get(key)
        if value is None or isinstance(value, bool):
            return value
        self._wrong(key, value, "true/false")
        return None

    def obj(self, key: str) -> Res:
        """A nested object (empty when absent or of the wrong type)."""
        value = self.body.get(key)
        if value is not None and not isinstance(value, dict):
            self._wrong(key, value, "an object")
        return Res(self.path, value, self.problems, f"{self.prefix}{key}.")

    def items(self, key: str) -> list[Res]:
        """The objects of an array; other members (and a non-array) are recorded, not used."""
        value = self.body.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self._wrong(key, value, "a list")
            return []
        out = []
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                self._wrong(f"{key}[{index}]", item, "an object")
                continue
            where = item.get("@odata.id")
            out.append(Res(where if isinstance(where, str) else f"{self.path}#/{key}/{index}", item,
                           self.problems))
        return out

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.body.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            self._wrong(key, value, "a list")
            return ()
        return tuple(str(v) for v in value if isinstance(v, (str, int, float)) and not isinstance(v, bool))

    def link(self, *keys: str) -> str | None:
        node: Any = self.body
        for key in keys:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        target = node.get("@odata.id") if isinstance(node, dict) else None
        return target if isinstance(target, str) else None

    def links(self, key: str) -> list[str]:
        """@odata.id of every member of a link array (Members, Drives, RelatedItem)."""
        return [target for item in self.items(key) if (target := item.link()) is not None]

    def odata_type(self) -> str:
        value = self.body.get("@odata.type")
        return value if isinstance(value, str) else ""

    def status(self) -> tuple[str | None, str | None, str | None]:
        """Status.State, Status.Health, Status.HealthRollup (None: not reported)."""
        status = self.obj("Status")
        return status.text("State"), status.text("Health"), status.text("HealthRollup")

    def name(self, *keys: str, default: str = "?") -> str:
        for key in keys:
            value = self.text(key)
            if value:
                return value
        return default
