"""The walk's way from a Bios resource to its BIOS AttributeRegistry (issue 13 rule 5).

A Bios resource names its registry by Id (`"AttributeRegistry": "BiosAttributeRegistryP89.v1_0_0"`).
The registry itself is found in three steps, each an ordinary GET of the walk (same session, size
caps, deadline and path validation as every other resource):

1. the service root's `Registries` collection (MessageRegistryFileCollection);
2. the member(s) naming that registry: a MessageRegistryFile. Members are matched by name, never all
   read: the Id itself, the same name with another version, or (sushy-tools, some OEMs) a shorter
   name the Id starts with (`BiosAttributeRegistry.v1_0_0` for `BiosAttributeRegistryP89.v1_0_0`);
   at most `MAX_FILES` of them;
3. the file's `Location[].Uri`: the registry as this BMC serves it. A Location is untrusted input:
   only a relative path under /redfish/v1 that passes the walk's path check is followed (no scheme,
   no host, no `..`). `PublicationUri` and `ArchiveUri` are never fetched: they point off the box.

Nothing on this chain can fail the BMC read: a failure, a refusal or an absence is kept here, not in
the walk's failed resources, and becomes the reason `bios_registry` is unknown (the check then says it
judged by the profile's aliases). The texts are the same live and replayed from a recording.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any

MAX_IDS = 2  # distinct registries asked for (a host's Bios and its settings object name the same one)
MAX_FILES = 3  # MessageRegistryFile members read per registry
MAX_LOCATIONS = 16  # Location entries looked at per file
_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_VERSION = re.compile(r"(?:[._\-]v?\d+(?:[._]\d+)*)$")

Validate = Callable[[str], "str | None"]  # the walk's path check: the clean path, or None when refused


def registry_id(body: dict[str, Any]) -> str | None:
    """The AttributeRegistry a Bios resource names, if it is a plausible registry Id."""
    value = body.get("AttributeRegistry")
    return value if isinstance(value, str) and _ID.match(value) else None


def _stem(name: str) -> str:
    """A registry name without its version: "BiosAttributeRegistryU58.v1_2_44" -> "biosattributeregistryu58"."""
    head = name.lower().split(".", 1)[0]
    return _VERSION.sub("", head) or head


def name_rank(candidate: str, wanted: str) -> int | None:
    """How well a registry name matches the wanted Id: 0 exactly, 1 another version, 2 a shorter name."""
    cand, want = candidate.lower(), wanted.lower()
    if cand == want:
        return 0
    stem, wanted_stem = _stem(cand), _stem(want)
    if stem == wanted_stem:
        return 1
    if len(stem) >= 8 and wanted_stem.startswith(stem):  # "biosattributeregistry" for "...registryp89"
        return 2
    return None


def _segment(path: str) -> str:
    return urllib.parse.unquote(path.rstrip("/").rsplit("/", 1)[-1])


def _kind(body: dict[str, Any]) -> str:
    kind = body.get("@odata.type")
    return kind if isinstance(kind, str) else ""


class RegistryChain:
    """What the walk asked for on the way to the BIOS attribute registries, and what went wrong."""

    def __init__(self, validate: Validate) -> None:
        self._validate = validate
        self.wanted: list[str] = []  # registry Ids the Bios resources name
        self.collection: str | None = None  # the Registries collection's path, once asked for
        self.collection_body: dict[str, Any] | None = None
        self.files: dict[str, str] = {}  # MessageRegistryFile path (lower case) -> the registry Id it is for
        self.locations: dict[str, str] = {}  # registry path (lower case) -> the registry Id it is for
        self.owned: set[str] = set()  # lower-case paths this chain asked for (their failures are its own)
        self.failures: dict[str, str] = {}  # path -> reason (the same text live and recorded)
        self.notes: dict[str, list[tuple[str, bool]]] = {}  # registry Id -> (why not followed, offers none)

    # --- the walk's side ---------------------------------------------------------------------------

    def owns(self, path: str) -> bool:
        return path.lower() in self.owned

    def asked(self, path: str) -> None:
        self.owned.add(path.lower())

    def failed(self, path: str, reason: str, status: int | None) -> None:
        # "HTTP 404 (Not Found)" live, "HTTP 404 (not in this recording)" replayed: the status is the fact.
        self.failures[path] = f"HTTP {status}" if status and reason.startswith(f"HTTP {status}") else reason

    def plan(self, path: str, body: dict[str, Any], root: dict[str, Any] | None) -> tuple[bool, list[str]]:
        """(whether these links replace the walk's own plan for `path`, the links to read next)."""
        lowered = path.lower()
        if self.collection is not None and lowered == self.collection.lower():
            self.collection_body = body
            return True, [p for wanted in self.wanted for p in self._files_for(wanted)]
        # A file or a location that turns out to be some other resource is the walk's to plan.
        if lowered in self.files and (not _kind(body) or "MessageRegistryFile." in _kind(body)):
            return True, self._location(path, body, self.files[lowered])
        if lowered in self.files:
            self._note(self.files[lowered], f"{path} is not a MessageRegistryFile", offers_none=False)
        if lowered in self.locations and "AttributeRegistry." in _kind(body):
            return True, []  # the registry itself: nothing below it is read
        if "Bios." in _kind(body) and (wanted := registry_id(body)) is not None:
            return False, self._want(wanted, root)
        return False, []

    def _note(self, wanted: str, text: str, offers_none: bool = True) -> None:
        notes = self.notes.setdefault(wanted, [])
        if (text, offers_none) not in notes:
            notes.append((text, offers_none))

    def _want(self, wanted: str, root: dict[str, Any] | None) -> list[str]:
        if wanted in self.wanted or len(self.wanted) >= MAX_IDS:
            return []
        self.wanted.append(wanted)
        if self.collection is None:
            link = root.get("Registries") if isinstance(root, dict) else None
            raw = link.get("@odata.id") if isinstance(link, dict) else None
            if raw is None and root is not None:
                self._note(wanted, "the service root links no Registries collection")
                return []
            checked = self._validate(raw if isinstance(raw, str) else "/redfish/v1/Registries")
            if checked is None:
                self._note(wanted, "the service root's Registries link is not a path under /redfish/v1")
                return []
            self.collection = checked
            return [checked]
        return self._files_for(wanted) if self.collection_body is not None else []

    def _files_for(self, wanted: str) -> list[str]:
        """The Registries members that name `wanted`, best first, at most MAX_FILES."""
        members = self.collection_body.get("Members") if self.collection_body is not None else None
        ranked: list[tuple[int, int, str]] = []
        taken: set[str] = set()
        for order, member in enumerate(members if isinstance(members, list) else []):
            raw = member.get("@odata.id") if isinstance(member, dict) else None
            if not isinstance(raw, str) or (checked := self._validate(raw)) is None:
                continue
            rank = name_rank(_segment(checked), wanted)
            if rank is not None and checked.lower() not in self.files and checked.lower() not in taken:
                taken.add(checked.lower())  # some BMCs list a member twice
                ranked.append((rank, order, checked))
        if not ranked:
            self._note(wanted, f"the Registries collection lists no file for {wanted}")
            return []
        best = min(rank for rank, _, _ in ranked)
        chosen = [path for rank, _, path in sorted(ranked) if rank == best][:MAX_FILES]
        for path in chosen:
            self.files[path.lower()] = wanted
        return chosen

    def _location(self, path: str, body: dict[str, Any], wanted: str) -> list[str]:
        """The file's registry on this BMC: the first acceptable `Location[].Uri` (English first)."""
        listed = body.get("Location")
        entries = [e for e in (listed if isinstance(listed, list) else [])[:MAX_LOCATIONS] if isinstance(e, dict)]
        entries.sort(key=lambda e: str(e.get("Language", "")).lower() not in ("en", "en-us"))
        refused: list[str] = []
        for entry in entries:
            uri = entry.get("Uri")
            if not isinstance(uri, str):
                continue
            checked = self._validate(uri) if uri.startswith("/redfish/v1/") else None
            if checked is None:
                refused.append(uri[:120])
                continue
            self.locations[checked.lower()] = wanted
            return [checked]
        if refused:
            self._note(wanted, f"refused the registry location {refused[0]!r} in {path}: only a path under "
                               "/redfish/v1 on this BMC is followed", offers_none=False)
        else:
            self._note(wanted, f"{path} gives no location on this BMC (a PublicationUri or ArchiveUri "
                               "is never fetched)")
        return []

    # --- the parser's side ---------------------------------------------------------------------------

    def registry_paths(self, wanted: str) -> list[str]:
        return [p for p, w in self.locations.items() if w == wanted]

    def reason(self, wanted: str) -> tuple[str, bool]:
        """Why registry `wanted` was not read, and whether the BMC simply offers none (not a failure)."""
        chain = [self.collection or "", *[p for p, w in self.files.items() if w == wanted],
                 *self.registry_paths(wanted)]
        failed = [(p, r) for p, r in self.failures.items() if p.lower() in {c.lower() for c in chain if c}]
        if failed:
            path, why = failed[-1]
            return f"{path}: {why}", why == "HTTP 404"
        notes = self.notes.get(wanted)
        if notes:
            return notes[0]
        if wanted not in self.wanted:
            return f"the registry {wanted} was not asked for", False
        return f"the registry {wanted} was not read", False
