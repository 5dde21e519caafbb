"""YAML loading that remembers where every value came from.

Profiles, waivers and config files are written by people; an error must name
the file and line. PyYAML's composer gives nodes with marks, and we build the
Python values ourselves so we can also refuse duplicate keys (PyYAML keeps
the last one silently) and keep dates as plain ISO strings.

Parsed files are cached as JSON (values plus lines), keyed by a SHA-256 of
the file's bytes, so an audit whose files were all seen before does not even
import PyYAML (its import alone costs more than the
rest of a simulated audit's profile handling). The cache is used only when
every folder from / to it is root's or the current user's and writable by
nobody else (`cache_dir`: root running with another user's HOME gets no
cache), entries are opened without following links, and entries that are not
owned by the current user or are writable by others are ignored: a cache must
never become a way to inject profile content or to make root write where
another user chose. NODEWARDEN_NO_CACHE=1 turns it off.

A caller that validates what it loads (profiles against their schema) may have the pass
remembered too (`validation`): such an entry is keyed by the file's digest and a fingerprint of
everything the check depends on (the schema's bytes, the validator's code), so a change to either
voids every remembered pass; it starts with the SHA-256 of the rest, so a damaged entry is ignored
(and the file validated again), never taken for a pass. A failed check is never remembered.

Files are hostile input too (a site folder, a copied snapshot), so parsing is
bounded: at most MAX_BYTES per file, nesting at most MAX_DEPTH deep, and no
aliases (`*name`): an alias makes PyYAML share one node, and building plain
values from shared nodes is where a "billion laughs" file expands to 10^9
values. No shipped file uses anchors; a file that does is refused with the
alias's line, like every other error.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import __version__
from agent.core.digest import sha256_hex
from agent.core.errors import NodewardenError
from agent.io.jsonfile import load_json_bytes, read_bounded, read_fd
from agent.io.trusted_input import read_trusted

PathKey = tuple[str | int, ...]
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_CACHE_FORMAT = 1
MAX_BYTES = 1 << 20  # profiles are ~10 KB; 1 MiB holds thousands of waivers (and composes in ~1 s)
MAX_DEPTH = 64  # profiles nest ~6 deep; libyaml itself stops at 1000, our builder recurses
_ENTRY_MAX_BYTES = 16 * MAX_BYTES  # a cached parse (values and lines as JSON) of the largest file
# (fingerprint of what the check depends on, the check: raises for an invalid document)
Validation = tuple[str, Callable[[Any, "LineMap"], None]]


class LineMap(dict[PathKey, int]):
    """Maps a value's path (keys and indices) to its 1-based line."""

    def line_for(self, path: PathKey) -> int | None:
        # Walk up to the nearest ancestor we know (a missing key's parent).
        for end in range(len(path), -1, -1):
            line = self.get(path[:end])
            if line is not None:
                return line
        return None


def _build(node: Any, path: PathKey, lines: LineMap, error: type[NodewardenError], source: str,
           scalars: Any) -> Any:
    import yaml

    lines[path] = node.start_mark.line + 1
    if len(path) >= MAX_DEPTH and not isinstance(node, yaml.ScalarNode):
        raise error(f"nested deeper than {MAX_DEPTH} levels", path=source, line=node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                raise error("keys must be plain scalars (no merge keys or complex keys)",
                            path=source, line=key_node.start_mark.line + 1)
            key = str(key_node.value)
            if key in out:
                raise error(f"duplicate key {key!r}", path=source, line=key_node.start_mark.line + 1)
            out[key] = _build(value_node, (*path, key), lines, error, source, scalars)
            lines[path + (key,)] = key_node.start_mark.line + 1  # noqa: RUF005 - 3.10 syntax
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), lines, error, source, scalars) for i, item in enumerate(node.value)]
    if node.tag == _TIMESTAMP:
        return str(node.value)  # keep dates as ISO text; JSON has no date type
    return scalars.construct_object(node)


def parse_yaml(text: str, source: str, error: type[NodewardenError] = NodewardenError) -> tuple[Any, LineMap]:
    """Parse one YAML document into plain values plus a LineMap."""
    import yaml

    try:  # the C parser is 5-10x faster; fall back to pure Python where absent
        loader: Any = yaml.CSafeLoader
    except AttributeError:  # pragma: no cover - depends on how PyYAML was built
        loader = yaml.SafeLoader
    lines = LineMap()
    try:
        if "&" in text and "*" in text:  # an alias needs an anchor: only then look for one
            _refuse_aliases(text, loader, source, error)
        node = yaml.compose(text, Loader=loader)
    except RecursionError:  # the pure-Python composer recurses (libyaml stops at 1000 levels)
        raise error(f"nested deeper than {MAX_DEPTH} levels", path=source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        start, end = exc.context_mark, exc.problem_mark
        if exc.context and start and end and start.line != end.line:
            problem += f" ({exc.context} started at line {start.line + 1})"
        raise error(f"invalid YAML: {problem}", path=source,
                    line=(mark.line + 1) if mark else None) from None
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML: {exc}", path=source) from None
    if node is None:
        return None, lines
    try:
        return _build(node, (), lines, error, source, yaml.constructor.SafeConstructor()), lines
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise error(f"invalid YAML value: {exc.problem}", path=source,
                    line=(mark.line + 1) if mark else None) from None
    except (ValueError, OverflowError) as exc:  # a tagged value that does not convert, an int of 5,000 digits
        raise error(f"invalid YAML value: {str(exc)[:120]}", path=source,
                    line=_line_of_last(lines)) from None


def _refuse_aliases(text: str, loader: Any, source: str, error: type[NodewardenError]) -> None:
    import yaml

    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise error(f"YAML aliases (*{event.anchor}) and merge keys are not allowed: write the value out",
                        path=source, line=event.start_mark.line + 1 if event.start_mark else None)


def _line_of_last(lines: LineMap) -> int | None:
    return max(lines.values()) if lines else None


def load_yaml_file(path: Path, error: type[NodewardenError] = NodewardenError,
                   validation: Validation | None = None, trusted: str | None = None) -> tuple[Any, LineMap]:
    """Parse `path` (from the cache where its content was seen before).

    `validation`: run the check on what was parsed, unless this content passed this same check
    before (see the module docstring); the check raises for an invalid document.
    `trusted` (what the file is, e.g. "site profile"): a file that decides what root writes, read
    only if nobody but root or the running user could have written it (agent.io.trusted_input).
    """
    try:
        # non-blocking either way: a FIFO named *.yaml must not hang
        data = read_bounded(path, MAX_BYTES) if trusted is None else read_trusted(path, MAX_BYTES, trusted, error)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", path=str(path)) from None
    if len(data) > MAX_BYTES:
        raise error(f"larger than {MAX_BYTES >> 20} MiB: not a file nodewarden reads", path=str(path))
    digest = sha256_hex(data)
    passed = None if validation is None else _validated_name(digest, validation[0])
    if passed is not None:
        remembered = _validated_get(passed)
        if remembered is not None:
            return remembered
    parsed = _cache_get(digest)
    if parsed is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise error(f"not valid UTF-8 (byte {exc.start})", path=str(path), line=line) from None
        parsed = parse_yaml(text, str(path), error)
        _cache_put(digest, *parsed)
    if validation is not None:
        validation[1](*parsed)  # raises for an invalid document: nothing is remembered
        if passed is not None:
            _validated_put(passed, *parsed)
    return parsed


# --- the parse cache ------------------------------------------------------------------------------


def _cache_base() -> Path | None:
    base = os.environ.get("CACHE_DIRECTORY") or os.environ.get("XDG_CACHE_HOME")  # systemd CacheDirectory=
    if base:
        return Path(base.split(":")[0])
    home = os.environ.get("HOME")
    return Path(home) / ".cache" if home else None


_TRUSTED_CACHE: dict[tuple[int, str], Path] = {}  # (euid, folder) -> its real path, once judged safe


def cache_dir(create: bool = False) -> Path | None:
    """The cache folder, if every folder from / to it is root's or ours and writable by nobody else.

    The environment names it (CACHE_DIRECTORY, XDG_CACHE_HOME, HOME), and root may run with a
    user's HOME (sudo): a folder on the way that this user owns, or a symlink they planted, would
    let them choose where root writes, or feed root forged entries. Each folder is judged by
    agent.io.fsutil.trusted_dir (the state dir's rule; missing ones created 0700 when `create`); an
    unsafe one means no cache at all (a cache is only an optimisation).
    """
    if os.environ.get("NODEWARDEN_NO_CACHE"):
        return None
    base = _cache_base()
    if base is None or not base.is_absolute():
        return None
    wanted = base / "nodewarden" / "yaml"
    known = _TRUSTED_CACHE.get((os.geteuid(), str(wanted)))
    if known is not None:
        return known
    from agent.io.fsutil import trusted_dir  # only when a folder is judged (once per process and folder)

    real: Path | None = None
    try:
        for level in (base, base / "nodewarden", wanted):
            real = trusted_dir(level, create=create, what="parse cache folder")
    except (OSError, NodewardenError):
        return None  # missing (and not asked to create it), unsafe, or not a folder: no cache
    if real is not None:
        _TRUSTED_CACHE[(os.geteuid(), str(wanted))] = real
    return real


def _safe(st: os.stat_result) -> bool:
    """Owned by us and writable by nobody else."""
    return st.st_uid == os.geteuid() and not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _cache_file(digest: str, create: bool = False) -> Path | None:
    """Entries are keyed by the file's content (and our version), never by its name."""
    directory = cache_dir(create)
    if directory is None:
        return None
    return directory / f"{digest}-{__version__}-{_CACHE_FORMAT}.json"


def _entry_doc(data: bytes) -> tuple[Any, LineMap]:
    doc = load_json_bytes(data, what="cache entry", max_bytes=_ENTRY_MAX_BYTES, max_depth=MAX_DEPTH + 4)
    lines = LineMap({tuple(key): int(line) for key, line in doc["lines"]})
    return doc["value"], lines


def _entry_text(value: Any, lines: LineMap) -> str | None:
    try:
        return json.dumps({"value": value, "lines": [[list(k), v] for k, v in lines.items()]})
    except (TypeError, ValueError):
        return None  # a value JSON cannot hold (e.g. !!binary): just do not cache it


def _read_entry(entry: Path) -> bytes | None:
    """An entry's bytes, if it is a regular file of ours alone (else, or absent: None).

    Opened without following a link, and judged by the descriptor that is then read.
    """
    limit = _ENTRY_MAX_BYTES + 80
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _safe(st)) or st.st_size > limit:
            return None
        data = read_fd(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _write_entry(entry: Path, text: str) -> None:
    from agent.io.fsutil import replace_file  # only when writing an entry

    with contextlib.suppress(OSError, NodewardenError):  # a read-only home or a sandbox: no cache, no problem
        replace_file(entry, text, 0o600)  # the one atomic writer: owner-only, fchmod on the descriptor


def _cache_get(digest: str) -> tuple[Any, LineMap] | None:
    entry = _cache_file(digest)
    if entry is None:
        return None
    data = _read_entry(entry)
    if data is None:
        return None
    try:
        return _entry_doc(data)
    except (ValueError, KeyError, TypeError):
        return None  # unreadable or damaged: parse the YAML instead


def _cache_put(digest: str, value: Any, lines: LineMap) -> None:
    entry = _cache_file(digest, create=True)
    text = None if entry is None else _entry_text(value, lines)
    if entry is not None and text is not None:
        _write_entry(entry, text)


# --- remembered validations -----------------------------------------------------------------------


def _validated_name(digest: str, fingerprint: str) -> Path | None:
    """The entry of "this content passed the check that `fingerprint` names" (None: no cache)."""
    directory = cache_dir(create=True)
    if directory is None:
        return None
    key = sha256_hex(f"{digest}\n{fingerprint}\n{__version__}".encode())
    return directory / f"valid-{key}-{_CACHE_FORMAT}.json"


def _validated_get(entry: Path) -> tuple[Any, LineMap] | None:
    data = _read_entry(entry)
    if data is None:
        return None
    check, _, body = data.partition(b"\n")
    if check.decode("ascii", "replace") != sha256_hex(body):
        return None  # truncated or altered since it was written: validate again
    try:
        return _entry_doc(body)
    except (ValueError, KeyError, TypeError):
        return None


def _validated_put(entry: Path, value: Any, lines: LineMap) -> None:
    text = _entry_text(value, lines)
    if text is not None:
        _write_entry(entry, f"{sha256_hex(text.encode())}\n{text}")
