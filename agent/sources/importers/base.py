"""The importer interface and the snapshot being assembled (`snapshot import`).

One importer per kind of capture, one module per importer. An importer is an
object with

* `kind`: its name (`nvidia-smi`, `kernel-log`, `lspci`, ...), what `--as KIND=FILE` names;
* `detect(head, name) -> bool`: is this content (its first `HEAD_BYTES`, and the
  file's name for a hint only) of my kind? Detection is by content: a name alone
  never decides;
* `contribute(data, builder) -> Contribution`: parse the whole input and add what
  it holds to the `Builder`; raise `InputError` (one line naming what is wrong)
  when it is not usable. Nothing else may escape: the runner turns any other
  exception into an error for this input, never a traceback, and goes on.
* optionally `contribute_lines(lines, builder) -> Contribution`: the same, from the
  input's text as an iterator of lines (`text_lines`), for kinds that can be
  huge (kernel logs, bug reports): a large input is then streamed to it and
  never held whole. Importers without it get the whole content as bytes.

The `Builder` holds the snapshot in memory (files under fs/, recorded links,
kernel log lines, nvml.json, ipmi.json parts, Redfish resources); `bundle`
writes it through `agent.io.fsutil` once every input is read. Every input is
untrusted: importers bound what they keep, and the first input to provide a
file wins (a later one is told it was skipped, and why).
"""

from __future__ import annotations

import io
import json
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from agent.core.errors import SnapshotError
from agent.sources.importers.nvml_merge import GpuPart, adopt_full, merge_parts, new_document
from agent.sources.local_sources import json_recording
from agent.sources.nvml_replay import RECORDING_MAX_BYTES as NVML_MAX_BYTES
from agent.sources.redfish_client import RECORDED_RESOURCE_MAX_BYTES as REDFISH_MAX_BYTES

HEAD_BYTES = 64 * 1024  # what `detect` sees
MAX_FS_FILE = 1 << 20  # what SnapshotFs will read of one sysfs/procfs value
MAX_KMSG_LINES = 200_000  # agent.sources.kmsg.MAX_RECORDS: the reader keeps no more
MAX_LINE = 1 << 20  # characters: `text_lines` hands a longer line on in pieces
LINKS_BUDGET = 48 << 20  # fs_links.json as an import writes it; SnapshotFs reads 64 MiB of it back
_FS_PATH_RE = re.compile(r"^(?:proc|sys|etc|run|var)/[A-Za-z0-9_.:@+,=-]+(?:/[A-Za-z0-9_.:@+,=-]+)*$")


def valid_fs_path(path: str) -> bool:
    """A path a snapshot's fs/ may hold (no leading "/"): kernel-name characters only, no "." or ".."."""
    return bool(_FS_PATH_RE.match(path)) and not any(p in (".", "..") for p in path.split("/"))


class InputError(SnapshotError):
    """One input (file or archive member) that cannot be used; the rest still imports."""


@dataclass
class Contribution:
    """What one input gave the snapshot, and what it held that was not used (with why)."""

    contributed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Importer(Protocol):
    kind: str

    def detect(self, head: bytes, name: str) -> bool: ...

    def contribute(self, data: bytes, builder: Builder) -> Contribution: ...


def decode_text(data: bytes) -> str:
    """Text as the tools print it: UTF-8 (UTF-16 with a BOM, as PowerShell redirects), bad bytes replaced."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8", errors="replace").removeprefix("\ufeff")


def text_lines(stream: IO[bytes] | io.RawIOBase, max_line: int = MAX_LINE) -> Iterator[str]:
    """The lines of a text read as `decode_text` reads it, in order, each with its "\\n" (split at "\\n" only).

    "".join() of them is decode_text() of the whole; a line longer than `max_line` characters comes in
    pieces, so memory stays bounded whatever the input holds.
    """
    buffered = io.BufferedReader(stream, 1 << 16)  # type: ignore[type-var]  # any readinto() will do
    encoding = "utf-16" if buffered.peek(2)[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    text = io.TextIOWrapper(buffered, encoding=encoding, errors="replace", newline="\n")
    try:
        while line := text.readline(max_line):
            yield line
    finally:  # leave `stream` open: its owner finishes reading it
        text.detach()
        buffered.detach()


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head[:4096] and not head.startswith((b"\xff\xfe", b"\xfe\xff"))


@dataclass
class Builder:
    """The snapshot being assembled from every input, in memory."""

    fs: dict[str, bytes] = field(default_factory=dict)  # "sys/class/dmi/id/product_name" -> bytes
    fs_owner: dict[str, str] = field(default_factory=dict)  # fs path -> the input that gave it
    fs_dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)  # fs_links.json: path -> target
    links_bytes: int = 0  # fs_links.json's size so far, as json_recording writes it
    kmsg: list[str] = field(default_factory=list)
    kmsg_from: list[str] = field(default_factory=list)
    nvml: dict[str, Any] | None = None
    nvml_from: str | None = None
    nvml_partial: bool = False  # the recording so far holds only facts from partial captures (nvlink -s, CSV)
    nvml_full_from: str | None = None  # the input whose full dump (-q) is in it
    nvml_also: list[str] = field(default_factory=list)  # later inputs that added NVML facts
    nvml_owners: dict[str, str] = field(default_factory=dict)  # "<gpu>/<key>" -> the input that gave it
    ipmi: dict[str, Any] = field(default_factory=dict)  # ipmi.json parts: sensors, sel, power, ...
    ipmi_from: dict[str, str] = field(default_factory=dict)
    redfish: dict[str, bytes] = field(default_factory=dict)  # "redfish/v1/Systems/1/index.json" -> body
    redfish_from: list[str] = field(default_factory=list)
    hostname: str | None = None
    captured_at: str | None = None
    current: str = ""  # the input being read, for ownership and messages
    # Each name `current` took -> (the input as given, its importer kind, the section inside it or None):
    # what meta.yaml's `evidence` names (a bug report's section is read as "<report> section '<header>'").
    refs: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    _seen_kmsg: set[str] = field(default_factory=set)

    # --- fs/ ------------------------------------------------------------------------------------

    def put_fs(self, path: str, data: bytes | str, result: Contribution, *, newline: bool = False) -> bool:
        """Record fs/`path` (a sysfs/procfs path without the leading "/"); False when an earlier input has it."""
        path = path.strip("/")
        if not valid_fs_path(path):
            result.skipped.append(f"{path[:120]!r}: not a path a snapshot may hold")
            return False
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if newline:
            raw += b"\n"
        if len(raw) > MAX_FS_FILE:
            result.skipped.append(f"/{path}: larger than {MAX_FS_FILE} bytes")
            return False
        if path in self.fs:
            if self.fs[path] != raw:
                result.skipped.append(f"/{path}: already given by {self.fs_owner[path]}")
            return False
        parts = path.split("/")
        if any("/".join(parts[:i]) in self.links for i in range(1, len(parts) + 1)):
            result.skipped.append(f"/{path}: a recorded link is in the way")
            return False
        self.fs[path] = raw
        self.fs_owner[path] = self.current
        return True

    def put_link(self, path: str, target: str, result: Contribution | None = None) -> bool:
        """Record a link; False when the path is taken or fs_links.json would outgrow what audit reads
        (LINKS_BUDGET: 100,000 members with 4 KB targets once could, issue 31), which `result` is told."""
        if path in self.links or path in self.fs:
            return False
        cost = len(json.dumps(path)) + len(json.dumps(target)) + 8
        if self.links_bytes + cost > LINKS_BUDGET:
            if result is not None:
                result.skipped.append(f"/{path}: a link past the {LINKS_BUDGET >> 20} MiB fs_links.json holds at "
                                      "most; not recorded")
            return False
        self.links[path] = target
        self.links_bytes += cost
        return True

    def add_dir(self, path: str) -> None:
        self.fs_dirs.add(path.strip("/"))

    # --- kernel log, NVML, IPMI -----------------------------------------------------------------

    def add_kmsg(self, lines: list[str], result: Contribution) -> int:
        """Append one file's kernel log lines (any format agent.sources.kmsg reads).

        A line an earlier file gave is dropped (dmesg and `journalctl -k` of one boot overlap); repeats
        within this file stay: a syslog stamps to the second, so six carrier losses or an EDAC storm in
        one second are six identical lines, and each one counts.
        """
        added = 0
        fresh: set[str] = set()
        for line in lines:
            if line in self._seen_kmsg:
                continue
            if len(self.kmsg) >= MAX_KMSG_LINES:
                result.skipped.append(f"kernel log lines past {MAX_KMSG_LINES} (the reader keeps no more)")
                break
            fresh.add(line)
            self.kmsg.append(line)
            added += 1
        self._seen_kmsg |= fresh
        if added and self.current not in self.kmsg_from:
            self.kmsg_from.append(self.current)
        return added

    def set_nvml(self, document: dict[str, Any], result: Contribution) -> bool:
        if (size := nvml_size(document)) > NVML_MAX_BYTES:
            result.skipped.append(f"the NVML recording: {size} bytes, more than the {NVML_MAX_BYTES >> 20} MiB "
                                  "audit reads of nvml.json; not recorded")
            return False
        if self.nvml is not None and self.nvml_partial:  # partial captures came first: their facts stay
            self.nvml, self.nvml_owners, skipped = adopt_full(self.nvml, self.nvml_owners, self.nvml_from or "",
                                                              document, self.current)
            result.skipped.extend(skipped)
            self.nvml_partial, self.nvml_full_from = False, self.current
            self._nvml_fed()
            return True
        if self.nvml is not None:
            result.skipped.append(f"the NVML recording: already taken from {self.nvml_full_from or self.nvml_from}")
            return False
        self.nvml, self.nvml_from, self.nvml_full_from = document, self.current, self.current
        return True

    def add_nvml_facts(self, parts: list[GpuPart], system: dict[str, Any], result: Contribution) -> int:
        """Facts of a partial capture (nvlink -s, --query-gpu CSV) merged GPU by GPU; the number added."""
        fresh = self.nvml is None
        if self.nvml is None:
            self.nvml, self.nvml_from, self.nvml_partial = new_document(), self.current, True
        added, skipped = merge_parts(self.nvml, self.nvml_owners, self.nvml_from or "", parts, system, self.current)
        result.skipped.extend(skipped)
        if added:
            self._nvml_fed()
        elif fresh:  # nothing usable: no NVML recording at all
            self.nvml, self.nvml_from, self.nvml_partial = None, None, False
        return added

    def _nvml_fed(self) -> None:
        if self.current != self.nvml_from and self.current not in self.nvml_also:
            self.nvml_also.append(self.current)

    def set_ipmi(self, part: str, value: Any, result: Contribution) -> bool:
        if part in self.ipmi:
            result.skipped.append(f"IPMI {part}: already taken from {self.ipmi_from[part]}")
            return False
        self.ipmi[part], self.ipmi_from[part] = value, self.current
        return True

    def put_redfish(self, odata_path: str, body: bytes, result: Contribution) -> bool:
        """A Redfish resource at its URI ("/redfish/v1/Systems/1") as the mockup layout stores it."""
        clean = posixpath.normpath("/" + odata_path.strip("/"))
        parts = clean.strip("/").split("/")
        if parts[:2] != ["redfish", "v1"] or any(not re.fullmatch(r"[A-Za-z0-9_.:@+,=#$-]{1,128}", p) for p in parts):
            result.skipped.append(f"{odata_path[:120]!r}: not a Redfish resource path")
            return False
        key = "/".join([*parts, "index.json"])
        if key in self.redfish:
            result.skipped.append(f"{clean}: already given by an earlier input")
            return False
        if len(body) > REDFISH_MAX_BYTES:
            result.skipped.append(f"{clean}: {len(body)} bytes, more than the {REDFISH_MAX_BYTES >> 20} MiB audit "
                                  "reads of one resource; not recorded")
            return False
        self.redfish[key] = body
        if self.current not in self.redfish_from:
            self.redfish_from.append(self.current)
        return True

    def note_host(self, hostname: str | None = None, captured_at: str | None = None) -> None:
        if hostname and not self.hostname:
            self.hostname = hostname
        if captured_at and not self.captured_at:
            self.captured_at = captured_at

    def fed_by(self) -> dict[str, list[str]]:
        """Each recorded source -> the inputs that gave it something (meta.yaml `fed_by`, the report's detail)."""
        fed: dict[str, list[str]] = {
            "host": sorted(set(self.fs_owner.values())), "kmsg": list(self.kmsg_from),
            "nvml": [self.nvml_from, *self.nvml_also] if self.nvml_from else [],
            "ipmi": sorted(set(self.ipmi_from.values())),
            "redfish": list(self.redfish_from)}
        return {source: names for source, names in fed.items() if names}

    @property
    def captured(self) -> list[str]:
        sources = []
        if self.fs:
            sources.append("host")
        if self.kmsg:
            sources.append("kmsg")
        if self.nvml is not None:
            sources.append("nvml")
        if self.ipmi:
            sources.append("ipmi")
        if self.redfish:
            sources.append("redfish")
        return sources


def detect_kind(head: bytes, name: str, kinds: list[Importer]) -> Importer | None:
    """The first of `kinds` that recognises this input by its first bytes (and name)."""
    if looks_binary(head):
        return None
    for importer in kinds:
        if importer.detect(head, name):
            return importer
    return None


def _note_ref(builder: Builder, kind: str, name: str, outer_name: str) -> None:
    """Which input (and section of it) `name` is: an input of its own, or a part of the one being read."""
    outer = builder.refs.get(outer_name) if outer_name else None
    if outer is not None and name == outer_name:  # a kind handing its own input on (a sos report's dmesg)
        return
    marker = f"{outer_name} section "
    if outer is not None and name.startswith(marker):  # bug_report: f"{outer} section {header!r}"
        header = name[len(marker):]
        if len(header) >= 2 and header[0] == header[-1] and header[0] in "'\"":
            header = header[1:-1]
        builder.refs[name] = (outer[0], outer[1], header)
    else:
        builder.refs[name] = (name, kind, None)


def run_importer(importer: Importer, data: bytes | IO[bytes] | io.RawIOBase, builder: Builder,
                 name: str) -> Contribution:
    """`importer.contribute`, with any failure turned into an InputError naming `name` (never a traceback).

    `data` may be a stream (a large input, `agent.sources.importers.inputs.Content`): it goes to the importer's
    `contribute_lines` when it has one, else it is read whole (the stream bounds itself) for `contribute`.
    """
    previous = builder.current
    builder.current = name
    _note_ref(builder, importer.kind, name, previous)
    try:
        if not isinstance(data, bytes):
            streamed = getattr(importer, "contribute_lines", None)
            if streamed is not None:
                result: Contribution = streamed(text_lines(data), builder)
                return result
            data = data.read() or b""
        return importer.contribute(data, builder)
    except InputError:
        raise
    except SnapshotError as exc:
        raise InputError(exc.message, path=exc.path or name, line=exc.line) from None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError, UnicodeError) as exc:
        raise InputError(f"could not import it (importer bug, please report): {type(exc).__name__}: {exc}"[:300],
                         path=name) from exc
    finally:
        builder.current = previous


def nvml_size(document: dict[str, Any]) -> int:
    """nvml.json's size as the import writes it: what audit's reader bounds (NVML_MAX_BYTES)."""
    return len(json_recording(document))
