"""The `dmidecode` kind: the SMBIOS strings Linux shows in /sys/class/dmi/id.

dmidecode prints records ("Handle 0x0100, DMI type 1, 27 bytes", a title, then
tab-indented "Key: Value" lines); the kernel's dmi/id files hold the same
strings (drivers/firmware/dmi-id.c). Only types 0 (BIOS), 1 (System), 2 (Base
Board) and 3 (Chassis) feed those files; the other records are counted as
not used; a dump holding none of those four (`dmidecode -t 39`, power
supplies only) is refused by name. dmidecode's placeholders ("Not Specified", "To Be Filled By O.E.M.")
are what the firmware holds, and are kept as printed.
"""

from __future__ import annotations

import re

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

DMI_DIR = "sys/class/dmi/id"
MAX_BYTES = 16 << 20
_HANDLE_RE = re.compile(r"^Handle 0x[0-9A-Fa-f]{4}, DMI type (\d+), \d+ bytes$")
_FIELDS: dict[int, dict[str, str]] = {
    0: {"Vendor": "bios_vendor", "Version": "bios_version", "Release Date": "bios_date"},
    1: {"Manufacturer": "sys_vendor", "Product Name": "product_name", "Version": "product_version",
        "Serial Number": "product_serial", "UUID": "product_uuid", "SKU Number": "product_sku",
        "Family": "product_family"},
    2: {"Manufacturer": "board_vendor", "Product Name": "board_name", "Version": "board_version",
        "Serial Number": "board_serial", "Asset Tag": "board_asset_tag"},
    3: {"Manufacturer": "chassis_vendor", "Version": "chassis_version", "Serial Number": "chassis_serial",
        "Asset Tag": "chassis_asset_tag"},
}


def parse_dmidecode(text: str) -> tuple[dict[str, str], dict[int, int]]:
    """dmi/id file name -> value (first record of each type wins), and how many records of each type."""
    values: dict[str, str] = {}
    types: dict[int, int] = {}
    current: int | None = None
    for line in text.splitlines():
        if m := _HANDLE_RE.match(line.strip()):
            current = int(m.group(1))
            types[current] = types.get(current, 0) + 1
            if types[current] > 1:
                current = None  # a second System record: the kernel shows the first
            continue
        if current is None or not line.startswith(("\t", " ")) or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        name = _FIELDS.get(current, {}).get(key.strip())
        if name and name not in values and (value := value.strip()):
            values[name] = value.lower() if name == "product_uuid" else value
    return values, types


class DmidecodeImporter:
    kind = "dmidecode"

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head)
        return bool(re.search(r"^Handle 0x[0-9A-Fa-f]{4}, DMI type \d+, \d+ bytes$", text, re.MULTILINE)) and (
            "SMBIOS" in text or "# dmidecode" in text or "DMI type" in text)

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not a dmidecode dump", path=builder.current)
        values, types = parse_dmidecode(decode_text(data))
        if not types:
            raise InputError("no DMI record in it", path=builder.current)
        if not values:  # e.g. `dmidecode -t 39` (power supplies): nothing /sys/class/dmi/id would show
            raise InputError("no DMI record of type 0, 1, 2 or 3 (BIOS, System, Base Board, Chassis), the "
                             f"records the audit reads (types in it: {', '.join(map(str, sorted(types)[:20]))})",
                             path=builder.current)
        written = [name for name, value in values.items() if builder.put_fs(f"{DMI_DIR}/{name}", value, result,
                                                                              newline=True)]
        if written:
            result.contributed.append(f"/sys/class/dmi/id: {', '.join(sorted(written))}")
        if 1 not in types:
            result.skipped.append("no System Information record (DMI type 1): sys_vendor and product_name "
                                  "are not in this snapshot")
        unused = sorted(t for t in types if t not in _FIELDS)
        if unused:
            result.skipped.append(f"{sum(types[t] for t in unused)} record(s) of DMI types "
                                  f"{', '.join(map(str, unused[:20]))}{' ...' if len(unused) > 20 else ''}: "
                                  "not used by the audit")
        return result
