"""Which physical GPU a finding's subject (`gpu7`) is: `{"index", "uuid", "pci_bus_id", "serial", "source"}`.

One helper for every consumer that names GPUs for a per-device tool (the JSON report's findings and
actions, JUnit, the health-check state file and decision trail), so they all say the same thing.

Only what was read is said, never a guess. NVML gives a present GPU's identity. A GPU NVML cannot
reach (fallen off the bus) answers nothing, so its identity is borrowed, by elimination only:
- from the BMC's processor view (bound to this host), when every other NVML GPU pairs with a BMC GPU
  by serial or UUID and exactly one BMC GPU and one NVML GPU are left over (`source: "bmc"`);
- its PCI address from the host's PCI bus, when exactly one NVIDIA GPU address is left over.
Anything less certain leaves the field out. A BMC's bare UUID is written as NVML writes it
(`GPU-<uuid>`, the form dcgm-exporter's `UUID` label and `NVIDIA_VISIBLE_DEVICES` use).
"""

from __future__ import annotations

import re
from typing import Any

from agent.core.facts import NodeFacts
from agent.core.facts_bmc import BmcFacts, BmcGpu
from agent.core.facts_nvml import GpuFacts, NvmlFacts

MAX_GPUS = 64  # a node holds at most this many GPUs worth naming; the rest are left unnamed
MAX_ID = 96  # characters: a longer UUID, serial or bus id is not one (left out rather than cut)
_SUBJECT = re.compile(r"gpu([0-9]{1,3})")
_BARE_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_PLACEHOLDERS = {"", "na", "n/a", "none", "null", "unknown", "not available", "0"}

GpuIdentity = dict[str, Any]  # {"index": int, "uuid"?: str, "pci_bus_id"?: str, "serial"?: str, "source": str}


def _usable(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if len(value) > MAX_ID or value.lower() in _PLACEHOLDERS or not value.isprintable():
        return None
    return value


def _uuid_key(value: object) -> str | None:
    """A UUID compared across views: NVML's `GPU-…` and a BMC's bare form are the same GPU."""
    text = _usable(value)
    if text is None:
        return None
    text = text.lower()
    return text[4:] if text.startswith("gpu-") else text


def _nvml_uuid(value: object) -> str | None:
    """A BMC's UUID as NVML writes it; any other form is kept as the BMC gave it."""
    text = _usable(value)
    if text is not None and _BARE_UUID.fullmatch(text):
        return "GPU-" + text.lower()
    return text


def subject_index(subject: str) -> int | None:
    """7 for `gpu7`; None for any other subject."""
    match = _SUBJECT.fullmatch(subject)
    return int(match.group(1)) if match else None


def _own(gpu: GpuFacts) -> GpuIdentity:
    out: GpuIdentity = {"index": gpu.index}
    for name, value in (("uuid", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id), ("serial", gpu.serial)):
        text = _usable(value)
        if text is not None:
            out[name] = text
    return out


def _bmc_gpus(facts: NodeFacts) -> list[BmcGpu]:
    bmc = facts.bmc
    if not isinstance(bmc, BmcFacts) or not isinstance(bmc.gpus, tuple):
        return []
    if facts.binding is not None and not facts.binding.describes_node:
        return []  # another host's BMC (or none bound): its GPUs are not ours
    return list(bmc.gpus[:MAX_GPUS])


def _same(ident: GpuIdentity, gpu: BmcGpu) -> bool:
    serial, uuid = _usable(gpu.serial), _uuid_key(gpu.uuid)
    return ((serial is not None and serial == _usable(ident.get("serial")))
            or (uuid is not None and uuid == _uuid_key(ident.get("uuid"))))


def _pair_bmc(ids: dict[int, GpuIdentity], board: list[BmcGpu], count: int) -> None:
    """Fill serials and UUIDs from the BMC GPU each NVML GPU shares a serial or UUID with; then the one
    GPU NVML could not identify takes the one BMC GPU left over, when the counts say they are the same."""
    left = list(board)
    unknown = []
    for ident in ids.values():
        match = next((g for g in left if _same(ident, g)), None)
        if match is not None:
            left.remove(match)
            for name, value in (("serial", _usable(match.serial)), ("uuid", _nvml_uuid(match.uuid))):
                if value is not None and name not in ident:
                    ident[name] = value
        elif "uuid" not in ident and "serial" not in ident:
            unknown.append(ident)
    if len(unknown) == 1 and len(left) == 1 and len(board) == count == len(ids):
        found = {k: v for k, v in (("uuid", _nvml_uuid(left[0].uuid)), ("serial", _usable(left[0].serial)))
                 if v is not None}
        if found:
            unknown[0].update(found, source="bmc")


def _pair_pci(ids: dict[int, GpuIdentity], facts: NodeFacts, count: int) -> None:
    """The one NVML GPU without a bus id takes the one NVIDIA GPU address on the bus no other GPU has."""
    pci = facts.host.nvidia_gpus
    if not isinstance(pci, tuple) or len(pci) != count or count != len(ids):
        return
    missing = [ident for ident in ids.values() if "pci_bus_id" not in ident]
    left = {g.address for g in pci} - {ident.get("pci_bus_id") for ident in ids.values()}
    if len(missing) == 1 and len(left) == 1:
        address = _usable(next(iter(left)))
        if address is not None:
            missing[0]["pci_bus_id"] = address


def gpu_identities(facts: NodeFacts | None, earlier: dict[str, GpuIdentity] | None = None) -> dict[str, GpuIdentity]:
    """`gpu7` -> its identity, for every GPU NVML counts (empty without NVML facts).

    `earlier`: what a long-running reader (the daemon) saw of the same GPUs (`learn`); a GPU that
    answers nothing now keeps the identity it had, when the GPU count is the same and the bus id
    (if known now) agrees (`source: "earlier"`)."""
    nvml = facts.nvml if facts is not None else None
    if facts is None or not isinstance(nvml, NvmlFacts):
        return {}
    gpus = nvml.gpus[:MAX_GPUS]
    ids = {gpu.index: _own(gpu) for gpu in gpus}
    for ident in ids.values():
        if "uuid" in ident or "serial" in ident:
            ident["source"] = "nvml"
    count = nvml.device_count if nvml.attached is None else -1  # a partial recording: no elimination
    if earlier and len(earlier) == len(ids):
        for index, ident in ids.items():
            before = earlier.get(f"gpu{index}")
            if ("uuid" in ident or "serial" in ident or before is None or before.get("source") != "nvml"
                    or ident.get("pci_bus_id", before.get("pci_bus_id")) != before.get("pci_bus_id")):
                continue
            ident.update({k: before[k] for k in ("uuid", "pci_bus_id", "serial") if k in before}, source="earlier")
    _pair_bmc(ids, _bmc_gpus(facts), count)
    _pair_pci(ids, facts, count)
    order = ("index", "uuid", "pci_bus_id", "serial", "source")
    return {f"gpu{index}": {k: ident[k] for k in order if k in ident} for index, ident in sorted(ids.items())}


def learn(earlier: dict[str, GpuIdentity], now: dict[str, GpuIdentity]) -> dict[str, GpuIdentity]:
    """What to remember for the next `gpu_identities`: NVML's own word on each GPU; the rest as it was.
    A new GPU count starts over (the indices may name other boards)."""
    same = len(earlier) == len(now)
    return {subject: ident if ident.get("source") == "nvml" or not same else earlier.get(subject, ident)
            for subject, ident in now.items()}


def gpu_of(subject: str, identities: dict[str, GpuIdentity]) -> GpuIdentity | None:
    """The identity of a GPU subject; None for other subjects and GPUs NVML does not count."""
    return identities.get(subject) if subject_index(subject) is not None else None
