"""The health-check decisions a state folder's ledger holds, as the JSON entries health-check kept
(agent.apps.scheduler.trail.record: each decision's detail is its JSON line), oldest first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.state.ledger import open_ledger


def decisions(state_dir: Path) -> list[dict[str, Any]]:
    try:
        ledger = open_ledger(state_dir, readonly=True)
    except FileNotFoundError:
        return []
    with ledger:
        kept = ledger.window(0.0, kinds=("decision", "drain", "resume"))
    return [json.loads(i.detail) for i in kept if i.source == "health-check"]
