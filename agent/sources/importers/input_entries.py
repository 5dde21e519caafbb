"""What `agent.sources.importers.inputs.Reader` yields: an `Entry` per input or archive member, and the rules
by which a member's name or a symlink's target is refused (by name, never followed or opened).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # an Entry only holds a Content, handed on by the Reader
    from agent.sources.importers.input_streams import Content

MAX_LINK_TARGET = 4095  # bytes: PATH_MAX less its NUL; a sysfs link's target is a few hundred


@dataclass
class Entry:
    """One input or archive member, as meta.yaml records it."""

    name: str
    size: int | None = None
    sha256: str | None = None
    kind: str | None = None  # a container's kind ("tar.gz archive", "folder") or the importer's, set later
    error: str | None = None
    contributed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    data: bytes | None = field(default=None, repr=False)  # a file's content, None for containers and refusals
    content: Content | None = field(default=None, repr=False)  # instead of `data`: a large file, streamed
    forced: str | None = None  # --as KIND
    link: str | None = None  # a symlink's target text (never followed); `kind` "symlink" until an importer takes it
    broken: bool = False  # it did not read to its end (corrupt or truncated): what it gave is part of a whole
    reading: str | None = field(default=None, repr=False)  # an archive's member being read (where it broke)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "size": self.size, "sha256": self.sha256, "kind": self.kind}
        if self.link is not None:
            out["link"] = self.link
        if self.error:
            out["error"] = self.error
        if self.broken:
            out["broken"] = True
        out["contributed"] = self.contributed
        if self.skipped:
            out["skipped"] = self.skipped
        return out


def unsafe_name(name: str) -> str | None:
    """Why an archive member's name is refused, or None."""
    if not name or "\x00" in name or any(ord(c) < 32 for c in name):
        return "a name with control characters"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a path with '..' (it would point outside the archive)"
    return None


def link_target_problem(target: str) -> str | None:
    """Why a symlink's target text is refused (it is only ever recorded, never followed), or None."""
    try:
        size = len(target.encode("utf-8"))
    except UnicodeEncodeError:
        return "a target that is not UTF-8"
    if not target:
        return "an empty target"
    if size > MAX_LINK_TARGET:
        return f"a target longer than {MAX_LINK_TARGET} bytes"
    if any(ord(c) < 32 or ord(c) == 127 for c in target):
        return "a target with control characters"
    return None


def link_entry(shown: str, target: str, *, in_folder: bool) -> Entry:
    """A symlink as an entry: its target's text only. Until an importer takes it, an archive's link is an
    error and a folder's a note, as every link was before links were recorded."""
    why = link_target_problem(target)
    if why is not None:
        text = f"a symlink with {why}: not recorded, not followed"
        return Entry(shown, kind="symlink", skipped=[text]) if in_folder else Entry(shown, error=f"refused: {text}")
    note = f"a symlink (to {target[:120]!r}): not followed"
    if in_folder:
        return Entry(shown, kind="symlink", link=target,
                     skipped=[f"{note}; not used (only a sysfs tree or a sos report records its links)"])
    return Entry(shown, kind="symlink", link=target, error=f"refused: {note}")
