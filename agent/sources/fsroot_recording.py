"""`RecordingFs`: a live root that remembers every answer, so `snapshot capture` stores exactly what was read."""

from __future__ import annotations

import errno
import posixpath

from agent.sources.fsroot import MAX_LINK_HOPS, LiveFs


class RecordingFs:
    """Wraps a live root and remembers every answer for `snapshot capture`.

    Files are stored at their canonical (link-resolved) path and every link met
    on the way is stored under its canonical parent, which is exactly how
    `SnapshotFs` resolves paths on replay.
    """

    def __init__(self, inner: LiveFs) -> None:
        self.inner = inner
        self.description = inner.description
        self.files: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = set()
        self.errors: dict[str, str] = {}
        self._checked: set[str] = set()

    def _canonical_key(self, path: str) -> str:
        parent, _, name = path.rstrip("/").rpartition("/")
        return posixpath.join(self.inner.realpath(parent or "/"), name).lstrip("/")

    def _record_links_on(self, path: str, depth: int = 0) -> None:
        if depth > MAX_LINK_HOPS:
            return
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if prefix in self._checked:
                continue
            self._checked.add(prefix)
            try:
                target = self.inner.readlink(prefix)
            except OSError:
                continue
            self.links[self._canonical_key(prefix)] = target
            # The target may itself hold links (class/net/X -> .../net/X/device).
            self._record_links_on(
                posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target)), depth + 1
            )

    def _error(self, path: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0)
        if name and exc.errno != errno.ENOENT:
            self.errors[self.inner.realpath(path).lstrip("/")] = name

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        self._record_links_on(path)
        try:
            data = self.inner.read_bytes(path, limit)
        except OSError as exc:
            self._error(path, exc)
            raise
        self.files[self.inner.realpath(path).lstrip("/")] = data
        return data

    def listdir(self, path: str) -> list[str]:
        self._record_links_on(path)
        try:
            names = self.inner.listdir(path)
        except OSError as exc:
            self._error(path, exc)
            raise
        real = self.inner.realpath(path).lstrip("/")
        self.dirs.add(real)
        for name in names:
            child = f"{path.rstrip('/')}/{name}"
            try:
                self.links[f"{real}/{name}".lstrip("/")] = self.inner.readlink(child)
            except OSError:
                if self.inner.is_dir(child):
                    self.dirs.add(f"{real}/{name}".lstrip("/"))
        return names

    def readlink(self, path: str) -> str:
        self._record_links_on(path)
        return self.inner.readlink(path)

    def is_dir(self, path: str) -> bool:
        # A directory the reader only tested for (bonding/, efivars/) must exist
        # on replay too, or the replay would answer differently.
        self._record_links_on(path)
        found = self.inner.is_dir(path)
        if found:
            self.dirs.add(self.inner.realpath(path).lstrip("/"))
        return found
