"""Hostile GPU identities: what NVML, a dump or a BMC says a GPU is decides its family and profile, so
a name, brand or architecture of the wrong type, size or content must place it in `unknown` (judged at
warning at most), never crash the audit nor reach a profile that makes settings critical.
"""

from __future__ import annotations

import pytest

from agent.core.facts import BmcFacts, BmcGpu
from agent.core.gpu_family import brand_code, classify
from agent.policy.matching import identify_bmc, select
from agent.policy.profiles import ProfileStore
from agent.sources.importers.nvidia_smi import parse_nvidia_smi
from tests.conftest import REPO


@pytest.mark.parametrize(("name", "brand", "arch", "pci_class"), [
    ("NVIDIA H100 80GB HBM3" + "x" * 10_000, None, None, None),  # longer than NVML's name buffer
    (b"NVIDIA H100", True, 9.0, "0x0302"),  # wrong types everywhere
    (None, 2**70, -1, 2**40),
    ("\x00\x1b[31mTesla\x07", 99, 10**9, 0x0300),
    (["NVIDIA B200"], {"brand": 2}, [9], None),
])
def test_hostile_inputs_are_unknown_never_an_error(name: object, brand: object, arch: object,
                                                   pci_class: object) -> None:
    got = classify(name, brand, arch, pci_class)
    assert got.family in ("unknown", "datacenter-pcie")  # "\x1b[31mTesla" is no "Tesla ..." name
    assert got.family == "unknown" or got.evidence


def test_a_long_name_does_not_buy_a_data_center_profile() -> None:
    store = ProfileStore()
    bmc = BmcFacts(protocol="redfish", gpus=(BmcGpu("GPU 0", "NVIDIA GH200 " + "9" * 5000),))
    assert select(identify_bmc(bmc), store).profile.name == "generic-nvidia"


def test_a_dump_with_a_made_up_brand_imports_as_an_unknown_brand() -> None:
    text = (REPO / "fixtures" / "nvidia-smi" / "thamada-gls" / "L40S.q.txt").read_text()
    text = text.replace("Product Brand                         : NVIDIA",
                        "Product Brand                         : \x1b]0;pwned\x07Mega" + "A" * 4000)
    device = parse_nvidia_smi(text, "dump")["devices"][0]
    assert device["nvmlDeviceGetBrand"] == 0  # NVML_BRAND_UNKNOWN: the name still places the board
    assert brand_code("nvidia rtx") == 13 and brand_code("") == 0
