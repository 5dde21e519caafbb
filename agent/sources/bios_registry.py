"""The enumeration values of a BMC's BIOS `AttributeRegistry` (DMTF AttributeRegistry schema).

A Bios resource names its registry (`"AttributeRegistry": "BiosAttributeRegistryU58.v1_2_44"`);
the registry lists, per attribute, the values the BIOS takes: `ValueName` (what `Attributes` and a
PATCH use) and `ValueDisplayName` (what setup shows). Some BMCs report a display name, or a value
decorated with a note ("Maximum Performance (Default)"); the registry says which value name that
is, so `bios.attribute` judges the setting, not its spelling.

The body is hostile input: sizes are bounded, entries of the wrong type are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_ATTRIBUTES = 5000  # Dell's registry lists ~700, HPE's ~350
MAX_VALUES = 256
MAX_TEXT = 256

EnumRegistry = dict[str, dict[str, str]]  # attribute -> {ValueName: ValueDisplayName}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_TEXT else None


def parse_attribute_registry(body: Mapping[str, Any]) -> EnumRegistry:
    """Attribute -> {ValueName: ValueDisplayName} for the enumeration attributes of a registry."""
    entries = body.get("RegistryEntries") if isinstance(body, Mapping) else None
    attributes = entries.get("Attributes") if isinstance(entries, Mapping) else None
    registry: EnumRegistry = {}
    if not isinstance(attributes, list):
        return registry
    for attribute in attributes[:MAX_ATTRIBUTES]:
        if not isinstance(attribute, Mapping):
            continue
        name, values = _text(attribute.get("AttributeName")), attribute.get("Value")
        if name is None or not isinstance(values, list):
            continue
        names: dict[str, str] = {}
        for value in values[:MAX_VALUES]:
            if isinstance(value, Mapping) and (value_name := _text(value.get("ValueName"))) is not None:
                names[value_name] = _text(value.get("ValueDisplayName")) or value_name
        if names:
            registry[name] = names
    return registry
