"""Remediation output: a readable plan (table) or the machine contract (json)."""

from __future__ import annotations

import json
from typing import Any

from agent.remediate import RemediationResult


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} on {v}" for k, v in value.items())
    return "-" if value is None else str(value)


def render_remediation(result: RemediationResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(result.to_json(), indent=2, sort_keys=False) + "\n"
    lines = [f"{result.mode} for {result.target} (profile {result.profile})"
             + (f", run {result.run_id}" if result.run_id else "")]
    if not result.actions:
        lines.append("  nothing to do: every remediable setting matches the profile")
    for action in result.actions:
        lines.append(f"  {action.outcome.value:<11} {action.action_class.value:<10} {action.id}: "
                     f"{_short(action.before)} -> {_short(action.after)}")
        if action.refused or action.error:
            lines.append(f"      reason: {action.refused or action.error}")
        for note in action.notes:
            lines.append(f"      note: {note}")
    if result.mode == "plan" and any(a.outcome.value == "planned" for a in result.actions):
        lines.append("run again with --apply to make these changes")
    if result.reboot_required:
        lines.append("a reboot is required for some changes to take effect")
    return "\n".join(lines) + "\n"
