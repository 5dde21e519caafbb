"""The `ip-link` kind: `ip link` / `ip -d link` text and `ip -j link` JSON as /sys/class/net.

Each interface becomes the folder the kernel shows for it under /sys/class/net
(as old kernels did, a folder rather than a link into /sys/devices: the PCI
path is not in `ip`'s output) holding what agent.sources.host reads:

* `mtu`, `operstate` (ip's `state UP` is the kernel's `up`), `type` (the ARP
  hardware type: link/ether 1, link/infiniband 32, link/loopback 772, link/none
  65534), `address` and `ifindex`;
* `master` (a recorded link to the bond or bridge, `master bond0`), and a
  `lower_<parent>` link for a VLAN or other stacked device (`eth0.100@eth0`);
* for a bond (`ip -d`: a `bond mode 802.3ad ...` line, or JSON `info_kind`), the
  `bonding/` folder with `mode` ("802.3ad 4"), which is what makes it a bond.

Speed and the PCI function are not in `ip`'s output (`ethtool` has them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent.core.errors import SnapshotError
from agent.io.jsonfile import load_json_bytes
from agent.sources.importers.base import Builder, Contribution, InputError, decode_text

MAX_BYTES = 16 << 20
MAX_INTERFACES = 4096
NET_DIR = "sys/class/net"
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,15}$")  # agent.sources.host.IFNAME_RE without '@' (ip's separator)
_HEAD_RE = re.compile(r"^(\d{1,10}): ([^\s:@]{1,64})(?:@([^\s:]{1,64}))?: <([A-Z0-9_,-]*)> (.*)$")
_LINK_RE = re.compile(r"^\s+link/(\S+)(?: (\S+))?")
_DETECT_RE = re.compile(r"^\d{1,10}: [^\s:]{1,64}: <[A-Z0-9_,-]*> mtu \d+ [^\n]*\n\s+link/\S+", re.MULTILINE)
_JSON_DETECT_RE = re.compile(rb'^\s*\[\s*\{\s*"ifindex"\s*:\s*\d+\s*,\s*"(?:ifname|link_index)"')
_STATES = {"UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP"}
ARP_TYPES = {"ether": 1, "infiniband": 32, "loopback": 772, "none": 65534, "ieee802.11": 801, "sit": 776,
             "ipip": 768, "gre": 778, "tunnel6": 769, "can": 280}
BOND_MODES = {"balance-rr": 0, "active-backup": 1, "balance-xor": 2, "broadcast": 3, "802.3ad": 4,
              "balance-tlb": 5, "balance-alb": 6}
_KINDS = {"bond", "bridge", "vlan", "veth", "vxlan", "macvlan", "macvtap", "ipvlan", "ipoib", "dummy", "tun",
          "geneve", "gre", "gretap", "ip6gre", "ipip", "sit", "vrf", "team", "wireguard", "openvswitch", "can"}
_MAC_RE = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5,19}$")


@dataclass
class Interface:
    name: str
    ifindex: int | None = None
    mtu: int | None = None
    state: str | None = None
    link_type: str | None = None
    address: str | None = None
    master: str | None = None
    parent: str | None = None
    kind: str | None = None
    bond_mode: str | None = None
    odd: list[str] = field(default_factory=list)


def _words(text: str) -> dict[str, str]:
    """'mtu 1500 qdisc mq master bond0 state UP' -> {'mtu': '1500', ...} (ip prints key value pairs)."""
    tokens = text.split()
    return {tokens[i]: tokens[i + 1] for i in range(0, len(tokens) - 1) if tokens[i].isidentifier()}


def parse_ip_text(text: str) -> list[Interface]:
    interfaces: list[Interface] = []
    current: Interface | None = None
    for line in text.splitlines():
        if m := _HEAD_RE.match(line):
            words = _words(m.group(5))
            current = Interface(name=m.group(2), ifindex=int(m.group(1)))
            interfaces.append(current)
            if m.group(3) and m.group(3) != "NONE" and not m.group(3).startswith("if"):
                current.parent = m.group(3)
            current.mtu = int(words["mtu"]) if words.get("mtu", "").isdigit() else None
            current.state = words.get("state") if words.get("state") in _STATES else None
            current.master = words.get("master")
            continue
        if current is None or not line.startswith((" ", "\t")):
            continue
        if (link := _LINK_RE.match(line)) and current.link_type is None:
            current.link_type = link.group(1)
            current.address = link.group(2)
            continue
        first, _, rest = line.strip().partition(" ")
        if first in _KINDS and current.kind is None:
            current.kind = first
            if first == "bond":
                current.bond_mode = _words(rest).get("mode")
    return interfaces


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) <= 64 else None


def parse_ip_json(data: bytes, name: str) -> list[Interface]:
    try:
        document = load_json_bytes(data, what=name, max_bytes=MAX_BYTES, max_depth=16)
    except SnapshotError as exc:
        raise InputError(f"not ip -j JSON: {exc.message}", path=name, line=exc.line) from None
    if not isinstance(document, list):
        raise InputError("not ip -j JSON: a list of interfaces was expected", path=name)
    interfaces: list[Interface] = []
    for item in document:
        if not isinstance(item, dict) or not isinstance(item.get("ifname"), str):
            continue
        info: dict[str, Any] = item["linkinfo"] if isinstance(item.get("linkinfo"), dict) else {}
        data_info: dict[str, Any] = info["info_data"] if isinstance(info.get("info_data"), dict) else {}
        iface = Interface(
            name=item["ifname"][:64],
            ifindex=item["ifindex"] if isinstance(item.get("ifindex"), int) else None,
            mtu=item["mtu"] if isinstance(item.get("mtu"), int) and not isinstance(item["mtu"], bool) else None,
            state=item["operstate"] if item.get("operstate") in _STATES else None,
            link_type=_text(item.get("link_type")), address=_text(item.get("address")),
            master=_text(item.get("master")), parent=_text(item.get("link")),
            kind=_text(info.get("info_kind")), bond_mode=_text(data_info.get("mode")))
        interfaces.append(iface)
    return interfaces


class IpLinkImporter:
    kind = "ip-link"

    def detect(self, head: bytes, name: str) -> bool:
        if _JSON_DETECT_RE.match(head):
            return True
        return bool(_DETECT_RE.search(decode_text(head).replace("\r\n", "\n")))

    def contribute(self, data: bytes, builder: Builder) -> Contribution:
        result = Contribution()
        if len(data) > MAX_BYTES:
            raise InputError(f"larger than {MAX_BYTES >> 20} MiB: not an ip link output", path=builder.current)
        if data.lstrip()[:1] == b"[":
            interfaces = parse_ip_json(data, builder.current)
        else:
            interfaces = parse_ip_text(decode_text(data))
        if not interfaces:
            raise InputError("no interface ('N: NAME: <FLAGS> mtu ...'): not an ip link output",
                             path=builder.current)
        written: list[str] = []
        names = {i.name for i in interfaces}
        for iface in interfaces[:MAX_INTERFACES]:
            if not IFNAME_RE.match(iface.name) or iface.name in (".", ".."):
                result.skipped.append(f"{iface.name[:40]!r}: not an interface name")
                continue
            if self._write(iface, names, builder, result):
                written.append(iface.name)
        if len(interfaces) > MAX_INTERFACES:
            result.skipped.append(f"{len(interfaces) - MAX_INTERFACES} interface(s) past {MAX_INTERFACES}: not read")
        if written:
            result.contributed.append(f"/sys/class/net: {len(written)} interface(s) ({', '.join(written[:16])}"
                                      f"{' ...' if len(written) > 16 else ''})")
        return result

    def _write(self, iface: Interface, names: set[str], builder: Builder, result: Contribution) -> bool:
        base = f"{NET_DIR}/{iface.name}"
        count = 0
        if iface.mtu is not None and 0 < iface.mtu < 1 << 20:
            count += builder.put_fs(f"{base}/mtu", str(iface.mtu), result, newline=True)
        if iface.state:
            count += builder.put_fs(f"{base}/operstate", iface.state.lower(), result, newline=True)
        if iface.link_type in ARP_TYPES:
            count += builder.put_fs(f"{base}/type", str(ARP_TYPES[iface.link_type]), result, newline=True)
        if iface.address and _MAC_RE.match(iface.address):
            count += builder.put_fs(f"{base}/address", iface.address, result, newline=True)
        if iface.ifindex is not None and 0 < iface.ifindex < 1 << 31:
            count += builder.put_fs(f"{base}/ifindex", str(iface.ifindex), result, newline=True)
        for link, other in (("master", iface.master), (f"lower_{iface.parent}", iface.parent)):
            if not other:
                continue
            if not IFNAME_RE.match(other) or other not in names:
                result.skipped.append(f"{iface.name} {link.split('_')[0]} {other[:40]!r}: not an interface "
                                      "listed here, not recorded")
                continue
            builder.put_link(f"{base}/{link}", f"../{other}", result)
        if iface.kind == "bond":
            builder.add_dir(f"{base}/bonding")
            mode = iface.bond_mode
            if mode in BOND_MODES:
                count += builder.put_fs(f"{base}/bonding/mode", f"{mode} {BOND_MODES[mode]}", result, newline=True)
        return count > 0
