"""The `nvidia-smi -q` text reader: an indentation tree ("Key : Value" lines, 4-space nesting,
section headers without a value) flattened into "Section/Sub/Key" paths per GPU, as `Dump`s."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.core.errors import SnapshotError
from agent.sources.importers.nvidia_smi_fields import (
    MAX_DEPTH,
    VERSION_SOURCES,
    Dump,
    GpuDump,
    Value,
    neutral,
    settle_versions,
    warn,
)

BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")
# nvidia-smi prints this (on stderr, often captured with 2>&1) for a GPU it cannot open.
HANDLE_ERROR = re.compile(r"^Unable to determine the device handle for (?:GPU ?)?(.*?): ([^:]+)$")
INFOROM_CORRUPTED = re.compile(r"WARNING: infoROM is corrupted at gpu ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")
KEY_VALUE = re.compile(r"^(.*?\S)\s+: ?(.*)$")  # key, padding, ':', value; values may hold ':'
TEXT_TOP_KEYS = {"Timestamp": "timestamp", "Attached GPUs": "attached",
                 **{text: text for sources in VERSION_SOURCES.values() for text, _ in sources}}


@dataclass
class _Node:
    key: str
    value: str | None
    line: int
    indent: int
    children: list[_Node] = field(default_factory=list)


def _parse_tree(lines: list[tuple[int, str]]) -> list[_Node]:
    """Nest "Key : Value" lines by indentation; a line without " : " is a section header.

    Nesting follows the actual indentation, not multiples of 4, so a stray
    misaligned line (gpud's corrupted dump has one) still lands somewhere sane.
    """
    roots: list[_Node] = []
    stack: list[_Node] = []
    for number, raw in lines:
        text = raw.rstrip()
        if not text.strip():
            continue
        indent = len(text) - len(text.lstrip(" "))
        body = text.strip()
        match = KEY_VALUE.match(body)
        node = _Node(match.group(1), match.group(2).strip(), number, indent) if match else \
            _Node(body, None, number, indent)
        while stack and stack[-1].indent >= indent:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def _flatten(node: _Node) -> dict[str, Value]:
    """A GPU section as {"PCI/GPU Link Info/Link Width/Max": Value}; the first duplicate wins."""
    flat: dict[str, Value] = {}
    pending: list[tuple[str, int, _Node]] = [(child.key, 1, child) for child in reversed(node.children)]
    while pending:  # iterative, and bounded: a hostile file can nest thousands deep
        path, depth, current = pending.pop()
        if path not in flat:
            flat[path] = Value(current.value or "", current.line)
        if depth < MAX_DEPTH:
            pending.extend((f"{path}/{child.key}", depth + 1, child) for child in reversed(current.children))
    return flat


def _is_dump_line(lines: list[tuple[int, str]], index: int) -> bool:
    """Whether a line at column 0 still belongs to the dump (see `_locate_text_dump`)."""
    body = lines[index][1].strip()
    if KEY_VALUE.match(body) or GPU_HEADER.match(body) or HANDLE_ERROR.match(body) or body.startswith("WARNING:"):
        return True
    for _, following in lines[index + 1:]:
        if following.strip():
            return following.startswith(" ")  # a section header: its content is indented
    return False


def _locate_text_dump(all_lines: list[str], name: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The lines of the (first) `nvidia-smi -q` dump in the file, numbered from 1.

    A dump starts after the "====NVSMI LOG====" banner (or, without one, at its
    first "Timestamp"/"Driver Version"/"Attached GPUs" line) and ends at the next
    banner or at the first line at column 0 that is neither "Key : Value", a
    "GPU <bus id>" header nor a section header. Text around it (a support bundle
    or a capture file holding several commands' output) is ignored with a warning.
    """
    warnings: list[str] = []
    numbered = [(i + 1, line.rstrip("\r").expandtabs(4)) for i, line in enumerate(all_lines)]
    banners = [i for i, (_, line) in enumerate(numbered) if BANNER.match(line.strip())]
    if banners:
        start = banners[0] + 1
    else:
        firsts = [i for i, (_, line) in enumerate(numbered)
                  if not line.startswith(" ") and (m := KEY_VALUE.match(line)) and m.group(1) in TEXT_TOP_KEYS]
        if not firsts:
            raise SnapshotError(f"not an nvidia-smi -q dump: {_what_is_it(all_lines)}", path=name)
        start = firsts[0]
    end = len(numbered)
    for i in range(start, len(numbered)):
        line = numbered[i][1]
        if BANNER.match(line.strip()) or (line.strip() and not line.startswith(" ")
                                          and not _is_dump_line(numbered, i)):
            end = i
            break
    region = numbered[start:end]
    outside = sum(1 for _, line in numbered[:start] + numbered[end:]
                  if line.strip() and not BANNER.match(line.strip()))
    if len(banners) > 1:
        where = ", ".join(str(numbered[i][0]) for i in banners)
        warnings.append(f"the file holds {len(banners)} nvidia-smi -q dumps (banners at lines {where}); "
                        f"imported the first, lines {numbered[start][0]}-{numbered[end - 1][0]}")
    if outside:
        warnings.append(f"ignored {outside} line(s) of the file that are not part of the nvidia-smi -q dump")
    return region, warnings


def _what_is_it(lines: list[str]) -> str:
    """A hint for a text that is not an `nvidia-smi -q` dump."""
    text = "\n".join(lines[:200])
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith(("{", "[")):
        return "it looks like JSON"
    if "No devices were found" in text:
        return "nvidia-smi found no GPUs ('No devices were found'), so there is nothing to import"
    if "NVIDIA-SMI has failed" in text:
        return "nvidia-smi could not talk to the driver ('NVIDIA-SMI has failed ...'), so there is nothing to import"
    if "NVIDIA-SMI" in text and "+---" in text:
        return "it is the default nvidia-smi table; run `nvidia-smi -q` (or `nvidia-smi -q -x`) instead"
    if re.search(r"^GPU \d+: .*\(UUID: ", text, re.M) and "Link" in text:
        return "it is `nvidia-smi nvlink` output; run `nvidia-smi -q` instead"
    if "," in first and "\n" in text and first.count(",") >= 2:
        return "it looks like CSV (`nvidia-smi --query-gpu`); run `nvidia-smi -q` instead"
    if re.search(r"^[0-9a-fA-F]{2,4}:[0-9a-fA-F]{2}\.[0-9a-fA-F] ", text, re.M):
        return "it looks like lspci output"
    return "no '==============NVSMI LOG==============' banner and no 'Attached GPUs' line"


def read_text(text: str, name: str) -> Dump:
    all_lines = text.split("\n")
    region, warnings = _locate_text_dump(all_lines, name)
    # nvidia-smi's warnings (stderr, interleaved by 2>&1) would close the GPU section they land in.
    roots = _parse_tree([(number, line) for number, line in region if not line.startswith("WARNING:")])
    top: dict[str, Value] = {}
    gpus: list[GpuDump] = []
    sections: list[_Node] = []
    for node in roots:
        header = GPU_HEADER.match(node.key) if node.value is None else None
        handle = HANDLE_ERROR.match(node.key) if node.value is None else None
        if header:
            sections.append(node)
            gpus.append(neutral(header.group(1), node.line, _flatten(node), "text"))
        elif handle:
            gpus.append(GpuDump(label=handle.group(1).strip(), line=node.line, handle_error=handle.group(2).strip()))
        elif node.key in TEXT_TOP_KEYS and node.value is not None:
            top.setdefault(TEXT_TOP_KEYS[node.key], Value(node.value, node.line))
    settle_versions(top, "text")  # the version lines (by their printed names) -> "driver", "cuda"
    if "attached" not in top:
        last = region[-1][0] if region else 1
        raise SnapshotError("truncated or not an nvidia-smi -q dump: no 'Attached GPUs' line",
                            path=name, line=last)
    cut = not text.endswith("\n") and bool(region) and region[-1][0] == len(all_lines)
    expected = _check_text_sections(top["attached"], gpus, sections, cut, name)
    if len(gpus) < expected:
        warnings.append(f"dump says {expected} attached GPUs but holds {len(gpus)} GPU section"
                        f"{'s' if len(gpus) != 1 else ''}, each whole (a dump of selected GPUs, nvidia-smi -q -i?): "
                        "only those are recorded")
    for number, line in enumerate(all_lines, start=1):
        if line.startswith("WARNING:"):  # nvidia-smi's own warnings, often captured with 2>&1
            warn(warnings, f"nvidia-smi warned (line {number}): {line.strip()}")
            corrupted = INFOROM_CORRUPTED.match(line)
            if corrupted:
                _mark_inforom(gpus, corrupted.group(1), warnings)
    return Dump("text", top, gpus, warnings)


def _check_text_sections(attached: Value, gpus: list[GpuDump], sections: list[_Node], cut: bool,
                         name: str) -> int:
    """Refuse a dump that lost GPUs or ends inside one: it would replay as a healthier node. The attached count.

    `nvidia-smi -q -i 0` prints the node's "Attached GPUs" and the selected GPU's section: fewer sections than
    attached, each one whole (from "Product Name" to "Processes") in a file that ends at a line end, is such a
    selection; a dump cut inside a section, or one with no section, is not.
    """
    try:
        expected = int(attached.text)
    except ValueError:
        raise SnapshotError(f"'Attached GPUs' is not a number: {attached.text!r}",
                            path=name, line=attached.line) from None
    whole = bool(sections) and all({"Product Name", "Processes"} <= {child.key for child in node.children}
                                   for node in sections)
    if expected != len(gpus) and not (0 < len(gpus) < expected and whole and not cut):
        raise SnapshotError(
            f"dump says {expected} attached GPU{'s' if expected != 1 else ''} but holds {len(gpus)} GPU "
            f"section{'s' if len(gpus) != 1 else ''} (truncated or corrupted?)", path=name, line=attached.line)
    if cut and sections and "Processes" not in {child.key for child in sections[-1].children}:
        raise SnapshotError("the dump ends in the middle of a line (truncated?)", path=name,
                            line=sections[-1].line)
    for node in sections:
        keys = {child.key for child in node.children}
        if not node.children:
            raise SnapshotError(f"GPU section {node.key[4:]} is empty (truncated?)", path=name, line=node.line)
        if "Product Name" in keys and "Processes" not in keys:
            # Every full `nvidia-smi -q` GPU section ends with "Processes" (drivers 450-595).
            raise SnapshotError(f"GPU section {node.key[4:]} ends before its 'Processes' line "
                                "(truncated or corrupted?)", path=name, line=node.line)
    for gpu in gpus:
        if gpu.handle_error is None and not gpu.values:
            raise SnapshotError(f"GPU section {gpu.label} holds nothing this importer recognises "
                                "(not an nvidia-smi -q dump, or a format it does not know)",
                                path=name, line=gpu.line)
    return expected


def _bus_key(bus_id: str) -> str | None:
    """'00000008:00:00.0' and '0008:00:00.0' -> '0008:00:00.0', to match the two spellings."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if rest else None
    except ValueError:
        return None


def _mark_inforom(gpus: list[GpuDump], bus_id: str, warnings: list[str]) -> None:
    wanted = _bus_key(bus_id)
    for gpu in gpus:
        if wanted is not None and _bus_key(gpu.label) == wanted:
            gpu.inforom_corrupted = True
            return
    warn(warnings, f"the file warns that the infoROM of GPU {bus_id} is corrupted, but the dump has no such GPU")

