"""Which kind of NVIDIA GPU this is, from what the GPU itself reports, not from a list of ids.

A family places any NVIDIA GPU, including one no profile lists, in a family profile:

* `datacenter-sxm`: SXM/OAM modules on an HGX/DGX board or a Grace superchip (HBM, ECC always on)
* `datacenter-pcie`: data-center PCIe boards (Tesla, A10/A30/A40/A100 PCIe, H100 NVL, L4/L40/L40S)
* `workstation`: Quadro, RTX A-series, RTX Ada, RTX PRO (GDDR; ECC off is the shipped default)
* `geforce`: GeForce and TITAN consumer boards (no ECC)
* `vgpu`: a vGPU guest (NVIDIA Virtual PC/Applications/Compute Server/RTX Virtual Workstation)
* `unknown`: what was reported does not tell (what could not be told is named)

Evidence, strongest first: NVML's brand (nvmlDeviceGetBrand, nvidia-smi's "Product Brand"), the
product name's grammar ("NVIDIA RTX 2000 Ada Generation", "Tesla V100-PCIE-32GB", "NVIDIA H100 80GB
HBM3", "NVIDIA GeForce RTX 4090", "GRID A100-40C"), the architecture (nvmlDeviceGetArchitecture) and,
for the form factor, the name ("SXM", "PCIe", "NVL") or NVSwitches beside the GPUs. The PCI class
tells a display-capable board (0x0300 VGA) from a compute-only one (0x0302 3D controller). Exact PCI
ids refine the choice in the profiles' `match:`; a family never needs them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

DATACENTER_SXM = "datacenter-sxm"
DATACENTER_PCIE = "datacenter-pcie"
WORKSTATION = "workstation"
GEFORCE = "geforce"
VGPU = "vgpu"
UNKNOWN = "unknown"
FAMILIES = (DATACENTER_SXM, DATACENTER_PCIE, WORKSTATION, GEFORCE, VGPU, UNKNOWN)

# NVML_DEVICE_ARCH_* (nvml.h) -> name, as nvidia-smi prints "Product Architecture".
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
# The last driver branch that supports an architecture (NVIDIA's Unix driver deprecation schedule:
# R470 is Kepler's legacy branch; "the release 580 series will be the last to support GPUs based on
# the Maxwell, Pascal, and Volta architectures"). Later architectures run the current branch.
LAST_DRIVER_BRANCH = {2: 470, 3: 580, 4: 580, 5: 580}

# NVML_BRAND_* (nvml.h) -> the family the brand alone says; NVML_BRAND_NVIDIA (14) only says "data
# center or newer" and NVML_BRAND_UNKNOWN (0) nothing: the name decides those.
_BRAND_FAMILY = {1: WORKSTATION, 2: "datacenter", 3: WORKSTATION, 4: VGPU, 5: GEFORCE, 6: GEFORCE,
                 7: VGPU, 8: VGPU, 9: VGPU, 10: VGPU, 11: VGPU, 12: WORKSTATION, 13: WORKSTATION,
                 14: "datacenter", 15: GEFORCE, 16: GEFORCE, 18: VGPU}
BRAND_NAMES = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "Titan",
               7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC", 9: "NVIDIA Virtual Compute Server",
               10: "NVIDIA RTX Virtual Workstation", 11: "NVIDIA Cloud Gaming", 12: "Quadro RTX",
               13: "NVIDIA RTX", 14: "NVIDIA", 15: "GeForce RTX", 16: "Titan RTX", 17: "NVIDIA DLA",
               18: "NVIDIA RTX Virtual Game Dev", 19: "NVIDIA NPU"}
# nvidia-smi's "Product Brand" text -> NVML_BRAND_* (nvidia-smi prints NVML's brand names; case is ignored).
BRAND_TEXTS = {name.lower(): code for code, name in BRAND_NAMES.items()}

_MAX_NAME = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE; longer text is not a GPU name
# A vGPU profile name: "GRID A100-40C", "NVIDIA H100XM-80C", "GRID V100-8Q", "NVIDIA A40-48Q".
_VGPU_NAME = re.compile(r"^(?:GRID|NVIDIA)\s+\S+-\d{1,3}[ABCQ]$", re.IGNORECASE)
_GEFORCE_NAME = re.compile(r"\b(?:GeForce|TITAN)\b", re.IGNORECASE)
_WORKSTATION_NAME = re.compile(
    r"\bQuadro\b|\bRTX\s+A\d{3,4}\b|\bRTX\s+\d{4}[A-Z]?(?:\s+SFF)?\s+Ada\b|\bRTX\s+PRO\s+\d{3,4}\b"
    r"|\bNVIDIA\s+T\d{3,4}\b|\bMax-Q\b|\bWorkstation Edition\b|\bNVS\s+\d", re.IGNORECASE)
# Data-center parts: "Tesla ...", and NVIDIA's letter+number names (A10G, A100, H100, H200, B200,
# GB200, GH200, L4, L40S, T4). Four-digit numbers are workstation boards (RTX A6000, T1000).
_DATACENTER_NAME = re.compile(r"^(?:NVIDIA\s+)?(?:Tesla\b|(?:GB|GH|[ABHL])\d{1,3}[A-Z]?\b|T4\b)", re.IGNORECASE)
_SXM_NAME = re.compile(r"\bSXM\d?\b|\bOAM\b|-SXM|\bHGX\b", re.IGNORECASE)
_PCIE_NAME = re.compile(r"PCI-?E\b|\bNVL\b|\bFHHL\b", re.IGNORECASE)
# Modules with no PCIe variant of the same name: Grace superchips, B200/B300, H200 and the H100/H800
# SXM5 name ("NVIDIA H100 80GB HBM3"). Their PCIe boards say so (H100 PCIe, H200 NVL, H800 PCIe).
_MODULE_NAME = re.compile(r"^(?:NVIDIA\s+)?(?:GB\d+|GH\d+|B[123]00|H200|H[18]00\s+\d+GB\s+HBM3)\b", re.IGNORECASE)
_PREFIX = r"^(?:NVIDIA\s+|GRID\s+|Tesla\s+)?"
# The architecture a name says, for dumps and BMCs that do not report NVML's architecture.
_NAME_ARCH = (
    (re.compile(_PREFIX + r"(?:GB\d+|B\d{3}[A-Z]?)\b|\bBlackwell\b|RTX\s+PRO\b|RTX\s+50[5-9]0", re.I), 10),
    (re.compile(_PREFIX + r"(?:GH\d+|H\d{2,3}[A-Z]?)", re.I), 9),
    (re.compile(_PREFIX + r"L\d{1,2}[A-Z]?\b|\bAda\b|RTX\s+40[5-9]0", re.I), 8),
    (re.compile(_PREFIX + r"A\d{1,3}[A-Z]?\b|\bRTX\s+A\d{3,4}\b|RTX\s+30[5-9]0", re.I), 7),
    (re.compile(r"\bT4\b|\bTuring\b|Quadro\s+RTX|TITAN\s+RTX|RTX\s+20[5-8]0|GTX\s+16\d0|\bNVIDIA\s+T\d{3,4}\b",
                re.I), 6),
    (re.compile(r"\bV100S?\b|TITAN\s+V\b|Quadro\s+GV100", re.I), 5),
    (re.compile(r"\bP\d{1,3}\b|GTX\s+10\d0|Quadro\s+P\d", re.I), 4),
    (re.compile(r"\bM\d{1,2}\b|GTX\s+9\d0|Quadro\s+M\d", re.I), 3),
    (re.compile(r"\bK\d{1,2}\b|GTX\s+[67]\d0\b|Quadro\s+K\d", re.I), 2),
)
PCI_CLASS_VGA = 0x0300
PCI_CLASS_3D = 0x0302


class GpuClass(NamedTuple):
    """One GPU's family, with the evidence for it and what could not be told."""

    family: str
    architecture: int | None  # NVML_DEVICE_ARCH_*
    form: str | None  # sxm | pcie | None (not told)
    evidence: tuple[str, ...]
    untold: tuple[str, ...] = ()

    @property
    def architecture_name(self) -> str | None:
        return ARCHITECTURES.get(self.architecture) if self.architecture is not None else None

    def describe(self) -> str:
        told = "; ".join(self.evidence) or "nothing reported"
        return f"{self.family} ({told})"


def brand_code(text: str) -> int:
    """nvidia-smi's "Product Brand" -> NVML_BRAND_*; NVML_BRAND_UNKNOWN for a text NVML does not print."""
    return BRAND_TEXTS.get(" ".join(text.split()).lower(), 0)


def name_architecture(name: str) -> int | None:
    """The architecture a product name says, or None."""
    for pattern, arch in _NAME_ARCH:
        if pattern.search(name):
            return arch
    return None


def classify(name: object = None, brand: object = None, architecture: object = None,
             pci_class: object = None, nvswitch: bool = False) -> GpuClass:
    """The family of one GPU from what it reports (each input may be absent, of any type: hostile input).

    `name`: NVML's product name; `brand`: NVML_BRAND_*; `architecture`: NVML_DEVICE_ARCH_*;
    `pci_class`: the 16-bit PCI class/subclass; `nvswitch`: NVSwitches on this node's PCI bus.
    """
    text = " ".join(name.split()) if isinstance(name, str) and len(name) <= _MAX_NAME else None
    brand_id = brand if isinstance(brand, int) and not isinstance(brand, bool) else None
    arch = architecture if isinstance(architecture, int) and architecture in ARCHITECTURES else None
    evidence: list[str] = []
    untold: list[str] = []
    if brand_id is not None and brand_id in BRAND_NAMES:
        evidence.append(f"brand {BRAND_NAMES[brand_id]}")
    else:
        untold.append("the brand (not reported)")
    if text:
        evidence.append(f"name {text!r}")
    else:
        untold.append("the product name")
    if arch is None and text:
        arch = name_architecture(text)
    if arch is not None:
        evidence.append(f"architecture {ARCHITECTURES[arch]}")
    display = None
    if isinstance(pci_class, int) and pci_class in (PCI_CLASS_VGA, PCI_CLASS_3D):
        display = pci_class == PCI_CLASS_VGA
        evidence.append("PCI class VGA (display-capable)" if display else "PCI class 3D controller (compute)")
    family = _family(text, brand_id)
    form: str | None = None
    if family == "datacenter":
        form = _form(text, nvswitch, display)
        if form is None:
            untold.append("the form factor (the name says neither SXM nor PCIe)")
        family = DATACENTER_SXM if form == "sxm" else DATACENTER_PCIE
    elif family == UNKNOWN:
        untold.append("the GPU's family (neither brand nor name places it)")
    return GpuClass(family, arch, form, tuple(evidence), tuple(untold))


def _family(text: str | None, brand: int | None) -> str:
    by_brand = _BRAND_FAMILY.get(brand) if brand is not None else None
    if text and _VGPU_NAME.match(text):
        return VGPU
    if by_brand is not None and by_brand != "datacenter":
        return by_brand
    if text:
        if _GEFORCE_NAME.search(text):
            return GEFORCE
        if _WORKSTATION_NAME.search(text):
            return WORKSTATION
        if _DATACENTER_NAME.search(text):
            return "datacenter"
    return by_brand or UNKNOWN


def _form(text: str | None, nvswitch: bool, display: bool | None) -> str | None:
    if text and _SXM_NAME.search(text):
        return "sxm"
    if text and _PCIE_NAME.search(text):
        return "pcie"
    if text and _MODULE_NAME.search(text):
        return "sxm"
    if nvswitch and display is not True:
        return "sxm"  # NVSwitches beside the GPUs: an NVLink switch board, which carries SXM modules
    if text and _DATACENTER_NAME.search(text):
        return "pcie"  # the other data-center names (A10, A30, A40, L4, L40S, T4, Tesla Vx00 PCIe) are boards
    return None


def node_family(classes: Iterable[GpuClass]) -> GpuClass | None:
    """The node's family: its GPUs' one family, `unknown` when they differ, None without GPUs."""
    seen = list(classes)
    if not seen:
        return None
    families = {c.family for c in seen}
    if len(families) == 1:
        return seen[0]
    return GpuClass(UNKNOWN, None, None, tuple(sorted({c.describe() for c in seen}))[:4],
                    ("one family for the node (its GPUs are of different families: " + ", ".join(sorted(families))
                     + ")",))


def last_driver_branch(architecture: int | None) -> int | None:
    """The newest driver branch that still runs this architecture, or None when the current one does."""
    return LAST_DRIVER_BRANCH.get(architecture) if architecture is not None else None
