"""NVML's names, as the reader and the replay use them, without importing `pynvml`.

The recorded backend (`nvml_replay.RecordedNvml`) answers with these constants,
structures and exception classes, so an audit of a snapshot never loads the
binding (`pynvml` costs ~15 ms to import, and ctypes.util with it). Every value
here is the C enum's, identical to nvidia-ml-py's; tests/unit/sources/test_nvml_poll_calls.py
compares them with the real binding, and tests/integration/test_contract_pynvml.py checks
every name the agent uses exists there.

The exception classes mirror pynvml's: `NVMLError(code)` constructs the
subclass for that code (`NVMLError_GpuIsLost` for NVML_ERROR_GPU_IS_LOST), and
`str()` is pynvml's text for the code.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.core.model import Unknown, Unsupported

DEFAULT_TIMEOUT_S = 10.0
RECORD_FORMAT = "nodewarden.nvml/v1"
NVLINK_SCOPES = 18  # NVLink4/5 GPUs have 18 links; A100 has 12 (the rest answer "invalid")

# One nvmlDeviceGetFieldValues call replaces ~30 separate calls per GPU.
FIELDS = (
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    "NVML_FI_DEV_RETIRED_SBE",
    "NVML_FI_DEV_RETIRED_DBE",
    "NVML_FI_DEV_RETIRED_PENDING",
    "NVML_FI_DEV_REMAPPED_COR",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
)
NVLINK_STATE_FIELD = "NVML_FI_DEV_NVLINK_GET_STATE"
# Grace Hopper/Blackwell module (CPU + GPU + memory) power limits, in mW, asked at NVML_POWER_SCOPE_MODULE.
MODULE_POWER_FIELDS = ("NVML_FI_DEV_POWER_CURRENT_LIMIT", "NVML_FI_DEV_POWER_REQUESTED_LIMIT")
# The GPU's own power draw and limits (mW, NVML_POWER_SCOPE_GPU), asked in the same batch instead of
# one call each; the call is the fallback where the driver does not answer the field. Which call
# each field stands for (the replay answers one from the other's recording, both ways).
GPU_POWER_FIELDS = {
    "NVML_FI_DEV_POWER_AVERAGE": "nvmlDeviceGetPowerUsage",  # averaged over 1 s, as the call on Ampere+
    "NVML_FI_DEV_POWER_REQUESTED_LIMIT": "nvmlDeviceGetPowerManagementLimit",  # the limit set
    "NVML_FI_DEV_POWER_CURRENT_LIMIT": "nvmlDeviceGetEnforcedPowerLimit",  # after every limiter
}
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

# --- constants (nvml.h) -----------------------------------------------------------------------------

NVML_SUCCESS = 0
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_ECC_SBE_AGG_TOTAL = 5
NVML_FI_DEV_ECC_DBE_AGG_TOTAL = 6
NVML_FI_DEV_RETIRED_SBE = 29
NVML_FI_DEV_RETIRED_DBE = 30
NVML_FI_DEV_RETIRED_PENDING = 31
NVML_FI_DEV_REMAPPED_COR = 142
NVML_FI_DEV_REMAPPED_UNC = 143
NVML_FI_DEV_REMAPPED_PENDING = 144
NVML_FI_DEV_REMAPPED_FAILURE = 145
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_FI_DEV_NVLINK_GET_STATE = 165
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_CURRENT_LIMIT = 190
NVML_FI_DEV_POWER_REQUESTED_LIMIT = 192

# --- errors -------------------------------------------------------------------------------------------

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: 'Uninitialized',
    NVML_ERROR_INVALID_ARGUMENT: 'Invalid Argument',
    NVML_ERROR_NOT_SUPPORTED: 'Not Supported',
    NVML_ERROR_NO_PERMISSION: 'Insufficient Permissions',
    NVML_ERROR_ALREADY_INITIALIZED: 'Already Initialized',
    NVML_ERROR_NOT_FOUND: 'Not Found',
    NVML_ERROR_INSUFFICIENT_SIZE: 'Insufficient Size',
    NVML_ERROR_INSUFFICIENT_POWER: 'Insufficient External Power',
    NVML_ERROR_DRIVER_NOT_LOADED: 'Driver Not Loaded',
    NVML_ERROR_TIMEOUT: 'Timeout',
    NVML_ERROR_IRQ_ISSUE: 'Interrupt Request Issue',
    NVML_ERROR_LIBRARY_NOT_FOUND: 'NVML Shared Library Not Found',
    NVML_ERROR_FUNCTION_NOT_FOUND: 'Function Not Found',
    NVML_ERROR_CORRUPTED_INFOROM: 'Corrupted infoROM',
    NVML_ERROR_GPU_IS_LOST: 'GPU is lost',
    NVML_ERROR_RESET_REQUIRED: 'GPU requires restart',
    NVML_ERROR_OPERATING_SYSTEM: 'The operating system has blocked the request.',
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: 'RM has detected an NVML/RM version mismatch.',
    NVML_ERROR_MEMORY: 'Insufficient Memory',
    NVML_ERROR_UNKNOWN: 'Unknown Error',
}
ERROR_NAMES = {code: name for name, code in globals().items()
               if name.startswith("NVML_ERROR_") and isinstance(code, int)}


class NVMLError(Exception):
    """pynvml's NVMLError: `NVMLError(code)` is the subclass for that code; `value` is the code."""

    _by_code: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        kind = NVMLError._by_code.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(kind)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = Exception.__hash__


def _error_class_name(constant: str) -> str:
    """NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost (pynvml's naming)."""
    return f"{NVMLError.__name__}_" + "".join(word.title() for word in constant.split("_")[2:])


ERROR_CLASSES: dict[str, type[NVMLError]] = {}
for _code, _constant in sorted(ERROR_NAMES.items()):
    _cls = type(_error_class_name(_constant), (NVMLError,), {"__module__": __name__})
    NVMLError._by_code[_code] = _cls
    ERROR_CLASSES[_cls.__name__] = _cls
globals().update(ERROR_CLASSES)  # NVMLError_GpuIsLost, ... as module attributes, as in pynvml


# --- structures ----------------------------------------------------------------------------------------

NVML_GPU_FABRIC_UUID_LEN = 16
nvmlGpuFabricInfo_v2 = 0x02000024


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # pynvml's name
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):  # pynvml's c_nvmlGpuFabricInfo_v2_t
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = nvmlGpuFabricInfo_v2


# --- answers as values (shared by the reader and the event thread) ----------------------------------


def error_text(nvml: Any, code: int) -> str:
    try:
        return str(nvml.NVMLError(code))
    except Exception:  # noqa: BLE001 - any failure here just means an unknown code
        return f"NVML error {code}"


def field_value(nvml: Any, value: Any, name: str) -> Any:
    """One nvmlFieldValue_t as a fact: its number, or why there is none."""
    if getattr(value, "not_recorded", False):
        return Unsupported(f"{name} is not in this recording")
    ret = int(value.nvmlReturn)
    if ret == nvml.NVML_ERROR_NOT_SUPPORTED:
        return Unsupported(f"not supported by this GPU or driver ({name})")
    if ret != nvml.NVML_SUCCESS:
        return Unknown(f"{name}: {error_text(nvml, ret)}")
    kind = int(value.valueType)
    attr = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }.get(kind, "ullVal")
    result = getattr(value.value, attr)
    return float(result) if attr == "dVal" else int(result)
