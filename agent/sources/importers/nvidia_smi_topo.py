"""The `nvidia-smi-topo` kind: `nvidia-smi topo -m`, the GPU/NIC connection matrix.

The matrix names devices by position only (GPU0, NIC0 with a legend naming
the NIC `mlx5_0`), with NV#, PIX, PXB, PHB, NODE, SYS between them and each
GPU's CPU and NUMA affinity. `topology.gpu_nic` judges the same distance from
the PCIe tree (which bridge each GPU and NIC hangs under, by PCI address), and
the matrix holds no PCI address, so there is no fact it can give: the importer
reads it, checks it is whole, and records what it shows per GPU in meta.yaml
(its `skipped` list: nearest NIC and level, affinity) for the engineer; the
audit's topology comes from an `lspci -vvv` input.
"""

from __future__ import annotations

import re

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 4 << 20
MAX_DEVICES = 512
LEVELS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first; NV# is nearer than all
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_RE = re.compile(r"^(GPU\d{1,3}|NIC\d{1,3}|mlx\d+_\d+|NVS\d+)$")
_CELL_RE = re.compile(r"^(X|PIX|PXB|PHB|NODE|SYS|SOC|NV\d{1,3})$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d{1,3}):\s*(\S{1,64})\s*$")


def _rank(cell: str) -> tuple[int, int]:
    if cell.startswith("NV"):
        return (0, -int(cell[2:]))
    return (1 + LEVELS.index("SYS" if cell == "SOC" else cell), 0)


def parse_topo(text: str) -> tuple[list[str], dict[str, list[str]], dict[str, str], dict[str, str]]:
    """(columns, row -> cells, row -> affinity text, NIC# -> name)."""
    lines = [_ANSI_RE.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines)
                      if re.match(r"^\s+GPU0(?:\s|$)", line) or re.match(r"^\s*GPU0\s+GPU1\s", line.strip())), None)
    if header_at is None:
        raise InputError("no matrix header (GPU0 GPU1 ... CPU Affinity): not an nvidia-smi topo -m output")
    header = lines[header_at].split("\t") if "\t" in lines[header_at] else re.split(r"\s{2,}", lines[header_at])
    names = [h.strip() for h in header if h.strip()]
    columns = [n for n in names if _DEVICE_RE.match(n)]
    if not columns or len(columns) > MAX_DEVICES:
        raise InputError(f"line {header_at + 1}: {len(columns)} devices in the matrix header")
    rows: dict[str, list[str]] = {}
    affinity: dict[str, str] = {}
    nics: dict[str, str] = {}
    for number, line in enumerate(lines[header_at + 1:], header_at + 2):
        if m := _NIC_LEGEND_RE.match(line):
            nics[m.group(1)] = m.group(2)
            continue
        tokens = line.split()
        if not tokens or not _DEVICE_RE.match(tokens[0]) or tokens[0] in rows:
            continue
        cells = tokens[1:1 + len(columns)]
        if len(cells) < len(columns) or not all(_CELL_RE.match(c) for c in cells):
            raise InputError(f"line {number}: row {tokens[0]} does not have {len(columns)} cells "
                             "(X, NV#, PIX, PXB, PHB, NODE, SYS)")
        rows[tokens[0]] = cells
        affinity[tokens[0]] = " ".join(tokens[1 + len(columns):])[:80]
    missing = [c for c in columns if c not in rows]
    if missing:
        raise InputError(f"the matrix has no row for {', '.join(missing[:4])}: truncated")
    return columns, rows, affinity, nics


class NvidiaSmiTopoImporter:
    kind = "nvidia-smi-topo"

    def detect(self, head: bytes, name: str) -> bool:
        text = _ANSI_RE.sub("", decode_text(head))
        return bool(re.search(r"^\s*GPU0\b[^\n]*\bCPU Affinity\b", text, re.MULTILINE)
                    and re.search(r"^GPU0\s+X\b", text, re.MULTILINE))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an nvidia-smi topo -m output",
                             path=builder.current)
        try:
            columns, rows, affinity, nics = parse_topo(decode_text(data))
        except InputError as exc:
            raise InputError(exc.message, path=builder.current) from None
        gpus = [c for c in columns if c.startswith("GPU")]
        nic_columns = [c for c in columns if not c.startswith("GPU")]
        for gpu in gpus[:64]:
            cells = dict(zip(columns, rows[gpu], strict=True))
            text = f"{gpu}: affinity {affinity[gpu] or 'none shown'}"
            if nic_columns:
                nearest = min(nic_columns, key=lambda c: (_rank(cells[c]), c))
                text += f", nearest NIC {nics.get(nearest, nearest)} ({cells[nearest]})"
            result.skipped.append(text)
        result.skipped.append("the GPU/NIC matrix names no PCI address: topology.gpu_nic reads the PCIe tree "
                              "(import lspci -vvv); the matrix is recorded here only")
        return result
