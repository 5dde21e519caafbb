"""The node's own names in a snapshot under `--redact hostnames`, whatever their length (issue 36, 2).

The names: meta.yaml's hostname, the recorded hostname files, and every JSON string under a host-name key
(Redfish HostName and FQDN, a dump's hostname), each with its short form (before the first dot). None is
skipped for being short: a host named `vm` is as identifying as one named `gpu-h100-01`.

A name is replaced as a token, never as a substring (redacting `vm` leaves `vmstat`, `kvm`, `vmlinuz`): not
next to a letter, digit, `_` or `-`, nor after a `.` (then it is a label of another dotted name). A `.` after it
is allowed: `vm.example.com` is this host in a domain nobody recorded.

A name is safe to replace everywhere when it cannot be one of the words the snapshot's data is made of: three
characters or more, not all digits or hex digits, and not a token of any fs/ file the kernel wrote (`up` is
every NIC's operstate, `c0` a PCI bus, `v1` part of every Redfish path, `7` a number). Any other name is
replaced exactly where it stands as the host's name (meta.yaml's hostname, the hostname files, JSON host-name
fields) and by token in the free-text logs (kmsg.txt, fs/var/log/; not a name of digits only: numbers are what
logs are made of). Anywhere else it stays, since replacing it would change what the audit reads, and the
capture says in which files (meta.yaml `redaction_notes` and a warning) rather than keep it silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

HOST_FILES = ("fs/proc/sys/kernel/hostname", "fs/etc/hostname")
_HOST_KEYS = {"hostname", "host_name", "fqdn", "hostnamefqdn"}  # JSON keys, lower-cased
_NOT_NAMES = {"localhost", "localhost.localdomain", "(none)"}  # the kernel's and distributions' defaults
_BEFORE = rb"(?<![A-Za-z0-9_.-])"
_AFTER = rb"(?![A-Za-z0-9_-])"
NOTES_SHOWN = 5


def json_hosts(value: Any, found: set[str]) -> None:
    """Every string under a host-name key in a parsed JSON document, into `found`."""
    pending = [value]  # a stack, not recursion: a hostile BMC's body may nest as deep as it likes
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and str(key).lower() in _HOST_KEYS:
                    found.add(item.strip())
                else:
                    pending.append(item)
        elif isinstance(value, list):
            pending.extend(value)


def host_forms(names: Iterable[str], placeholders: set[str]) -> set[str]:
    """The names and their short forms, less placeholders ("unknown", "localhost")."""
    out: set[str] = set()
    for name in (n.strip() for n in names):
        out |= {name, name.split(".")[0]}
    return {n for n in out if n and n.lower() not in placeholders | _NOT_NAMES and not n.isspace()}


def is_free_text(rel: str) -> bool:
    return rel == "kmsg.txt" or rel.startswith("fs/var/log/")


def is_kernel_data(rel: str) -> bool:
    """An fs/ file the kernel (or a daemon's state) wrote: its words are values the audit reads."""
    return rel.startswith("fs/") and rel not in HOST_FILES and not is_free_text(rel)


def _token_re(names: Iterable[str]) -> re.Pattern[bytes] | None:
    ordered = sorted({n.encode() for n in names}, key=len, reverse=True)  # longest first: the FQDN before its host
    if not ordered:
        return None
    return re.compile(_BEFORE + rb"(?:" + b"|".join(re.escape(n) for n in ordered) + rb")" + _AFTER)


def short_or_shapeless(name: str) -> bool:
    return len(name) < 3 or re.fullmatch(r"[0-9A-Fa-f]+", name) is not None


class HostNames:
    """The host's names, and where each may be replaced (see the module's docstring)."""

    def __init__(self, names: set[str], unsafe: set[str], token: Callable[[bytes], bytes]) -> None:
        self.names = {n.encode() for n in names}
        self.token = token
        self.anywhere = _token_re(names)
        self.everywhere = _token_re(names - unsafe)
        self.in_text = _token_re(n for n in unsafe if not n.isdigit())
        self.unsafe = {n.encode() for n in unsafe}
        self.kept: dict[str, int] = {}  # file -> how many times a name was left in it
        alternatives = b"|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
        self.meta_line = re.compile(rb"(?m)^(hostname:[ \t]*)(['\"]?)(" + alternatives + rb")\2([ \t]*\r?)$")
        self.json_field = re.compile(rb'("(?i:host_?name|fqdn|hostnamefqdn)"\s*:\s*")(' + alternatives + rb')"')

    def _sub(self, match: re.Match[bytes]) -> bytes:
        return self.token(match.group(0))

    def apply(self, data: bytes, rel: str | None) -> bytes:
        """`data` (a file's bytes at `rel`, or a file name in the Redfish tree when None) with the names replaced."""
        if rel in HOST_FILES and data.strip() in self.names:
            name = data.strip()
            start = data.find(name)
            data = data[:start] + self.token(name) + data[start + len(name):]
        elif rel == "meta.yaml":
            data = self.meta_line.sub(lambda m: m.group(1) + m.group(2) + self.token(m.group(3)) + m.group(2)
                                      + m.group(4), data)
        elif rel is not None and rel.endswith(".json"):
            data = self.json_field.sub(lambda m: m.group(1) + self.token(m.group(2)) + b'"', data)
        if rel is not None and is_free_text(rel) and self.in_text is not None:
            data = self.in_text.sub(self._sub, data)
        if self.everywhere is not None:
            data = self.everywhere.sub(self._sub, data)
        return data

    def check(self, data: bytes, rel: str) -> None:
        """Count the names still standing as a word in a redacted file, for the capture's note."""
        if self.anywhere is not None and (count := len(self.anywhere.findall(data))):
            self.kept[rel] = self.kept.get(rel, 0) + count

    def notes(self) -> list[str]:
        """What the capture says when a name was kept somewhere; the name itself is never written."""
        if not self.kept:
            return []
        files = sorted(self.kept)
        shown = ", ".join(files[:NOTES_SHOWN]) + (f" and {len(files) - NOTES_SHOWN} more" if len(files) > NOTES_SHOWN
                                                   else "")
        return [f"hostnames: the host's name is also a word of the recorded data, kept there (replacing it would "
                f"change what the audit reads) in {len(files)} file(s): {shown}; it is redacted where it stands "
                "as the host's name and in the logs"]


def unsafe_names(names: set[str], kernel_data: Iterable[bytes]) -> set[str]:
    """The names that are, or could be, words of the snapshot's own data (see the module's docstring)."""
    unsafe = {n for n in names if short_or_shapeless(n)}
    rest = _token_re(names - unsafe)
    if rest is None:
        return unsafe
    for data in kernel_data:
        unsafe |= {m.decode() for m in rest.findall(data)}
        if unsafe == names:
            break
    return unsafe
