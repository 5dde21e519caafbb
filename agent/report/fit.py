"""Lines that fit the terminal: names wrap (never cut), a message is cut without -v and wraps with it.

The standard library's textwrap does the breaking: the table is plain text with at most two
coloured words per row (styled after fitting, so escape codes never count as width), which needs
no layout engine (docs/decisions.md).
"""

from __future__ import annotations

import textwrap

MIN_WIDTH = 40  # narrower terminals are treated as this wide (a line may then overflow)
MIN_MESSAGE = 24  # a message with less room than this beside its head goes to the next line
NARROW_INDENT = " " * 6  # continuation lines where the table's own columns leave no room


def clamp(width: int) -> int:
    return max(MIN_WIDTH, width)


def wrap(text: str, width: int, indent: str = "", first: str = "") -> list[str]:
    """`text` broken at spaces into lines of at most `width` (a word longer than a line is split)."""
    lines = textwrap.wrap(text, width=clamp(width), initial_indent=first, subsequent_indent=indent,
                          break_long_words=True, break_on_hyphens=False)
    return [line.rstrip() for line in lines] or [first.rstrip()]


def cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(room - 3, 1)] + "..."


def continuation(indent: str, width: int) -> str:
    """The indent for a row's further lines: the message column, or a small one if that leaves no room."""
    return indent if len(indent) <= clamp(width) - 2 * MIN_MESSAGE else NARROW_INDENT


def row(head: str, message: str, width: int, indent: str, verbose: bool) -> list[str]:
    """`head` (status, names: never cut) then `message`, in lines of at most `width`.

    The message starts on the head's line when there is room for it there (MIN_MESSAGE), else on
    the next line at `indent`; without `verbose` it is cut to one line, with it it wraps.
    """
    width = clamp(width)
    indent = continuation(indent, width)
    if len(head) + MIN_MESSAGE <= width:
        if not verbose:
            return [(head + cut(message, width - len(head))).rstrip()]
        lines = textwrap.wrap(message, width=width, initial_indent=" " * len(head), subsequent_indent=indent,
                              break_long_words=True, break_on_hyphens=False) or [" " * len(head)]
        return [(head + lines[0][len(head):]).rstrip(), *(line.rstrip() for line in lines[1:])]
    lines = wrap(head.rstrip(), width, indent)
    if not message:
        return lines
    if not verbose:
        return [*lines, indent + cut(message, width - len(indent))]
    return [*lines, *wrap(message, width, indent, indent)]
