"""The `ibstat` kind: `ibstat` and `ibstatus` (infiniband-diags) as /sys/class/infiniband.

Both print what the kernel shows in sysfs (Documentation/ABI/stable/sysfs-class-infiniband);
each device becomes fs/sys/class/infiniband/<dev>/ with `hca_type` and `fw_ver`
(ibstat's "CA type", "Firmware version") and ports/<n>/{state, phys_state, rate,
link_layer} in the kernel's own format ("4: ACTIVE", "5: LinkUp", "400 Gb/sec",
"InfiniBand"), what agent.sources.rdma reads. ibstatus prints those sysfs
values as they are; ibstat prints names ("Active", "LinkUp") and the rate in Gb/s
without the width, so the value is "400 Gb/sec". Which PCI function and netdev
a device is, neither tool says: those stay out of the snapshot.
"""

from __future__ import annotations

import re

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 16 << 20
MAX_DEVICES = 256
IB_DIR = "sys/class/infiniband"
_DEV_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")
_IBSTAT_CA_RE = re.compile(r"^CA '([^']+)'\s*$")
_IBSTATUS_RE = re.compile(r"^Infiniband device '([^']+)' port (\d+) status:\s*$")
_PORT_RE = re.compile(r"^\s+Port (\d+):\s*$")
_FIELD_RE = re.compile(r"^\s+([A-Za-z_ ]+?):\s*(.*?)\s*$")
_STATES = {"down": "1: DOWN", "initializing": "2: INIT", "init": "2: INIT", "armed": "3: ARMED",
           "active": "4: ACTIVE", "active_defer": "5: ACTIVE_DEFER"}
_PHYS = {"sleep": "1: Sleep", "polling": "2: Polling", "disabled": "3: Disabled",
         "portconfigurationtraining": "4: PortConfigurationTraining", "linkup": "5: LinkUp",
         "linkerrorrecovery": "6: LinkErrorRecovery", "phy test": "7: Phy Test"}


def _state(value: str, table: dict[str, str]) -> str | None:
    if re.match(r"^\d+:\s*\S", value):  # ibstatus: already the sysfs text
        return value
    return table.get(value.strip().lower())


def _rate(value: str) -> str | None:
    if re.match(r"^\d+(?:\.\d+)?\s*Gb/sec", value):
        return value
    return f"{value} Gb/sec" if re.fullmatch(r"\d+(?:\.\d+)?", value) else None


def _convert(name: str, value: str) -> str | None:
    if name == "state":
        return _state(value, _STATES)
    if name == "phys_state":
        return _state(value, _PHYS)
    if name == "rate":
        return _rate(value)
    if name == "link_layer":
        return value if value in ("InfiniBand", "Ethernet") else None
    return None


def parse_ibstat(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """device -> {"": device files, "<port>": port files}, in sysfs names and formats."""
    devices: dict[str, dict[str, dict[str, str]]] = {}
    device: str | None = None
    port: str | None = None
    for line in text.splitlines():
        if m := _IBSTAT_CA_RE.match(line):
            device, port = m.group(1), None
            devices.setdefault(device, {"": {}})
            continue
        if m := _IBSTATUS_RE.match(line):
            device, port = m.group(1), m.group(2)
            devices.setdefault(device, {"": {}}).setdefault(port, {})
            continue
        if device is None:
            continue
        if m := _PORT_RE.match(line):
            port = m.group(1)
            devices[device].setdefault(port, {})
            continue
        if not (f := _FIELD_RE.match(line)):
            continue
        key, value = f.group(1).strip().lower().replace("_", " "), f.group(2)
        files = devices[device][port] if port is not None else devices[device][""]
        if port is None:
            if key == "ca type" and value:
                files["hca_type"] = value
            elif key == "firmware version" and value:
                files["fw_ver"] = value
            continue
        name = {"physical state": "phys_state", "phys state": "phys_state", "link layer": "link_layer"}.get(key, key)
        sysfs = _convert(name, value)
        if sysfs is not None:
            files.setdefault(name, sysfs)
    return devices


class IbstatImporter:
    kind = "ibstat"

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head)
        return bool(re.search(r"^CA '[^']+'\s*$\n\s+CA type:", text, re.MULTILINE)
                    or _IBSTATUS_RE.search(text.splitlines()[0] if text.strip() else "")
                    or re.search(r"^Infiniband device '[^']+' port \d+ status:\s*$\n\s+default gid:", text,
                                 re.MULTILINE))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an ibstat output", path=builder.current)
        devices = parse_ibstat(decode_text(data))
        if not devices:
            raise InputError("no InfiniBand device (CA '...' or Infiniband device '...') in it", path=builder.current)
        written: list[str] = []
        for device, parts in list(devices.items())[:MAX_DEVICES]:
            if not _DEV_RE.match(device):
                result.skipped.append(f"{device[:80]!r}: not an RDMA device name")
                continue
            base = f"{IB_DIR}/{device}"
            builder.add_dir(base)
            count = 0
            for port, files in sorted(parts.items()):
                folder = base if port == "" else f"{base}/ports/{port}"
                if port and (not port.isdigit() or not 0 < int(port) < 256):
                    result.skipped.append(f"{device} port {port[:20]!r}: not a port number")
                    continue
                if port:
                    builder.add_dir(folder)
                for name, value in sorted(files.items()):
                    count += builder.put_fs(f"{folder}/{name}", value, result, newline=True)
            if count:
                written.append(device)
        if len(devices) > MAX_DEVICES:
            result.skipped.append(f"{len(devices) - MAX_DEVICES} device(s) past {MAX_DEVICES}: not read")
        if written:
            result.contributed.append(f"/sys/class/infiniband: {len(written)} device(s) ({', '.join(written[:16])}"
                                      f"{' ...' if len(written) > 16 else ''})")
        return result
