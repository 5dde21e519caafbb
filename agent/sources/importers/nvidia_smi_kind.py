"""The `nvidia-smi` kind: `nvidia-smi -q` text or `-q -x` XML, through agent.sources.importers.nvidia_smi."""

from __future__ import annotations

import re

from agent.core.errors import SnapshotError
from agent.sources.importers.base import Builder, Contribution, InputError, decode_text
from agent.sources.importers.nvidia_smi import MAX_BYTES, parse_nvidia_smi

_BANNER = re.compile(rb"^=+\s*NVSMI LOG\s*=+\s*$", re.MULTILINE)


class NvidiaSmiImporter:
    kind = "nvidia-smi"

    def detect(self, head: bytes, name: str) -> bool:
        text = head.replace(b"\x00", b"")  # UTF-16 (PowerShell) reads as ASCII without its zero bytes
        return bool(_BANNER.search(text)) or b"<nvidia_smi_log" in text

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an nvidia-smi dump", path=builder.current)
        try:
            document = parse_nvidia_smi(decode_text(data), builder.current)
        except SnapshotError as exc:
            raise InputError(exc.message, path=exc.path, line=exc.line) from None
        devices = document.get("devices", [])
        if builder.set_nvml(document, result):
            driver = document.get("system", {}).get("nvmlSystemGetDriverVersion")
            shown = driver if isinstance(driver, str) else "unknown"
            result.contributed.append(f"nvml.json: {len(devices)} GPU(s), driver {shown}")
        return result
