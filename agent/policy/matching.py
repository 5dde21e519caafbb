"""Pick the profile for a node from exact identifiers, never substrings.

A rule for H200 (10de:2335) must not catch GH200 (10de:2342/2348): matching
compares PCI IDs, counts and DMI strings for equality only.

Without a host in the audit (a BMC-only snapshot, a jump host without GPUs auditing a
remote BMC, or one whose identity cannot be read but whose BMC lists GPUs it does not have:
`bmc_gpus_host_lacks`) the identity comes from Redfish: Manufacturer, Model and SKU stand for DMI's
sys_vendor, product_name and product_sku, and the GPU processors' names map to PCI ids
through an exact table. `board_fit` then tells whether what is seen is the whole board a
profile describes or a partial view of it (one GPU of an SXM part in a VM or a dump).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from agent.core.errors import ProfileError
from agent.core.facts import BmcFacts, HostFacts, NodeFacts, NvmlFacts
from agent.core.gpu_family import ARCHITECTURES, UNKNOWN, GpuClass, classify, name_architecture, node_family
from agent.core.model import Unknown
from agent.policy.profiles import FALLBACK_PROFILE, NO_GPU_PROFILE, MatchRule, Profile, ProfileStore


class Identity(NamedTuple):
    """The facts profiles are matched on."""

    gpu_pci_ids: tuple[str, ...]
    gpu_count: int | None
    dmi: Mapping[str, str]
    problems: tuple[str, ...] = ()
    nvidia_driver: bool = False  # /proc/driver/nvidia or the nvidia module: meant to be a GPU node
    source: str = "host"  # host (PCI, DMI) | nvml (no GPU in the PCI tree) | bmc (Redfish: no host in the audit)
    classes: tuple[GpuClass, ...] = ()  # each GPU's family (agent.core.gpu_family), from what it reports
    # Where a GPU's own report (NVML name, architecture) contradicts its PCI id's model: said, and the
    # identity follows the GPU (issue 31.6)
    id_conflicts: tuple[str, ...] = ()

    @property
    def family(self) -> GpuClass | None:
        """The node's GPU family, None without GPUs to classify."""
        return node_family(self.classes)

    @property
    def without_gpu(self) -> bool:
        """Positive evidence of a host that is not a GPU node: PCI read, no NVIDIA GPU, no driver."""
        return self.gpu_count == 0 and not self.gpu_pci_ids and not self.nvidia_driver

    def describe(self) -> str:
        ids = ", ".join(sorted(set(self.gpu_pci_ids))) or "none"
        model = " ".join(x for x in (self.dmi.get("sys_vendor"), self.dmi.get("product_name")) if x)
        count = self.gpu_count if self.gpu_count is not None else "?"
        where = model or ("an unidentified system (the BMC names none)" if self.source == "bmc"
                          else "an unidentified system (no DMI)")
        return f"{count} NVIDIA GPU(s) [{ids}] in {where}" + (" (from the BMC)" if self.source == "bmc" else "")

    def to_json(self) -> dict[str, Any]:
        return {"gpu_pci_ids": sorted(set(self.gpu_pci_ids)), "gpu_count": self.gpu_count,
                "dmi": dict(self.dmi)}


class Selection(NamedTuple):
    profile: Profile
    how: str  # auto | forced | fallback
    identity: Identity
    matched_on: tuple[str, ...] = ()
    also_matched: tuple[str, ...] = ()


# DMI strings profiles match on; product_uuid/product_serial identify one machine and only bind the BMC.
MATCH_DMI_KEYS = ("sys_vendor", "product_name", "product_family", "board_vendor", "board_name", "product_sku")

# Exact GPU names (NVML's product names, which BMCs repeat in Processor Name or Model) -> PCI id,
# for identities read from a BMC that lists no PCIe function for its GPUs. Exact: "NVIDIA H200"
# is 10de:2335 and "NVIDIA GH200 480GB" is another machine (10de:2342).
GPU_MODEL_PCI_IDS = {
    "NVIDIA H100 80GB HBM3": "10de:2330", "NVIDIA H100 PCIe": "10de:2331", "NVIDIA H100 NVL": "10de:2321",
    "NVIDIA H200": "10de:2335", "NVIDIA GH200 480GB": "10de:2342",
    "NVIDIA A100-SXM4-80GB": "10de:20b2", "NVIDIA A100-SXM4-40GB": "10de:20b0",
    "NVIDIA A100 80GB PCIe": "10de:20b5", "NVIDIA A100-PCIE-40GB": "10de:20f1",
    "NVIDIA B200": "10de:2901", "B200 180GB HBM3e": "10de:2901", "NVIDIA GB200": "10de:2941",
    "NVIDIA L40S": "10de:26b9", "NVIDIA L40": "10de:26b5", "NVIDIA L4": "10de:27b8",
    "NVIDIA A10": "10de:2236", "NVIDIA A10G": "10de:2237", "NVIDIA A30": "10de:20b7", "NVIDIA A40": "10de:2235",
    "Tesla T4": "10de:1eb8", "Tesla V100-PCIE-16GB": "10de:1db4", "Tesla V100-PCIE-32GB": "10de:1db6",
    "Tesla V100S-PCIE-32GB": "10de:1df6", "NVIDIA RTX 4000 SFF Ada Generation": "10de:27b0",
    "NVIDIA RTX 6000 Ada Generation": "10de:26b1", "NVIDIA RTX A6000": "10de:2230",
}


def identify_bmc(bmc: BmcFacts) -> Identity:
    """The node as its BMC describes it: a BMC-only audit has no PCI, DMI or NVML of its own."""
    problems: list[str] = []
    dmi = {key: value for key, value in (("sys_vendor", bmc.manufacturer), ("product_name", bmc.model),
                                         ("product_sku", bmc.system_sku)) if isinstance(value, str)}
    if isinstance(bmc.gpus, Unknown):
        problems.append(f"the BMC lists no GPUs ({bmc.gpus.reason})")
        return Identity((), None, dmi, tuple(problems), source="bmc")
    ids = []
    classes = []
    for gpu in bmc.gpus:
        pci_id = GPU_MODEL_PCI_IDS.get(gpu.name) or GPU_MODEL_PCI_IDS.get(gpu.model or "")
        if pci_id is None:
            problems.append(f"GPU {gpu.name!r} (model {gpu.model!r}) has no known PCI id")
        else:
            ids.append(pci_id)
        # The BMC repeats NVML's product name in Model (or Name): the family comes from it, not from the id table.
        named = [classify(text) for text in (gpu.model, gpu.name) if isinstance(text, str)]
        classes.append(next((c for c in named if c.family != UNKNOWN), named[0] if named else classify()))
    return Identity(tuple(ids), len(bmc.gpus), dmi, (*_untold(classes), *problems[:1]), nvidia_driver=bool(bmc.gpus),
                    source="bmc", classes=tuple(classes))


def bmc_gpus_host_lacks(bmc: BmcFacts, host: Identity) -> int:
    """How many GPU processors the BMC lists that a host with positive evidence of no GPU (PCI read, no NVIDIA
    function, no driver) cannot have: 0 when the host has or may have GPUs, or the BMC lists none."""
    if not isinstance(bmc.gpus, tuple) or host.gpu_count != 0 or host.nvidia_driver:
        return 0
    return len(bmc.gpus)


def identify(host: HostFacts, nvml: NvmlFacts | Unknown | None = None) -> Identity:
    """Identity from PCI (independent of the driver), else from NVML's view.

    NVML's PCI ids (pciDeviceId) count when the PCI tree lists no GPU: a container or VM that sees
    the GPUs through the driver but not in /sys/bus/pci. Where the views disagree,
    crosscheck.gpu_views says so.
    """
    problems: list[str] = []
    gpus = host.nvidia_gpus
    ids: tuple[str, ...] = ()
    count: int | None = None
    source = "host"
    nvml_gpus = nvml.gpus if isinstance(nvml, NvmlFacts) else ()
    if not isinstance(gpus, Unknown) and (gpus or not nvml_gpus):
        ids = tuple(g.pci_id for g in gpus)
        count = len(gpus)
    elif nvml_gpus and isinstance(nvml, NvmlFacts):
        ids = tuple(g.pci_id.lower() for g in nvml_gpus if isinstance(g.pci_id, str))
        count = nvml.device_count
        source = "nvml"
    elif isinstance(gpus, Unknown):
        problems.append(gpus.reason)
    dmi = {k: v for k, v in host.dmi.items() if isinstance(v, str) and k in MATCH_DMI_KEYS}
    problems += [v.reason for k, v in host.dmi.items() if isinstance(v, Unknown) and k in MATCH_DMI_KEYS][:1]
    modules = host.modules if isinstance(host.modules, dict) else {}
    driver = not isinstance(host.nvidia_driver, Unknown) or "nvidia" in modules or bool(nvml_gpus)
    classes = _classes(host, nvml)
    ids, conflicts = _by_the_gpus_word(ids, source, gpus if not isinstance(gpus, Unknown) else (), nvml_gpus)
    return Identity(ids, count, dmi, (*_untold(classes), *problems), driver, source, classes, conflicts)


_PCI_ID_MODELS: dict[str, str] = {}
for _model, _pci_id in GPU_MODEL_PCI_IDS.items():
    _PCI_ID_MODELS.setdefault(_pci_id, _model)


def _by_the_gpus_word(ids: tuple[str, ...], source: str, on_pci: Iterable[Any], nvml_gpus: Iterable[Any]
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The PCI ids, each replaced where the GPU's own report (NVML's name and architecture) says another
    architecture than the model that id is known as (a placeholder id: NVIDIA's mock, an engineering
    sample): by the id its name is known by, else dropped, so the name and family choose the profile. The
    id table refines here, it never overrules the GPU; an id or a name it does not know is left as it is."""
    if not ids:
        return ids, ()
    reports = []
    for gpu in nvml_gpus:
        arch = gpu.architecture if isinstance(gpu.architecture, int) and gpu.architecture in ARCHITECTURES else None
        name = gpu.name if isinstance(gpu.name, str) else None
        if name and arch is None:
            arch = name_architecture(name)
        reports.append((gpu.pci_bus_id.lower() if isinstance(gpu.pci_bus_id, str) else None,
                        gpu.pci_id.lower() if isinstance(gpu.pci_id, str) else None, name, arch))
    by_bus = {bus: (name, arch) for bus, _, name, arch in reports if bus}
    if source == "host":
        pairs = [(f.pci_id, *by_bus.get(f.address.lower(), (None, None))) for f in on_pci]
    else:
        pairs = [(pci_id, name, arch) for _, pci_id, name, arch in reports if pci_id]
    fixed: dict[str, str | None] = {}
    conflicts: list[str] = []
    for pci_id, name, arch in pairs:
        if name is None or arch is None or pci_id in fixed:
            continue
        model = _PCI_ID_MODELS.get(pci_id)
        named = GPU_MODEL_PCI_IDS.get(name)
        if model is None:  # an id nodewarden does not know: a name it knows says which model it is
            if named is not None and named != pci_id and pci_id.startswith("10de:"):
                fixed[pci_id] = named
                conflicts.append(f"PCI id {pci_id} is no model nodewarden knows, the GPU says {name!r} "
                                 f"({ARCHITECTURES[arch]}): judged by the GPU's own report, as {named}")
            continue
        id_arch = name_architecture(model)
        if id_arch is None or id_arch == arch:
            continue
        fixed[pci_id] = named
        conflicts.append(f"PCI id {pci_id} is an {model} ({ARCHITECTURES[id_arch]}), the GPU says {name!r} "
                         f"({ARCHITECTURES[arch]}): judged by the GPU's own report"
                         + (f", as {named}" if named else ", by its name and family"))
    if not fixed:
        return ids, ()
    return tuple(new for old in ids if (new := fixed.get(old, old)) is not None), tuple(conflicts)


def _untold(classes: Iterable[GpuClass]) -> tuple[str, ...]:
    """What the fallback profile says it could not tell about the GPUs (first among the problems)."""
    family = node_family(classes)
    if family is None or family.family != UNKNOWN:
        return ()
    told = "; ".join(family.evidence) or "nothing the GPU reported"
    return (f"could not tell {', '.join(family.untold)} (from {told}), so settings are judged at warning at most",)


def _classes(host: HostFacts, nvml: NvmlFacts | Unknown | None) -> tuple[GpuClass, ...]:
    """Each GPU's family from NVML (brand, name, architecture) and its PCI class; PCI alone without NVML."""
    pci = host.pci if not isinstance(host.pci, Unknown) else ()
    nvswitch = any(f.is_nvswitch for f in pci)
    on_pci = {f.address.lower(): f.subclass for f in pci if f.is_nvidia_gpu}
    if isinstance(nvml, NvmlFacts) and nvml.gpus:
        return tuple(classify(g.name, g.brand, g.architecture,
                              on_pci.get(g.pci_bus_id.lower()) if isinstance(g.pci_bus_id, str) else None,
                              nvswitch) for g in nvml.gpus if g.lost is None)
    return tuple(classify(pci_class=subclass, nvswitch=nvswitch) for subclass in on_pci.values())


def rule_matches(rule: MatchRule, identity: Identity) -> tuple[str, ...] | None:
    """The criteria that matched, or None if any criterion fails."""
    matched: list[str] = []
    if rule.gpu_pci_ids:
        present = set(identity.gpu_pci_ids)
        if not present or not present <= set(rule.gpu_pci_ids):
            return None
        matched.append("gpu_pci_ids=" + ",".join(sorted(present)))
    if rule.gpu_count:
        if identity.gpu_count not in rule.gpu_count:
            return None
        matched.append(f"gpu_count={identity.gpu_count}")
    for key, allowed in rule.dmi:
        value = identity.dmi.get(key)
        if value is None or value not in allowed:
            return None
        matched.append(f"dmi.{key}={value}")
    return tuple(matched) if matched else None


def select(identity: Identity, store: ProfileStore, forced: str | None = None) -> Selection:
    if forced is not None:
        if store.file(forced).data.get("abstract"):
            raise ProfileError(f"profile {forced!r} is abstract (a base for others); pick a concrete one")
        return Selection(store.profile(forced), "forced", identity)
    candidates: list[tuple[int, str, tuple[str, ...]]] = []
    for name, rule in store.match_rules().items():
        if rule is None:
            continue
        matched = rule_matches(rule, identity)
        if matched is not None:
            candidates.append((rule.criteria, name, matched))
    if not candidates and identity.without_gpu and NO_GPU_PROFILE in store.names():
        return Selection(store.profile(NO_GPU_PROFILE), "no_gpu", identity)
    if not candidates:
        by_family = _family_selection(identity, store)
        if by_family is not None:
            return by_family
        if FALLBACK_PROFILE not in store.names():
            raise ProfileError(f"no profile matches and the fallback {FALLBACK_PROFILE!r} is missing")
        return Selection(store.profile(FALLBACK_PROFILE), "fallback", identity)
    # Most specific rule wins; ties go by name so the choice is stable.
    candidates.sort(key=lambda c: (-c[0], c[1]))
    best = candidates[0]
    tied = tuple(c[1] for c in candidates[1:] if c[0] == best[0])
    return Selection(store.profile(best[1]), "auto", identity, best[2], tied)


def forced_misfit(profile: Profile, identity: Identity) -> str:
    """Why the hardware does not fit a profile named with --profile, "" if it fits or cannot be told.

    Only positive evidence counts: GPU PCI ids or DMI strings that were read and differ from the
    profile's `match:`, or, for a profile that only covers a family, GPUs classified into another
    one. The GPU count is left out: fewer GPUs than the board's is a partial view or lost GPUs,
    which gpu.count and board_fit judge.
    """
    rule = profile.match
    if rule is None:
        return ""
    differs: list[str] = []
    ids = set(identity.gpu_pci_ids)
    if rule.gpu_pci_ids and ids and not ids <= set(rule.gpu_pci_ids):
        more = len(rule.gpu_pci_ids) - 4
        listed = ", ".join(rule.gpu_pci_ids[:4]) + (f" and {more} more" if more > 0 else "")
        differs.append(f"GPU PCI ids {', '.join(sorted(ids))}, the profile's {listed}")
    for key, allowed in rule.dmi:
        value = identity.dmi.get(key)
        if value is not None and value not in allowed:
            differs.append(f"dmi {key} {value!r}, the profile's {' or '.join(repr(a) for a in allowed)}")
    family = identity.family
    if (not rule.gpu_pci_ids and not rule.dmi and rule.gpu_family and family is not None
            and family.family != UNKNOWN and family.family not in rule.gpu_family):
        differs.append(f"GPU family {family.family}, the profile's {' or '.join(rule.gpu_family)}")
    return "; ".join(differs)


def _family_selection(identity: Identity, store: ProfileStore) -> Selection | None:
    """No exact rule matched: the profile that covers the GPUs' family (`match: gpu_family`), if one does."""
    family = identity.family
    if family is None or family.family == UNKNOWN:
        return None
    names = sorted(name for name, rule in store.match_rules().items()
                   if rule is not None and family.family in rule.gpu_family)
    if not names:
        return None
    how = f"gpu_family={family.family} ({'; '.join(family.evidence)})"
    return Selection(store.profile(names[0]), "auto", identity, (how,), tuple(names[1:]))


# --- does the view fit the profile's board? ------------------------------------------------------

_BOARD_WORD = re.compile(r"(?<![A-Za-z0-9])[DH]GX")  # "DGX H100", "DGXH100", "NVIDIA HGX B200"


class Fit(NamedTuple):
    """Whether the GPUs in view are the whole board the profile describes (`expect.board.gpus`)."""

    full: bool  # judge board-level counts (gpu.count, host.gpu.pci_count, fabric.nvswitch.count)
    seen: int | None  # most GPUs any view of this node shows
    board: int | None  # GPUs on the profile's board; None: the profile describes no board
    why: str


def board_fit(profile: Profile, facts: NodeFacts) -> Fit:
    """A partial view (one GPU of an SXM part in a VM, a one-GPU nvidia-smi dump, a GPU selection)
    is not a board missing GPUs, unless the evidence says the whole board is there: NVSwitches on
    PCI, DMI or the node's BMC naming an HGX/DGX system or a platform the profile lists, the BMC
    listing the board's GPUs or its NVLink switches, or a dump of selected GPUs whose "Attached
    GPUs" (NVML's device count on the node) is the board's count."""
    board = profile.section("board")
    size = board.get("gpus")
    if not isinstance(size, int):
        return Fit(True, None, None, "the profile describes no board")
    host, nvml = facts.host, facts.nvml
    bmc = facts.bmc if isinstance(facts.bmc, BmcFacts) and (
        facts.binding is None or facts.binding.describes_node) else None
    views: dict[str, int] = {}
    if not isinstance(host.nvidia_gpus, Unknown):
        views["PCI"] = len(host.nvidia_gpus)
    attached = nvml.attached if isinstance(nvml, NvmlFacts) else None
    if isinstance(nvml, NvmlFacts):
        views["NVML"] = nvml.device_count
    if bmc is not None and not isinstance(bmc.gpus, Unknown):
        views["BMC"] = len(bmc.gpus)
    seen = max(views.values()) if views else None
    if seen is None or seen == 0 or seen >= size:
        return Fit(True, seen, size, f"{seen} of the board's {size} GPUs in view")
    platforms = {str(p) for p in board.get("platforms") or ()}
    evidence: list[str] = []
    if not isinstance(host.pci, Unknown):
        switches = sum(1 for f in host.pci if f.is_nvswitch)
        if switches:
            evidence.append(f"{switches} NVSwitch(es) on PCI")
    for key in ("product_name", "board_name", "product_family"):
        value = host.dmi.get(key)
        if isinstance(value, str) and (_BOARD_WORD.search(value) or (key == "product_name" and value in platforms)):
            evidence.append(f"DMI {key} {value!r}")
    if bmc is not None:
        if isinstance(bmc.model, str) and (_BOARD_WORD.search(bmc.model) or bmc.model in platforms):
            evidence.append(f"the BMC's system model {bmc.model!r}")
        if not isinstance(bmc.switches, Unknown) and any(
                (s.switch_type or "").lower() == "nvlink" for s in bmc.switches):
            evidence.append("NVLink switches on the BMC")
    if attached is not None and attached >= size:
        evidence.append(f"the dump's 'Attached GPUs : {attached}' (a dump of selected GPUs)")
    seen_text = ", ".join(f"{k} {v}" + (f" (of {attached} attached, the dump says)" if k == "NVML" and attached
                                         else "") for k, v in views.items())
    if evidence:
        return Fit(True, seen, size, f"{seen_text} of the board's {size} GPUs, and {', '.join(evidence)} "
                   "show(s) the whole board")
    return Fit(False, seen, size, f"a partial view: {seen_text} of the {size}-GPU board ({profile.name}) and "
               "nothing shows the whole board (no NVSwitch on PCI, neither DMI nor the BMC names an HGX/DGX "
               "system): a VM, a one-GPU dump or a GPU selection")
