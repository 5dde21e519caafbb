"""Node identity before cross-checks: is the BMC that was read this host's own?

A BMC named with `--bmc` may belong to another node (an audit from a jump host, a wrong address in
a config file). Comparing its GPUs with the local PCI and NVML view would then report faults that
exist nowhere. The binding compares the host ComputerSystem's `UUID` (and `SerialNumber`/`SKU`)
with DMI's `product_uuid` (and `product_serial`): the same SMBIOS record, read from both sides.

Placeholders that firmware ships unfilled ("To Be Filled By O.E.M.", the AMI default UUID
03000200-0400-0500-0006-000700080009, all zeros) identify nothing and count as unknown. Some BMCs
print the UUID's first three fields in the other byte order (SMBIOS before 2.6 stored them
big-endian); that form matches too.
"""

from __future__ import annotations

import re

from agent.core.facts import BmcBinding, BmcFacts, HostFacts
from agent.core.model import Unknown

NO_BMC = BmcBinding("no_bmc", "no BMC was read")

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PLACEHOLDER_UUIDS = frozenset({
    "03000200-0400-0500-0006-000700080009",  # AMI Aptio default
    "00020003-0004-0005-0006-000700080009",  # the same, other byte order
    "12345678-1234-5678-90ab-cddeefaabbcc",
})
_PLACEHOLDER_SERIALS = frozenset({
    "to be filled by o.e.m.", "to be filled by oem", "default string", "system serial number", "not specified",
    "not applicable", "none", "n/a", "na", "unknown", "0", "00000000", "0000000000", "0123456789", "1234567890",
    "123456789", "serial number", "chassis serial number", "xxxxxxxx", "$(default_string)", "invalid",
})


def _swapped(uuid: str) -> str:
    """The UUID with its first three fields byte-swapped (SMBIOS < 2.6 vs >= 2.6 encoding)."""
    a, b, c, rest = uuid.split("-", 3)

    def flip(part: str) -> str:
        return "".join(reversed([part[i:i + 2] for i in range(0, len(part), 2)]))

    return f"{flip(a)}-{flip(b)}-{flip(c)}-{rest}"


def usable_uuid(value: object) -> str | None:
    """A UUID that identifies a machine, lower case; None for a missing, malformed or placeholder one."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if not _UUID.match(text) or text in _PLACEHOLDER_UUIDS:
        return None
    if len(set(text.replace("-", ""))) == 1:  # 00000000-... or ffffffff-...
        return None
    return text


def usable_serial(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) < 4 or text.lower() in _PLACEHOLDER_SERIALS or len(set(text.lower())) == 1:
        return None
    return text.upper()


def _why_missing(value: object, what: str) -> str:
    if isinstance(value, Unknown):
        return value.reason
    if isinstance(value, str) and value.strip():
        return f"{what} is a placeholder ({value.strip()!r})"
    return f"{what} is empty"


def bind_bmc(host: HostFacts, bmc: BmcFacts | Unknown, bmc_only: bool = False) -> BmcBinding:
    """bound | remote | unknown | bmc_only | no_bmc, with the evidence in `observed`."""
    if not isinstance(bmc, BmcFacts):
        return NO_BMC
    bmc_uuid, bmc_serial = usable_uuid(bmc.system_uuid), usable_serial(bmc.system_serial)
    bmc_sku = usable_serial(bmc.system_sku)
    model = " ".join(x for x in (bmc.manufacturer, bmc.model) if isinstance(x, str))
    observed: dict[str, str | None] = {"bmc_uuid": bmc_uuid, "bmc_serial": bmc_serial, "bmc_model": model or None}
    if bmc_only:
        return BmcBinding("bmc_only", "BMC-only audit: the BMC is the node audited; no host is in this audit",
                          observed)
    dmi_uuid_raw, dmi_serial_raw = host.dmi.get("product_uuid"), host.dmi.get("product_serial")
    host_uuid, host_serial = usable_uuid(dmi_uuid_raw), usable_serial(dmi_serial_raw)
    observed.update(host_uuid=host_uuid, host_serial=host_serial)
    other = f"{model or 'a system'} (UUID {bmc_uuid or '?'}, serial {bmc_serial or bmc_sku or '?'})"
    if host_uuid and bmc_uuid:
        if host_uuid == bmc_uuid:
            return BmcBinding("bound", f"the BMC describes this host: Redfish UUID {bmc_uuid} = DMI product_uuid",
                              observed)
        if _swapped(host_uuid) == bmc_uuid:
            return BmcBinding("bound", f"the BMC describes this host: Redfish UUID {bmc_uuid} = DMI product_uuid "
                              "(first three fields in the other byte order)", observed)
        return BmcBinding("remote", f"the BMC describes another node, {other}: this host's DMI product_uuid is "
                          f"{host_uuid}", observed)
    bmc_serials = {s for s in (bmc_serial, bmc_sku) if s}
    if host_serial and bmc_serials:
        if host_serial in bmc_serials:
            return BmcBinding("bound", f"the BMC describes this host: serial {host_serial} = DMI product_serial "
                              "(no usable UUID on one side)", observed)
        return BmcBinding("remote", f"the BMC describes another node, {other}: this host's DMI product_serial is "
                          f"{host_serial}", observed)
    missing = []
    if not host_uuid and not host_serial:
        missing.append("this host: " + _why_missing(dmi_uuid_raw, "DMI product_uuid"))
    if not bmc_uuid and not bmc_serials:
        missing.append("the BMC: " + _why_missing(bmc.system_uuid, "the ComputerSystem UUID"))
    if not missing:  # a UUID on one side only, a serial on the other: nothing to compare
        missing.append(f"this host has {'a UUID' if host_uuid else 'a serial'} and the BMC "
                       f"{'a UUID' if bmc_uuid else 'a serial'} only")
    return BmcBinding("unknown", "cannot tell whether the BMC is this host's (" + "; ".join(missing) + ")",
                      observed)
