"""Tuning profiles: locate -> load -> resolve `extends` -> merge -> compile.

Each step is small and separately testable (as in Red Hat tuned). Every
error names the file and line it comes from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from agent.core.digest import sha256_hex
from agent.core.errors import ProfileError
from agent.core.expect import COMPARATORS, Expectation
from agent.core.sanitise import is_clean
from agent.io.schema import Validator, describe_path, validate_document
from agent.io.yamlfile import LineMap, PathKey, load_yaml_file

FALLBACK_PROFILE = "generic-nvidia"
# Chosen when the node positively has no NVIDIA GPU and no NVIDIA driver (a laptop, a CPU node):
# GPU-node tuning does not apply there, so nothing is judged against it.
NO_GPU_PROFILE = "no-nvidia-gpu"
SITE_PROFILE_DIR = Path("/etc/nodewarden/profiles")


def data_dir(name: str) -> Path:
    """A data folder shipped with the package (wheel) or in the source tree."""
    here = Path(__file__).resolve().parents[1]  # agent/ (this module is agent/policy/profiles.py)
    for candidate in (here / "_data" / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise ProfileError(f"the installation has no {name}/ folder (looked beside {here})")


def shipped_profile_dir() -> Path:
    return data_dir("profiles")


@lru_cache(maxsize=1)
def profile_validator() -> Validator:
    path = shipped_profile_dir() / "schema.json"
    try:
        return Validator(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise ProfileError(f"broken profile schema: {exc}", path=str(path)) from None


@lru_cache(maxsize=1)
def schema_fingerprint() -> str | None:
    """What a profile's schema check depends on: the schema's bytes and the validator's code.

    A profile file that passed the check is remembered under this (agent.io.yamlfile), so that a
    later run neither builds the validator nor validates it again; editing the schema or
    agent/io/schema.py, or another interpreter, changes the fingerprint. None (unreadable): nothing
    is remembered, every file is validated.
    """
    import sys

    from agent.io import schema

    try:
        parts = [(shipped_profile_dir() / "schema.json").read_bytes(), Path(str(schema.__file__)).read_bytes()]
    except (OSError, ProfileError):
        return None
    return sha256_hex(b"\0".join([*parts, sys.implementation.cache_tag.encode()]))


def _validate_profile(data: Any, lines: LineMap, source: str) -> None:
    if isinstance(data, dict):  # anything else is refused by `load` itself, with its own message
        validate_document(data, lines, source, profile_validator(), ProfileError)


class ProfileFile(NamedTuple):
    """One profile file as loaded and validated, before inheritance (immutable: a NamedTuple, a fifth
    of a frozen dataclass's cost to define)."""

    name: str
    path: Path
    data: dict[str, Any]
    lines: LineMap

    @property
    def extends(self) -> str | None:
        value = self.data.get("extends")
        return str(value) if value is not None else None


class MatchRule(NamedTuple):
    gpu_pci_ids: tuple[str, ...] = ()
    gpu_count: tuple[int, ...] = ()
    dmi: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Families (agent.core.gpu_family) this profile covers when no exact rule matches: not a criterion.
    gpu_family: tuple[str, ...] = ()

    @property
    def criteria(self) -> int:
        return (1 if self.gpu_pci_ids else 0) + (1 if self.gpu_count else 0) + len(self.dmi)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.gpu_pci_ids:
            out["gpu_pci_ids"] = list(self.gpu_pci_ids)
        if self.gpu_count:
            out["gpu_count"] = list(self.gpu_count)
        if self.dmi:
            out["dmi"] = {key: list(values) for key, values in self.dmi}
        if self.gpu_family:
            out["gpu_family"] = list(self.gpu_family)
        return out


@dataclass
class Profile:
    """A merged, validated and compiled profile."""

    name: str
    description: str
    chain: tuple[str, ...]  # files from the root ancestor to this profile (+ overrides)
    match: MatchRule | None
    expect: dict[str, Any]
    abstract: bool = False
    origins: dict[PathKey, tuple[str, int | None]] = field(default_factory=dict)
    # Security-relevant sysctls the operator's own profile files allow `remediate` to set
    # (`remediate_protected_sysctls:`; ignored in shipped files, see remediations.sysctl).
    protected_sysctls: frozenset[str] = frozenset()
    _compiled: dict[PathKey, Expectation] = field(default_factory=dict)

    def expectation(self, *path: str) -> Expectation | None:
        return self._compiled.get(tuple(path))

    def section(self, *path: str) -> Mapping[str, Any]:
        node: Any = self.expect
        for part in path:
            if not isinstance(node, Mapping):
                return {}
            node = node.get(part)
        return node if isinstance(node, Mapping) else {}

    def expectations_under(self, *path: str) -> dict[str, Expectation]:
        """Compiled expectations one level below `path`, by key (e.g. sysctls)."""
        n = len(path)
        return {
            str(key[n]): exp for key, exp in self._compiled.items()
            if len(key) == n + 1 and key[:n] == tuple(path)
        }

    def origin(self, *path: str | int) -> str:
        file, line = self.origins.get(tuple(path), ("?", None))
        return f"{file}:{line}" if line else file

    @property
    def sysctl_keys(self) -> tuple[str, ...]:
        return tuple(self.section("sysctl"))


# --- locate -------------------------------------------------------------------------------------


def search_path(extra_dirs: Iterable[Path] = ()) -> list[Path]:
    """Site folders first, so a site can ship its own profiles; shipped last."""
    dirs = [*extra_dirs, SITE_PROFILE_DIR, shipped_profile_dir()]
    return [d for d in dirs if d.is_dir()]


def locate(name: str, dirs: list[Path]) -> Path:
    if not _valid_name(name):
        raise ProfileError(f"invalid profile name {name!r} (lower-case letters, digits and '-')")
    for directory in dirs:
        candidate = directory / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(available(dirs))) or "none"
    raise ProfileError(f"unknown profile {name!r} (known: {known})")


def available(dirs: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in dirs:
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def _valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 64 and all((c.isalnum() and c.islower()) or c.isdigit() or c == "-"
                                                  for c in name) and name[0] != "-"


# --- load ---------------------------------------------------------------------------------------


def is_shipped(path: Path) -> bool:
    """A profile file of the installed package (trusted as shipped: root's, in site-packages)."""
    return path.parent == shipped_profile_dir()


def load(path: Path, trust: bool = True) -> ProfileFile:
    """One profile file. `trust`: a site file decides what root writes, so it is read only when
    root or the running user owns it and its folders (agent.io.trusted_input); `profiles validate`
    of a draft, which writes nothing, passes False."""
    fingerprint = schema_fingerprint()
    trusted = "site profile" if trust and not is_shipped(path) else None
    if fingerprint is None:
        data, lines = load_yaml_file(path, ProfileError, trusted=trusted)
        _validate_profile(data, lines, str(path))
    else:  # a file whose content passed this schema check before is not checked again
        data, lines = load_yaml_file(path, ProfileError, validation=(
            fingerprint, lambda doc, where: _validate_profile(doc, where, str(path))), trusted=trusted)
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a YAML mapping", path=str(path), line=1)
    if data["name"] != path.stem:
        raise ProfileError(f"name {data['name']!r} must match the file name {path.stem!r}",
                           path=str(path), line=lines.line_for(("name",)))
    return ProfileFile(path.stem, path, data, lines)


# --- resolve and merge ---------------------------------------------------------------------------


def merge_tree(base: dict[str, Any], overlay: Mapping[str, Any], origin: str, lines: LineMap,
               origins: dict[PathKey, tuple[str, int | None]], path: PathKey = ()) -> dict[str, Any]:
    """Child over parent, key by key; a null value drops the key."""
    out = dict(base)
    for key, value in overlay.items():
        sub = (*path, key)
        if value is None:
            out.pop(key, None)
            continue
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and not _is_leaf(value):
            out[key] = merge_tree(out[key], value, origin, lines, origins, sub)
        else:
            out[key] = value
            _record_origins(value, sub, origin, lines, origins)
    origins.setdefault(path, (origin, lines.line_for(path)))
    return out


def _is_leaf(value: Mapping[str, Any]) -> bool:
    # An expectation (or an MTU rule) replaces its parent's whole, never merges
    # comparators: a child saying {min: 9000} must not inherit an `equals`.
    return "severity" in value or "expect" in value


def _record_origins(value: Any, path: PathKey, origin: str, lines: LineMap,
                    origins: dict[PathKey, tuple[str, int | None]]) -> None:
    origins[path] = (origin, lines.line_for(path))
    if isinstance(value, Mapping):
        for key, item in value.items():
            _record_origins(item, (*path, key), origin, lines, origins)


Overlay = tuple[str, dict[str, Any], LineMap]


def build(chain: list[ProfileFile], overrides: Iterable[Overlay] = (),
          errors: list[ProfileError] | None = None) -> Profile:
    leaf = chain[-1]
    origins: dict[PathKey, tuple[str, int | None]] = {}
    expect: dict[str, Any] = {}
    for item in chain:
        expect = merge_tree(expect, item.data.get("expect") or {}, str(item.path),
                            _shift(item.lines, "expect"), origins)
    overlays = list(overrides)
    for source, tree, lines in overlays:
        expect = merge_tree(expect, tree, source, lines, origins)
    match = leaf.data.get("match")
    profile = Profile(
        name=leaf.name,
        description=str(leaf.data.get("description", "")),
        chain=tuple(str(p.path) for p in chain) + tuple(s for s, _, _ in overlays),
        match=_compile_match(match) if match else None,
        expect=expect,
        abstract=bool(leaf.data.get("abstract", False)),
        origins=origins,
        protected_sysctls=frozenset(str(key) for item in chain if not is_shipped(item.path)
                                    for key in item.data.get("remediate_protected_sysctls") or ()),
    )
    _compile_expectations(profile, expect, (), errors)
    return profile


def _fail(errors: list[ProfileError] | None, error: ProfileError) -> None:
    """Raise `error`, or, when collecting every error of a file (`profiles validate`), keep it."""
    if errors is None:
        raise error
    errors.append(error)


def _shift(lines: LineMap, prefix: str) -> LineMap:
    """Line map of a subtree, with paths relative to it."""
    out = LineMap()
    for key, line in lines.items():
        if key[:1] == (prefix,):
            out[key[1:]] = line
    return out


def _compile_match(data: Mapping[str, Any]) -> MatchRule:
    count = data.get("gpu_count", ())
    counts = [count] if isinstance(count, (int, float)) else list(count)
    return MatchRule(
        gpu_pci_ids=tuple(str(x).lower() for x in data.get("gpu_pci_ids", ())),
        gpu_count=tuple(int(c) for c in counts),  # 8.0 is a valid JSON Schema integer
        dmi=tuple(sorted((k, tuple(v)) for k, v in (data.get("dmi") or {}).items())),
        gpu_family=tuple(str(x) for x in data.get("gpu_family", ())),
    )


# Sections that hold lookup tables, not expectations.
TABLES = {("gpu", "xid"), ("history",), ("counters",)}  # rules (checks/history*.py), not comparisons

# Keys people put under sysctl that are not sysctls, with where they live instead.
NOT_SYSCTLS = {
    "vm.transparent_hugepage": "transparent hugepages live in sysfs: use thp.enabled / thp.defrag",
    "vm.transparent_hugepage.enabled": "use thp.enabled (sysfs, not a sysctl)",
    "vm.transparent_hugepage.defrag": "use thp.defrag (sysfs, not a sysctl)",
    "kernel.numa_balancing": "use numa.balancing (checked as host.numa.balancing)",
}


def _domain_hints(data: Mapping[str, Any], lines: LineMap, source: str) -> list[ProfileError]:
    """What a key means where it was put (THP is sysfs, not a sysctl): said first, before the schema's
    missing keys, which would only lead the user to complete the wrong entry (issue 36.9)."""
    expect = data.get("expect")
    sysctl = expect.get("sysctl") if isinstance(expect, Mapping) else None
    if not isinstance(sysctl, Mapping):
        return []
    return [ProfileError(f"expect.sysctl.{key}: {NOT_SYSCTLS[key]}", path=source,
                         line=lines.line_for(("expect", "sysctl", key)))
            for key in sysctl if key in NOT_SYSCTLS]


def _compile_expectations(profile: Profile, node: Mapping[str, Any], path: PathKey,
                          errors: list[ProfileError] | None = None) -> None:
    if path == ("sysctl",):
        for key in node:
            if key in NOT_SYSCTLS:
                file, line = profile.origins.get((*path, key), ("?", None))
                _fail(errors, ProfileError(f"expect.sysctl.{key}: {NOT_SYSCTLS[key]}", path=file, line=line))
    for key, value in node.items():
        sub = (*path, key)
        if not isinstance(value, Mapping) or sub in TABLES:
            continue
        if "severity" in value:
            comparators = [c for c in COMPARATORS if c in value]
            file, line = profile.origins.get(sub, ("?", None))
            where = f"expect.{'.'.join(map(str, sub))}"
            if not comparators:
                _fail(errors, ProfileError(f"{where}: needs one of {', '.join(COMPARATORS)}", path=file, line=line))
                continue
            rng = value.get("range")
            if rng is not None and rng[0] > rng[1]:
                _fail(errors, ProfileError(f"{where}: range low {rng[0]} > high {rng[1]}", path=file, line=line))
                continue
            if _refuse_control_characters(profile, sub, value, errors):
                profile._compiled[sub] = Expectation.from_mapping(value)
        else:
            _compile_expectations(profile, value, sub, errors)


def _refuse_control_characters(profile: Profile, path: PathKey, expectation: Mapping[str, Any],
                               errors: list[ProfileError] | None = None) -> bool:
    """Values (and keys) that remediation may write into sysctl.d, boot.conf or a BIOS PATCH are one
    line of printable text: a newline would add a line of the attacker's choosing to a root-owned file.
    False (with `errors` collecting) if one is not."""
    where = f"expect.{'.'.join(map(str, path))}"
    clean = True
    for part in path:
        if isinstance(part, str) and not is_clean(part):
            file, line = profile.origins.get(path, ("?", None))
            _fail(errors, ProfileError(f"{where}: a key with a control character or line break", path=file, line=line))
            clean = False
    for comparator in COMPARATORS:
        values = expectation.get(comparator)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and not is_clean(value):
                file, line = profile.origins.get((*path, comparator), profile.origins.get(path, ("?", None)))
                _fail(errors, ProfileError(f"{where}.{comparator}: {value!r} holds a control character or line "
                                           "break (values nodewarden may write to config files are one line of "
                                           "text)", path=file, line=line))
                clean = False
    return clean


# --- public entry points -----------------------------------------------------------------------


class ProfileStore:
    """Profiles on the search path, each file loaded and validated once per run."""

    def __init__(self, extra_dirs: Iterable[Path] = (), overrides_file: Path | None = None) -> None:
        self.dirs = search_path(extra_dirs)
        self.overrides_file = overrides_file
        self._files: dict[str, ProfileFile] = {}
        self._built: dict[str, Profile] = {}
        self._overlay: Overlay | None = None

    def names(self) -> list[str]:
        return sorted(available(self.dirs))

    def file(self, name: str) -> ProfileFile:
        if name not in self._files:
            self._files[name] = load(locate(name, self.dirs))
        return self._files[name]

    def chain(self, name: str) -> list[ProfileFile]:
        chain: list[ProfileFile] = []
        seen: list[str] = []
        current: str | None = name
        while current is not None:
            if current in seen:
                cycle = " -> ".join([*seen, current])
                raise ProfileError(f"cyclic extends: {cycle}", path=str(chain[-1].path),
                                   line=chain[-1].lines.line_for(("extends",)))
            seen.append(current)
            try:
                loaded = self.file(current)
            except ProfileError as exc:
                if chain and exc.path is None:  # name the file whose `extends` is wrong
                    raise ProfileError(exc.message, path=str(chain[-1].path),
                                       line=chain[-1].lines.line_for(("extends",))) from None
                raise
            chain.append(loaded)
            current = loaded.extends
        chain.reverse()
        return chain

    def profile(self, name: str, with_overrides: bool = True) -> Profile:
        key = f"{name}+" if with_overrides else name
        if key not in self._built:
            overlays: list[Overlay] = []
            if with_overrides and self.overrides_file is not None:
                if self._overlay is None:
                    self._overlay = load_overrides(self.overrides_file)
                overlays.append(self._overlay)
            self._built[key] = build(self.chain(name), overlays)
        return self._built[key]

    def validate_file(self, path: Path) -> Profile:
        """Load one file wherever it is, resolve its parents on the search path, build it."""
        loaded = load(path, trust=False)
        return build([*self._parents(loaded), loaded])

    def _parents(self, loaded: ProfileFile) -> list[ProfileFile]:
        path = loaded.path
        try:
            parents = self.chain(loaded.extends) if loaded.extends else []
        except ProfileError as exc:
            if exc.path is None:  # the parent it names does not exist: this file's `extends` is wrong
                raise ProfileError(exc.message, path=str(path), line=loaded.lines.line_for(("extends",))) from None
            raise
        if any(p.name == loaded.name for p in parents):
            raise ProfileError(f"cyclic extends: {loaded.name} -> ... -> {loaded.name}", path=str(path),
                               line=loaded.lines.line_for(("extends",)))
        return parents

    def validate_file_errors(self, path: Path) -> list[ProfileError]:
        """Every error of one file, in line order (`profiles validate`): each schema violation, then,
        if the document has the profile's shape, its `extends` and every expectation that cannot compile.
        A file that does not parse is one error."""
        try:
            data, lines = load_yaml_file(path, ProfileError)
        except ProfileError as exc:
            return [exc]
        if not isinstance(data, dict):
            return [ProfileError("a profile must be a YAML mapping", path=str(path), line=1)]
        hints = _domain_hints(data, lines, str(path))
        hinted = {e.line for e in hints}
        errors = [ProfileError(f"{describe_path(e.path)}: {e.message}", path=str(path), line=lines.line_for(e.path))
                  for e in profile_validator().errors(data)]
        errors = [e for e in errors if e.line not in hinted]  # the hint says what the schema's keys cannot
        if not errors and data["name"] != path.stem:
            errors.append(ProfileError(f"name {data['name']!r} must match the file name {path.stem!r}",
                                       path=str(path), line=lines.line_for(("name",))))
        if not errors:  # the rest reads the document's shape: only once the schema holds
            try:
                loaded = ProfileFile(path.stem, path, data, lines)
                build([*self._parents(loaded), loaded], errors=errors)
            except ProfileError as exc:
                errors.append(exc)
        said = {e.message for e in hints}
        return hints + sorted((e for e in errors if e.message not in said), key=lambda e: (e.path != str(path),
                                                                                            e.line or 0))

    def match_rules(self) -> dict[str, MatchRule | None]:
        """Each concrete profile's own `match:` (the leaf file decides)."""
        rules: dict[str, MatchRule | None] = {}
        for name in self.names():
            data = self.file(name).data
            if data.get("abstract"):
                continue
            rules[name] = _compile_match(data["match"]) if data.get("match") else None
        return rules


def load_overrides(path: Path) -> Overlay:
    """A site overlay: `expect:` merged onto whichever profile is selected."""
    data, lines = load_yaml_file(path, ProfileError, trusted="overrides file")
    if data is None:
        return str(path), {}, LineMap()
    if not isinstance(data, dict) or set(data) - {"expect"}:
        raise ProfileError("an overrides file holds one key, `expect:`", path=str(path), line=1)
    expect: dict[str, Any] = data.get("expect") or {}
    wrapped = {"name": "overrides", "description": "site overrides", "expect": expect}
    validate_document(wrapped, lines, str(path), profile_validator(), ProfileError)
    return str(path), expect, _shift(lines, "expect")
