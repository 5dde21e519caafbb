"""What `snapshot import` prints: a summary by kind (default), every file (-v), problems only (-q).

A Redfish mockup is a thousand files and a sos report hundreds: one line per file buries the one
that failed. By default each kind gets one line with its counts, and the files that failed or
that no importer recognised are named (the first MAX_NAMED of each; -v names them all).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.core.sanitise import clean
from agent.sources.importers.input_entries import Entry

# The --as kinds for `snapshot import --help`, without importing every importer to list them (the
# help of any command loads this module); a test keeps it equal to agent.sources.importers.bundle.kind_names().
IMPORT_KINDS = ("sosreport", "nvidia-bug-report", "nvidia-smi", "dmidecode", "lspci", "kernel-log", "ipmitool",
                "ibstat", "nvidia-smi-nvlink", "nvidia-smi-topo", "nvidia-smi-query-csv", "ip-link", "ethtool",
                "lsmod", "redfish-mockup", "sysfs-tree")
MAX_NAMED = 10  # failed or unrecognised files named one by one without -v; the rest are counted
QUIET, SUMMARY, EVERY_FILE = -1, 0, 1


@dataclass
class Printout:
    out: list[str] = field(default_factory=list)  # stdout
    err: list[str] = field(default_factory=list)  # stderr: errors and files not imported


def _area(contribution: str) -> str:
    """"redfish: /redfish/v1/Systems/1" -> "redfish"; a host file ("/proc/cmdline ...") -> "host"."""
    head, sep, _rest = contribution.partition(":")
    return head.strip() if sep and head and "/" not in head and " " not in head.strip() else "host"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _named(lines: list[str], limit: int | None, what: str) -> list[str]:
    if limit is None or len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... and {len(lines) - limit:,} more {what} (-v lists them all)"]


def printout(entries: Iterable[Entry], captured: list[str], out: str, kinds: Iterable[str],
             verbosity: int = SUMMARY) -> Printout:
    """The lines `snapshot import` prints for `entries` (what bundle.import_inputs recorded)."""
    entries = list(entries)
    importer_kinds = set(kinds)
    limit = None if verbosity >= EVERY_FILE else MAX_NAMED
    result = Printout()
    # names and messages come from the inputs (archive member names): cleaned of control characters
    errors = [clean(f"error: {e.name}: {e.error}") for e in entries if e.error]
    unknown = [clean(f"skipped: {e.name}: {'; '.join(e.skipped)}") for e in entries
               if not e.error and e.kind == "unknown"]
    result.err += _named(errors, limit, "errors")
    if verbosity <= QUIET:
        return result
    result.err += _named(unknown, limit, "files not imported")
    if verbosity >= EVERY_FILE:
        result.out += [clean(f"{e.name} ({e.kind}): {'; '.join(e.contributed)}") for e in entries
                       if not e.error and e.contributed]
    else:
        files: Counter[str] = Counter()
        used: Counter[str] = Counter()
        areas: dict[str, Counter[str]] = {}
        for e in entries:
            if e.error or e.kind not in importer_kinds:
                continue
            kind = str(e.kind)
            files[kind] += 1
            used[kind] += bool(e.contributed)
            areas.setdefault(kind, Counter()).update(_area(c) for c in e.contributed)
        for kind, count in files.items():
            parts = ", ".join(f"{area} {n:,}" for area, n in sorted(areas[kind].items()))
            unused = count - used[kind]
            line = f"{kind}: {_plural(count, 'file')}" + (f", {used[kind]:,} used ({parts})" if parts else "")
            result.out.append(line + (f", {unused:,} not used by the audit" if unused else ""))
        if errors or unknown:
            result.out.append(f"{_plural(len(errors), 'error')}, {_plural(len(unknown), 'file')} of no kind "
                              "nodewarden reads (on stderr; -v lists every file and what it gave)")
    result.out.append(clean(f"imported {', '.join(captured)} into {out}"))
    return result
