"""pcie.link (non-GPU links trained below capability), pcie.acs (ACS redirect on GPU <-> NIC
peer paths) and host.iommu (the IOMMU's mode).

GPU links have gpu.pcie.link (NVML). Here only the device classes the profile
names are judged (`pcie.link.RULE.pci_ids`), because a healthy server has
links that run below their capability on purpose (a Gen4 SSD in a Gen5 slot
reports its own Gen4 maximum, but riser and management links vary).
"""

from __future__ import annotations

from agent.core.facts import NodeFacts, PciFunction
from agent.core.model import Finding, Status, Unknown, Unsupported
from agent.policy.profiles import Profile
from agent.sources.pcie import peer_bridges
from checks import Check

LINK = Check("pcie.link", "PCIe link of NICs, NVSwitches and NVMe", source="host", action="reseat",
             evidence="sysfs current vs max link speed/width of the device classes the profile names",
             parts=("pci", "pci_links"))
ACS = Check("pcie.acs", "ACS on GPU <-> NIC peer paths", source="host", remediation="acs", action="disable_acs",
            evidence="ACS control bits on switch ports in GPU<->NIC peer paths, from config space in sysfs",
            parts=("pci",))
IOMMU = Check("host.iommu", "IOMMU mode", source="host", action="fix_kernel_cmdline",
              evidence="the kernel's IOMMU mode from /sys/class/iommu and /proc/cmdline", parts=("iommu", "cmdline"))


def _speed(text: str | None) -> float | None:
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def link_state(fn: PciFunction) -> str | Unknown:
    """full | slower | narrower | slower and narrower, or Unknown when sysfs reports no link."""
    cur_s, max_s = _speed(fn.current_link_speed), _speed(fn.max_link_speed)
    if cur_s is None or max_s is None or fn.current_link_width is None or fn.max_link_width is None:
        return Unknown(f"{fn.address} reports no link speed or width in sysfs")
    if cur_s == 0 or fn.current_link_width == 0:
        return "down"
    slower, narrower = cur_s < max_s, fn.current_link_width < fn.max_link_width
    if slower and narrower:
        return "slower and narrower"
    return "slower" if slower else "narrower" if narrower else "full"


@LINK.evaluator
def evaluate_link(facts: NodeFacts, profile: Profile) -> list[Finding]:
    rules = profile.section("pcie", "link")
    if not rules:
        return []
    pci = facts.host.pci
    if isinstance(pci, Unknown):
        return [LINK.missing("node", profile.expectation("pcie", "link", sorted(rules)[0]), pci, "PCI functions")]
    findings = []
    for name in sorted(rules):
        expectation = profile.expectation("pcie", "link", name)
        if expectation is None:
            continue
        ids = {str(x).lower() for x in rules[name].get("pci_ids") or ()}
        for fn in sorted((f for f in pci if f.pci_id in ids), key=lambda f: f.address):
            state = link_state(fn)
            if isinstance(state, Unknown) and isinstance(facts.host.pci_links, Unknown):
                state = Unsupported(f"{fn.address}: no link speed or width in this snapshot "
                                    f"({facts.host.pci_links.reason})")
            what = f"PCIe link of {fn.address} ({name}, {fn.pci_id})"
            finding = LINK.compare(fn.address, expectation, state, what)
            if not isinstance(state, Unknown):
                finding.message += (f": {fn.current_link_speed} x{fn.current_link_width} of "
                                    f"{fn.max_link_speed} x{fn.max_link_width}")
                finding.observed = {"state": state, "speed": fn.current_link_speed, "width": fn.current_link_width,
                                    "max_speed": fn.max_link_speed, "max_width": fn.max_link_width}
            findings.append(finding)
    return findings


@ACS.evaluator
def evaluate_acs(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("pcie", "acs")
    if expectation is None:
        return []
    host = facts.host
    for value in (host.pci, host.rdma, host.pcie_acs):
        if isinstance(value, Unknown):
            return [ACS.missing("node", expectation, value, "ACS on GPU <-> NIC paths")]
    assert not isinstance(host.pci, Unknown) and not isinstance(host.rdma, Unknown)
    assert not isinstance(host.pcie_acs, Unknown)
    pairs = peer_bridges(host.pci, host.rdma)
    nic_names = {d.pci_address: d.name for d in host.rdma if d.pci_address}
    findings = []
    for bridge in sorted(pairs):
        paths = ", ".join(f"GPU {g} <-> {nic_names.get(n, n)} ({n})" for g, n in pairs[bridge])
        acs = host.pcie_acs.get(bridge, Unknown(f"{bridge}: ACS not read"))
        what = f"ACS on switch port {bridge}"
        if isinstance(acs, Unknown):
            findings.append(ACS.missing(bridge, expectation, acs, what))
            continue
        observed = "enabled" if acs is not None and acs.redirects else "disabled"
        finding = ACS.compare(bridge, expectation, observed, what)
        detail = "no ACS capability" if acs is None else acs.describe()
        finding.message += f" ({detail}) on the P2P path of {paths}"
        if finding.status is not Status.PASS:
            finding.message += ": P2P requests are redirected up to the root complex"
        findings.append(finding)
    return findings


@IOMMU.evaluator
def evaluate_iommu(facts: NodeFacts, profile: Profile) -> list[Finding]:
    expectation = profile.expectation("iommu", "mode")
    if expectation is None:
        return []
    iommu = facts.host.iommu
    if isinstance(iommu, Unknown):
        return [IOMMU.missing("node", expectation, iommu, "IOMMU mode")]
    finding = IOMMU.compare("node", expectation, iommu.mode, "IOMMU mode")
    finding.message += f" ({iommu.why})"
    return [finding]
