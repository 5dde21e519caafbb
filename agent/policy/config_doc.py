"""The configuration's documentation, generated from its schema (agent.policy.config.CONFIG_SCHEMA).

Two renderings of one source, so neither can drift from what the loader accepts:
* `example_config()`: /etc/nodewarden/config.yaml as `nodewarden install` writes it, every key
  present and commented out, with its meaning and default;
* `reference_markdown()`: docs/config.md (a test fails when the committed file differs; regenerate
  with `python -m agent.policy.config_doc > docs/config.md`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from agent.policy.config import CONFIG_SCHEMA


def _keys(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(dotted key, depth, schema) for every documented key, in schema order."""
    for name, node in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        yield key, key.count("."), node
        if node.get("type") == "object" and "properties" in node:
            yield from _keys(node, f"{key}.")


def _type(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return " | ".join(str(v) for v in node["enum"])
    kind = node.get("type", "")
    if kind == "array":
        return "list of " + str(node.get("items", {}).get("type", "values"))
    return str(kind)


def _yaml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) or any(c in value for c in ":#{}[],'\"") else value


def example_config() -> str:
    lines = ["# /etc/nodewarden/config.yaml: every key, commented out, with its default.",
             "# Uncomment what this node needs; command-line options win over this file.",
             "# Reference: docs/config.md (generated from the same schema as this file).", ""]
    for key, depth, node in _keys(CONFIG_SCHEMA):
        indent = "  " * depth
        name = key.rsplit(".", 1)[-1]
        lines.append(f"{indent}# {node.get('description', '')}")
        if node.get("type") == "object" and "properties" in node:
            lines.append(f"{indent}#{name}:")
            continue
        value = node["default"] if "default" in node else (node.get("examples") or [None])[0]
        shown = "" if value is None else f" {_yaml(value)}"
        lines.append(f"{indent}#{name}:{shown}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text for one Markdown table cell: a bare `|` (enums, descriptions) would start a new column."""
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    out = ["# Configuration reference", "",
           "Generated from `agent/policy/config.py` by `python -m agent.policy.config_doc > docs/config.md`; "
           "do not edit.",
           f"{CONFIG_SCHEMA['description']}. `nodewarden install` writes an example with every key commented out.",
           "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for key, _depth, node in _keys(CONFIG_SCHEMA):
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        example = f" (e.g. `{json.dumps(node['examples'][0])}`)" if node.get("examples") else ""
        meaning = _cell(f"{node.get('description', '')}{example}")
        out.append(f"| `{key}` | {_cell(_type(node))} | {_cell(default)} | {meaning} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
