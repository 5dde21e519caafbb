"""Constants of the IPMI source, shared by the reader process (ipmi_worker) and the parser (ipmi_parse).

Nothing here imports the rest of the agent: the worker process imports this module only, so it
starts fast.
"""

from __future__ import annotations

DEFAULT_TIMEOUT_S = 10.0
RECORD_FORMAT = "nodewarden.ipmi/v1"
SOURCE = "ipmi"
FRU_CHUNK = 32  # ipmi_sim answers 0xC8 above 32 bytes; real BMCs take more, none needs less
PARTS = ("device_id", "power", "sensors", "fru", "sel")
THRESHOLD_KEYS = ("lnc", "lc", "lnr", "unc", "uc", "unr")  # Get Sensor Thresholds order
PREINIT_LIMIT = 0x20000000  # SEL timecodes below this count seconds since BMC init
TIMECODE_UNSPECIFIED = 0xFFFFFFFF
HEALTH_WARNING, HEALTH_CRITICAL, HEALTH_FAILED = 1, 2, 4  # pyghmi.constants.Health bits
MAX_USER_BYTES = 16  # IPMI 2.0 user names
LOGIN_STEP = "login"
LOGOUT_STEP = "logout"

# IANA enterprise numbers of common BMC vendors (Get Device ID manufacturer id).
IANA_VENDORS = {
    2: "IBM",
    9: "Cisco",
    11: "HP",
    343: "Intel",
    674: "Dell",
    2011: "Huawei",
    5703: "NVIDIA",
    7244: "Quanta",
    10368: "Fujitsu",
    10876: "Supermicro",
    15370: "GIGABYTE",
    19046: "Lenovo",
    37945: "Inspur",
    47196: "HPE",
}

AUTH_ERRORS = ("incorrect password", "unauthorized name", "invalid username", "unauthorized role",
               "unauthorized guid", "invalid integrity check")
