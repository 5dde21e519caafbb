"""Numbered names said once: `gpu0`..`gpu7` is `gpu0-7`, `Power Supply.Slot.1`..`6` is `Power Supply.Slot.1-6`.

The range mark is an en dash (U+2013), shown here as `-`.

Used where one line stands for several parts (the table's collapsed rows, firmware groups). The
result is never ambiguous: names compress only when they differ in exactly one number, and every
number is kept (`gpu0-2,5`, `mlx5_{0-3}/1`), never an ellipsis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DASH = "\u2013"  # en dash: a range, as in gpu0-7
_NUMBER = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts gpu2 before gpu10."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _NUMBER.split(text) if part)


def ranges(numbers: Iterable[str]) -> str:
    """`["0", "1", "2", "5"]` -> `0-2,5` (the numbers' own spelling, leading zeros kept)."""
    ordered = sorted(set(numbers), key=lambda n: (int(n), n))
    runs: list[list[str]] = []
    for number in ordered:
        if runs and int(number) == int(runs[-1][-1]) + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ",".join(run[0] if len(run) == 1 else f"{run[0]},{run[1]}" if len(run) == 2 else
                    f"{run[0]}{DASH}{run[-1]}" for run in runs)


def compress(names: Iterable[str]) -> str | None:
    """One name for names that differ in one number only; the name itself if they are all equal.

    None when they differ in anything else (text, or more than one number): list them instead.
    """
    unique = sorted(set(names), key=natural_key)
    if not unique:
        return None
    if len(unique) == 1:
        return unique[0]
    split = [_NUMBER.split(name) for name in unique]
    if len({len(parts) for parts in split}) != 1:
        return None
    varying = [i for i in range(len(split[0])) if len({parts[i] for parts in split}) > 1]
    if len(varying) != 1 or varying[0] % 2 == 0:  # odd positions are the numbers
        return None
    at = varying[0]
    head, tail = "".join(split[0][:at]), "".join(split[0][at + 1:])
    numbers = ranges(parts[at] for parts in split)
    if tail and not tail[0].isspace():
        numbers = "{" + numbers + "}"  # mlx5_{0-7}/1: where the numbers end stays visible
    return f"{head}{numbers}{tail}"
