"""Generate profiles/schema.json and the README's check reference from the check registry.

A check declares what it reads from a profile (`Check.expect_path`, `Check.schema`: the JSON-Schema
fragment under `expect.<expect_path>`). The shared definitions (comparators, severity, reason, match
rules) and the sections no check owns yet ("legacy": moved into their check modules one by one) are
hand-written in profiles/schema_base.json. The generated schema is the base plus every check's
fragment; tests fail when the committed files differ from what this module produces:

    python -m agent.apps.cli.schema_gen > profiles/schema.json
    python -m agent.apps.cli.schema_gen --readme          # rewrites the table between the README markers
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from checks import Check, all_checks

REPO = Path(__file__).resolve().parents[3]  # agent/apps/cli/schema_gen.py -> the checkout
BASE_PATH = REPO / "profiles" / "schema_base.json"
README_BEGIN = "<!-- checks:begin -->"
README_END = "<!-- checks:end -->"


def _container() -> dict[str, Any]:
    """A profile section that only holds named keys (created for a check's expect_path)."""
    return {"type": ["object", "null"], "additionalProperties": False, "properties": {}}


def _place(expect: dict[str, Any], check: Check) -> None:
    if check.schema is None:
        return
    if not check.expect_path:
        raise ValueError(f"check {check.id} has a schema fragment but no expect_path")
    node = expect
    for part in check.expect_path[:-1]:
        props = node.setdefault("properties", {})
        child = props.setdefault(part, _container())
        if "properties" not in child or child.get("additionalProperties") is not False:
            raise ValueError(f"check {check.id}: expect.{part} is not a section of named keys")
        node = child
    props = node.setdefault("properties", {})
    leaf = check.expect_path[-1]
    if leaf in props:
        raise ValueError(f"check {check.id}: expect.{'.'.join(check.expect_path)} is declared twice "
                         "(by another check, or still in profiles/schema_base.json)")
    props[leaf] = copy.deepcopy(dict(check.schema))


def generate_schema(checks: Iterable[Check] | None = None,
                    base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The profile schema: the hand-written base plus each check's fragment, in check id order."""
    schema: dict[str, Any] = copy.deepcopy(dict(base)) if base is not None else json.loads(
        BASE_PATH.read_text(encoding="utf-8"))
    schema.pop("$comment", None)  # the base's note to its editors, not part of the schema
    expect = schema["$defs"]["expect"]
    for check in sorted(all_checks() if checks is None else checks, key=lambda c: c.id):
        _place(expect, check)
    return schema


def schema_text(schema: Mapping[str, Any] | None = None) -> str:
    return json.dumps(generate_schema() if schema is None else schema, indent=2) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def checks_table(checks: Iterable[Check] | None = None) -> str:
    """The README's check reference: one row per registered check."""
    rows = ["| id | title | source | what counts as evidence | default action |",
            "|---|---|---|---|---|"]
    for check in sorted(all_checks() if checks is None else checks, key=lambda c: c.id):
        source = check.source + "".join(f" + {r}" for r in check.reads)
        parts = [f"`{check.action}`"] if check.action else []
        if check.remediation:
            parts.append(f"fix: `{check.remediation}`")
        action = ", ".join(parts) or "-"
        rows.append(f"| `{check.id}` | {_cell(check.title)} | {source} | {_cell(check.evidence) or '-'} | {action} |")
    return "\n".join(rows) + "\n"


def readme_with_table(readme: str, table: str | None = None) -> str:
    """`readme` with the text between the check markers replaced by the generated table."""
    start = readme.index(README_BEGIN) + len(README_BEGIN)
    end = readme.index(README_END, start)
    return readme[:start] + "\n" + (checks_table() if table is None else table) + readme[end:]


def main(argv: list[str]) -> int:
    if argv == ["--readme"]:
        path = REPO / "README.md"
        text = path.read_text(encoding="utf-8")
        new = readme_with_table(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
        return 0
    if argv:
        sys.stderr.write("usage: python -m agent.apps.cli.schema_gen [--readme]\n")
        return 2
    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
