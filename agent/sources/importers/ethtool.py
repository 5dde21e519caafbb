"""The `ethtool` kind: `ethtool -i IF` (driver information) and `ethtool IF` (link settings).

`ethtool IF` names the interface ("Settings for eth1:") and gives what the
kernel shows in /sys/class/net/IF: `speed` (Mb/s; "Unknown!" is no speed, as
reading a down link's speed fails), `duplex` and `carrier` ("Link detected").
`ethtool -i IF` does not print the interface's name: it is taken from a line
before the block (`ethtool -i eth0`, `# eth0`, `eth0:`), else from the file's name
as support tools write it (sosreport `ethtool_-i_eth0`, `ethtool-i.eth0.txt`); a
block whose interface cannot be named is skipped, never guessed. Its
`bus-info`, when a PCI address, becomes the interface's `device` link to
/sys/bus/pci/devices/ADDR, which is how the host reader ties a netdev to its
PCI function; the driver the audit reads is that function's (an `lspci -vvv`
input records it); `driver`, `version` and `firmware-version` are summarised.
Interfaces are folders under /sys/class/net, as agent.sources.importers.ip_link writes them.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 4 << 20
MAX_BLOCKS = 4096
NET_DIR = "sys/class/net"
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,15}$")
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SETTINGS_RE = re.compile(r"^Settings for ([^\s:]{1,64}):\s*$")
_INFO_KEYS = ("driver", "version", "firmware-version", "expansion-rom-version", "bus-info", "supports-statistics",
              "supports-test", "supports-eeprom-access", "supports-register-dump", "supports-priv-flags")
_INFO_LINE_RE = re.compile(r"^(" + "|".join(map(re.escape, _INFO_KEYS)) + r"):[ \t]?(.*)$")
_NAME_LINE_RES = (re.compile(r"^(?:[$#>]\s*)?(?:sudo\s+)?(?:/\S*/)?ethtool\s+(?:-i|--driver)\s+([^\s:]{1,64})\s*$"),
                  re.compile(r"^[#=*\-\s]*([A-Za-z0-9_.\-]{1,15})\s*:?[#=*\-\s]*$"))
_FILE_NAME_RE = re.compile(r"ethtool[_\-. ]+(?:-i|--driver|i)[_\-. ]+([A-Za-z0-9_.\-]{1,15}?)(?:\.(?:txt|out|log))?$")
_DUPLEX = {"full": "full", "half": "half"}


@dataclass
class Block:
    name: str | None
    line: int
    info: dict[str, str] = field(default_factory=dict)  # ethtool -i
    settings: dict[str, str] = field(default_factory=dict)  # ethtool IF


def parse_ethtool(text: str, file_name: str) -> list[Block]:
    blocks: list[Block] = []
    current: Block | None = None
    pending_name: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := _SETTINGS_RE.match(line):
            current = Block(m.group(1), number)
            blocks.append(current)
            continue
        if m := _INFO_LINE_RE.match(line):
            key, value = m.group(1), m.group(2).strip()
            if key == "driver" or current is None or (not current.info and current.settings):
                current = Block(pending_name, number)
                blocks.append(current)
                pending_name = None
            current.info.setdefault(key, value)
            continue
        if current is not None and line.startswith(("\t", " ")) and ":" in line:
            if current.info:
                continue
            key, _, value = line.strip().partition(":")
            current.settings.setdefault(key.strip(), value.strip())
            continue
        if line.strip():
            for pattern in _NAME_LINE_RES:
                if m := pattern.match(line.strip()):
                    pending_name = m.group(1)
                    current = None
                    break
    unnamed = [b for b in blocks if b.name is None]
    if len(unnamed) == 1 and len([b for b in blocks if b.info]) == 1:
        found = _FILE_NAME_RE.search(posixpath.basename(file_name.replace(":", "/")))
        if found:
            unnamed[0].name = found.group(1)
    return blocks


def _speed(text: str) -> str | None:
    found = re.fullmatch(r"(\d{1,7})\s*Mb/s", text)
    return found.group(1) if found and int(found.group(1)) > 0 else None


class EthtoolImporter:
    kind = "ethtool"

    def detect(self, head: bytes, name: str) -> bool:
        text = decode_text(head).replace("\r\n", "\n")
        if re.search(r"^Settings for [^\s:]+:\s*\n\s+(?:Supported|Speed|Link detected|Current message)", text,
                     re.MULTILINE):
            return True
        return bool(re.search(r"^driver: \S+\n(?:version: .*\n)?firmware-version: .*\n(?:expansion-rom-version: .*\n)?"
                              r"bus-info: ", text, re.MULTILINE))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an ethtool output", path=builder.current)
        blocks = parse_ethtool(decode_text(data), builder.current)
        if not blocks:
            raise InputError("no 'Settings for IF:' or 'driver:' block: not an ethtool output", path=builder.current)
        written: list[str] = []
        for block in blocks[:MAX_BLOCKS]:
            if block.name is None:
                result.skipped.append(f"line {block.line}: ethtool -i does not name the interface and nothing "
                                      "before it does (put `ethtool -i IF` above it, or name the file "
                                      "ethtool_-i_IF): not recorded")
                continue
            if not IFNAME_RE.match(block.name) or block.name in (".", ".."):
                result.skipped.append(f"{block.name[:40]!r}: not an interface name")
                continue
            described = self._write(block, builder, result)
            if described:
                written.append(f"{block.name} ({described})")
        if len(blocks) > MAX_BLOCKS:
            result.skipped.append(f"{len(blocks) - MAX_BLOCKS} block(s) past {MAX_BLOCKS}: not read")
        if written:
            result.contributed.append(f"/sys/class/net: {'; '.join(written[:16])}{' ...' if len(written) > 16 else ''}")
        return result

    def _write(self, block: Block, builder: Builder, result: Contribution) -> str:
        base = f"{NET_DIR}/{block.name}"
        what: list[str] = []
        settings = block.settings
        if (speed := _speed(settings.get("Speed", ""))) and builder.put_fs(f"{base}/speed", speed, result,
                                                                         newline=True):
            what.append(f"{speed} Mb/s")
        duplex = _DUPLEX.get(settings.get("Duplex", "").lower())
        if duplex and builder.put_fs(f"{base}/duplex", duplex, result, newline=True):
            what.append(f"{duplex} duplex")
        carrier = {"yes": "1", "no": "0"}.get(settings.get("Link detected", "").lower())
        if carrier and builder.put_fs(f"{base}/carrier", carrier, result, newline=True):
            what.append("link detected" if carrier == "1" else "no link")
        info = block.info
        bus = info.get("bus-info", "").lower()
        if PCI_RE.match(bus):
            link = f"{base}/device"
            if link in builder.links and builder.links[link] != f"../../../bus/pci/devices/{bus}":
                result.skipped.append(f"{block.name} bus-info {bus}: the interface's device is already recorded")
            else:
                builder.put_link(link, f"../../../bus/pci/devices/{bus}", result)
                builder.add_dir(base)
                what.append(f"PCI {bus}")
        elif bus and bus not in ("n/a", "tap"):
            result.skipped.append(f"{block.name} bus-info {bus[:60]!r}: not a PCI address, not recorded")
        for key in ("driver", "firmware-version"):
            if info.get(key):
                what.append(f"{key} {info[key][:60]}")
        return ", ".join(what)
