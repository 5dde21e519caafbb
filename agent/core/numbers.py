"""Numbers and times from outside (a BMC, a snapshot, a kernel log), bounded before any arithmetic.

JSON and `float()` accept what no sensor reports: `NaN`, `Infinity`, `1e999` (infinity), integers
of thousands of digits (`float()` of one raises OverflowError; `int()` of text past 4,300 digits
raises ValueError). A datetime near year 1 or 9999 overflows on the first `- timedelta`. Each
helper returns a finite value of a sane magnitude, or None, and the caller reports that reading as
`unknown` with a message instead of letting the audit crash (exit 3).
"""

from __future__ import annotations

import datetime as dt
import math
import re

MAGNITUDE = 1e15  # well past any reading (watts, °C, RPM, counts, seconds) and exact as a float
_TEXT_CHARS = 64  # a number written as text, longer than any real one
_NUMBER_TEXT = re.compile(r"^\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?\s*$")
# Times nodewarden judges: the Unix era to well before datetime's end, so that +- a few centuries of
# timedelta (windows, zone offsets, uptimes) can never overflow.
MIN_YEAR, MAX_YEAR = 1970, 9000
MAX_UPTIME_S = 100 * 365.25 * 86400  # a century: past that, /proc/uptime is not an uptime


def finite(value: object, *, low: float = -MAGNITUDE, high: float = MAGNITUDE) -> float | None:
    """`value` (an int, a float, or a number written as text) as a float in [low, high]; else None.

    bool is not a number; NaN and infinities are refused; a huge int is compared as an int (exact,
    no OverflowError) and refused before it is ever converted.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if low <= value <= high else None
    if isinstance(value, float):
        return value if math.isfinite(value) and low <= value <= high else None
    if isinstance(value, str) and len(value) <= _TEXT_CHARS and _NUMBER_TEXT.match(value):
        return finite(float(value), low=low, high=high)
    return None


def is_number_text(value: str) -> bool:
    """Whether `value` is a plain decimal number as text (no NaN, inf, underscores or hex)."""
    return len(value) <= _TEXT_CHARS and _NUMBER_TEXT.match(value) is not None


def sane_time(when: dt.datetime | None) -> dt.datetime | None:
    """`when` if its year (in UTC when aware) is one nodewarden can reason about, else None."""
    if when is None:
        return None
    if not MIN_YEAR <= when.year <= MAX_YEAR:
        return None  # checked first: astimezone near year 1 or 9999 overflows
    if when.tzinfo is not None and not MIN_YEAR <= when.astimezone(dt.timezone.utc).year <= MAX_YEAR:
        return None
    return when


def parse_iso_time(text: object) -> dt.datetime | None:
    """An ISO 8601 stamp (`Z` allowed; naive read as UTC) within the sane years, else None."""
    if not isinstance(text, str) or len(text) > _TEXT_CHARS:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return sane_time(stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc))
