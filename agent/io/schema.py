"""A small JSON Schema (2020-12 subset) validator.

Why not the `jsonschema` package: importing it costs ~70 ms, more than the
whole audit of a simulated node, and we only need the keywords listed in
SUPPORTED. The test suite checks that `jsonschema` agrees with this code on
every shipped profile and on a set of broken ones, and this validator refuses
a schema that uses any keyword it does not implement, so the two cannot drift
apart silently.

Patterns follow ECMA-262, JSON Schema's regex dialect, where `$` matches only
at the very end: Python's `$` also matches before a final newline, so
`^[a-z.]+$` would pass "vm.swappiness" plus a newline (jsonschema, on Python's
`re`, has that hole; we close it by compiling `$` as end-of-text, `\\Z`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from agent.core.errors import NodewardenError
from agent.io.yamlfile import LineMap

SUPPORTED = frozenset({
    "$schema", "$id", "$defs", "$comment", "$ref", "title", "description", "default", "examples",
    "type", "enum", "const", "properties", "patternProperties", "additionalProperties", "required",
    "minProperties", "items", "minItems", "maxItems", "uniqueItems", "minimum", "maximum",
    "exclusiveMinimum", "minLength", "maxLength", "pattern", "anyOf", "oneOf", "not",
    "propertyNames",
})

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class SchemaError(NamedTuple):
    path: tuple[str | int, ...]
    message: str


def describe_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_schema_keywords(schema: Any, where: str = "#") -> None:
    """Raise ValueError if the schema uses a keyword this validator lacks."""
    if isinstance(schema, Mapping):
        unknown = set(schema) - SUPPORTED
        if unknown:
            raise ValueError(f"schema at {where} uses unsupported keywords: {sorted(unknown)}")
        for key, value in schema.items():
            if key in ("properties", "patternProperties", "$defs"):
                for name, sub in value.items():
                    check_schema_keywords(sub, f"{where}/{key}/{name}")
            elif key in ("items", "additionalProperties", "not", "propertyNames") and isinstance(
                value, Mapping
            ):
                check_schema_keywords(value, f"{where}/{key}")
            elif key in ("anyOf", "oneOf"):
                for i, sub in enumerate(value):
                    check_schema_keywords(sub, f"{where}/{key}/{i}")


class Validator:
    def __init__(self, schema: Mapping[str, Any]) -> None:
        check_schema_keywords(schema)
        self.root = schema
        self._patterns: dict[str, re.Pattern[str]] = {}

    def _pattern(self, text: str) -> re.Pattern[str]:
        pat = self._patterns.get(text)
        if pat is None:
            pat = self._patterns[text] = re.compile(ecma_anchors(text))
        return pat

    def _ref(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported: {ref}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part]
        return node  # type: ignore[no-any-return]

    def errors(self, value: Any, schema: Mapping[str, Any] | bool | None = None,
               path: tuple[str | int, ...] = ()) -> list[SchemaError]:
        if schema is None:
            schema = self.root
        if schema is True:
            return []
        if schema is False:
            return [SchemaError(path, "is not allowed here")]
        assert isinstance(schema, Mapping)
        if "$ref" in schema:
            errs = self.errors(value, self._ref(schema["$ref"]), path)
            if errs:
                return errs
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_is_type(value, n) for n in names):
                return [SchemaError(path, f"expected {' or '.join(names)}, got {_short(value)}")]
        if "enum" in schema and not any(json_equal(value, v) for v in schema["enum"]):
            allowed = ", ".join(str(v) for v in schema["enum"])
            return [SchemaError(path, f"{_short(value)} is not one of: {allowed}")]
        if "const" in schema and not json_equal(value, schema["const"]):
            return [SchemaError(path, f"must be {schema['const']!r}")]
        errors: list[SchemaError] = []
        if isinstance(value, dict):
            errors += self._object(value, schema, path)
        elif isinstance(value, list):
            errors += self._array(value, schema, path)
        elif isinstance(value, str):
            errors += self._string(value, schema, path)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            errors += self._number(value, schema, path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                errors += self._alternatives(value, schema[key], key, path)
        if "not" in schema and not self.errors(value, schema["not"], path):
            errors.append(SchemaError(path, "matches a form that is not allowed"))
        return errors

    def _alternatives(self, value: Any, options: list[Any], key: str,
                      path: tuple[str | int, ...]) -> list[SchemaError]:
        results = [self.errors(value, option, path) for option in options]
        matched = sum(1 for r in results if not r)
        if key == "oneOf" and matched > 1:
            return [SchemaError(path, "matches more than one allowed form")]
        if matched:
            return []
        # Report the error of the alternative that got furthest (deepest path).
        best = max(results, key=lambda errs: max(len(e.path) for e in errs))
        if all(len(e.path) == len(path) for e in best):
            descs = "; ".join(errs[0].message for errs in results)
            return [SchemaError(path, f"does not match any allowed form ({descs})")]
        return best

    def _object(self, value: dict[str, Any], schema: Mapping[str, Any],
                path: tuple[str | int, ...]) -> list[SchemaError]:
        errors: list[SchemaError] = []
        props = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(SchemaError(path, f"missing required key {name!r}"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errors.append(SchemaError(path, f"needs at least {schema['minProperties']} key(s)"))
        for key, item in value.items():
            sub_path = (*path, key)
            if "propertyNames" in schema:
                errors += [SchemaError(sub_path, f"key {key!r}: {e.message}")
                           for e in self.errors(key, schema["propertyNames"], sub_path)]
            matched = False
            if key in props:
                matched = True
                errors += self.errors(item, props[key], sub_path)
            for pattern, sub in patterns.items():
                if self._pattern(pattern).search(key):
                    matched = True
                    errors += self.errors(item, sub, sub_path)
            if not matched and "additionalProperties" in schema:
                extra = schema["additionalProperties"]
                if extra is False:
                    allowed = ", ".join(sorted(props)) or "none"
                    errors.append(SchemaError(sub_path, f"unknown key {key!r} (allowed: {allowed})"))
                else:
                    errors += self.errors(item, extra, sub_path)
        return errors

    def _array(self, value: list[Any], schema: Mapping[str, Any],
               path: tuple[str | int, ...]) -> list[SchemaError]:
        errors: list[SchemaError] = []
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(SchemaError(path, f"needs at least {schema['minItems']} item(s)"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(SchemaError(path, f"allows at most {schema['maxItems']} item(s)"))
        if schema.get("uniqueItems"):
            seen: list[Any] = []
            for item in value:
                if any(json_equal(item, other) for other in seen):
                    errors.append(SchemaError(path, f"duplicate item {_short(item)}"))
                seen.append(item)
        if "items" in schema:
            for i, item in enumerate(value):
                errors += self.errors(item, schema["items"], (*path, i))
        return errors

    def _string(self, value: str, schema: Mapping[str, Any],
                path: tuple[str | int, ...]) -> list[SchemaError]:
        errors: list[SchemaError] = []
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(SchemaError(path, "must not be empty" if schema["minLength"] == 1
                                      else f"needs at least {schema['minLength']} characters"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(SchemaError(path, f"allows at most {schema['maxLength']} characters"))
        if "pattern" in schema and not self._pattern(schema["pattern"]).search(value):
            errors.append(SchemaError(path, f"{_short(value)} does not match {schema['pattern']}"))
        return errors

    def _number(self, value: float, schema: Mapping[str, Any],
                path: tuple[str | int, ...]) -> list[SchemaError]:
        errors: list[SchemaError] = []
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(SchemaError(path, f"must be >= {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(SchemaError(path, f"must be <= {schema['maximum']}"))
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(SchemaError(path, f"must be > {schema['exclusiveMinimum']}"))
        return errors


def ecma_anchors(pattern: str) -> str:
    """`pattern` with each `$` outside a character class made end-of-text only (`\\Z`), as in ECMA-262."""
    out: list[str] = []
    in_class = False
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index:index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return "".join(out)


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return name == "boolean"
    if name == "integer" and isinstance(value, float):
        return value.is_integer()  # JSON Schema: 8.0 is an integer
    return isinstance(value, _TYPES[name])


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema defines it: true is not 1, 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def validate_document(data: Any, lines: LineMap, source: str, validator: Validator,
                      error: type[NodewardenError]) -> None:
    """Raise `error` naming the file and line of the first schema violation."""
    errors = validator.errors(data)
    if errors:
        first = min(errors, key=lambda e: lines.line_for(e.path) or 0)
        raise error(f"{describe_path(first.path)}: {first.message}", path=source,
                           line=lines.line_for(first.path))
