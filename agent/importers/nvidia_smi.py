"""Import an `nvidia-smi -q` (text) or `nvidia-smi -q -x` (XML) dump as a snapshot.

The snapshot holds `meta.yaml` and `nvml.json` in the `nodewarden.nvml/v1`
format (docs/nvml-recording.md), so `RecordedNvml` replays the dump through
the same `NvmlReader` that runs on a live GPU.

Three layers, so that the text and XML formats share one mapping:

1. readers turn the dump into format-neutral `GpuDump`s: the text reader
   builds an indentation tree ("Key : Value" lines, 4-space nesting, section
   headers without a value), the XML reader walks the element tree; both
   flatten a GPU into "Section/Sub/Key" paths and pick the paths they know
   (`_PATHS`) into canonical keys ("pcie_width", "temp_gpu", ...);
2. `_GpuMapper` turns canonical keys into NVML answers (units, enums, errors);
3. `import_nvidia_smi` writes the snapshot atomically.

Only what the dump shows is recorded. A key the dump has no line for is left
out, so the replay reports "not in this recording" instead of inventing a
value; "N/A" becomes NVML_ERROR_NOT_SUPPORTED, as NVML itself would answer.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from agent import __version__
from agent.errors import SnapshotError

RECORD_FORMAT = "nodewarden.nvml/v1"  # the same string as agent.sources.nvml.RECORD_FORMAT
MAX_BYTES = 32 * 1024 * 1024  # an 8-GPU `nvidia-smi -q` is ~100 KB; anything this big is not one
MAX_DEPTH = 8  # nvidia-smi nests 5 levels below a GPU; deeper is ignored (and cannot blow up paths)
KNOWN_XML_VERSIONS = frozenset({10, 11, 12, 13})  # nvsmi_device_vNN.dtd seen from driver 450 to 595
BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")
# nvidia-smi prints this (on stderr, often captured with 2>&1) for a GPU it cannot open.
HANDLE_ERROR = re.compile(r"^Unable to determine the device handle for (?:GPU ?)?(.*?): ([^:]+)$")
INFOROM_CORRUPTED = re.compile(r"WARNING: infoROM is corrupted at gpu ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")
KEY_VALUE = re.compile(r"^(.*?\S)\s+: ?(.*)$")  # key, padding, ':', value; values may hold ':'
TEXT_TOP_KEYS = {"Timestamp": "timestamp", "Driver Version": "driver", "CUDA Version": "cuda",
                 "Attached GPUs": "attached"}

# How nvidia-smi prints an NVML error in place of a value -> (NVML error, note).
_ERROR_TEXTS = {
    "n/a": ("NVML_ERROR_NOT_SUPPORTED", "N/A in nvidia-smi"),
    "not supported": ("NVML_ERROR_NOT_SUPPORTED", "Not Supported in nvidia-smi"),
    "requested functionality has been deprecated": ("NVML_ERROR_NOT_SUPPORTED", "deprecated in nvidia-smi"),
    "insufficient permissions": ("NVML_ERROR_NO_PERMISSION", "Insufficient Permissions in nvidia-smi"),
    # NVML's own text for NVML_ERROR_UNKNOWN: a failing call, not a missing feature.
    "unknown error": ("NVML_ERROR_UNKNOWN", "Unknown Error in nvidia-smi"),
    "gpu is lost": ("NVML_ERROR_GPU_IS_LOST", "GPU is lost in nvidia-smi"),
    "gpu requires reset": ("NVML_ERROR_RESET_REQUIRED", "GPU requires reset in nvidia-smi"),
}
# Fabric "Status" strings are NVML return codes (nvmlErrorString) -> the code.
_NVML_RETURN_CODES = {
    "success": 0, "uninitialized": 1, "invalid argument": 2, "not supported": 3,
    "insufficient permissions": 4, "not found": 6, "insufficient size": 7, "timeout": 10,
    "function not found": 13, "gpu is lost": 15, "gpu requires reset": 16, "in use by another client": 19,
    "no data": 21, "insufficient resources": 23, "not ready": 27, "unknown error": 999,
}
ARCHITECTURES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7,
                 "ada lovelace": 8, "hopper": 9, "blackwell": 10}
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
FABRIC_STATES = {"not supported": 0, "not started": 1, "in progress": 2, "completed": 3}
RECOVERY_ACTIONS = {"none": 0}  # NVML_GPU_RECOVERY_ACTION_NONE; other texts are not documented

# Clock event (formerly "throttle") reasons: (bit, text labels under the section, XML tag suffix).
CLOCK_REASONS = (
    (0x1, ("Idle",), "gpu_idle"),
    (0x2, ("Applications Clocks Setting",), "applications_clocks_setting"),
    (0x4, ("SW Power Cap",), "sw_power_cap"),
    (0x8, ("HW Slowdown",), "hw_slowdown"),
    (0x10, ("Sync Boost",), "sync_boost"),
    (0x20, ("SW Thermal Slowdown",), "sw_thermal_slowdown"),
    (0x40, ("HW Slowdown/HW Thermal Slowdown", "HW Thermal Slowdown"), "hw_thermal_slowdown"),
    (0x80, ("HW Slowdown/HW Power Brake Slowdown", "HW Power Brake Slowdown"), "hw_power_brake_slowdown"),
    (0x100, ("Display Clock Setting",), "display_clocks_setting"),
)
CLOCK_SECTIONS = {  # format -> ((section, kind), ...), newest name first
    "text": (("Clocks Event Reasons", "event"), ("Clocks Throttle Reasons", "throttle")),
    "xml": (("clocks_event_reasons", "event"), ("clocks_throttle_reasons", "throttle")),
}


def _paths() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Canonical key -> (text paths, XML paths), first match wins, across drivers 450-595."""
    p: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "name": (("Product Name",), ("product_name",)),
        "architecture": (("Product Architecture",), ("product_architecture",)),
        "uuid": (("GPU UUID",), ("uuid",)),
        "serial": (("Serial Number",), ("serial",)),
        "vbios": (("VBIOS Version",), ("vbios_version",)),
        "inforom_image": (("Inforom Version/Image Version",), ("inforom_version/img_version",)),
        "persistence": (("Persistence Mode",), ("persistence_mode",)),
        "compute_mode": (("Compute Mode",), ("compute_mode",)),
        "mig_current": (("MIG Mode/Current",), ("mig_mode/current_mig",)),
        "mig_pending": (("MIG Mode/Pending",), ("mig_mode/pending_mig",)),
        # "Ecc Mode" until R470 or so (the 460.32.03 V100 dump), "ECC Mode" since
        "ecc_current": (("ECC Mode/Current", "Ecc Mode/Current"), ("ecc_mode/current_ecc",)),
        "ecc_pending": (("ECC Mode/Pending", "Ecc Mode/Pending"), ("ecc_mode/pending_ecc",)),
        "recovery_action": (("GPU Recovery Action",), ("gpu_recovery_action",)),
        "pci_bus": (("PCI/Bus",), ("pci/pci_bus",)),
        "pci_device": (("PCI/Device",), ("pci/pci_device",)),
        "pci_domain": (("PCI/Domain",), ("pci/pci_domain",)),
        "pci_device_id": (("PCI/Device Id",), ("pci/pci_device_id",)),
        "pci_bus_id": (("PCI/Bus Id",), ("pci/pci_bus_id",)),
        "pci_subsystem_id": (("PCI/Sub System Id",), ("pci/pci_sub_system_id",)),
        "pcie_gen_max": (("PCI/GPU Link Info/PCIe Generation/Max",),
                         ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",)),
        "pcie_gen": (("PCI/GPU Link Info/PCIe Generation/Current",),
                     ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",)),
        "pcie_width_max": (("PCI/GPU Link Info/Link Width/Max",),
                           ("pci/pci_gpu_link_info/link_widths/max_link_width",)),
        "pcie_width": (("PCI/GPU Link Info/Link Width/Current",),
                       ("pci/pci_gpu_link_info/link_widths/current_link_width",)),
        "pcie_replays": (("PCI/Replays Since Reset",), ("pci/replay_counter",)),
        "app_graphics": (("Applications Clocks/Graphics",), ("applications_clocks/graphics_clock",)),
        "app_memory": (("Applications Clocks/Memory",), ("applications_clocks/mem_clock",)),
        "default_app_graphics": (("Default Applications Clocks/Graphics",),
                                 ("default_applications_clocks/graphics_clock",)),
        "default_app_memory": (("Default Applications Clocks/Memory",), ("default_applications_clocks/mem_clock",)),
        "clock_sm": (("Clocks/SM",), ("clocks/sm_clock",)),
        "clock_memory": (("Clocks/Memory",), ("clocks/mem_clock",)),
        "util_gpu": (("Utilization/Gpu",), ("utilization/gpu_util",)),
        "util_memory": (("Utilization/Memory",), ("utilization/memory_util",)),
        "retired_sbe": (("Retired Pages/Single Bit ECC",),
                        ("retired_pages/multiple_single_bit_retirement/retired_count",)),
        "retired_dbe": (("Retired Pages/Double Bit ECC",), ("retired_pages/double_bit_retirement/retired_count",)),
        "retired_pending": (("Retired Pages/Pending Page Blacklist", "Retired Pages/Pending Page Retirement"),
                            ("retired_pages/pending_retirement", "retired_pages/pending_blacklist")),
        "remap_cor": (("Remapped Rows/Correctable Error",), ("remapped_rows/remapped_row_corr",)),
        "remap_unc": (("Remapped Rows/Uncorrectable Error",), ("remapped_rows/remapped_row_unc",)),
        "remap_pending": (("Remapped Rows/Pending",), ("remapped_rows/remapped_row_pending",)),
        "remap_failure": (("Remapped Rows/Remapping Failure Occurred",), ("remapped_rows/remapped_row_failure",)),
        "temp_gpu": (("Temperature/GPU Current Temp",), ("temperature/gpu_temp",)),
        "temp_memory": (("Temperature/Memory Current Temp",), ("temperature/memory_temp",)),
        "temp_tlimit": (("Temperature/GPU T.Limit Temp",), ("temperature/gpu_temp_tlimit",)),
        "shutdown": (("Temperature/GPU Shutdown Temp",), ("temperature/gpu_temp_max_threshold",)),
        "slowdown": (("Temperature/GPU Slowdown Temp",), ("temperature/gpu_temp_slow_threshold",)),
        "gpu_max": (("Temperature/GPU Max Operating Temp",), ("temperature/gpu_temp_max_gpu_threshold",)),
        "mem_max": (("Temperature/Memory Max Operating Temp",), ("temperature/gpu_temp_max_mem_threshold",)),
        "shutdown_tlimit": (("Temperature/GPU Shutdown T.Limit Temp",),
                            ("temperature/gpu_temp_max_tlimit_threshold",)),
        "slowdown_tlimit": (("Temperature/GPU Slowdown T.Limit Temp",),
                            ("temperature/gpu_temp_slow_tlimit_threshold",)),
        "gpu_max_tlimit": (("Temperature/GPU Max Operating T.Limit Temp",),
                           ("temperature/gpu_temp_max_gpu_tlimit_threshold",)),
        "mem_max_tlimit": (("Temperature/Memory Max Operating T.Limit Temp",),
                           ("temperature/gpu_temp_max_mem_tlimit_threshold",)),
        "fabric_state": (("Fabric/State",), ("fabric/state",)),
        "fabric_status": (("Fabric/Status",), ("fabric/status",)),
        "fabric_clique": (("Fabric/CliqueId",), ("fabric/cliqueId",)),
    }
    # ECC counters: SRAM/DRAM split (Ampere and later, and every driver >= ~510),
    # or "Single Bit"/"Double Bit" with a "Total" line (older drivers).
    for scope, tag in (("Volatile", "volatile"), ("Aggregate", "aggregate")):
        for part, label in (("sram_correctable", "SRAM Correctable"), ("sram_uncorrectable", "SRAM Uncorrectable"),
                            ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity"),
                            ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED"),
                            ("dram_correctable", "DRAM Correctable"), ("dram_uncorrectable", "DRAM Uncorrectable"),
                            ("single_bit", "Single Bit/Total"), ("double_bit", "Double Bit/Total")):
            xml = {"single_bit": "single_bit/total", "double_bit": "double_bit/total"}.get(part, part)
            p[f"ecc_{tag}_{part}"] = ((f"ECC Errors/{scope}/{label}",), (f"ecc_errors/{tag}/{xml}",))
    # Power: "Power Readings" with Power/Enforced Power Limit until ~525; "GPU Power Readings" with
    # Requested/Current Power Limit since (nvidia-smi --help-query-gpu: "power.limit" or
    # "gpu.power.requested_limit" is the software limit, "enforced.power.limit" or
    # "gpu.power.current_limit" the enforced one); Average/Instantaneous Power Draw since ~550.
    text_sections, xml_sections = ("GPU Power Readings", "Power Readings"), ("gpu_power_readings", "power_readings")
    for key, labels, tags in (
        ("power_draw", ("Power Draw", "Average Power Draw", "Instantaneous Power Draw"),
         ("power_draw", "average_power_draw", "instant_power_draw")),
        ("power_limit", ("Requested Power Limit", "Power Limit"), ("requested_power_limit", "power_limit")),
        ("power_enforced", ("Current Power Limit", "Enforced Power Limit"),
         ("current_power_limit", "enforced_power_limit")),
        ("power_default", ("Default Power Limit",), ("default_power_limit",)),
        ("power_min", ("Min Power Limit",), ("min_power_limit",)),
        ("power_max", ("Max Power Limit",), ("max_power_limit",)),
    ):
        p[key] = (tuple(f"{s}/{label}" for label in labels for s in text_sections),
                  tuple(f"{s}/{tag}" for tag in tags for s in xml_sections))
    # "Module Power Readings" (535+): the Grace Hopper module's limits; N/A on GPUs without a module.
    p["module_limit"] = (("Module Power Readings/Current Power Limit",), ("module_power_readings/current_power_limit",))
    p["module_requested"] = (("Module Power Readings/Requested Power Limit",),
                             ("module_power_readings/requested_power_limit",))
    for bit, labels, suffix in CLOCK_REASONS:
        p[f"clock_{bit}"] = (
            tuple(f"{section}/{label}" for section, _ in CLOCK_SECTIONS["text"] for label in labels),
            tuple(f"{section}/{section[:-1]}_{suffix}" for section, _ in CLOCK_SECTIONS["xml"]),
        )
    return p


_PATHS = _paths()


# --- results and the neutral form ----------------------------------------------------------------


@dataclass
class ImportResult:
    """What `import_nvidia_smi` wrote, for the CLI to report."""

    gpu_count: int
    driver_version: str | None
    format: str  # "text" | "xml"
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Value:
    """One value as printed, with its line in the file (None for XML)."""

    text: str
    line: int | None = None


@dataclass
class GpuDump:
    """One GPU section in format-neutral terms: canonical key -> printed value."""

    label: str  # the bus id of the section header ("GPU 00000000:19:00.0") or XML id
    line: int | None
    values: dict[str, Value] = field(default_factory=dict)
    clock_kind: str | None = None  # "event" (Clocks Event Reasons) | "throttle" (older drivers)
    handle_error: str | None = None  # "Unable to determine the device handle": NVML error text
    inforom_corrupted: bool = False


@dataclass
class Dump:
    """A whole dump in format-neutral terms."""

    format: str
    top: dict[str, Value]  # timestamp, driver, cuda, attached
    gpus: list[GpuDump]
    warnings: list[str]


def _warn(warnings: list[str], message: str) -> None:
    if message not in warnings:
        warnings.append(message)


def _pick(flat: dict[str, Value], paths: tuple[str, ...]) -> Value | None:
    """The first path with a real value, else the first with an error text, else an
    ancestor section printed as a value ("Remapped Rows : N/A" covers its rows)."""
    candidates = [flat[p] for p in paths if p in flat and flat[p].text]
    for value in candidates:
        if _error_record(value.text) is None:
            return value
    if candidates:
        return candidates[0]
    for path in paths:
        parts = path.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            ancestor = flat.get("/".join(parts[:depth]))
            if ancestor is not None and _error_record(ancestor.text) is not None:
                return ancestor
    return None


def _neutral(label: str, line: int | None, flat: dict[str, Value], fmt: str) -> GpuDump:
    index = 0 if fmt == "text" else 1
    gpu = GpuDump(label=label, line=line)
    for key, paths in _PATHS.items():
        value = _pick(flat, paths[index])
        if value is not None:
            gpu.values[key] = value
    for section, kind in CLOCK_SECTIONS[fmt]:
        if section in flat:
            gpu.clock_kind = kind
            break
    return gpu


# --- text: nvidia-smi -q ---------------------------------------------------------------------------


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


def _read_text(text: str, name: str) -> Dump:
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
            gpus.append(_neutral(header.group(1), node.line, _flatten(node), "text"))
        elif handle:
            gpus.append(GpuDump(label=handle.group(1).strip(), line=node.line, handle_error=handle.group(2).strip()))
        elif node.key in TEXT_TOP_KEYS and node.value is not None:
            top.setdefault(TEXT_TOP_KEYS[node.key], Value(node.value, node.line))
    if "attached" not in top:
        last = region[-1][0] if region else 1
        raise SnapshotError("truncated or not an nvidia-smi -q dump: no 'Attached GPUs' line",
                            path=name, line=last)
    cut = not text.endswith("\n") and bool(region) and region[-1][0] == len(all_lines)
    _check_text_sections(top["attached"], gpus, sections, cut, name)
    for number, line in enumerate(all_lines, start=1):
        if line.startswith("WARNING:"):  # nvidia-smi's own warnings, often captured with 2>&1
            _warn(warnings, f"nvidia-smi warned (line {number}): {line.strip()}")
            corrupted = INFOROM_CORRUPTED.match(line)
            if corrupted:
                _mark_inforom(gpus, corrupted.group(1), warnings)
    return Dump("text", top, gpus, warnings)


def _check_text_sections(attached: Value, gpus: list[GpuDump], sections: list[_Node], cut: bool,
                         name: str) -> None:
    """Refuse a dump that lost GPUs or ends inside one: it would replay as a healthier node."""
    try:
        expected = int(attached.text)
    except ValueError:
        raise SnapshotError(f"'Attached GPUs' is not a number: {attached.text!r}",
                            path=name, line=attached.line) from None
    if expected != len(gpus):
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
    _warn(warnings, f"the file warns that the infoROM of GPU {bus_id} is corrupted, but the dump has no such GPU")


# --- XML: nvidia-smi -q -x -------------------------------------------------------------------------


def _read_xml(text: str, name: str) -> Dump:
    """Walk `nvidia-smi -q -x` output; unknown elements are ignored, so newer DTDs import too."""
    import xml.etree.ElementTree as ET  # only the XML path needs it

    entity = re.search(r"<!ENTITY", text, re.IGNORECASE)
    if entity:
        # Entity expansion is how "billion laughs" documents blow up; nvidia-smi never declares any.
        raise SnapshotError("refusing XML that declares entities (<!ENTITY>): nvidia-smi never writes them",
                            path=name, line=text.count("\n", 0, entity.start()) + 1)
    try:
        root = ET.fromstring(text)  # noqa: S314 - entities refused above; external DTDs are never fetched
    except ET.ParseError as exc:
        raise SnapshotError(f"malformed XML (truncated or corrupted?): {exc}", path=name,
                            line=exc.position[0]) from None
    if root.tag != "nvidia_smi_log":
        raise SnapshotError(f"not an nvidia-smi -q -x dump: the XML root element is <{root.tag}>, "
                            "not <nvidia_smi_log>", path=name, line=1)
    warnings: list[str] = []
    # The version is in the DOCTYPE (nvsmi_device_v12.dtd) or, in some releases, a <dtd_version>.
    declared = re.search(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device_v(\d+)\.dtd\"", text) or \
        re.fullmatch(r"\s*v?(\d+)(?:\.\d+)*\s*", root.findtext("dtd_version") or "")
    if declared is None:
        warnings.append("the XML names no nvsmi_device DTD version: imported the elements this importer knows")
    elif int(declared.group(1)) not in KNOWN_XML_VERSIONS:
        warnings.append(f"unknown nvidia-smi XML version nvsmi_device_v{declared.group(1)}.dtd: "
                        "imported the elements this importer knows")
    top: dict[str, Value] = {}
    for key, tag in (("timestamp", "timestamp"), ("driver", "driver_version"), ("cuda", "cuda_version"),
                     ("attached", "attached_gpus")):
        found = root.find(tag)
        if found is not None and (found.text or "").strip():
            top[key] = Value((found.text or "").strip())
    gpus: list[GpuDump] = []
    for index, element in enumerate(root.findall("gpu")):
        flat: dict[str, Value] = {}
        pending = [(child.tag, 1, child) for child in reversed(list(element))]
        while pending:
            path, depth, current = pending.pop()
            if path not in flat:
                flat[path] = Value((current.text or "").strip())
            if depth < MAX_DEPTH:
                pending.extend((f"{path}/{child.tag}", depth + 1, child) for child in reversed(list(current)))
        label = element.get("id") or flat.get("pci/pci_bus_id", Value(f"#{index}")).text
        gpu = _neutral(label, None, flat, "xml")
        if not gpu.values:
            raise SnapshotError(f"GPU {label}: none of the elements this importer reads are present "
                                "(an nvidia-smi XML schema it does not know?)", path=name)
        gpus.append(gpu)
    if "attached" not in top:
        raise SnapshotError("not an nvidia-smi -q -x dump: no <attached_gpus> element", path=name)
    try:
        attached = int(top["attached"].text)
    except ValueError:
        raise SnapshotError(f"<attached_gpus> is not a number: {top['attached'].text!r}", path=name) from None
    if attached != len(gpus):
        # Well-formed XML ends with </nvidia_smi_log>, so nvidia-smi finished: fewer <gpu> elements
        # than attached GPUs means a selection (`nvidia-smi -q -x -i 0`), not a truncation.
        warnings.append(f"dump says {attached} attached GPU{'s' if attached != 1 else ''} but holds "
                        f"{len(gpus)} <gpu> element{'s' if len(gpus) != 1 else ''} (a dump of selected GPUs, "
                        f"nvidia-smi -q -x -i?): only those are recorded")
    return Dump("xml", top, gpus, warnings)


# --- neutral -> NVML --------------------------------------------------------------------------------


class _Unreadable(ValueError):
    """A value that does not have the form nvidia-smi prints for it."""


def _error_record(text: str) -> dict[str, str] | None:
    """{"error": ..., "note": ...} when nvidia-smi printed an NVML error instead of a value."""
    known = _ERROR_TEXTS.get(text.strip().strip("[]").strip().lower())
    return None if known is None else {"error": known[0], "note": known[1]}


def _match(pattern: str, text: str) -> re.Match[str]:
    found = re.fullmatch(pattern, text.strip(), re.IGNORECASE)
    if found is None:
        raise _Unreadable(text)
    return found


def _celsius(text: str) -> int:
    return int(_match(r"(-?\d+)\s*C", text).group(1))


def _count(text: str) -> int:
    return int(_match(r"\d+", text).group(0))


def _mhz(text: str) -> int:
    return int(_match(r"(\d+)\s*MHz", text).group(1))


def _percent(text: str) -> int:
    return int(_match(r"(\d+)\s*%", text).group(1))


def _milliwatts(text: str) -> int:
    try:
        return int(Decimal(_match(r"(\d+(?:\.\d+)?)\s*W", text).group(1)) * 1000)
    except InvalidOperation:
        raise _Unreadable(text) from None


def _hex(text: str) -> int:
    return int(_match(r"(?:0x)?([0-9a-f]+)", text).group(1), 16)


def _width(text: str) -> int:
    return int(_match(r"(\d+)x", text).group(1))


def _enabled(text: str) -> int:
    return {"enabled": 1, "disabled": 0}[_match(r"enabled|disabled", text).group(0).lower()]


def _yes(text: str) -> int:
    return {"yes": 1, "no": 0}[_match(r"yes|no", text).group(0).lower()]


def _lookup(table: dict[str, int]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return table[text.strip().lower()]
        except KeyError:
            raise _Unreadable(text) from None
    return parse


def _string(text: str) -> str:
    return text.strip()


def _cuda_version(text: str) -> int:
    found = _match(r"(\d+)\.(\d+)", text)
    return int(found.group(1)) * 1000 + int(found.group(2)) * 10


_MISSING = object()


class _GpuMapper:
    """One GPU's canonical values -> its nvml.json device table."""

    def __init__(self, gpu: GpuDump, warnings: list[str]) -> None:
        self.gpu = gpu
        self.warnings = warnings
        self.derived_thresholds = False

    def raw(self, key: str) -> Value | None:
        return self.gpu.values.get(key)

    def convert(self, key: str, parse: Callable[[str], Any]) -> Any:
        """The NVML answer for one canonical value, an error record, or _MISSING."""
        value = self.gpu.values.get(key)
        if value is None:
            return _MISSING
        record = _error_record(value.text)
        if record is not None:
            return record
        try:
            return parse(value.text)
        except (_Unreadable, ValueError, KeyError):
            where = f" (line {value.line})" if value.line else ""
            _warn(self.warnings, f"GPU {self.gpu.label}: unreadable {key} value {value.text!r}{where}: "
                                 "recorded as an unknown NVML error")
            return {"error": "NVML_ERROR_UNKNOWN", "note": f"unreadable in the nvidia-smi dump: {value.text!r}"}

    def number(self, key: str, parse: Callable[[str], int]) -> int | None:
        result = self.convert(key, parse)
        return result if isinstance(result, int) else None

    def device(self) -> dict[str, Any]:
        gpu = self.gpu
        if gpu.handle_error is not None:
            record = _error_record(gpu.handle_error) or {"error": "NVML_ERROR_UNKNOWN"}
            _warn(self.warnings, f"GPU {gpu.label}: nvidia-smi could not open it ({gpu.handle_error})")
            return {"nvmlDeviceGetHandleByIndex": {"error": record["error"], "note": gpu.handle_error}}
        out: dict[str, Any] = {}

        def put(nvml_key: str, value: Any) -> None:
            if value is not _MISSING:
                out[nvml_key] = value

        put("nvmlDeviceGetName", self.convert("name", _string))
        put("nvmlDeviceGetUUID", self.convert("uuid", _string))
        put("nvmlDeviceGetSerial", self.convert("serial", _string))
        put("nvmlDeviceGetPciInfo", self.pci_info())
        put("nvmlDeviceGetArchitecture", self.convert("architecture", _lookup(ARCHITECTURES)))
        put("nvmlDeviceGetVbiosVersion", self.convert("vbios", _string))
        put("nvmlDeviceGetInforomImageVersion", self.convert("inforom_image", _string))
        if gpu.inforom_corrupted:
            out["nvmlDeviceValidateInforom"] = {"error": "NVML_ERROR_CORRUPTED_INFOROM",
                                                "note": "WARNING: infoROM is corrupted (nvidia-smi)"}
        put("nvmlDeviceGetPersistenceMode", self.convert("persistence", _enabled))
        put("nvmlDeviceGetComputeMode", self.convert("compute_mode", _lookup(COMPUTE_MODES)))
        put("nvmlDeviceGetMigMode", self.pair("mig_current", "mig_pending"))
        put("nvmlDeviceGetEccMode", self.pair("ecc_current", "ecc_pending"))
        fields = self.field_values()
        if fields:
            out["nvmlDeviceGetFieldValues"] = fields
        out.update(self.thresholds())
        put("nvmlDeviceGetTemperatureV(0)", self.convert("temp_gpu", _celsius))
        out.update(self.clock_reasons())
        put("nvmlDeviceGetPowerUsage", self.convert("power_draw", _milliwatts))
        put("nvmlDeviceGetPowerManagementLimit", self.convert("power_limit", _milliwatts))
        put("nvmlDeviceGetPowerManagementDefaultLimit", self.convert("power_default", _milliwatts))
        put("nvmlDeviceGetPowerManagementLimitConstraints", self.pair("power_min", "power_max", _milliwatts))
        put("nvmlDeviceGetEnforcedPowerLimit", self.convert("power_enforced", _milliwatts))
        put("nvmlDeviceGetCurrPcieLinkGeneration", self.convert("pcie_gen", _count))
        put("nvmlDeviceGetMaxPcieLinkGeneration", self.convert("pcie_gen_max", _count))
        put("nvmlDeviceGetCurrPcieLinkWidth", self.convert("pcie_width", _width))
        put("nvmlDeviceGetMaxPcieLinkWidth", self.convert("pcie_width_max", _width))
        # Keys carry the clock type as the reader asks: NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_MEM = 2.
        put("nvmlDeviceGetApplicationsClock(0)", self.convert("app_graphics", _mhz))
        put("nvmlDeviceGetApplicationsClock(2)", self.convert("app_memory", _mhz))
        put("nvmlDeviceGetDefaultApplicationsClock(0)", self.convert("default_app_graphics", _mhz))
        put("nvmlDeviceGetDefaultApplicationsClock(2)", self.convert("default_app_memory", _mhz))
        # Current clocks (NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2) and utilization (baselines).
        put("nvmlDeviceGetClockInfo(1)", self.convert("clock_sm", _mhz))
        put("nvmlDeviceGetClockInfo(2)", self.convert("clock_memory", _mhz))
        put("nvmlDeviceGetUtilizationRates", self.utilization())
        put("nvmlDeviceGetGpuFabricInfoV", self.fabric())
        return out

    def utilization(self) -> Any:
        """c_nvmlUtilization_t {gpu, memory}: one call answers both or fails as a whole."""
        rates = self.pair("util_gpu", "util_memory", _percent)
        return {"gpu": rates[0], "memory": rates[1]} if isinstance(rates, list) else rates

    def pair(self, first: str, second: str, parse: Callable[[str], int] = _enabled) -> Any:
        """[current, pending] or [min, max]: NVML answers both or fails as a whole."""
        a, b = self.convert(first, parse), self.convert(second, parse)
        if a is _MISSING and b is _MISSING:
            return _MISSING
        for part in (a, b):
            if isinstance(part, dict):
                return part
        if a is _MISSING or b is _MISSING:
            return {"error": "NVML_ERROR_UNKNOWN", "note": f"the dump shows only one of {first}/{second}"}
        return [a, b]

    def pci_info(self) -> Any:
        """nvmlDeviceGetPciInfo's fields that the dump shows; the bus id falls back to the header."""
        info: dict[str, Any] = {}
        bus_id = self.raw("pci_bus_id")
        info["busId"] = bus_id.text if bus_id is not None and _error_record(bus_id.text) is None else self.gpu.label
        for member, key in (("pciDeviceId", "pci_device_id"), ("pciSubSystemId", "pci_subsystem_id"),
                            ("domain", "pci_domain"), ("bus", "pci_bus"), ("device", "pci_device")):
            value = self.convert(key, _hex)
            if isinstance(value, int):
                info[member] = value
        parts = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-9a-fA-F]", info["busId"].strip())
        if parts:
            for member, text in zip(("domain", "bus", "device"), parts.groups(), strict=True):
                info.setdefault(member, int(text, 16))
        return info

    def field_values(self) -> dict[str, Any]:
        """nvmlDeviceGetFieldValues entries the dump has lines for (never NVLink: -q does not show it)."""
        fields: dict[str, Any] = {}

        def put(name: str, value: Any) -> None:
            if value is not _MISSING:
                fields[name] = value

        for scope, short in (("volatile", "VOL"), ("aggregate", "AGG")):
            put(f"NVML_FI_DEV_ECC_SBE_{short}_TOTAL",
                self.ecc_total(scope, ("sram_correctable", "dram_correctable"), "single_bit"))
            sram = ("sram_uncorrectable",) if self.raw(f"ecc_{scope}_sram_uncorrectable") else \
                ("sram_uncorrectable_parity", "sram_uncorrectable_secded")
            put(f"NVML_FI_DEV_ECC_DBE_{short}_TOTAL",
                self.ecc_total(scope, (*sram, "dram_uncorrectable"), "double_bit"))
        put("NVML_FI_DEV_RETIRED_SBE", self.convert("retired_sbe", _count))
        put("NVML_FI_DEV_RETIRED_DBE", self.convert("retired_dbe", _count))
        put("NVML_FI_DEV_RETIRED_PENDING", self.convert("retired_pending", _yes))
        put("NVML_FI_DEV_REMAPPED_COR", self.convert("remap_cor", _count))
        put("NVML_FI_DEV_REMAPPED_UNC", self.convert("remap_unc", _count))
        put("NVML_FI_DEV_REMAPPED_PENDING", self.convert("remap_pending", _yes))
        put("NVML_FI_DEV_REMAPPED_FAILURE", self.convert("remap_failure", _yes))
        put("NVML_FI_DEV_PCIE_REPLAY_COUNTER", self.convert("pcie_replays", _count))
        put("NVML_FI_DEV_MEMORY_TEMP", self.convert("temp_memory", _celsius))
        put("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", self.convert("recovery_action", _lookup(RECOVERY_ACTIONS)))
        # at NVML_POWER_SCOPE_MODULE (1), the key the reader asks for
        put("NVML_FI_DEV_POWER_CURRENT_LIMIT:1", self.convert("module_limit", _milliwatts))
        put("NVML_FI_DEV_POWER_REQUESTED_LIMIT:1", self.convert("module_requested", _milliwatts))
        return fields

    def ecc_total(self, scope: str, parts: tuple[str, ...], old_total: str) -> Any:
        """Sum of the SRAM/DRAM counters, or the old "Single/Double Bit" Total line.

        A location printed as N/A does not exist on this GPU and adds nothing;
        only when every location is N/A is the total itself not supported.
        """
        values = [self.convert(f"ecc_{scope}_{part}", _count) for part in parts]
        present = [v for v in values if v is not _MISSING]
        if not present:
            return self.convert(f"ecc_{scope}_{old_total}", _count)
        numbers = [v for v in present if isinstance(v, int)]
        unreadable = [v for v in present if isinstance(v, dict) and v["error"] != "NVML_ERROR_NOT_SUPPORTED"]
        if unreadable:
            return unreadable[0]
        return sum(numbers) if numbers else present[0]

    def thresholds(self) -> dict[str, Any]:
        """Temperature thresholds, absolute where printed, else derived from T.Limit offsets.

        For Hopper and Ada GPUs, drivers from about 535.161 on print the thresholds
        relative to T.Limit (A10/A100 still get absolute ones under 550-555), e.g.
        gpud/nvidia-smi-query.535.161.08.out.0.valid.txt, GPU 00000000:19:00.0::

            GPU Current Temp                  : 29 C
            GPU T.Limit Temp                  : 56 C
            GPU Shutdown T.Limit Temp         : -8 C
            GPU Slowdown T.Limit Temp         : -2 C
            GPU Max Operating T.Limit Temp    : 0 C

        "GPU T.Limit Temp" is the current margin, T.Limit minus the current
        temperature (NVML nvmlDeviceGetMarginTemperature), and the "... T.Limit
        Temp" thresholds are on the same margin scale: the GPU slows down when
        the margin falls below -2 C, i.e. when it is 2 C *above* T.Limit. So
        T.Limit = current + margin and threshold = T.Limit - offset:
        T.Limit = 29 + 56 = 85 C, shutdown 85 + 8 = 93 C, slowdown 85 + 2 = 87 C,
        max operating 85 C; only that order (shutdown > slowdown > max operating)
        is physically sensible. The margin and the current temperature come from
        different sensors, so identical GPUs derive T.Limit 1-2 C apart.
        "Memory Max Operating T.Limit Temp" is relative to a memory T.Limit that
        nvidia-smi does not print, so threshold 2 cannot be derived from it.
        """
        out: dict[str, Any] = {}
        current = self.number("temp_gpu", _celsius) if "temp_tlimit" in self.gpu.values else None
        margin = self.number("temp_tlimit", _celsius) if current is not None else None
        for index, absolute, relative in ((0, "shutdown", "shutdown_tlimit"), (1, "slowdown", "slowdown_tlimit"),
                                          (3, "gpu_max", "gpu_max_tlimit"), (2, "mem_max", "mem_max_tlimit")):
            key = f"nvmlDeviceGetTemperatureThreshold({index})"
            value = self.convert(absolute, _celsius)
            offset = self.convert(relative, _celsius)
            if isinstance(value, int):
                out[key] = value
            elif isinstance(offset, int):
                if index != 2 and current is not None and margin is not None:
                    out[key] = current + margin - offset
                    self.derived_thresholds = True
                    continue
                if index == 2:
                    _warn(self.warnings, "Memory Max Operating T.Limit Temp is relative to a memory T.Limit that "
                                         "nvidia-smi does not print: the memory max threshold is not recorded")
                else:
                    _warn(self.warnings, f"GPU {self.gpu.label}: {relative} without a GPU T.Limit Temp reading: "
                                         f"threshold {index} not recorded")
                if value is not _MISSING:
                    out[key] = value
            elif value is not _MISSING:
                out[key] = value
            elif offset is not _MISSING:
                out[key] = offset
        return out

    def clock_reasons(self) -> dict[str, Any]:
        """The clock event reasons bitmask, under the call the dump's driver would answer."""
        kind = self.gpu.clock_kind
        if kind is None:
            return {}
        mask, seen, error = 0, False, None
        for bit, _, _ in CLOCK_REASONS:
            value = self.convert(f"clock_{bit}", _lookup({"active": 1, "not active": 0}))
            if isinstance(value, int):
                seen = True
                mask |= bit if value else 0
            elif isinstance(value, dict) and error is None:
                error = value
        result: Any = mask if seen else (error or {"error": "NVML_ERROR_NOT_SUPPORTED", "note": "no reasons"})
        if kind == "event":
            return {"nvmlDeviceGetCurrentClocksEventReasons": result}
        # "Clocks Throttle Reasons": a driver older than the ClocksEvent API (< 535), so replay its fallback.
        return {"nvmlDeviceGetCurrentClocksEventReasons": {"error": "NVML_ERROR_FUNCTION_NOT_FOUND",
                                                           "note": "the dump shows Clocks Throttle Reasons"},
                "nvmlDeviceGetCurrentClocksThrottleReasons": result}

    def fabric(self) -> Any:
        """nvmlDeviceGetGpuFabricInfoV from the "Fabric" section (Hopper and later)."""
        state = self.convert("fabric_state", _lookup(FABRIC_STATES))
        if state is _MISSING or isinstance(state, dict):
            return state
        status = self.convert("fabric_status", _lookup(_NVML_RETURN_CODES))
        clique = self.convert("fabric_clique", _count)
        return {"state": state, "status": status if isinstance(status, int) else 0,
                "cliqueId": clique if isinstance(clique, int) else 0, "healthMask": 0}


def _system_error(text: str) -> dict[str, str] | None:
    """A system call answers NotSupported or fails; device errors (GPU is lost) do not apply to it."""
    record = _error_record(text)
    if record is not None and record["error"] != "NVML_ERROR_NOT_SUPPORTED":
        record = {"error": "NVML_ERROR_UNKNOWN", "note": f"{text.strip()} in nvidia-smi"}
    return record


def _document(dump: Dump, warnings: list[str]) -> dict[str, Any]:
    system: dict[str, Any] = {}
    driver = dump.top.get("driver")
    if driver is not None:
        system["nvmlSystemGetDriverVersion"] = _system_error(driver.text) or driver.text
    cuda = dump.top.get("cuda")
    if cuda is not None:
        record = _system_error(cuda.text)
        if record is None:
            try:
                system["nvmlSystemGetCudaDriverVersion_v2"] = _cuda_version(cuda.text)
            except _Unreadable:
                _warn(warnings, f"unreadable CUDA Version {cuda.text!r}: not recorded")
        else:
            system["nvmlSystemGetCudaDriverVersion_v2"] = record
    system["nvmlDeviceGetCount"] = len(dump.gpus)
    devices = []
    derived = False
    for gpu in dump.gpus:
        mapper = _GpuMapper(gpu, warnings)
        devices.append(mapper.device())
        derived = derived or mapper.derived_thresholds
    if derived:
        _warn(warnings, "thresholds derived from T.Limit-relative values "
                        "(threshold = current temperature + T.Limit margin - offset)")
    if not dump.gpus:
        _warn(warnings, "the dump lists no GPUs")
    return {"format": RECORD_FORMAT, "system": system, "devices": devices}


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
    dump = _read_xml(text, name) if text.lstrip().startswith("<") else _read_text(text, name)
    warnings = list(dump.warnings)
    document = _document(dump, warnings)
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
            _warn(warnings, f"unreadable Timestamp {timestamp.text!r}: captured_at is the import time")
    else:
        _warn(warnings, "the dump has no Timestamp: captured_at is the import time")
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def import_nvidia_smi(source: Path, out: Path) -> ImportResult:
    """Write `out/meta.yaml` and `out/nvml.json` from an nvidia-smi dump at `source`.

    `out` must not exist or be an empty directory; it appears complete or not at all.
    """
    import yaml

    name = str(source)
    try:
        with source.open("rb") as handle:
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
    driver_version = driver.text if driver is not None and _error_record(driver.text) is None else None
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
        "nvml.json": json.dumps(parsed.document, indent=1, sort_keys=True) + "\n",
    })
    return ImportResult(gpu_count=len(parsed.dump.gpus), driver_version=driver_version,
                        format=parsed.dump.format, warnings=warnings)


def _write_snapshot(out: Path, files: dict[str, str]) -> None:
    """Write into a temporary sibling directory, then rename it into place."""
    from agent.fsutil import write_output_dir  # the one writer (its folder must exist: exit 2)

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SnapshotError("output exists and is not an empty directory; refusing to overwrite", path=str(out))

    def fill(tmp: Path) -> None:
        for file_name, content in files.items():
            (tmp / file_name).write_text(content, encoding="utf-8")  # inside our private 0700 folder

    write_output_dir(out, fill)
