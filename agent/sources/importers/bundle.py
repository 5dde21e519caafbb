"""`nodewarden snapshot import INPUT... --out DIR`: many captures, one snapshot.

Inputs (files, folders, archives) are expanded by `inputs.Reader` (bounded,
nothing extracted to disk), each file's kind is found by content (`KINDS`, in
order: the first importer whose `detect` says yes), or forced with
`--as KIND=FILE`, and its importer adds what it holds to one `Builder`. A file
no importer recognises, or one that fails, is recorded with why, and the rest
still imports. inputs.jsonl lists every input (name, size, sha256, kind, what it
contributed, what was skipped and why; meta.yaml the first that fit); `audit --snapshot` shows that list in
the report (node.snapshot.inputs). What no input provided is simply not in the
snapshot: the audit says "not in this snapshot", never fails on it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from agent import __version__
from agent.core.errors import SnapshotError
from agent.sources.bmc_source import IPMI_FILE
from agent.sources.host_parts import parts_of, parts_of_path
from agent.sources.importers.base import (
    HEAD_BYTES,
    Builder,
    Importer,
    InputError,
    detect_kind,
    looks_binary,
    run_importer,
)
from agent.sources.importers.inputs import STREAM_ABOVE, Budget, Content, Entry, Reader
from agent.sources.local_sources import KMSG_FILE, LINKS_FILE, NVML_FILE, json_recording, kmsg_recording
from agent.sources.snapshot_index import INDEX_FILE, index_lines


def importers() -> list[Importer]:
    """Every kind, most specific first (a bug report holds nvidia-smi, lspci and dmesg sections)."""
    from agent.sources.importers.bug_report import BugReportImporter
    from agent.sources.importers.dmidecode import DmidecodeImporter
    from agent.sources.importers.ibstat import IbstatImporter
    from agent.sources.importers.ipmitool import IpmitoolImporter
    from agent.sources.importers.kernel_log import KernelLogImporter
    from agent.sources.importers.lspci import LspciImporter
    from agent.sources.importers.nvidia_smi_kind import NvidiaSmiImporter

    sections: list[Importer] = [NvidiaSmiImporter(), DmidecodeImporter(), LspciImporter(), KernelLogImporter()]
    from agent.sources.importers.ethtool import EthtoolImporter
    from agent.sources.importers.ip_link import IpLinkImporter
    from agent.sources.importers.lsmod import LsmodImporter
    from agent.sources.importers.nvidia_smi_csv import NvidiaSmiCsvImporter
    from agent.sources.importers.nvidia_smi_nvlink import NvidiaSmiNvlinkImporter
    from agent.sources.importers.nvidia_smi_topo import NvidiaSmiTopoImporter
    more: list[Importer] = [NvidiaSmiNvlinkImporter(), NvidiaSmiTopoImporter(), NvidiaSmiCsvImporter(),
                            IpLinkImporter(), EthtoolImporter(), LsmodImporter()]
    from agent.sources.importers.redfish_mockup import RedfishMockupImporter
    from agent.sources.importers.sosreport import SosreportImporter
    from agent.sources.importers.sysfs_tree import SysfsTreeImporter
    rest: list[Importer] = [BugReportImporter(sections), *sections, IpmitoolImporter(), IbstatImporter(), *more,
                            RedfishMockupImporter(), SysfsTreeImporter()]
    return [SosreportImporter(rest), *rest]  # a sos report's files are claimed by their path, judged at the end


def kind_names() -> list[str]:
    return [k.kind for k in importers()]


@dataclass
class ImportSummary:
    captured: list[str]
    entries: list[Entry]

    @property
    def errors(self) -> list[Entry]:
        return [e for e in self.entries if e.error]


def _forced_kind(entry: Entry, forced: dict[str, str]) -> str | None:
    for target, kind in forced.items():
        clean = target.rstrip("/")
        if entry.name == clean or entry.name.startswith(clean + ":") or entry.name.endswith(("/" + clean, ":" + clean)):
            return kind
    return None


def import_inputs(paths: list[Path], out: Path, forced: dict[str, str] | None = None,
                  budget: Budget | None = None) -> ImportSummary:
    """Import every input into one new snapshot at `out` (missing or an empty folder; exit 2 otherwise)."""
    from agent.io.fsout import write_output_dir  # moved from fsutil (issue 21, 2)

    forced = forced or {}
    kinds = importers()
    by_name = {k.kind: k for k in kinds}
    unknown = sorted(set(forced.values()) - set(by_name))
    if unknown:
        raise SnapshotError(f"unknown kind {unknown[0]!r} in --as (kinds: {', '.join(by_name)})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SnapshotError("output exists and is not an empty directory; refusing to overwrite", path=str(out))
    builder = Builder()
    entries: list[Entry] = []
    for entry in Reader(budget, stream_above=STREAM_ABOVE).read_paths(paths):  # a large file comes as a stream
        entries.append(entry)
        if entry.data is None and entry.content is None:
            continue
        data: bytes | Content = entry.data if entry.data is not None else cast(Content, entry.content)
        head = data[:HEAD_BYTES] if isinstance(data, bytes) else data.head
        entry.data = entry.content = None
        want = _forced_kind(entry, forced)
        importer = by_name[want] if want else detect_kind(head, entry.name, kinds)
        if importer is None:
            entry.kind = "unknown"
            entry.skipped.append("not a kind nodewarden imports (binary)" if looks_binary(head[:4096]) else
                                 f"not a kind nodewarden imports ({', '.join(by_name)}); "
                                 "name one with --as KIND=FILE")
            continue
        entry.kind = importer.kind
        try:
            result = run_importer(importer, data, builder, entry.name)
        except InputError as exc:
            entry.error = str(exc) if exc.path not in (None, entry.name) else exc.message if exc.line is None else (
                f"line {exc.line}: {exc.message}")
            continue
        entry.contributed, entry.skipped = result.contributed, entry.skipped + result.skipped
    broken = [e for e in entries if e.broken]
    if broken:  # never imported in part: a snapshot built from half an archive would be judged as a whole
        named = "; ".join(f"{e.name}: {e.error}" for e in broken[:3]) + (
            f"; and {len(broken) - 3} more" if len(broken) > 3 else "")
        raise SnapshotError(f"nothing written: {named}: an input that does not read to its end is never "
                            "imported in part (copy it again, or leave it out)")
    for importer in kinds:  # a kind that sees a group of files (a sos report) judges them once all are read
        finish = getattr(importer, "finish", None)
        if finish is not None:
            finish(builder, entries)
    if not builder.captured:
        problems = [f"{e.name}: {e.error}" for e in entries if e.error][:3]
        if not problems:  # a kind it reads, but nothing of it could be kept: say why, not "no kind"
            problems = [f"{e.name}: {e.skipped[0]}" for e in entries if e.kind != "unknown" and e.skipped][:3]
            if problems:
                raise SnapshotError("nothing to import: nothing of the inputs could be recorded "
                                    f"({'; '.join(problems)})")
        raise SnapshotError("nothing to import: no input holds a kind nodewarden reads"
                            + (f" ({'; '.join(problems)})" if problems else ""))
    write_output_dir(out, lambda tmp: _write(tmp, builder, entries))
    return ImportSummary(builder.captured, entries)


def put_file(root: Path, rel: str, data: bytes | Iterable[bytes]) -> None:
    """A new file inside our private 0700 folder (the one writer's `create_file`: never through a link)."""
    from agent.io.fsutil import create_file

    create_file(root, rel, data)


def _write(tmp: Path, builder: Builder, entries: list[Entry]) -> None:
    if builder.fs or builder.fs_dirs:
        (tmp / "fs").mkdir(mode=0o755)
        for rel, data in sorted(builder.fs.items()):
            put_file(tmp / "fs", rel, data)
        for rel in sorted(builder.fs_dirs):
            (tmp / "fs" / rel).mkdir(parents=True, exist_ok=True, mode=0o755)
        for link in builder.links:  # a recorded link's folder must exist for listings
            (tmp / "fs" / os.path.dirname(link)).mkdir(parents=True, exist_ok=True, mode=0o755)
        put_file(tmp, LINKS_FILE, json_recording(builder.links))
    # The recording files as each source's own capture writes them (agent.sources.registry).
    if builder.kmsg:
        put_file(tmp, KMSG_FILE, kmsg_recording(builder.kmsg))
    if builder.nvml is not None:
        put_file(tmp, NVML_FILE, json_recording(builder.nvml))
    if builder.ipmi:
        put_file(tmp, IPMI_FILE, json_recording(_ipmi_document(builder.ipmi)))
    for rel, body in sorted(builder.redfish.items()):
        put_file(tmp, rel, body)
    rows = [e.to_json() for e in entries]
    put_file(tmp, INDEX_FILE, index_lines(rows))  # every input, bounded per row (agent.sources.snapshot_index)
    meta: dict[str, Any] = {
        "hostname": builder.hostname or "imported",
        "captured_at": builder.captured_at or dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "nodewarden_version": __version__,
        "captured": builder.captured,
        **({"host_parts": parts_of([*builder.fs, *builder.links])} if builder.fs else {}),  # a class is links
        "source": f"snapshot import of {len([e for e in entries if ':' not in e.name])} input(s)",
        "inputs_index": INDEX_FILE,
        "evidence": evidence_of(builder, entries),
    }
    put_file(tmp, "meta.yaml", _meta_text(meta, rows, builder.fed_by()))


META_WRITE_MAX = 1 << 19  # what an import writes to meta.yaml: half of what audit reads (META_MAX_BYTES)
META_INPUTS_CHARS = 192 << 10  # meta.yaml's preview of the index: the first inputs that fit (all, for most imports)
FED_BY_NAMES = 100  # inputs named per source in `fed_by`: what agent.sources.node.snapshot_feeds reads back
FED_BY_CHARS = 300


def _meta_text(meta: dict[str, Any], rows: list[dict[str, Any]], fed_by: dict[str, list[str]]) -> bytes:
    """meta.yaml, within META_WRITE_MAX whatever the inputs: audit must read what import wrote (issue 31).

    The whole index is in INDEX_FILE; meta.yaml keeps, for a person reading it, the first inputs that fit
    (`inputs`, with `inputs_left_out` saying how many are only in the index) and `fed_by` bounded as it is
    read back. Should hostile names still make it too big, the preview goes, then `fed_by` is cut harder.
    """
    import json

    import yaml

    from agent.sources.snapshot import META_MAX_BYTES

    preview: list[dict[str, Any]] = []
    used = 0
    for row in rows:
        used += len(json.dumps(row)) + 16
        if used > META_INPUTS_CHARS:
            break
        preview.append(row)
    tries: tuple[tuple[list[dict[str, Any]], int, int], ...] = (
        (preview, FED_BY_NAMES, FED_BY_CHARS), ([], FED_BY_NAMES, FED_BY_CHARS), ([], 10, 100))
    text = b""
    for shown, names, chars in tries:
        doc = {**meta, "inputs": shown, **({"inputs_left_out": len(rows) - len(shown)} if len(shown) < len(rows)
                                           else {}),
               "fed_by": {source: [n[:chars] for n in listed[:names]] for source, listed in fed_by.items()}}
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=False, width=200).encode()
        if len(text) <= META_WRITE_MAX:
            return text
    if len(text) > META_MAX_BYTES:  # never write a snapshot that audit would refuse
        raise SnapshotError(f"meta.yaml would be {len(text)} bytes, more than audit reads: not written")
    return text


_SOS_TOPS = ("sos_commands/", "proc/", "sys/", "etc/", "var/", "run/")  # where a sos report's own files start
MAX_EVIDENCE = 20  # inputs named per fact area in meta.yaml `evidence` (the engine reads back no more)
MAX_EVIDENCE_CHARS = 64 << 10  # all of it (meta.yaml: META_WRITE_MAX at most): names cut as the engine cuts them


def evidence_of(builder: Builder, entries: list[Entry]) -> dict[str, list[dict[str, str]]]:
    """meta.yaml `evidence`: each fact area -> the inputs that gave it ({file, kind, section}).

    Areas: `host.<part>` (agent.sources.host_parts; from which input wrote each fs/ file), `kmsg`, `nvml`,
    `ipmi.<part>`, `redfish`. The engine ties each finding to the areas its check reads.
    """
    from agent.sources.importers.sosreport import splits

    kinds = {e.name: e.kind for e in entries}
    areas: dict[str, list[dict[str, str]]] = {}
    cache: dict[str, dict[str, str]] = {}

    def ref(name: str, path: str | None = None) -> dict[str, str]:
        if name in cache:
            return cache[name]
        file, kind, section = builder.refs.get(name, (name, kinds.get(name) or "unknown", None))
        if section is None and kind == "sosreport":  # the file inside the report: "sos_commands/kernel/dmesg"
            found = [rel for _root, rel in splits(file)]
            section = next((rel for rel in found if rel.startswith(_SOS_TOPS)), found[-1] if found else None)
        out = {"file": file[:300], "kind": kind[:64], **({"section": section[:200]} if section else {})}
        if section is None and kind == "nvidia-bug-report" and path is not None:
            return {**out, "section": f"*** /{path}"[:200]}  # a file section ("*** /proc/cmdline") as it is
        cache[name] = out
        return out

    used = 0

    def add(area: str, name: str, path: str | None = None) -> None:
        nonlocal used
        refs = areas.setdefault(area, [])
        if len(refs) < MAX_EVIDENCE and used < MAX_EVIDENCE_CHARS and (item := ref(name, path)) not in refs:
            refs.append(dict(item))  # a copy: yaml would write a shared one as an alias, which meta.yaml refuses
            used += sum(len(v) + 12 for v in item.values())

    for path, name in builder.fs_owner.items():
        for part in parts_of_path(path):
            add(f"host.{part}", name, path)
    ordered = {area: areas[area] for area in sorted(areas)}
    for name in builder.kmsg_from:
        add("kmsg", name)
    for name in [builder.nvml_from, *builder.nvml_also] if builder.nvml_from else []:
        add("nvml", name)
    for part, name in sorted(builder.ipmi_from.items()):
        add(f"ipmi.{part}", name)
    for name in builder.redfish_from:
        add("redfish", name)
    return {area: refs for area, refs in {**ordered, **areas}.items() if refs}


def _ipmi_document(parts: dict[str, Any]) -> dict[str, Any]:
    """ipmi.json as agent.sources.ipmi's recorded reader reads it: a part no input gave says so."""
    from agent.sources.ipmi import PARTS, RECORD_FORMAT

    document: dict[str, Any] = {"format": RECORD_FORMAT, "requests": 0}
    for part in PARTS:
        document[part] = parts.get(part, {"not_captured": "not in this snapshot (no input held it)"})
    return document
