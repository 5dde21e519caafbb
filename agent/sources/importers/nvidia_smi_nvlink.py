"""The `nvidia-smi-nvlink` kind: `nvidia-smi nvlink -s` (`--status`) as NVML's NVLink link states.

nvidia-smi prints each GPU's header (its index, NVML name and UUID) and one line
per link: its speed when the link is up, `<inactive>` when it is not; a GPU whose
links are all down gets NVML's own sentence instead of link lines:

    GPU 3: Tesla V100-SXM2-32GB (UUID: GPU-50b1bd2e-77ee-2731-fd2f-17c44103b7b9)
             Link 0: 25.781 GB/s
             Link 3: <inactive>
    GPU 6: NVIDIA A100-SXM4-80GB (UUID: GPU-9667d95e-...)
    NVML: Unable to retrieve NVLink information as all links are inactive

Each link becomes `NVML_FI_DEV_NVLINK_GET_STATE:<link>` (1 active, 0 inactive),
what `gpu.nvlink.links` reads; the header gives `nvmlDeviceGetName` and
`nvmlDeviceGetUUID`. These are added to the NVML recording GPU by GPU (matched
by UUID with an `nvidia-smi -q` dump of the same node, in any order). For a GPU
with every link down the number of links is the other GPUs' in the capture, or
the GPU model's (V100 SXM2 6, A100 SXM4 12, H100/H200/B200 18); with neither,
link 0 is recorded down, which is enough for "0 active". Speeds have no NVML
fact the audit reads: they are summarised, not recorded.
"""

from __future__ import annotations

import re

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text
from agent.sources.importers.nvml_merge import GpuPart

MAX_BYTES = 16 << 20
MAX_LINKS = 18  # agent.sources.nvml.NVLINK_SCOPES: the reader asks for no more
STATE_FIELD = "NVML_FI_DEV_NVLINK_GET_STATE"
_HEADER_RE = re.compile(r"^GPU (\d{1,3}): (.{1,96}?) \(UUID: (GPU-[0-9A-Fa-f-]{8,64}|MIG-[0-9A-Fa-f-]{8,64})\)\s*$")
_LINK_RE = re.compile(r"^\s+Link (\d{1,3}): (?:(\d{1,5}(?:\.\d{1,3})?) GB/s|(<inactive>))\s*$")
_ALL_DOWN_RE = re.compile(r"^NVML: Unable to retrieve NVLink information as all links are inactive\s*$")
_DETECT_RE = re.compile(
    r"^GPU \d{1,3}: [^\n]{1,96}\(UUID: [^)\n]+\)[ \t\r]*\n"
    r"(?:[ \t]+Link \d{1,3}: (?:\d[\d.]* GB/s|<inactive>)|NVML: Unable to retrieve NVLink information)",
    re.MULTILINE)
# NVLinks per GPU model, for a GPU whose links are all down and no other GPU in the capture shows its count.
_MODEL_LINKS = ((re.compile(r"V100-SXM"), 6), (re.compile(r"A100-SXM|A100 SXM"), 12),
                (re.compile(r"H100 80GB HBM3|H100-SXM|H200|GH200|B200|GB200"), 18))


class _Gpu:
    def __init__(self, index: int, name: str, uuid: str, line: int) -> None:
        self.index, self.name, self.uuid, self.line = index, name, uuid, line
        self.links: dict[int, str | None] = {}  # link -> speed text, None when inactive
        self.all_down = False


def parse_nvlink_status(text: str) -> tuple[list[_Gpu], list[str]]:
    """The GPUs and their links; lines that are not part of it are counted, never guessed at."""
    gpus: list[_Gpu] = []
    odd: list[str] = []
    current: _Gpu | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if m := _HEADER_RE.match(line):
            index = int(m.group(1))
            if any(g.index == index for g in gpus):
                raise InputError(f"line {number}: GPU {index} is listed twice")
            current = _Gpu(index, m.group(2).strip(), m.group(3), number)
            gpus.append(current)
            continue
        if current is not None and (m := _LINK_RE.match(line)):
            link = int(m.group(1))
            if link in current.links:
                raise InputError(f"line {number}: GPU {current.index} link {link} is listed twice")
            current.links[link] = m.group(2)
            continue
        if current is not None and _ALL_DOWN_RE.match(line):
            current.all_down = True
            continue
        if len(odd) < 3:
            odd.append(f"line {number}: {line.strip()[:80]!r}")
        else:
            odd.append("")
    return gpus, odd


def _links_when_all_down(gpu: _Gpu, gpus: list[_Gpu]) -> int:
    seen = [max(g.links) + 1 for g in gpus if g.links]
    if seen:
        return min(max(seen), MAX_LINKS)
    for pattern, count in _MODEL_LINKS:
        if pattern.search(gpu.name):
            return count
    return 1


class NvidiaSmiNvlinkImporter:
    kind = "nvidia-smi-nvlink"

    def detect(self, head: bytes, name: str) -> bool:
        return bool(_DETECT_RE.search(decode_text(head).replace("\r\n", "\n")))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an nvidia-smi nvlink -s output",
                             path=builder.current)
        gpus, odd = parse_nvlink_status(decode_text(data))
        if not gpus:
            raise InputError("no 'GPU N: NAME (UUID: ...)' header: not an nvidia-smi nvlink -s output",
                             path=builder.current)
        parts: list[GpuPart] = []
        summary: list[str] = []
        for gpu in gpus:
            states: dict[str, int] = {}
            for link, speed in sorted(gpu.links.items()):
                if link >= MAX_LINKS:
                    result.skipped.append(f"GPU {gpu.index} link {link}: past the {MAX_LINKS} links NVML reports")
                    continue
                states[f"{STATE_FIELD}:{link}"] = 0 if speed is None else 1
            if gpu.all_down and not gpu.links:
                count = _links_when_all_down(gpu, gpus)
                states = {f"{STATE_FIELD}:{link}": 0 for link in range(count)}
                summary.append(f"GPU {gpu.index}: all links inactive ({count} recorded down)")
            elif not gpu.links:
                result.skipped.append(f"GPU {gpu.index}: no link lines (no NVLink on this GPU?): "
                                      "link states not recorded")
            else:
                speeds = sorted({s for s in gpu.links.values() if s is not None})
                down = [str(k) for k, s in sorted(gpu.links.items()) if s is None]
                summary.append(f"GPU {gpu.index}: {len(gpu.links) - len(down)}/{len(gpu.links)} active"
                               + (f" at {'/'.join(speeds)} GB/s" if speeds else "")
                               + (f", down: {', '.join(down)}" if down else ""))
            facts: dict[str, object] = {"nvmlDeviceGetName": gpu.name}
            if states:
                facts["nvmlDeviceGetFieldValues"] = states
            parts.append(GpuPart(label=f"GPU {gpu.index}", index=gpu.index, uuid=gpu.uuid, facts=facts))
        added = builder.add_nvml_facts(parts, {}, result)
        if added:
            result.contributed.append(f"nvml.json NVLink link states of {len(gpus)} GPU(s): "
                                      + "; ".join(summary[:16]) + (" ..." if len(summary) > 16 else ""))
        if odd:
            shown = [o for o in odd if o]
            result.skipped.append(f"{len(odd)} line(s) that are not part of nvlink -s: {'; '.join(shown)}")
        return result
