"""The `nvidia-smi-query-csv` kind: `nvidia-smi --query-gpu=FIELDS --format=csv` as NVML answers.

The header row names the fields (`index, name, pci.bus_id, power.limit [W]`,
`nvidia-smi --help-query-gpu` spells them; `nounits` drops the units); each
row is one GPU. The fields NVML facts hold become that GPU's answers in
nvml.json, in NVML's units (mW, MHz, C; "Enabled" 1), and are added GPU by GPU
to the recording (matched by UUID or bus id with an `nvidia-smi -q` dump of
the same node, in any order, else by index). `[N/A]` and `[Not Supported]` are
NVML_ERROR_NOT_SUPPORTED, as NVML answers; `[Unknown Error]`, `[GPU is lost]` the
matching errors. Fields NVML answers in pairs (ECC mode current and pending,
MIG mode, power min/max limits, utilization gpu/memory) are recorded only when
the query asked for both. Other fields are named as not used. A header without
field names (`noheader`) cannot be read: its columns are unknown.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text
from agent.sources.importers.nvidia_smi_fields import version_text
from agent.sources.importers.nvml_merge import GpuPart, bus_key
from agent.sources.importers.values import Unreadable, choice, string

MAX_BYTES = 16 << 20
MAX_COLUMNS = 256  # --help-query-gpu lists about 200 fields
MAX_ROWS = 1024
MAX_LINE = 64 * 1024
FIELDS_KEY = "nvmlDeviceGetFieldValues"
PCI_KEY = "nvmlDeviceGetPciInfo"
_HEADER_TOKEN_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+){0,5}(?: \[[^\]\n]{1,16}\])?$")
# nvidia-smi's other spellings of a field -> the name used here
ALIASES = {
    "gpu_bus_id": "pci.bus_id", "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count", "retired_pages.dbe": "retired_pages.double_bit.count",
    "clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory",
    "clocks.applications.gr": "clocks.applications.graphics", "clocks.applications.mem": "clocks.applications.memory",
    "clocks.default_applications.gr": "clocks.default_applications.graphics",
    "clocks.default_applications.mem": "clocks.default_applications.memory",
    "inforom.image": "inforom.img", "pcie.link.gen.gpucurrent": "pcie.link.gen.current",
    "enforced.power.limit": "power.enforced_limit",
}
# Fields seen in --query-gpu that NVML facts here do not hold (recognised, named as not used).
_OTHER_FIELDS = {
    "timestamp", "count", "fan.speed", "pstate", "memory.total", "memory.used", "memory.free", "memory.reserved",
    "display_mode", "display_active", "accounting.mode", "driver_model.current", "encoder.stats.sessioncount",
    "clocks.current.graphics", "clocks.gr", "clocks.current.video", "clocks.max.graphics", "clocks.max.sm",
    "clocks.max.memory", "clocks_throttle_reasons.active", "clocks_event_reasons.active", "power.management",
    "pcie.link.gen.gpumax", "pcie.link.gen.hostmax", "gom.current",
}

_ERRORS = {
    "n/a": "NVML_ERROR_NOT_SUPPORTED", "not supported": "NVML_ERROR_NOT_SUPPORTED",
    "insufficient permissions": "NVML_ERROR_NO_PERMISSION", "unknown error": "NVML_ERROR_UNKNOWN",
    "gpu is lost": "NVML_ERROR_GPU_IS_LOST", "gpu requires reset": "NVML_ERROR_RESET_REQUIRED",
    "requested functionality has been deprecated": "NVML_ERROR_NOT_SUPPORTED",
}
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}


def _error(text: str) -> dict[str, str] | None:
    code = _ERRORS.get(text.strip().strip("[]").strip().lower())
    return None if code is None else {"error": code, "note": f"{text.strip()} in nvidia-smi --query-gpu"}


def _number(text: str, unit: str) -> Decimal:
    found = re.fullmatch(r"(-?\d{1,12}(?:\.\d{1,6})?)\s*" + (f"(?:{unit})?" if unit else ""), text.strip(),
                         re.IGNORECASE)
    if found is None:
        raise Unreadable(text)
    try:
        return Decimal(found.group(1))
    except InvalidOperation:
        raise Unreadable(text) from None


def _int(unit: str = "") -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _number(text, unit)
        if value != value.to_integral_value():
            raise Unreadable(text)
        return int(value)
    return parse


def _milliwatts(text: str) -> int:
    return int(_number(text, "W") * 1000)


def _hex(text: str) -> int:
    found = re.fullmatch(r"(?:0x)?([0-9a-f]{1,16})", text.strip(), re.IGNORECASE)
    if found is None:
        raise Unreadable(text)
    return int(found.group(1), 16)


def _string(text: str) -> str:
    return string(text, limit=256)


def _version(text: str) -> str | None:
    """A driver version without 595/610's "[Deprecated; ...]" note; None (not recorded) for their
    'Deprecated, see "KMD version" instead' in place of one: the kmd_version column has it."""
    bare = version_text(text)
    return None if bare is None else string(bare, limit=256)


_ENABLED = choice({"enabled": 1, "disabled": 0})
_YES = choice({"yes": 1, "no": 0})

# field -> (where: "device" key, "field" (nvmlDeviceGetFieldValues), "pci" member, "system" key), parser
SINGLE: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    "name": ("device", "nvmlDeviceGetName", _string),
    "serial": ("device", "nvmlDeviceGetSerial", _string),
    "vbios_version": ("device", "nvmlDeviceGetVbiosVersion", _string),
    "inforom.img": ("device", "nvmlDeviceGetInforomImageVersion", _string),
    "kmd_version": ("system", "nvmlSystemGetDriverVersion", _version),  # 595+: the driver version's new name
    "driver_version": ("system", "nvmlSystemGetDriverVersion", _version),
    "persistence_mode": ("device", "nvmlDeviceGetPersistenceMode", _ENABLED),
    "compute_mode": ("device", "nvmlDeviceGetComputeMode", choice(COMPUTE_MODES)),
    "pci.domain": ("pci", "domain", _hex),
    "pci.bus": ("pci", "bus", _hex),
    "pci.device": ("pci", "device", _hex),
    "pci.device_id": ("pci", "pciDeviceId", _hex),
    "pci.sub_device_id": ("pci", "pciSubSystemId", _hex),
    "retired_pages.single_bit_ecc.count": ("field", "NVML_FI_DEV_RETIRED_SBE", _int()),
    "retired_pages.double_bit.count": ("field", "NVML_FI_DEV_RETIRED_DBE", _int()),
    "retired_pages.pending": ("field", "NVML_FI_DEV_RETIRED_PENDING", _YES),
    "remapped_rows.correctable": ("field", "NVML_FI_DEV_REMAPPED_COR", _int()),
    "remapped_rows.uncorrectable": ("field", "NVML_FI_DEV_REMAPPED_UNC", _int()),
    "remapped_rows.pending": ("field", "NVML_FI_DEV_REMAPPED_PENDING", _YES),
    "remapped_rows.failure": ("field", "NVML_FI_DEV_REMAPPED_FAILURE", _YES),
    "ecc.errors.corrected.volatile.total": ("field", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", _int()),
    "ecc.errors.uncorrected.volatile.total": ("field", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", _int()),
    "ecc.errors.corrected.aggregate.total": ("field", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", _int()),
    "ecc.errors.uncorrected.aggregate.total": ("field", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL", _int()),
    "temperature.gpu": ("device", "nvmlDeviceGetTemperatureV(0)", _int("C")),
    "temperature.memory": ("field", "NVML_FI_DEV_MEMORY_TEMP", _int("C")),
    "power.draw": ("device", "nvmlDeviceGetPowerUsage", _milliwatts),
    "power.limit": ("device", "nvmlDeviceGetPowerManagementLimit", _milliwatts),
    "power.default_limit": ("device", "nvmlDeviceGetPowerManagementDefaultLimit", _milliwatts),
    "power.enforced_limit": ("device", "nvmlDeviceGetEnforcedPowerLimit", _milliwatts),
    "clocks.current.sm": ("device", "nvmlDeviceGetClockInfo(1)", _int("MHz")),
    "clocks.current.memory": ("device", "nvmlDeviceGetClockInfo(2)", _int("MHz")),
    "clocks.applications.graphics": ("device", "nvmlDeviceGetApplicationsClock(0)", _int("MHz")),
    "clocks.applications.memory": ("device", "nvmlDeviceGetApplicationsClock(2)", _int("MHz")),
    "clocks.default_applications.graphics": ("device", "nvmlDeviceGetDefaultApplicationsClock(0)", _int("MHz")),
    "clocks.default_applications.memory": ("device", "nvmlDeviceGetDefaultApplicationsClock(2)", _int("MHz")),
    "pcie.link.gen.current": ("device", "nvmlDeviceGetCurrPcieLinkGeneration", _int()),
    "pcie.link.gen.max": ("device", "nvmlDeviceGetMaxPcieLinkGeneration", _int()),
    "pcie.link.width.current": ("device", "nvmlDeviceGetCurrPcieLinkWidth", _int()),
    "pcie.link.width.max": ("device", "nvmlDeviceGetMaxPcieLinkWidth", _int()),
}
# NVML answers these in one call: (first field, second field) -> (device key, parser, shape)
PAIRS: dict[tuple[str, str], tuple[str, Callable[[str], int], str]] = {
    ("ecc.mode.current", "ecc.mode.pending"): ("nvmlDeviceGetEccMode", _ENABLED, "list"),
    ("mig.mode.current", "mig.mode.pending"): ("nvmlDeviceGetMigMode", _ENABLED, "list"),
    ("power.min_limit", "power.max_limit"): ("nvmlDeviceGetPowerManagementLimitConstraints", _milliwatts, "list"),
    ("utilization.gpu", "utilization.memory"): ("nvmlDeviceGetUtilizationRates", _int("%"), "utilization"),
}
IDENTITY = {"index", "uuid", "pci.bus_id"}
KNOWN = IDENTITY | set(SINGLE) | {f for pair in PAIRS for f in pair} | set(ALIASES) | _OTHER_FIELDS


def _field_name(token: str) -> str:
    name = token.strip().split(" [", 1)[0].strip().lower()
    return ALIASES.get(name, name)


def _header(line: str) -> list[str] | None:
    tokens = [t.strip() for t in line.split(",")]
    if len(tokens) < 2 or not all(_HEADER_TOKEN_RE.match(t) for t in tokens):
        return None
    return tokens


def _convert(text: str, parse: Callable[[str], Any], label: str, field: str, warnings: list[str]) -> Any:
    record = _error(text)
    if record is not None:
        return record
    try:
        return parse(text)
    except (Unreadable, ValueError, KeyError):
        warnings.append(f"{label} {field}: unreadable value {text.strip()[:40]!r}, not recorded")
        return None


class NvidiaSmiCsvImporter:
    kind = "nvidia-smi-query-csv"

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head[:MAX_LINE])
        first = next((line for line in text.splitlines() if line.strip()), "")
        tokens = _header(first[:MAX_LINE])
        if tokens is None:
            return False
        names = [_field_name(t) for t in tokens]
        return sum(1 for n in names if n in KNOWN) >= 2 and any(n in IDENTITY or n in SINGLE for n in names)

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an nvidia-smi --query-gpu CSV",
                             path=builder.current)
        lines = decode_text(data).splitlines()
        numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
        for number, line in numbered:
            if len(line) > MAX_LINE:
                raise InputError(f"line {number}: longer than {MAX_LINE >> 10} KiB: not an nvidia-smi CSV row",
                                 path=builder.current)
        if not numbered:
            raise InputError("empty: not an nvidia-smi --query-gpu CSV", path=builder.current)
        tokens = _header(numbered[0][1])
        if tokens is None:
            raise InputError("line 1: no header naming the fields (was it --format=csv,noheader?)",
                             path=builder.current)
        if len(tokens) > MAX_COLUMNS:
            raise InputError(f"line {numbered[0][0]}: {len(tokens)} columns, more than the {MAX_COLUMNS} "
                             "fields nvidia-smi --query-gpu has", path=builder.current)
        fields = [_field_name(t) for t in tokens]
        duplicates = sorted({f for f in fields if fields.count(f) > 1})
        if duplicates:
            raise InputError(f"line {numbered[0][0]}: field {duplicates[0]!r} named twice", path=builder.current)
        rows = numbered[1:]
        if not rows:
            raise InputError("a header and no GPU row", path=builder.current)
        if len(rows) > MAX_ROWS:
            raise InputError(f"{len(rows)} rows, more than {MAX_ROWS} GPUs", path=builder.current)
        parsed: list[tuple[int, dict[str, str]]] = []
        for number, line in rows:
            try:
                values = next(csv.reader([line], skipinitialspace=True))
            except csv.Error as exc:
                raise InputError(f"line {number}: not a CSV row ({exc})", path=builder.current) from None
            if len(values) != len(fields):
                raise InputError(f"line {number}: {len(values)} values for the header's {len(fields)} fields",
                                 path=builder.current)
            parsed.append((number, dict(zip(fields, (v.strip() for v in values), strict=True))))
        return self._record(fields, parsed, builder, result)

    def _record(self, fields: list[str], rows: list[tuple[int, dict[str, str]]], builder: Builder,
                result: Contribution) -> Contribution:
        warnings: list[str] = []
        parts: list[GpuPart] = []
        system: dict[str, Any] = {}
        for position, (number, row) in enumerate(rows):
            index: int | None = position
            if "index" in row:
                index = int(row["index"]) if re.fullmatch(r"\d{1,3}", row["index"]) else None
                if index is None:
                    raise InputError(f"line {number}: index {row['index'][:20]!r} is not a GPU index",
                                     path=builder.current)
            label = f"GPU {index}"
            uuid = row.get("uuid") if re.fullmatch(r"(?:GPU|MIG)-[0-9A-Fa-f-]{8,64}", row.get("uuid", "")) else None
            bus = row.get("pci.bus_id") if bus_key(row.get("pci.bus_id")) else None
            facts: dict[str, Any] = {}
            pci: dict[str, Any] = {"busId": bus} if bus else {}
            counters: dict[str, Any] = {}
            for name, text in row.items():
                if name not in SINGLE:
                    continue
                where, key, parse = SINGLE[name]
                value = _convert(text, parse, label, name, warnings)
                if value is None:
                    continue
                if where == "system":
                    if not isinstance(value, dict):
                        system.setdefault(key, value)
                elif where == "pci":
                    if isinstance(value, int):
                        pci[key] = value
                elif where == "field":
                    counters[key] = value
                else:
                    facts[key] = value
            for (first, second), (key, parse, shape) in PAIRS.items():
                if first not in row or second not in row:
                    continue
                a = _convert(row[first], parse, label, first, warnings)
                b = _convert(row[second], parse, label, second, warnings)
                if a is None or b is None:
                    continue
                failed = next((v for v in (a, b) if isinstance(v, dict)), None)
                if failed is not None:
                    facts[key] = failed
                elif shape == "utilization":
                    facts[key] = {"gpu": a, "memory": b}
                else:
                    facts[key] = [a, b]
            if pci:
                facts[PCI_KEY] = pci
            if counters:
                facts[FIELDS_KEY] = counters
            parts.append(GpuPart(label=label, index=index, uuid=uuid, bus_id=bus, facts=facts))
        added = builder.add_nvml_facts(parts, system, result)
        used = IDENTITY | set(SINGLE) | {f for pair in PAIRS for f in pair if all(p in fields for p in pair)}
        unused = [f for f in fields if f not in used]
        lonely = [f for pair in PAIRS if any(p in fields for p in pair) and not all(p in fields for p in pair)
                  for f in pair if f in fields]
        if added:
            mapped = [f for f in fields if f in used and f != "index"]
            result.contributed.append(f"nvml.json: {len(rows)} GPU(s), {', '.join(mapped[:24])}"
                                      f"{' ...' if len(mapped) > 24 else ''}")
        for field_name in lonely:
            result.skipped.append(f"{field_name}: NVML answers it together with its pair "
                                  f"({' and '.join(next(p for p in PAIRS if field_name in p))}); query both")
        others = [f for f in unused if f not in lonely]
        if others:
            result.skipped.append(f"field(s) not used by the audit: {', '.join(o[:40] for o in others[:20])}"
                                  f"{' ...' if len(others) > 20 else ''}")
        result.skipped.extend(warnings[:20])
        return result
