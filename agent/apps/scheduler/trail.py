"""Every health-check decision, kept: in the node's ledger (agent.state.ledger, issue 33: it replaced
the decisions.jsonl this module rewrote whole, up to 1 MiB, at every run) and the logger; and the
per-node hysteresis memory (`scheduler/slurm-NODE.json`).

Each decision is one incident: kind `drain` or `resume` for those acts (the history rules count them),
`decision` for the others (none, unknown, failed, breaker); its detail is the decision's JSON line of at
most MAX_LINE characters (the GPUs a drain names shrink first). `nodewarden ledger export --kind decision
--kind drain --kind resume` gives them back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.apps.scheduler.state import MAX_SMALL_BYTES
from agent.core.errors import NodewardenError
from agent.io.fsutil import replace_file
from agent.io.jsonfile import JsonInputError, load_json_file
from agent.state.layout import scheduler_folder

log = logging.getLogger("nodewarden.scheduler")

MAX_LINE = 2048


def _line(entry: dict[str, Any]) -> str:
    """One JSON line of at most MAX_LINE characters: a drain's GPUs shrink to index and UUID, then go,
    before the line would be cut (a cut line is no JSON: the next rewrite drops it)."""
    def dump(doc: dict[str, Any]) -> str:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)

    line = dump(entry)
    if len(line) > MAX_LINE and isinstance(entry.get("gpus"), list):
        line = dump({**entry, "gpus": [{k: g[k] for k in ("index", "uuid") if k in g}
                                       for g in entry["gpus"] if isinstance(g, dict)]})
        if len(line) > MAX_LINE:
            line = dump({k: v for k, v in entry.items() if k != "gpus"})
    return line[:MAX_LINE]


def record(state_dir: Path, entry: dict[str, Any]) -> str | None:
    """Log `entry` and keep it in the node's ledger (kind drain or resume for those acts, which
    history.node counts, else decision; the detail is the whole JSON line); the error text when the
    ledger could not be written (the decision stands: it is logged and Slurm holds it)."""
    from agent.engine.history import action_incident, record_action

    line = _line(entry)
    action = str(entry.get("action") or "")
    level = logging.CRITICAL if action == "breaker" else (
        logging.WARNING if action in ("drain", "unknown", "failed") else logging.INFO)
    log.log(level, "health-check %s: %s", action, entry.get("why", ""),
            extra={"fields": {"event": "health_check", **entry}})
    at = entry.get("at")
    severity = {logging.CRITICAL: "critical", logging.WARNING: "warning"}.get(level, "info")
    incident = action_incident(action if action in ("drain", "resume") else "decision", "health-check",
                               action or "none", str(entry.get("node") or ""), line, severity=severity,
                               now=float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None)
    unwritten = record_action(state_dir, incident)
    if unwritten:
        log.error("could not keep the health-check decision in the ledger: %s", unwritten)
    return unwritten


Cause = tuple[str, str]  # (check, subject) of a finding that made the verdict bad
MAX_CAUSES = 64  # a drain's causes kept; more is a node to look at by hand anyway


@dataclass
class Memory:
    """What a node's earlier checks leave for the next: healthy checks in a row since our drain, and
    the checks and subjects that caused it (each must come back `pass` before a resume)."""

    healthy: int = 0
    drained_at: float | None = None  # when nodewarden drained it (for require_accept)
    causes: tuple[Cause, ...] = ()


def _memory_path(state_dir: Path, node: str, *, create: bool) -> Path:
    return scheduler_folder(state_dir, create=create) / f"slurm-{node}.json"  # node names are validated: [A-Za-z0-9._-]


def recall(state_dir: Path, node: str) -> Memory:
    try:
        doc = load_json_file(_memory_path(state_dir, node, create=False), max_bytes=MAX_SMALL_BYTES,
                             what="health-check memory")
    except (OSError, JsonInputError, NodewardenError):
        return Memory()  # forgetting only delays a resume: the safe direction
    if not isinstance(doc, dict):
        return Memory()
    healthy, drained = doc.get("healthy"), doc.get("drained_at")
    return Memory(healthy if isinstance(healthy, int) and not isinstance(healthy, bool) and 0 <= healthy < 10**6
                  else 0,
                  float(drained) if isinstance(drained, int | float) and not isinstance(drained, bool)
                  and 0 <= drained < 1e11 else None,
                  _causes(doc.get("causes")))


def _causes(value: object) -> tuple[Cause, ...]:
    """The causes read back; anything malformed is dropped, which leaves the drain without causes:
    never resumed on its own (the safe direction)."""
    if not isinstance(value, list):
        return ()
    pairs = [(c, s) for c, s in (p for p in value[:MAX_CAUSES] if isinstance(p, list) and len(p) == 2)
             if isinstance(c, str) and isinstance(s, str) and 0 < len(c) <= 200 and 0 < len(s) <= 200]
    return tuple(dict.fromkeys(pairs)) if len(pairs) == len(value) else ()


def remember(state_dir: Path, node: str, memory: Memory) -> None:
    replace_file(_memory_path(state_dir, node, create=True),
                 json.dumps({"healthy": memory.healthy, "drained_at": memory.drained_at,
                             "causes": [list(c) for c in memory.causes[:MAX_CAUSES]]}) + "\n", 0o600)
