"""Where the test peers live: one cache shared by every clone of the project on this machine.

`NODEWARDEN_PEERS_DIR` overrides it; otherwise
`$XDG_CACHE_HOME/nodewarden/test-peers` (default `~/.cache/nodewarden/test-peers`). A cache outside
the checkout means a fresh clone reuses the peers an earlier clone installed.
"""

from __future__ import annotations

import os
from pathlib import Path

SETUP_COMMAND = ".venv/bin/python -m tests.peers.setup"


def peers_dir() -> Path:
    explicit = os.environ.get("NODEWARDEN_PEERS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "nodewarden" / "test-peers"
