"""Text from outside made safe for every output format: one helper for all renderers.

Hostnames, sysctl values, BMC strings, NVML names and fleet files can hold
anything: ESC sequences that repaint an operator's terminal, NUL and other
characters XML 1.0 forbids (a JUnit file no parser reads), newlines that
break a table row or a Prometheus sample, bidi overrides that make text read
backwards, and lone surrogates (a JSON `"\\udcff"`) that no UTF-8 writer can
encode at all. `clean` replaces each of those with a visible escape (`\\x1b`,
`\\n`, `\\u202e`; a surrogate standing for a raw byte becomes `\\xff`), so the
output stays one line per value, valid in its format, and still shows what
was there. Clean text is returned as is (one regex search), and cleaning is
idempotent: fleet reports re-clean already clean audit JSON for nothing.

On top of that, per format: `csv_cell` neutralises spreadsheet formulas
(a cell starting with `= + - @` gets a leading `'`, plain numbers excepted),
and `md_cell` escapes Markdown (`|` would end a table cell; `*`, `_`, `` ` ``,
`~`, `[`, `]`, `<`, `>` and `\\` would format, link or open raw HTML).
"""

from __future__ import annotations

import re
from typing import Any

from agent.core.lazyre import lazy_compile

# C0 controls (tab and newline included), DEL, C1 controls, bidi marks and overrides, line and
# paragraph separators, BOM, the two noncharacters XML forbids, and every surrogate code point.
_NOT_US = ("\x00-\x09\x0b-\x1e\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ufffe\uffff"
           "\ud800-\udfff")  # all but newline and \x1f (the unit separator, used to join a CSV row below)
_UNSAFE_CHARS = _NOT_US + "\x1f"
_UNSAFE = re.compile(f"[\n{_UNSAFE_CHARS}]")
_UNSAFE_BUT_NEWLINE = lazy_compile(f"[{_UNSAFE_CHARS}]")  # for formats that escape newlines themselves
_UNSAFE_BUT_US = lazy_compile(f"[\n{_NOT_US}]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
FORMULA_START = ("=", "+", "-", "@")
_FORMULA_AFTER_US = tuple("\x1f" + c for c in FORMULA_START)
_NUMBER = lazy_compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_MARKDOWN = lazy_compile(r"([\\`*_\[\]<>|~])")  # what ends a cell, formats, links or starts HTML


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the raw byte that did not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str, *, newlines: bool = False) -> str:
    """`text` with every unsafe character replaced by a visible escape (`newlines`: keep `\\n`)."""
    pattern = _UNSAFE_BUT_NEWLINE() if newlines else _UNSAFE
    return text if pattern.search(text) is None else pattern.sub(_escape, text)


def is_clean(text: str) -> bool:
    return _UNSAFE.search(text) is None


def clean_value(value: Any) -> Any:
    """A JSON-like value with every string (keys included) cleaned; other values as they are."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_value(v) for v in value]
    return value


def csv_cell(text: str) -> str:
    """A clean CSV cell that a spreadsheet shows as text, never runs as a formula."""
    text = clean(text)
    if text.startswith(FORMULA_START) and _NUMBER().fullmatch(text) is None:
        return "'" + text
    return text


def csv_row(cells: list[str]) -> list[str]:
    """`csv_cell` of each cell; a row that needs nothing (the usual case) costs a few C-level searches."""
    joined = "\x1f" + "\x1f".join(cells)  # each cell follows one \x1f: formulas are "\x1f=" etc.
    if (_UNSAFE_BUT_US().search(joined) is None and joined.count("\x1f") == len(cells)
            and not any(start in joined for start in _FORMULA_AFTER_US)):
        return cells
    return [csv_cell(cell) for cell in cells]


def md_cell(value: Any) -> str:
    """One Markdown table cell: clean, one line, with Markdown's special characters escaped."""
    return _MARKDOWN().sub(r"\\\1", clean(str(value)))
