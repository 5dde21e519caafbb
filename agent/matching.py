"""Pick the profile for a node from exact identifiers, never substrings.

A rule for H200 (10de:2335) must not catch GH200 (10de:2342/2348): matching
compares PCI IDs, counts and DMI strings for equality only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from agent.errors import ProfileError
from agent.facts import HostFacts, NvmlFacts
from agent.model import Unknown
from agent.profiles import FALLBACK_PROFILE, NO_GPU_PROFILE, MatchRule, Profile, ProfileStore


class Identity(NamedTuple):
    """The facts profiles are matched on."""

    gpu_pci_ids: tuple[str, ...]
    gpu_count: int | None
    dmi: Mapping[str, str]
    problems: tuple[str, ...] = ()
    nvidia_driver: bool = False  # /proc/driver/nvidia or the nvidia module: meant to be a GPU node

    @property
    def without_gpu(self) -> bool:
        """Positive evidence of a host that is not a GPU node: PCI read, no NVIDIA GPU, no driver."""
        return self.gpu_count == 0 and not self.gpu_pci_ids and not self.nvidia_driver

    def describe(self) -> str:
        ids = ", ".join(sorted(set(self.gpu_pci_ids))) or "none"
        model = " ".join(x for x in (self.dmi.get("sys_vendor"), self.dmi.get("product_name")) if x)
        count = self.gpu_count if self.gpu_count is not None else "?"
        return f"{count} NVIDIA GPU(s) [{ids}] in {model or 'an unidentified system (no DMI)'}"

    def to_json(self) -> dict[str, Any]:
        return {"gpu_pci_ids": sorted(set(self.gpu_pci_ids)), "gpu_count": self.gpu_count,
                "dmi": dict(self.dmi)}


class Selection(NamedTuple):
    profile: Profile
    how: str  # auto | forced | fallback
    identity: Identity
    matched_on: tuple[str, ...] = ()
    also_matched: tuple[str, ...] = ()


def identify(host: HostFacts, nvml: NvmlFacts | Unknown | None = None) -> Identity:
    """Identity from PCI (independent of the driver), else from NVML's view."""
    problems: list[str] = []
    gpus = host.nvidia_gpus
    ids: tuple[str, ...] = ()
    count: int | None = None
    if not isinstance(gpus, Unknown):
        ids = tuple(g.pci_id for g in gpus)
        count = len(gpus)
    elif isinstance(nvml, NvmlFacts) and nvml.gpus:
        ids = tuple(g.pci_id for g in nvml.gpus if isinstance(g.pci_id, str))
        count = nvml.device_count
    else:
        problems.append(gpus.reason)
    dmi = {k: v for k, v in host.dmi.items() if isinstance(v, str)}
    problems += [v.reason for v in host.dmi.values() if isinstance(v, Unknown)][:1]
    modules = host.modules if isinstance(host.modules, dict) else {}
    driver = not isinstance(host.nvidia_driver, Unknown) or "nvidia" in modules or (
        isinstance(nvml, NvmlFacts) and bool(nvml.gpus))
    return Identity(ids, count, dmi, tuple(problems), driver)


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
        if FALLBACK_PROFILE not in store.names():
            raise ProfileError(f"no profile matches and the fallback {FALLBACK_PROFILE!r} is missing")
        return Selection(store.profile(FALLBACK_PROFILE), "fallback", identity)
    # Most specific rule wins; ties go by name so the choice is stable.
    candidates.sort(key=lambda c: (-c[0], c[1]))
    best = candidates[0]
    tied = tuple(c[1] for c in candidates[1:] if c[0] == best[0])
    return Selection(store.profile(best[1]), "auto", identity, best[2], tied)
