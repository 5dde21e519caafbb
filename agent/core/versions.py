"""Vendor firmware versions: what `version_min` / `version_max` compare.

BMCs report versions in their vendor's own format; each is parsed into a family (which firmware
line the version belongs to), a release (the parts that order), and a build date or build id
where the format carries one. Formats, with the real strings they come from:

* HPE System ROM `U58 v2.44 (01/17/2025)`: family `U58` (the platform's ROM family), release 2.44,
  date. A `U46` ROM is another platform's firmware: not comparable with a `U58` bound.
* HPE iLO `iLO 5 v3.11` (Manager.FirmwareVersion; family `iLO 5`), `3.11 Feb 25 2025`,
  `2.81 Feb 06 2023` (the inventory's version plus build date).
* Lenovo `TEI334L 2.10`, `TEE142M-2.41`: build id, whose three-letter prefix is the family
  (one firmware of one product line), and the release.
* Supermicro `2.1b`: a letter after a number is a respin, so 2.1 < 2.1a < 2.1b < 2.2 < 2.10.
* Dell `2.19.1`, `7.10.50.00`; NVIDIA `535.129.03`; VBIOS `96.00.74.00.0D` (hex parts, when both
  sides look like a VBIOS); `0x20` (a hex number).

Two versions of different families are never compared as numbers. A bound without a family
compares with any observed family (the profile names the release it means). A `version_min` of
`0` (or `0.0`, or empty) is "no minimum": any version passes and is shown.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, NamedTuple

Part = tuple[int, int, str] | tuple[int, str]  # (0, number, letter suffix) or (1, text): text sorts last

_HEX_VERSION = re.compile(r"^[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){3,}$")
_HPE_ROM = re.compile(r"^(?:(?P<family>[A-Z]\d{2,3})\s+)?v(?P<release>\d+(?:\.\d+)+)"
                      r"(?:\s*\((?P<date>\d{1,2}/\d{1,2}/\d{4})\))?$")
_ILO = re.compile(r"^(?P<family>iLO)\s*(?P<generation>\d+)\s+v?(?P<release>\d[\w.]*)"
                  r"(?:\s+(?P<date>[A-Z][a-z]{2}\s+\d{1,2}\s+\d{4}))?$", re.IGNORECASE)
_LENOVO = re.compile(r"^(?P<family>[A-Z]{3})(?P<build>[A-Z0-9]{3}[A-Z])[\s_-]+v?(?P<release>\d+(?:\.\d+)+[a-z]?)$")
_TRAILING_DATE = re.compile(r"^(?P<release>v?\d[\w.\-]*?)(?:\s+|_)(?P<date>[A-Z][a-z]{2}\s+\d{1,2}\s+\d{4}"
                            r"|\d{1,2}-\d{1,2}-\d{4})$")
_NUMBER = re.compile(r"^(\d+)([A-Za-z]?)$")
_HEX_NUMBER = re.compile(r"^0x[0-9A-Fa-f]+$")
_DATE_FORMATS = ("%m/%d/%Y", "%b %d %Y", "%m-%d-%Y")
MAX_TEXT = 128  # a version longer than this is not a version


class Version(NamedTuple):
    text: str
    release: tuple[Part, ...]
    family: str | None = None  # "U58", "iLO 5", "TEI": versions of different families do not compare
    date: dt.date | None = None  # the build date the format carries
    build: str | None = None  # Lenovo's build id after the family ("334L"; orders equal releases)

    @property
    def is_zero(self) -> bool:
        """`0`, `0.0`: the profile's way of saying "no minimum" (base records every version)."""
        return self.family is None and all(p == (0, 0, "") for p in self.release)


def _date(text: str | None) -> dt.date | None:
    if not text:
        return None
    for fmt in _DATE_FORMATS:
        try:
            return dt.datetime.strptime(" ".join(text.split()), fmt).date()
        except ValueError:
            continue
    return None


def _parts(text: str, hex_parts: bool = False) -> tuple[Part, ...]:
    parts: list[Part] = []
    for token in re.split(r"[.\-_\s]+", text.strip()):
        if not token or token.lower() == "build":  # "13.3.0 Build 37" is 13.3.0.37
            continue
        number = _NUMBER.match(token)
        if hex_parts:
            parts.append((0, int(token, 16), ""))
        elif number:
            parts.append((0, int(number.group(1)), number.group(2).lower()))
        elif _HEX_NUMBER.match(token):
            parts.append((0, int(token, 16), ""))
        else:
            parts.append((1, token.lower()))
    while len(parts) > 1 and parts[-1] == (0, 0, ""):
        parts.pop()  # 2.1 == 2.1.0
    return tuple(parts)


def parse(value: Any, hex_parts: bool = False) -> Version | None:
    """A vendor version, or None for text that is not one ("N/A", "Unknown", "", None, True)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    text = " ".join(str(value).split())
    if not text or len(text) > MAX_TEXT or not any(c.isdigit() for c in text):
        return None
    if hex_parts:
        return Version(text, _parts(text, hex_parts=True))
    rom = _HPE_ROM.match(text)
    if rom:
        return Version(text, _parts(rom["release"]), rom["family"], _date(rom["date"]))
    ilo = _ILO.match(text)
    if ilo:
        return Version(text, _parts(ilo["release"]), f"iLO {ilo['generation']}", _date(ilo["date"]))
    lenovo = _LENOVO.match(text)
    if lenovo:
        return Version(text, _parts(lenovo["release"]), lenovo["family"], None, lenovo["build"])
    dated = _TRAILING_DATE.match(text)
    if dated and _date(dated["date"]) is not None:
        return Version(text, _parts(dated["release"].lstrip("vV")), None, _date(dated["date"]))
    return Version(text, _parts(text.lstrip("vV")))


def is_no_minimum(bound: Any) -> bool:
    """`version_min: "0"` (or 0, "0.0", "", null): no minimum, the version is only recorded."""
    if bound is None or (isinstance(bound, str) and not bound.strip()):
        return True
    parsed = parse(bound)
    return parsed is not None and parsed.is_zero


def compare(observed: Any, bound: Any) -> int | str:
    """-1, 0 or 1 as `observed` is older than, equal to or newer than `bound`; or why they cannot
    be compared (not a version, or versions of different families)."""
    hex_parts = all(isinstance(v, str) and _HEX_VERSION.match(v.strip()) for v in (observed, bound))
    seen, limit = parse(observed, hex_parts), parse(bound, hex_parts)
    if seen is None:
        return f"{observed!r} is not a version"
    if limit is None:
        return f"the bound {bound!r} is not a version"
    if seen.family and limit.family and seen.family.lower() != limit.family.lower():
        return (f"{seen.text} is {seen.family} firmware and the bound {limit.text} is {limit.family}: "
                "versions of different firmware families are not compared")
    order = _order(seen.release, limit.release)
    if order == 0 and seen.date and limit.date:
        order = _order(seen.date, limit.date)  # the same release rebuilt later
    if order == 0 and seen.build and limit.build:
        order = _order(seen.build, limit.build)
    return order


def _order(mine: Any, theirs: Any) -> int:
    return -1 if mine < theirs else 1 if mine > theirs else 0
