"""The `nvidia-bug-report` kind: nvidia-bug-report.log(.gz), split into its sections.

nvidia-bug-report.sh writes sections one after another (each piped through
gzip on its own, so the .gz is many gzip members, which `inputs` reads as one
stream). Every section starts with a line of 44 underscores and a blank line,
then a header: `*** /path` and a `*** ls: ...` line for a file it copied
(append()), or the command it ran (`/usr/bin/nvidia-smi --query`,
`/sbin/lspci -nnDvvvxxxx`, `/usr/sbin/dmidecode`), or a title (`dmesg:`).
Each section's body goes to the importer of its kind (found by content, as
any input); copied /proc files the host reader reads go to fs/ as they are;
every other section is listed by name as not used.
"""

from __future__ import annotations

import re

from agent.importers.base import Builder, Contribution, Importer, InputError, decode_text, detect_kind, run_importer

SEPARATOR = "_" * 44
MAX_BYTES = 1 << 30
_FILE_RE = re.compile(r"^\*\*\* (/\S+)$")
_HOST_FILES = re.compile(r"^/proc/(?:cmdline|modules|version|driver/nvidia/version|driver/nvidia/params|"
                         r"sys/.+)$")  # what agent.sources.host reads, copied by append()


def split_sections(text: str) -> list[tuple[str, str]]:
    """(header, body) of every section, in order; the prologue's header is "Start of NVIDIA bug report"."""
    sections: list[tuple[str, str]] = []
    for chunk in ("\n" + text).split("\n" + SEPARATOR + "\n")[1:]:
        lines = chunk.removeprefix("\n").split("\n")
        header = lines[0].strip()
        body_lines = lines[1:]
        if _FILE_RE.match(header):
            if body_lines and body_lines[0].startswith("*** ls:"):
                body_lines = body_lines[1:]
        elif body_lines and not body_lines[0].strip():
            body_lines = body_lines[1:]
        body = "\n".join(body_lines)
        sections.append((header, body.removesuffix("\n")))
    return sections


class BugReportImporter:
    """Splits a bug report into its sections and hands each to the importer of its kind (`sections`)."""

    kind = "nvidia-bug-report"

    def __init__(self, sections: list[Importer]) -> None:
        self.sections = sections

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head[:4096])
        return text.startswith(SEPARATOR) and "NVIDIA bug report log file" in text

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 30} GiB: not read", path=builder.current)
        sections = split_sections(decode_text(data).replace("\r\n", "\n"))
        if not sections:
            raise InputError("no nvidia-bug-report section in it", path=builder.current)
        unused: list[str] = []
        outer = builder.current
        for header, body in sections:
            shown = header[:100] or "(untitled)"
            if m := _FILE_RE.match(header):
                path = m.group(1)
                if _HOST_FILES.match(path) and body:
                    if builder.put_fs(path, body + "\n", result):
                        result.contributed.append(f"{path} (section {shown!r})")
                    continue
            payload = body.encode("utf-8")
            importer = detect_kind(payload[:65536], shown, self.sections) if body.strip() else None
            if importer is None or importer.kind == self.kind:
                unused.append(shown)
                continue
            try:
                part = run_importer(importer, payload, builder, f"{outer} section {shown!r}")
            except InputError as exc:
                result.skipped.append(f"section {shown!r} ({importer.kind}): {exc.message}")
                continue
            result.contributed += [f"{item} (section {shown!r})" for item in part.contributed]
            result.skipped += [f"section {shown!r}: {item}" for item in part.skipped]
        if unused:
            result.skipped.append(f"{len(unused)} section(s) not used: " + "; ".join(unused[:60])
                                  + (" ..." if len(unused) > 60 else ""))
        return result
