"""Issue 31.5: plain `lspci` (names, no `-nn` ids) is read with the system's pci.ids, the database lspci
printed the names from, where the importer's own tables do not name a device; without one, the message
tells the user what to capture, never to edit our tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.sources.importers import lspci, pci_ids
from agent.sources.importers.lspci import parse_lspci, parse_lspci_lenient

# pci.ids (https://pci-ids.ucw.cz, GPL-2.0-or-later or BSD-3-Clause): the lines this dump needs, as the file has them
PCI_IDS = """\
# excerpt
144d  Samsung Electronics Co Ltd
\ta80a  NVMe SSD Controller PM9A1/PM9A3/980PRO
\t\t144d a801  SSD 980 PRO
8086  Intel Corporation
\t1592  Ethernet Controller E810-C for QSFP
\t\t8086 0002  Ethernet Network Adapter E810-C-Q2
C 01  Mass storage controller
\t08  Non-Volatile memory controller
\t\t02  NVM Express
C 02  Network controller
\t00  Ethernet controller
"""
PLAIN = """\
3b:00.0 Ethernet controller: Intel Corporation Ethernet Controller E810-C for QSFP (rev 02)
\tSubsystem: Intel Corporation Ethernet Network Adapter E810-C-Q2
\tKernel driver in use: ice

c1:00.0 Non-Volatile memory controller: Samsung Electronics Co Ltd NVMe SSD Controller PM9A1/PM9A3/980PRO (prog-if 02 [NVM Express])
\tSubsystem: Samsung Electronics Co Ltd SSD 980 PRO
\tKernel driver in use: nvme
"""


@pytest.fixture
def system_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pci.ids"
    path.write_text(PCI_IDS)
    monkeypatch.setattr(pci_ids, "PCI_IDS_PATHS", (tmp_path / "absent.ids", path))
    pci_ids.system_pci_names.cache_clear()
    pci_ids.system_vendors_longest_first.cache_clear()
    yield path
    pci_ids.system_pci_names.cache_clear()
    pci_ids.system_vendors_longest_first.cache_clear()


def test_plain_lspci_is_read_by_name_with_the_systems_pci_ids(system_ids: Path) -> None:
    nic, nvme = parse_lspci(PLAIN)
    assert (nic.vendor, nic.device, nic.class_code >> 8, nic.subsystem) == (0x8086, 0x1592, 0x0200, (0x8086, 0x0002))
    assert (nvme.vendor, nvme.device, nvme.class_code, nvme.subsystem) == (0x144D, 0xA80A, 0x010802, (0x144D, 0xA801))
    assert nic.driver == "ice" and lspci.VENDORS.get("Samsung Electronics Co Ltd") is None  # pci.ids, not our table


def test_without_pci_ids_the_message_says_what_to_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pci_ids, "PCI_IDS_PATHS", (tmp_path / "none.ids",))
    pci_ids.system_pci_names.cache_clear()
    pci_ids.system_vendors_longest_first.cache_clear()
    try:
        functions, skipped = parse_lspci_lenient(PLAIN)
    finally:
        pci_ids.system_pci_names.cache_clear()
        pci_ids.system_vendors_longest_first.cache_clear()
    assert functions == [] and len(skipped) == 2
    assert all("lspci -nn -vvv" in why and "add it to" not in why and "table" not in why for why in skipped), skipped


def test_a_hostile_pci_ids_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huge = tmp_path / "pci.ids"
    huge.write_bytes(b"8086  Intel Corporation\n" + b"#" * (pci_ids.MAX_BYTES + 10))
    monkeypatch.setattr(pci_ids, "PCI_IDS_PATHS", (huge,))
    pci_ids.system_pci_names.cache_clear()
    try:
        assert pci_ids.system_pci_names() is None
    finally:
        pci_ids.system_pci_names.cache_clear()
    names = pci_ids.parse_pci_ids("garbage\n\tnot under a vendor  x\n" + PCI_IDS + "\t\tzzzz  bad\n")
    assert names.vendors["Intel Corporation"] == 0x8086 and names.classes["Ethernet controller"] == 0x0200
