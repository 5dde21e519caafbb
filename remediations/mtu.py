"""mtu: interface MTU at runtime through /sys/class/net/IF/mtu.

The profile rule that judged the interface is found again with the check's
own matcher, so bond members are only touched when the rule says
`bond_members: true`. On a live node the NIC's maximum comes from netlink
(`ip -d -j link`, IFLA_MAX_MTU): a value above it is refused at plan time
instead of failing half-way through a run.
"""

from __future__ import annotations

import re

from agent.core.model import Finding, Unknown
from agent.io.jsonfile import load_json_bytes
from agent.io.programs import run_bounded
from agent.io.trusted_exec import UntrustedProgram, find_program
from agent.sources.host import NET_DIR, read_interface, read_pci_function, read_rdma_ports
from checks.net_mtu import rule_matches
from remediations import Action, ActionClass, AttrWrite, PlanContext, actuator, refused, target_value
from remediations.boot import BOOT_CONF, persist

IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}\Z")  # IFNAMSIZ - 1, no '/'
IP_TIMEOUT_S = 5.0
IP_FOLDERS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")  # iproute2's, never a folder PATH adds


def parse_mtu(raw: bytes) -> str:
    return raw.decode("utf-8").strip()


def shown_mtu(old: bytes, value: str) -> bytes:
    return f"{value}\n".encode()


def netlink_mtu_limits(name: str) -> tuple[int | None, int | None]:
    """(min_mtu, max_mtu) of a live interface from `ip -d -j link`; (None, None) if unknown."""
    try:  # run as root: the program is trusted input (agent.io.trusted_exec), not whatever PATH says
        ip = find_program("ip", IP_FOLDERS, "ip")
    except UntrustedProgram:
        return None, None
    ran = run_bounded([ip, "-d", "-j", "link", "show", "dev", name], timeout_s=IP_TIMEOUT_S, max_output=1 << 20)
    try:
        (link,) = load_json_bytes(ran.stdout, what="ip link", max_bytes=1 << 20) if ran.ok else [{}]
    except ValueError:
        return None, None
    low, high = link.get("min_mtu"), link.get("max_mtu")
    return (low if isinstance(low, int) else None, high if isinstance(high, int) and high > 0 else None)


@actuator("mtu", writes=(f"{NET_DIR}/*/mtu", BOOT_CONF))
def plan_mtu(finding: Finding, ctx: PlanContext) -> list[Action]:
    name = finding.subject
    action_id = f"mtu:{name}"
    if not IFNAME_RE.match(name) or name in (".", ".."):
        return [refused(action_id, finding, ActionClass.SAFE, finding.observed, f"not an interface name: {name!r}")]
    fs = ctx.target.fs
    iface = read_interface(fs, name, read_rdma_ports(fs))
    if isinstance(iface.mtu, Unknown):
        return [refused(action_id, finding, ActionClass.SAFE, None,
                        f"cannot read the MTU of {name}: {iface.mtu.reason}")]
    rules = ctx.profile.section("network", "mtu")
    pci_id = ""
    if iface.pci_address:
        function = read_pci_function(fs, iface.pci_address)
        pci_id = "" if isinstance(function, Unknown) or isinstance(function.pci_id, Unknown) else function.pci_id
    rule = next((r for r in sorted(rules) if rule_matches(rules[r]["match"], iface, {iface.pci_address or "": pci_id})),
                None)
    expectation = ctx.profile.expectation("network", "mtu", rule, "expect") if rule else None
    if expectation is None:
        return [refused(action_id, finding, ActionClass.SAFE, iface.mtu,
                        "no profile rule matches this interface (bond members need `bond_members: true`)")]
    value = target_value(expectation)
    if value is None or not value.isdigit():
        return [refused(action_id, finding, ActionClass.SAFE, iface.mtu,
                        f"rule {rule} allows {expectation.describe()} but names no single MTU to set")]
    if expectation.evaluate(iface.mtu).ok:
        return []
    notes: list[str] = []
    if ctx.target.live and getattr(ctx.target, "root", "/") == "/":
        low, high = netlink_mtu_limits(name)
        if high is not None and int(value) > high:
            return [refused(action_id, finding, ActionClass.SAFE, iface.mtu,
                            f"{name} supports at most MTU {high} (driver {iface.driver or 'virtual'}); "
                            f"the profile asks for {value}")]
        if low is not None and int(value) < low:
            return [refused(action_id, finding, ActionClass.SAFE, iface.mtu, f"{name} needs MTU >= {low}")]
    else:
        notes.append("the NIC's maximum MTU is not recorded in a snapshot; the kernel enforces it on a live node")
    if iface.bond_master:
        notes.append(f"{name} is a member of {iface.bond_master}; the bond's own MTU also needs the new value")
    return [Action(action_id, "mtu", ActionClass.SAFE, name, finding.check, iface.mtu, int(value),
                   changes=(AttrWrite(f"{NET_DIR}/{name}/mtu", value, parse_mtu, shown_mtu),
                            persist(f"mtu.{name}", value)),
                   expectation=expectation, notes=notes)]
