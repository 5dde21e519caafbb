"""The `lsmod` kind: `lsmod` (or a copy of /proc/modules) as /proc/modules.

lsmod prints /proc/modules as a table ("Module  Size  Used by", then name, size,
use count and the modules using it); the kernel's file is one line per module:
`name size refcount users, state address` (kernel/module/procfs.c). The host
reader (agent.sources.host.read_modules) takes the name and the state, and
lsmod lists only loaded modules, so each line is written as the kernel would
print a live one: the users comma-terminated, or "-", state `Live`, address
0x0000000000000000 (what the kernel shows a reader without CAP_SYSLOG). Taint
flags are not in lsmod's output and are left out.
"""

from __future__ import annotations

import re

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 4 << 20
MAX_MODULES = 20_000
_HEADER_RE = re.compile(r"^Module\s+Size\s+Used by\s*$")
_ROW_RE = re.compile(r"^([A-Za-z0-9_]{1,64})\s+(\d{1,12})\s+(-?\d{1,9})(?:\s+(\S{1,4096}))?\s*$")
_PROC_RE = re.compile(r"^([A-Za-z0-9_]{1,64}) (\d{1,12}) (-?\d{1,9}) (\S+) (Live|Loading|Unloading) (0x[0-9a-f]+)"
                      r"(?: \([A-Z]+\))?\s*$")


def parse_lsmod(text: str) -> tuple[list[str], list[str]]:
    """The /proc/modules lines, and what could not be read (line numbers)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        return [], []
    out: list[str] = []
    odd: list[str] = []
    proc = not _HEADER_RE.match(lines[start])
    for number, line in enumerate(lines[start + (0 if proc else 1):], start + (1 if proc else 2)):
        if not line.strip():
            continue
        if proc and _PROC_RE.match(line):
            out.append(line.rstrip())
            continue
        m = None if proc else _ROW_RE.match(line)
        if m is None:
            odd.append(f"line {number}")
            continue
        name, size, count, users = m.groups()
        used = "".join(f"{u}," for u in users.split(",") if u) if users and users != "-" else "-"
        out.append(f"{name} {size} {count} {used} Live 0x0000000000000000")
    return out, odd


class LsmodImporter:
    kind = "lsmod"

    def detect(self, head: bytes, name: str) -> bool:
        lines = [line for line in decode_text(head).splitlines()[:8] if line.strip()]
        if not lines:
            return False
        if _HEADER_RE.match(lines[0]):
            return len(lines) == 1 or bool(_ROW_RE.match(lines[1]))
        return sum(1 for line in lines[:4] if _PROC_RE.match(line)) >= min(2, len(lines))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an lsmod output", path=builder.current)
        modules, odd = parse_lsmod(decode_text(data))
        if not modules:
            raise InputError("no module line (Module  Size  Used by): not an lsmod output", path=builder.current)
        if len(modules) > MAX_MODULES:
            raise InputError(f"{len(modules)} modules, more than {MAX_MODULES}: not an lsmod output",
                             path=builder.current)
        names = sorted({line.split(" ", 1)[0] for line in modules})
        if len(names) != len(modules):
            result.skipped.append(f"{len(modules) - len(names)} module(s) listed twice")
        if builder.put_fs("proc/modules", "\n".join(modules), result, newline=True):
            nvidia = [n for n in names if n.startswith(("nvidia", "nv_peer", "gdrdrv", "mlx5", "ib_"))]
            result.contributed.append(f"/proc/modules: {len(modules)} module(s)"
                                      + (f" ({', '.join(nvidia[:12])}{' ...' if len(nvidia) > 12 else ''})"
                                         if nvidia else ""))
        if odd:
            result.skipped.append(f"{len(odd)} line(s) that are not lsmod rows ({', '.join(odd[:5])}"
                                  f"{' ...' if len(odd) > 5 else ''})")
        return result
