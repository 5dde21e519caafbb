"""The node's ledger (issue 33): what happened, kept across restarts and reboots, in STATE_DIR.

One entry point for the rest of nodewarden: `open_ledger(state_dir, readonly=...)` finds the file
through agent.state.layout and opens it by the rules in `store` (created by the safe writer, judged
before SQLite reads it, set aside and rebuilt when it is not ours). Writers: the daemon, health-check,
accept and remediate. Readers: `nodewarden ledger`, a one-shot audit, a snapshot's copy.
"""

from __future__ import annotations

from pathlib import Path

from agent.state.layout import LEDGER_FILE, ledger_folder
from agent.state.ledger.store import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_BYTES,
    SCHEMA_VERSION,
    Ledger,
    LedgerError,
)

__all__ = ["DEFAULT_MAX_AGE_S", "DEFAULT_MAX_BYTES", "LEDGER_FILE", "SCHEMA_VERSION", "Ledger", "LedgerError",
           "ledger_file", "open_ledger"]


def ledger_file(state_dir: Path, *, create: bool) -> Path:
    return ledger_folder(state_dir, create=create) / LEDGER_FILE


def open_ledger(state_dir: Path, *, readonly: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> Ledger:
    """The node's ledger; FileNotFoundError for a reader when there is none, LedgerError when unusable."""
    return Ledger.open(ledger_file(state_dir, create=not readonly), readonly=readonly, max_bytes=max_bytes)
