"""Kernel-log parsing: /dev/kmsg records, dmesg and ISO (also decoded) lines, continuations, the record
bound, recorded kmsg files and the real dumps in fixtures/kmsg."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.core.facts import KmsgRecord
from agent.core.model import Unknown
from agent.sources import kmsg
from agent.sources.kmsg import parse_kmsg_line, parse_kmsg_text, read_recorded_kmsg

# ---------------------------------------------------------------------------------------------
# kernel log
# ---------------------------------------------------------------------------------------------


def test_parse_kmsg_record_format() -> None:
    assert parse_kmsg_line("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == KmsgRecord(
        message="nvidia-nvswitch2: open (major=510)", priority=6, seq=3964, ts_usec=206764307)


@pytest.mark.parametrize(("prefix", "priority"), [(0, 0), (3, 3), (14, 6), (4, 4), (12, 4), (30, 6), (191, 7)])
def test_kmsg_priority_drops_the_facility_bits(prefix: int, priority: int) -> None:
    record = parse_kmsg_line(f"{prefix},1,2,c;msg; with semicolon")
    assert record == KmsgRecord("msg; with semicolon", priority, 1, 2)


@pytest.mark.parametrize(("line", "message", "ts_usec"), [
    ("[  12.345678] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
     "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.", 12_345_678),
    ("[    0.000000] Linux version 6.8.0", "Linux version 6.8.0", 0),
    ("[123456.5] short fraction", "short fraction", 123_456_500_000),
    ("[    1.000000]", "", 1_000_000),
])
def test_parse_dmesg_format(line: str, message: str, ts_usec: int) -> None:
    assert parse_kmsg_line(line) == KmsgRecord(message=message, ts_usec=ts_usec)


@pytest.mark.parametrize("line", [
    "2024-11-15T05:39:15,491363+00:00 nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
    "2024-11-15T05:39:15.491363+0000 nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
])
def test_parse_iso_format(line: str) -> None:
    assert parse_kmsg_line(line) == KmsgRecord(
        message="nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context", wall=line.split(" ", 1)[0])


def test_parse_decoded_iso_format_strips_facility_and_level() -> None:
    """`dmesg --decode --time-format=iso` (support bundles, gpud test data) prefixes 'kern  :warn  : '."""
    line = ("kern  :warn  : 2025-01-21T02:21:33,498559+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', "
            "name=<unknown>, Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address")
    record = parse_kmsg_line(line)
    assert record is not None
    assert record.message.startswith("NVRM: Xid (PCI:0000:38:00): 13, ")


@pytest.mark.parametrize("line", ["", "   ", " SUBSYSTEM=pci", " DEVICE=+pci:0000:18:00.0", "\t"])
def test_continuation_and_blank_lines_are_skipped(line: str) -> None:
    assert parse_kmsg_line(line) is None


def test_unknown_format_keeps_the_whole_line() -> None:
    assert parse_kmsg_line("NVRM: loading") == KmsgRecord(message="NVRM: loading")


def test_parse_kmsg_text_skips_continuations_and_respects_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ["6,1,10,-;first\n", " SUBSYSTEM=pci\n", "\n", "[ 1.0] second\n", "third\n", "fourth\n"]
    assert [r.message for r in parse_kmsg_text(lines)] == ["first", "second", "third", "fourth"]
    monkeypatch.setattr(kmsg, "MAX_RECORDS", 2)
    assert [r.message for r in parse_kmsg_text(lines)] == ["first", "second"]


def test_read_recorded_kmsg(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(b"6,1,10,-;caf\xe9\n4,2,20,-;NVRM: Xid 79\n")
    assert read_recorded_kmsg(path) == (KmsgRecord("caf\\xe9", 6, 1, 10), KmsgRecord("NVRM: Xid 79", 4, 2, 20))
    missing = read_recorded_kmsg(tmp_path / "absent.txt")
    assert isinstance(missing, Unknown) and "absent.txt" in missing.reason


KERNEL_LOGS = Path(__file__).resolve().parents[3] / "fixtures" / "kmsg"
_PREFIXES = (r"^\d+,\d+,\d+,", r"^\[\s*\d+\.\d+\]", r"^\d{4}-\d{2}-\d{2}T", r"^[a-z]+\s*:[a-z]+\s*: ")


@pytest.mark.parametrize("name", ["kmsg.1.log", "dmesg.0.log", "dmesg.decode.iso.log.0"])
def test_real_kernel_logs_parse_without_format_prefixes(name: str) -> None:
    """Real dumps (gpud test data, fixtures/kmsg): one record per line, prefix removed."""
    lines = (KERNEL_LOGS / name).read_text(encoding="utf-8").splitlines()
    expected = sum(1 for line in lines if line.strip() and not line.startswith(" "))
    records = parse_kmsg_text(lines)
    assert expected > 30
    assert len(records) == expected
    leftovers = [r.message for r in records if any(re.match(p, r.message) for p in _PREFIXES)]
    assert leftovers == []
    assert all(r.message.strip() for r in records)
