"""A rule's window as profiles write it ("24h", "7d", "2w"): the one grammar the history and counter
rules share (agent.core.history_rules, agent.core.counters). Standard library only."""

from __future__ import annotations

import re

_WINDOW_RE = re.compile(r"^([1-9][0-9]{0,5})(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_WINDOW_S = 366 * 86400


def window_seconds(text: str) -> float:
    """'24h' -> 86400.0; raises ValueError for anything else (profiles are validated first)."""
    match = _WINDOW_RE.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"window {text!r} is not N followed by s, m, h, d or w")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"window {text!r} is longer than a year")
    return float(seconds)
