"""A snapshot directory as the recorded sources read it (DESIGN.md "Snapshot = recorded node").

Below agent/sources/snapshot.py (capture, open, copy), so that the sources it drives can name the type
without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.sources.fsroot_snapshot import SnapshotFs


@dataclass(frozen=True)
class Snapshot:
    path: Path
    meta: dict[str, Any]
    origin: str | None = None  # what the user named, where that is not `path` (an archive, extracted)

    @property
    def captured(self) -> list[str]:
        return [str(c) for c in self.meta.get("captured", [])]

    def has(self, source: str) -> bool:
        return source in self.captured

    def fs(self) -> SnapshotFs:
        return SnapshotFs(self.path)

    @property
    def kmsg_path(self) -> Path:
        return self.path / "kmsg.txt"
