"""YAML loading that remembers where every value came from.

Profiles, waivers and config files are written by people; an error must name
the file and line. PyYAML's composer gives nodes with marks, and we build the
Python values ourselves so we can also refuse duplicate keys (PyYAML keeps
the last one silently) and keep dates as plain ISO strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agent.errors import NodewardenError

try:  # the C parser is 5-10x faster; fall back to pure Python where absent
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

PathKey = tuple[str | int, ...]
_SCALARS = yaml.constructor.SafeConstructor()
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class LineMap(dict[PathKey, int]):
    """Maps a value's path (keys and indices) to its 1-based line."""

    def line_for(self, path: PathKey) -> int | None:
        # Walk up to the nearest ancestor we know (a missing key's parent).
        for end in range(len(path), -1, -1):
            line = self.get(path[:end])
            if line is not None:
                return line
        return None


def _build(node: yaml.Node, path: PathKey, lines: LineMap, error: type[NodewardenError],
           source: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                raise error("keys must be plain scalars (no merge keys or complex keys)",
                            path=source, line=key_node.start_mark.line + 1)
            key = str(key_node.value)
            if key in out:
                raise error(f"duplicate key {key!r}", path=source, line=key_node.start_mark.line + 1)
            out[key] = _build(value_node, (*path, key), lines, error, source)
            lines[path + (key,)] = key_node.start_mark.line + 1  # noqa: RUF005 - 3.10 syntax
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), lines, error, source) for i, item in enumerate(node.value)]
    if node.tag == _TIMESTAMP:
        return str(node.value)  # keep dates as ISO text; JSON has no date type
    return _SCALARS.construct_object(node)


def parse_yaml(text: str, source: str, error: type[NodewardenError] = NodewardenError) -> tuple[Any, LineMap]:
    """Parse one YAML document into plain values plus a LineMap."""
    lines = LineMap()
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        start, end = exc.context_mark, exc.problem_mark
        if exc.context and start and end and start.line != end.line:
            problem += f" ({exc.context} started at line {start.line + 1})"
        raise error(f"invalid YAML: {problem}", path=source,
                    line=(mark.line + 1) if mark else None) from None
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML: {exc}", path=source) from None
    if node is None:
        return None, lines
    try:
        return _build(node, (), lines, error, source), lines
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise error(f"invalid YAML value: {exc.problem}", path=source,
                    line=(mark.line + 1) if mark else None) from None


def load_yaml_file(path: Path, error: type[NodewardenError] = NodewardenError) -> tuple[Any, LineMap]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", path=str(path)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"not valid UTF-8 (byte {exc.start})", path=str(path), line=line) from None
    return parse_yaml(text, str(path), error)
