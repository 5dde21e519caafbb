"""Import an `nvidia-smi -q` (text) or `nvidia-smi -q -x` (XML) dump as a snapshot.

The snapshot holds `meta.yaml` and `nvml.json` in the `nodewarden.nvml/v1`
format (docs/nvml-recording.md), so `RecordedNvml` replays the dump through
the same `NvmlReader` that runs on a live GPU.

Three layers, so that the text and XML formats share one mapping:

1. readers turn the dump into format-neutral `GpuDump`s (agent.sources.importers.nvidia_smi_fields):
   the text reader (agent.sources.importers.nvidia_smi_text) builds an indentation tree
   ("Key : Value" lines, 4-space nesting, section headers without a value), the XML
   reader (agent.sources.importers.nvidia_smi_xml) walks the element tree; both flatten a GPU
   into "Section/Sub/Key" paths and pick the paths they know (`PATHS`) into canonical
   keys ("pcie_width", "temp_gpu", ...);
2. agent.sources.importers.nvidia_smi_nvml turns canonical keys into NVML answers (units, enums, errors);
3. `import_nvidia_smi` (here) writes the snapshot atomically.

Only what the dump shows is recorded. A key the dump has no line for is left
out, so the replay reports "not in this recording" instead of inventing a
value; "N/A" becomes NVML_ERROR_NOT_SUPPORTED, as NVML itself would answer.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import __version__
from agent.core.errors import SnapshotError
from agent.sources.importers.nvidia_smi_fields import Dump, Value, error_record, warn
from agent.sources.importers.nvidia_smi_nvml import RECORD_FORMAT, build_document
from agent.sources.importers.nvidia_smi_text import read_text
from agent.sources.importers.nvidia_smi_xml import read_xml
from agent.sources.local_sources import NVML_FILE, json_recording

__all__ = ["MAX_BYTES", "RECORD_FORMAT", "ImportResult", "import_nvidia_smi", "parse_nvidia_smi"]

MAX_BYTES = 32 * 1024 * 1024  # an 8-GPU `nvidia-smi -q` is ~100 KB; anything this big is not one


@dataclass
class ImportResult:
    """What `import_nvidia_smi` wrote, for the CLI to report."""

    gpu_count: int
    driver_version: str | None
    format: str  # "text" | "xml"
    warnings: list[str] = field(default_factory=list)


# --- entry points ------------------------------------------------------------------------------------


@dataclass
class _Parsed:
    document: dict[str, Any]
    dump: Dump
    warnings: list[str]


def _check_text(text: str, name: str) -> str:
    """Refuse empty and binary input before any parsing; drop a BOM."""
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise SnapshotError("empty file: not an nvidia-smi dump", path=name)
    sample = text[:65536]
    odd = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r\x0c\x1b") or ch == "\ufffd")
    if "\x00" in sample or odd > max(8, len(sample) // 200):
        raise SnapshotError("binary data, not an nvidia-smi dump (run `nvidia-smi -q > FILE`)", path=name)
    return text


def _parse(text: str, name: str) -> _Parsed:
    text = _check_text(text, name)
    dump = read_xml(text, name) if text.lstrip().startswith("<") else read_text(text, name)
    warnings = list(dump.warnings)
    document = build_document(dump, warnings)
    return _Parsed(document, dump, warnings)


def parse_nvidia_smi(text: str, name: str) -> dict[str, Any]:
    """The nvml.json document for an `nvidia-smi -q` or `-q -x` dump (no I/O).

    `name` is the file name used in error messages. Raises SnapshotError for
    anything that is not a complete dump; never anything else.
    """
    return _parse(text, name).document


def _captured_at(timestamp: Value | None, warnings: list[str]) -> str:
    """The dump's own time ("Wed Jul 31 11:22:39 2024", the dumped node's local time)."""
    if timestamp is not None:
        try:
            return dt.datetime.strptime(" ".join(timestamp.text.split()), "%a %b %d %H:%M:%S %Y").isoformat()
        except ValueError:
            warn(warnings, f"unreadable Timestamp {timestamp.text!r}: captured_at is the import time")
    else:
        warn(warnings, "the dump has no Timestamp: captured_at is the import time")
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def import_nvidia_smi(source: Path, out: Path) -> ImportResult:
    """Write `out/meta.yaml` and `out/nvml.json` from an nvidia-smi dump at `source`.

    `out` must not exist or be an empty directory; it appears complete or not at all.
    """
    import yaml

    name = str(source)
    try:
        # Non-blocking, then fstat: a FIFO or device named here must be refused, not block the import.
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SnapshotError("not a regular file (a FIFO, socket or device): refused, not read", path=name)
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SnapshotError(f"cannot read the dump: {exc.strerror or exc}", path=name) from None
    if len(data) > MAX_BYTES:
        raise SnapshotError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB: not an nvidia-smi dump", path=name)
    # Windows PowerShell 5 writes `nvidia-smi -q > FILE` as UTF-16 with a byte order mark.
    encoding = "utf-16" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8"
    try:
        parsed = _parse(data.decode(encoding, errors="replace"), name)
    except SnapshotError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        # A bug here must not show a traceback to the operator; the tests fuzz _parse without this net.
        raise SnapshotError(f"could not import this dump (importer bug, please report): "
                            f"{type(exc).__name__}: {exc}", path=name) from exc
    warnings = parsed.warnings
    driver = parsed.dump.top.get("driver")
    driver_version = driver.text if driver is not None and error_record(driver.text) is None else None
    meta = {
        "hostname": source.stem,  # nvidia-smi -q and -q -x do not print the host name
        "captured_at": _captured_at(parsed.dump.top.get("timestamp"), warnings),
        "nodewarden_version": __version__,
        "captured": ["nvml"],
        "source": f"nvidia-smi import of {source.name}",
        "driver_version": driver_version,
        "warnings": warnings,
    }
    _write_snapshot(out, {
        "meta.yaml": yaml.safe_dump(meta, sort_keys=False),
        NVML_FILE: json_recording(parsed.document).decode(),  # as the NVML source records it
    })
    return ImportResult(gpu_count=len(parsed.dump.gpus), driver_version=driver_version,
                        format=parsed.dump.format, warnings=warnings)


def _write_snapshot(out: Path, files: dict[str, str]) -> None:
    """Write into a temporary sibling directory, then rename it into place."""
    from agent.io.fsout import write_output_dir  # the one writer (its folder must exist: exit 2)
    from agent.io.fsutil import create_file

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SnapshotError("output exists and is not an empty directory; refusing to overwrite", path=str(out))

    def fill(tmp: Path) -> None:
        for file_name, content in files.items():
            create_file(tmp, file_name, content)  # inside our private 0700 folder

    write_output_dir(out, fill)
