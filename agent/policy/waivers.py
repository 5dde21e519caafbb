"""Waivers: accepted deviations with a reason and an expiry date (InSpec-style).

A waived finding is still evaluated and reported with its waiver; it counts
as waived and never fails the exit code. An expired waiver stops waiving and
raises a warning of its own, so nothing stays silenced by accident.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.core.errors import ConfigError
from agent.core.model import Finding, Severity, Status, Waiver
from agent.io.schema import Validator, validate_document
from agent.io.yamlfile import load_yaml_file

DEFAULT_WAIVERS = Path("/etc/nodewarden/waivers.yaml")

WAIVER_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "waivers": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["check", "reason", "expires"],
                "properties": {
                    "check": {"type": "string", "minLength": 1},
                    "subject": {"type": "string", "minLength": 1},
                    "reason": {"type": "string", "minLength": 1},
                    "expires": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                },
            },
        }
    },
}


def matches_every_check(glob: str, known_checks: Iterable[str]) -> bool:
    """A glob no check can escape (`*`, `*.*`, `?*`): silencing criticals needs a named check or area."""
    known = list(known_checks)
    sentinels = ("x", "zz.zz", "zz.zz.zz.zz")  # ids of no real check, of every shape
    return all(fnmatch.fnmatchcase(s, glob) for s in sentinels) or (bool(known) and all(
        fnmatch.fnmatchcase(check, glob) for check in known))


def load_waivers(path: Path, known_checks: Iterable[str] = ()) -> list[Waiver]:
    known = tuple(known_checks)
    data, lines = load_yaml_file(path, ConfigError, trusted="waivers file")
    if data is None:
        return []
    validate_document(data, lines, str(path), Validator(WAIVER_SCHEMA), ConfigError)
    waivers = []
    for index, item in enumerate(data.get("waivers") or []):
        line = lines.line_for(("waivers", index))
        if matches_every_check(item["check"], known):
            raise ConfigError(f"waivers[{index}].check: {item['check']!r} matches every check; a waiver must "
                              "name a check or an area (e.g. 'gpu.ecc.mode', 'bmc.*')", path=str(path), line=line)
        try:
            dt.date.fromisoformat(item["expires"])
        except ValueError:
            raise ConfigError(f"waivers[{index}].expires: {item['expires']!r} is not a date",
                              path=str(path), line=line) from None
        waivers.append(Waiver(item["check"], item.get("subject", "*"), item["reason"], item["expires"],
                              str(path), line))
    return waivers


def apply_waivers(findings: list[Finding], waivers: list[Waiver], today: dt.date) -> list[Finding]:
    """Attach live waivers to matching findings; add a warning per expired waiver."""
    extra: list[Finding] = []
    for waiver in waivers:
        expired = dt.date.fromisoformat(waiver.expires) < today
        matched = [f for f in findings if fnmatch.fnmatchcase(f.check, waiver.check)
                   and fnmatch.fnmatchcase(f.subject, waiver.subject)]
        if expired:
            where = f" ({waiver.file}:{waiver.line})" if waiver.file else ""
            extra.append(Finding(
                check="waiver.expired", subject=f"{waiver.check}/{waiver.subject}", status=Status.WARN,
                severity=Severity.WARNING, source="host",
                message=f"waiver for {waiver.check} on {waiver.subject} expired {waiver.expires}{where}; "
                        f"it no longer waives {len(matched)} finding(s)",
                observed=waiver.expires, expected=f"on or after {today.isoformat()}",
                reason=waiver.reason, action="review_waiver"))
            continue
        for finding in matched:
            if finding.waiver is None:
                finding.waiver = waiver
    return findings + extra
