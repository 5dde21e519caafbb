"""One Xid counted once, whether the NVML event set or the kernel log shows it first (agent.sources.nvml_events).

The event thread itself runs against NVIDIA's mock libnvidia-ml in tests/nvml_mock/test_daemon_mock.py.
"""

from __future__ import annotations

from agent.core.facts import KmsgRecord
from agent.sources.nvml_events import MAX_PENDING, NvmlEvent, XidLedger
from agent.sources.xid import parse_xid, parse_xids

BUS = "0000:8b:00.0"


def kernel_line(code: int, at_s: float, bus: str = "0000:8b:00") -> KmsgRecord:
    return KmsgRecord(f"NVRM: Xid (PCI:{bus}): {code}, pid=1234, name=python, Ch 00000008", 3, 7,
                      int(at_s * 1_000_000))


def logged(ledger: XidLedger, code: int, at_s: float) -> bool:
    event = parse_xid(kernel_line(code, at_s))
    assert event is not None
    return ledger.from_kmsg(event)


def test_an_event_then_its_kernel_log_line_is_one_xid() -> None:
    ledger = XidLedger()
    assert ledger.from_event(NvmlEvent(BUS, 48, 100.0))
    assert [e.xid for e in parse_xids(ledger.records())] == [48]  # judged before the log shows it
    assert not logged(ledger, 48, 100.2)
    assert ledger.records() == ()  # the kernel log's own line is the one judged now


def test_a_kernel_log_line_then_its_event_is_one_xid() -> None:
    ledger = XidLedger()
    assert logged(ledger, 79, 50.0)
    assert not ledger.from_event(NvmlEvent(BUS, 79, 50.5))
    assert ledger.records() == ()


def test_other_codes_gpus_and_times_are_other_xids() -> None:
    ledger = XidLedger(window_s=5)
    assert ledger.from_event(NvmlEvent(BUS, 48, 100.0))
    assert logged(ledger, 63, 100.0)  # another code
    assert logged(ledger, 48, 200.0)  # the same code much later: a second Xid
    assert ledger.from_event(NvmlEvent("0000:19:00.0", 48, 100.0))  # another GPU
    assert ledger.from_event(NvmlEvent(BUS, 48, 100.1))  # a second event: one log line matches one event
    assert not logged(ledger, 48, 100.2)
    assert len(ledger.records()) == 2


def test_a_storm_of_events_is_bounded() -> None:
    ledger = XidLedger()
    for i in range(MAX_PENDING * 4):
        ledger.from_event(NvmlEvent(BUS, 48, float(i * 100)))
    assert len(ledger.records()) == MAX_PENDING
