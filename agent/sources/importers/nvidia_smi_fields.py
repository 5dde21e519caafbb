"""The format-neutral form of an nvidia-smi dump, and where each canonical key is printed.

Both readers (agent.sources.importers.nvidia_smi_text for `nvidia-smi -q`,
agent.sources.importers.nvidia_smi_xml for `-q -x`) flatten a GPU into "Section/Sub/Key"
paths and pick the paths listed in `PATHS` (drivers 450-610) into canonical keys
("pcie_width", "temp_gpu", ...): a `GpuDump`. agent.sources.importers.nvidia_smi_nvml
turns those into NVML answers.

Drivers 595/610 renamed the top lines: "KMD Version" and "CUDA UMD Version" carry the versions,
and the old "Driver Version"/"CUDA Version" lines stay with a "[Deprecated; ...]" suffix (or a
"Deprecated, see ..." text instead of a value). `settle_versions` keeps the new names first and
reads every version without its suffix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_DEPTH = 8  # nvidia-smi nests 5 levels below a GPU; deeper is ignored (and cannot blow up paths)

# How nvidia-smi prints an NVML error in place of a value -> (NVML error, note).
ERROR_TEXTS = {
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
NVML_RETURN_CODES = {
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


# Top-level version lines, newest name first -> (text key, XML tag). The 595/610 names are modelled on
# NVIDIA's nvidia-smi documentation and public captures of `nvidia-smi -q` (docs/decisions.md, issue 22 item 4).
VERSION_SOURCES = {
    "driver": (("KMD Version", "kmd_version"), ("Driver Version", "driver_version")),
    "cuda": (("CUDA UMD Version", "cuda_umd_version"), ("CUDA Driver Version", "cuda_driver_version"),
             ("CUDA Version", "cuda_version")),
}
_SUFFIX = re.compile(r"\s*\[[^\[\]]*\]\s*$")  # "13.3 [Deprecated; use CUDA UMD Version instead]"


def version_text(text: str) -> str | None:
    """A version as printed, without a "[...]" note; None for a "Deprecated, see ..." text in its place."""
    bare = text.strip()
    while (cut := _SUFFIX.sub("", bare)) != bare:  # bounded: each pass removes one bracketed note
        bare = cut
    if not bare or bare.lower().startswith("deprecated"):
        return None
    return bare


def settle_versions(top: dict[str, Value], fmt: str) -> None:
    """Set top["driver"] and top["cuda"] from the version lines `top` holds under their printed names, newest first.

    An error text (N/A) is kept only when no line holds a version, as `pick` does for GPU values.
    """
    index = 0 if fmt == "text" else 1
    for key, sources in VERSION_SOURCES.items():
        fallback: Value | None = None
        for source in sources:
            value = top.get(source[index])
            if value is None:
                continue
            bare = version_text(value.text)
            if bare is None:
                continue
            if error_record(bare) is None:
                top[key] = Value(bare, value.line)
                break
            fallback = fallback or Value(bare, value.line)
        else:
            if fallback is not None:
                top[key] = fallback


def _paths() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Canonical key -> (text paths, XML paths), first match wins, across drivers 450-610."""
    p: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "name": (("Product Name",), ("product_name",)),
        "architecture": (("Product Architecture",), ("product_architecture",)),
        "brand": (("Product Brand",), ("product_brand",)),
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
    # "gpu.power.current_limit" the enforced one); Average/Instantaneous Power Draw since ~550. Drivers 610+
    # group the limits under a "GPU Ceiling Power Limit" subsection (beside "GPU Base Power"), per NVIDIA's docs.
    text_sections = ("GPU Power Readings", "Power Readings", "GPU Power Readings/GPU Ceiling Power Limit")
    xml_sections = ("gpu_power_readings", "power_readings", "gpu_power_readings/gpu_ceiling_power_limit")
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


PATHS = _paths()


# --- the neutral form ----------------------------------------------------------------------------


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


def warn(warnings: list[str], message: str) -> None:
    if message not in warnings:
        warnings.append(message)


def error_record(text: str) -> dict[str, str] | None:
    """{"error": ..., "note": ...} when nvidia-smi printed an NVML error instead of a value."""
    known = ERROR_TEXTS.get(text.strip().strip("[]").strip().lower())
    return None if known is None else {"error": known[0], "note": known[1]}


def pick(flat: dict[str, Value], paths: tuple[str, ...]) -> Value | None:
    """The first path with a real value, else the first with an error text, else an
    ancestor section printed as a value ("Remapped Rows : N/A" covers its rows)."""
    candidates = [flat[p] for p in paths if p in flat and flat[p].text]
    for value in candidates:
        if error_record(value.text) is None:
            return value
    if candidates:
        return candidates[0]
    for path in paths:
        parts = path.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            ancestor = flat.get("/".join(parts[:depth]))
            if ancestor is not None and error_record(ancestor.text) is not None:
                return ancestor
    return None


def neutral(label: str, line: int | None, flat: dict[str, Value], fmt: str) -> GpuDump:
    index = 0 if fmt == "text" else 1
    gpu = GpuDump(label=label, line=line)
    for key, paths in PATHS.items():
        value = pick(flat, paths[index])
        if value is not None:
            gpu.values[key] = value
    for section, kind in CLOCK_SECTIONS[fmt]:
        if section in flat:
            gpu.clock_kind = kind
            break
    return gpu

