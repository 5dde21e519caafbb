"""Which RDMA devices are compute rails, and whether the node is a virtual machine.

A rail is a family of parts, not one PCI id. The kernel's mlx5 table (drivers/net/ethernet/
mellanox/mlx5/core/main.c) and pci.ids name them; `hca_type` is "MT" and the PCI device id in
decimal (mlx5_ib `hca_type_show`):

| family | physical function | virtual function |
|---|---|---|
| ConnectX-6 | MT4123 (15b3:101b) | MT4124 (15b3:101c) |
| ConnectX-6 Dx | MT4125 (15b3:101d) | MT4126 (15b3:101e, shared) |
| ConnectX-6 Lx | MT4127 (15b3:101f) | MT4126 |
| ConnectX-7 | MT4129 (15b3:1021) | MT4126 |
| ConnectX-8 | MT4131 (15b3:1023) | MT4126 |
| BlueField-2 (integrated ConnectX-6 Dx) | MT41686 (15b3:a2d6) | MT4126 |
| BlueField-3 (integrated ConnectX-7) | MT41692 (15b3:a2dc) | MT4126 |
| BlueField-4 (integrated ConnectX-8) | MT41695 (15b3:a2df) | MT4126 |

15b3:101e, "ConnectX Family mlx5Gen Virtual Function", serves every generation since ConnectX-6
Dx; the firmware a VF reports is its physical function's, whose major number is the silicon's
(20 ConnectX-6, 22 ConnectX-6 Dx, 24 BlueField-2, 26 ConnectX-6 Lx, 28 ConnectX-7, 32 BlueField-3,
40 ConnectX-8). A VF whose physical function is on this host (sysfs `device/physfn`, SR-IOV for
containers) is never a rail: its physical function is. A VF without one was passed through to a
virtual machine, and is the VM's rail.

A profile's `rdma.hca_types` lists family names (a family covers its physical function and its
virtual functions) or exact hca_types (`MT4129`: that id only).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from agent.core.facts import HostFacts, RdmaDevice
from agent.core.model import Unknown

PHYSICAL = {"MT4123": "ConnectX-6", "MT4125": "ConnectX-6 Dx", "MT4127": "ConnectX-6 Lx", "MT4129": "ConnectX-7",
            "MT4131": "ConnectX-8", "MT41686": "BlueField-2", "MT41692": "BlueField-3", "MT41695": "BlueField-4"}
VIRTUAL = {"MT4124": "ConnectX-6"}
SHARED_VF = "MT4126"  # 15b3:101e: the family is told by the firmware's major number
FIRMWARE_MAJOR = {20: "ConnectX-6", 22: "ConnectX-6 Dx", 24: "BlueField-2", 26: "ConnectX-6 Lx", 28: "ConnectX-7",
                  32: "BlueField-3", 40: "ConnectX-8"}
FAMILIES = frozenset(PHYSICAL.values())
_FW_MAJOR = re.compile(r"^(\d+)\.")

# A hypervisor's own PCI functions: QEMU/KVM (1b36 Red Hat: root ports 000c, bridges), Hyper-V
# (1414), VMware (15ad), Xen (5853). Virtio (1af4) is left out: BlueField emulates virtio on bare metal.
HYPERVISOR_PCI_VENDORS = {0x1B36: "QEMU", 0x1414: "Hyper-V", 0x15AD: "VMware", 0x5853: "Xen"}
VM_SYS_VENDORS = frozenset({"QEMU", "Xen", "VMware, Inc.", "innotek GmbH", "Parallels Software International Inc.",
                            "OpenStack Foundation", "Nutanix"})
VM_PRODUCTS = frozenset({"Virtual Machine", "KVM", "Google Compute Engine", "OpenStack Nova", "OpenStack Compute",
                         "HVM domU", "VMware Virtual Platform", "BHYVE", "Bochs", "RHEV Hypervisor", "oVirt Node",
                         "Standard PC (Q35 + ICH9, 2009)", "Standard PC (i440FX + PIIX, 1996)"})


class HcaKind(NamedTuple):
    family: str | None  # None: not a part this table knows (or a shared VF whose firmware is unreadable)
    virtual_function: bool = False

    def describe(self, hca_type: str) -> str:
        name = self.family or "unknown family"
        return f"{name}{' VF' if self.virtual_function else ''} ({hca_type})"


def hca_kind(device: RdmaDevice) -> HcaKind:
    hca = device.hca_type if isinstance(device.hca_type, str) else ""
    if hca in PHYSICAL:
        return HcaKind(PHYSICAL[hca])
    if hca in VIRTUAL:
        return HcaKind(VIRTUAL[hca], True)
    if hca == SHARED_VF:
        major = _FW_MAJOR.match(device.fw_ver) if isinstance(device.fw_ver, str) else None
        return HcaKind(FIRMWARE_MAJOR.get(int(major.group(1))) if major else None, True)
    return HcaKind(None)


def kind_label(device: RdmaDevice) -> str:
    """'MT4129', or for the shared VF id the family its firmware tells: 'MT4126 ConnectX-7 VF'."""
    hca = device.hca_type if isinstance(device.hca_type, str) else "HCA"
    kind = hca_kind(device)
    return f"{hca} {kind.family} VF" if hca == SHARED_VF and kind.family else hca


def matches_types(device: RdmaDevice, types: tuple[str, ...]) -> bool:
    """Whether a device is of the profile's rail types (family names or exact hca_types)."""
    if device.physfn is not None:
        return False  # a VF of a physical function on this host: the physical function is the rail
    if isinstance(device.hca_type, str) and device.hca_type in types:
        return True
    family = hca_kind(device).family
    return family is not None and family in types


def virtual_machine(host: HostFacts, rails: list[RdmaDevice] | None = None) -> str | None:
    """Evidence that the node is a virtual machine, or None: DMI strings a hypervisor sets, the
    hypervisor's own PCI functions, or rails that are virtual functions passed through."""
    for field, known in (("product_name", VM_PRODUCTS), ("sys_vendor", VM_SYS_VENDORS)):
        value = host.dmi.get(field)
        if isinstance(value, str) and value in known:
            return f"DMI {field} {value!r}"
    vendor, product = host.dmi.get("sys_vendor"), host.dmi.get("product_name")
    if vendor == "Amazon EC2" and isinstance(product, str) and not product.endswith(".metal"):
        return f"DMI {vendor!r} {product!r}"
    if not isinstance(host.pci, Unknown):
        for function in host.pci:
            if function.vendor in HYPERVISOR_PCI_VENDORS:
                return f"{HYPERVISOR_PCI_VENDORS[function.vendor]} PCI function {function.pci_id} at {function.address}"
    passed = [d.name for d in rails or () if hca_kind(d).virtual_function and d.physfn is None]
    if passed:
        return f"rails {', '.join(passed[:3])}{' ...' if len(passed) > 3 else ''} are virtual functions passed through"
    return None
