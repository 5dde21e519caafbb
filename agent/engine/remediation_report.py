"""Remediation output: a readable plan (table) or the machine contract (json)."""

from __future__ import annotations

import json
from typing import Any

from agent.core.sanitise import clean, clean_value
from agent.engine.remediate import RemediationResult


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return clean(", ".join(f"{k} on {v}" for k, v in value.items()))
    return "-" if value is None else clean(str(value))


def render_remediation(result: RemediationResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(clean_value(result.to_json()), indent=2, sort_keys=False) + "\n"
    lines = [f"{result.mode} for {clean(result.target)} (profile {clean(result.profile)})"
             + (f", run {result.run_id}" if result.run_id else "")]
    if not result.actions:
        lines.append("  nothing to do: every remediable setting matches the profile")
    for action in result.actions:
        lines.append(f"  {action.outcome.value:<11} {action.action_class.value:<10} {clean(action.id)}: "
                     f"{_short(action.before)} -> {_short(action.after)}")
        if action.refused or action.error:
            lines.append(f"      reason: {clean(action.refused or action.error or '')}")
        for note in action.notes:
            lines.append(f"      note: {clean(note)}")
    if result.mode == "plan" and any(a.outcome.value == "planned" for a in result.actions):
        if result.simulated:  # --apply is refused on a simulated node: say how to practise instead (36.8)
            lines.append(f"a simulated node is read-only: to apply these, make a copy with `nodewarden snapshot "
                         f"capture --simulate {clean(result.simulated)} --out DIR` and run remediate --snapshot DIR "
                         "--apply")
        else:
            lines.append("run again with --apply to make these changes")
    if result.reboot_required:
        lines.append("a reboot is required for some changes to take effect")
    return "\n".join(lines) + "\n"
