"""A dump's canonical values -> the nvml.json document (`nodewarden.nvml/v1`, docs/nvml-recording.md).

Units, enums and error texts become NVML's answers. A key the dump has no line
for is left out, so the replay reports "not in this recording" instead of
inventing a value; "N/A" becomes NVML_ERROR_NOT_SUPPORTED, as NVML itself would answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from agent.core.gpu_family import brand_code
from agent.sources.importers.nvidia_smi_fields import (
    ARCHITECTURES,
    CLOCK_REASONS,
    COMPUTE_MODES,
    FABRIC_STATES,
    NVML_RETURN_CODES,
    RECOVERY_ACTIONS,
    Dump,
    GpuDump,
    Value,
    error_record,
    warn,
)
from agent.sources.importers.values import Unreadable, choice, string

RECORD_FORMAT = "nodewarden.nvml/v1"  # the same string as agent.sources.nvml.RECORD_FORMAT


def _match(pattern: str, text: str) -> re.Match[str]:
    found = re.fullmatch(pattern, text.strip(), re.IGNORECASE)
    if found is None:
        raise Unreadable(text)
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
        raise Unreadable(text) from None


def _hex(text: str) -> int:
    return int(_match(r"(?:0x)?([0-9a-f]+)", text).group(1), 16)


def _width(text: str) -> int:
    return int(_match(r"(\d+)x", text).group(1))


def _enabled(text: str) -> int:
    return {"enabled": 1, "disabled": 0}[_match(r"enabled|disabled", text).group(0).lower()]


def _yes(text: str) -> int:
    return {"yes": 1, "no": 0}[_match(r"yes|no", text).group(0).lower()]



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
        record = error_record(value.text)
        if record is not None:
            return record
        try:
            return parse(value.text)
        except (Unreadable, ValueError, KeyError):
            where = f" (line {value.line})" if value.line else ""
            warn(self.warnings, f"GPU {self.gpu.label}: unreadable {key} value {value.text!r}{where}: "
                                 "recorded as an unknown NVML error")
            return {"error": "NVML_ERROR_UNKNOWN", "note": f"unreadable in the nvidia-smi dump: {value.text!r}"}

    def number(self, key: str, parse: Callable[[str], int]) -> int | None:
        result = self.convert(key, parse)
        return result if isinstance(result, int) else None

    def device(self) -> dict[str, Any]:
        gpu = self.gpu
        if gpu.handle_error is not None:
            record = error_record(gpu.handle_error) or {"error": "NVML_ERROR_UNKNOWN"}
            warn(self.warnings, f"GPU {gpu.label}: nvidia-smi could not open it ({gpu.handle_error})")
            return {"nvmlDeviceGetHandleByIndex": {"error": record["error"], "note": gpu.handle_error}}
        out: dict[str, Any] = {}

        def put(nvml_key: str, value: Any) -> None:
            if value is not _MISSING:
                out[nvml_key] = value

        put("nvmlDeviceGetName", self.convert("name", string))
        put("nvmlDeviceGetUUID", self.convert("uuid", string))
        put("nvmlDeviceGetSerial", self.convert("serial", string))
        put("nvmlDeviceGetPciInfo", self.pci_info())
        put("nvmlDeviceGetArchitecture", self.convert("architecture", choice(ARCHITECTURES)))
        put("nvmlDeviceGetBrand", self.convert("brand", brand_code))  # NVML_BRAND_UNKNOWN for an unknown text
        put("nvmlDeviceGetVbiosVersion", self.convert("vbios", string))
        put("nvmlDeviceGetInforomImageVersion", self.convert("inforom_image", string))
        if gpu.inforom_corrupted:
            out["nvmlDeviceValidateInforom"] = {"error": "NVML_ERROR_CORRUPTED_INFOROM",
                                                "note": "WARNING: infoROM is corrupted (nvidia-smi)"}
        put("nvmlDeviceGetPersistenceMode", self.convert("persistence", _enabled))
        put("nvmlDeviceGetComputeMode", self.convert("compute_mode", choice(COMPUTE_MODES)))
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
        info["busId"] = bus_id.text if bus_id is not None and error_record(bus_id.text) is None else self.gpu.label
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
        put("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", self.convert("recovery_action", choice(RECOVERY_ACTIONS)))
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
                    warn(self.warnings, "Memory Max Operating T.Limit Temp is relative to a memory T.Limit that "
                                         "nvidia-smi does not print: the memory max threshold is not recorded")
                else:
                    warn(self.warnings, f"GPU {self.gpu.label}: {relative} without a GPU T.Limit Temp reading: "
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
            value = self.convert(f"clock_{bit}", choice({"active": 1, "not active": 0}))
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
        state = self.convert("fabric_state", choice(FABRIC_STATES))
        if state is _MISSING or isinstance(state, dict):
            return state
        status = self.convert("fabric_status", choice(NVML_RETURN_CODES))
        clique = self.convert("fabric_clique", _count)
        return {"state": state, "status": status if isinstance(status, int) else 0,
                "cliqueId": clique if isinstance(clique, int) else 0, "healthMask": 0}


def _system_error(text: str) -> dict[str, str] | None:
    """A system call answers NotSupported or fails; device errors (GPU is lost) do not apply to it."""
    record = error_record(text)
    if record is not None and record["error"] != "NVML_ERROR_NOT_SUPPORTED":
        record = {"error": "NVML_ERROR_UNKNOWN", "note": f"{text.strip()} in nvidia-smi"}
    return record


def build_document(dump: Dump, warnings: list[str]) -> dict[str, Any]:
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
            except Unreadable:
                warn(warnings, f"unreadable CUDA Version {cuda.text!r}: not recorded")
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
        warn(warnings, "thresholds derived from T.Limit-relative values "
                        "(threshold = current temperature + T.Limit margin - offset)")
    if not dump.gpus:
        warn(warnings, "the dump lists no GPUs")
    document: dict[str, Any] = {"format": RECORD_FORMAT, "system": system, "devices": devices}
    attached = dump.top.get("attached")
    if attached is not None and re.fullmatch(r"[0-9]{1,6}", attached.text.strip()) and \
            int(attached.text) > len(dump.gpus):
        # A dump of selected GPUs (nvidia-smi -q -i 0): nvidia-smi's "Attached GPUs" is NVML's device count
        # on the node; the recording holds only the selected GPUs (docs/nvml-recording.md).
        document["attached_gpus"] = int(attached.text)
    return document

