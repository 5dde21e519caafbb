"""Value parsers the nvidia-smi importers share (`nvidia-smi -q` and `--query-gpu` CSV).

Each parser takes the text nvidia-smi printed for one value and returns the
NVML answer, or raises `Unreadable` when the text does not have the form
nvidia-smi prints for it (the caller records an unknown NVML error or drops it).
"""

from __future__ import annotations

from collections.abc import Callable


class Unreadable(ValueError):
    """A value that does not have the form nvidia-smi prints for it."""


def choice(table: dict[str, int]) -> Callable[[str], int]:
    """A parser for an enumerated value: its text, case-insensitive, looked up in `table`."""
    def parse(text: str) -> int:
        try:
            return table[text.strip().lower()]
        except KeyError:
            raise Unreadable(text) from None
    return parse


def string(text: str, limit: int | None = None) -> str:
    """The printed text without its padding; with a `limit`, empty or longer text is unreadable."""
    if limit is not None and (not text.strip() or len(text) > limit):
        raise Unreadable(text)
    return text.strip()
