"""net.mtu: interface MTU per profile rule (e.g. jumbo frames on RoCE ports)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from agent.core.facts import NetInterface, NodeFacts
from agent.core.model import Finding, Unknown
from agent.policy.profiles import Profile
from checks import Check

MTU = Check("net.mtu", "Interface MTU", source="host", remediation="mtu",
            evidence="sysfs MTU of the interfaces a profile rule selects (by driver, name or PCI id)",
            parts=("net", "pci"))


def rule_matches(rule: Mapping[str, Any], iface: NetInterface, pci_ids: Mapping[str, str]) -> bool:
    """All given criteria must hold; names are globs, everything else exact."""
    if iface.bond_master and not rule.get("bond_members", False):
        return False  # the bond carries the MTU; members follow it
    if "driver" in rule and iface.driver not in rule["driver"]:
        return False
    if "link_layer" in rule and iface.link_layer not in rule["link_layer"]:
        return False
    if "rdma" in rule and bool(iface.rdma_device) != rule["rdma"]:
        return False
    if "pci_ids" in rule and pci_ids.get(iface.pci_address or "") not in rule["pci_ids"]:
        return False
    return not ("names" in rule and not any(fnmatch.fnmatchcase(iface.name, g) for g in rule["names"]))


@MTU.evaluator
def evaluate(facts: NodeFacts, profile: Profile) -> list[Finding]:
    rules = profile.section("network", "mtu")
    if not rules:
        return []
    interfaces = facts.host.interfaces
    if isinstance(interfaces, Unknown):
        first = profile.expectation("network", "mtu", sorted(rules)[0], "expect")
        return [MTU.missing("node", first, interfaces, "network interfaces")]
    pci = facts.host.pci
    pci_ids = {} if isinstance(pci, Unknown) else {f.address: f.pci_id for f in pci}
    findings = []
    for iface in interfaces:
        for name in sorted(rules):
            if not rule_matches(rules[name]["match"], iface, pci_ids):
                continue
            expectation = profile.expectation("network", "mtu", name, "expect")
            assert expectation is not None
            what = f"MTU of {iface.name} ({iface.driver or 'virtual'}, rule {name})"
            findings.append(MTU.compare(iface.name, expectation, iface.mtu, what))
            break
    return findings
