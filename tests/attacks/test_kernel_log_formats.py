"""Hostile kernel logs and bug-report sections against the format grammars (issue 22 items 5 and 9).

A log someone crafted: `dmesg -H` offsets that run past year 9999, a stamp on 30 February, lines of a
megabyte, a syslog program quoting an Xid, bug-report sections that name paths outside /proc and /sys.
Each must be read in bounded time, keep what is a record, and never judge what is not one.
"""

from __future__ import annotations

import time

from agent.sources.importers.bug_report import host_file
from agent.sources.importers.kernel_log import KernelLogImporter
from agent.sources.kernel_events import parse_kernel_events
from agent.sources.kmsg import line_grammar, parse_kmsg_text
from agent.sources.xid import parse_xids


def test_reltime_offsets_past_year_9999_keep_their_records() -> None:
    records = parse_kmsg_text(["[Dec31 23:59] first", "[  +999999999999.999999] second", "[  +1.000000] third",
                               "[Feb30 01:00] a day that is not", "[  +0.5] fifth"])
    assert [r.message for r in records] == ["first", "second", "third", "a day that is not", "fifth"]
    assert records[0].wall == "Dec 31 23:59:00"
    assert records[1].wall is None and records[2].wall is None  # the clock overflowed: no stamp, no crash
    assert records[4].wall is None  # after a stamp that is no date, offsets have nothing to add to


def test_a_program_quoting_an_xid_in_syslog_is_never_an_xid() -> None:
    lines = ["Feb 13 04:56:01 node7 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
             "Feb 13 04:56:02 node7 evil[66]: NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, GPU has fallen off",
             "2025-02-13T04:56:03+0000 node7 kernel: nvidia-nvswitch0: probe",
             "2025-02-13T04:56:04+0000 node7 evil[66]: NVRM: Xid (PCI:0000:19:00): 48, pid=1, name=x, DBE"]
    assert parse_xids(parse_kmsg_text(lines)) == ()
    assert len(parse_kmsg_text(lines)) == 2


def test_megabyte_lines_are_classified_in_bounded_time() -> None:
    evil = "a " + "b" * (1 << 20) + " " + "c" * (1 << 20) + ": NVRM: "
    head = ("\n".join([evil] * 3) + "\n").encode()
    start = time.monotonic()
    KernelLogImporter().detect(head, "evil.log")
    records = parse_kmsg_text([evil, "[Feb13 04:56] " + evil, "<6>[ 1.0] " + evil])
    assert time.monotonic() - start < 5
    assert len(records) == 3 and records[2].ts_usec == 1_000_000


def test_bug_report_sections_outside_proc_and_sys_are_no_host_files() -> None:
    assert host_file("*** /proc/../etc/shadow") is None
    assert host_file("*** /sys/../../root/.ssh/id_rsa") is None
    assert host_file("*** /proc") is None and host_file("*** /procfoo/x") is None
    assert host_file("*** /proc/driver/nvidia/./gpus/0000:19:00.0/information") == \
        "/proc/driver/nvidia/gpus/0000:19:00.0/information"
    assert host_file("*** /sys/kernel/mm/transparent_hugepage/enabled") == "/sys/kernel/mm/transparent_hugepage/enabled"


def test_only_a_whole_network_manager_carrier_line_is_a_record_and_nothing_rides_along() -> None:
    # A network manager's carrier line is the one user-space line kept as a record (net.link_flap reads it). A
    # program that appends text to that grammar, names a port past IFNAMSIZ or borrows another tag gets nothing.
    xid = "NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, GPU has fallen off the bus."
    stamp = "Feb 13 04:56:0{} node7 "
    lines = [stamp.format(0) + "systemd-networkd[812]: ib0: Lost carrier",
             stamp.format(1) + f"systemd-networkd[812]: ib0: Lost carrier {xid}",
             stamp.format(2) + f"NetworkManager[9]: <info>  [1.2] device (ib0): carrier: link disconnected {xid}",
             stamp.format(3) + "NetworkManager[9]: <info>  [1.2] device (ib0): state change: activated -> "
                               f"unavailable (reason 'carrier-changed') {xid}",
             stamp.format(4) + "systemd-networkd[812]: " + "i" * 10_000 + ": Lost carrier",
             stamp.format(5) + "evil[66]: ib0: Lost carrier",
             "2025-02-13T04:56:06+0000 node7 systemd-networkd[812]: ib0: Lost carrier " + "x" * (1 << 20)]
    start = time.monotonic()
    records = parse_kmsg_text(lines)
    assert time.monotonic() - start < 2.0
    assert [line_grammar(line) for line in lines[:6]] == ["syslog-link"] + ["syslog-user"] * 5
    assert line_grammar(lines[6]) != "syslog-link"  # no journal around it: dmesg ISO text, as before, no event
    assert [r.message for r in records[:-1]] == ["systemd-networkd[812]: ib0: Lost carrier"]
    assert [(e.rule, e.key) for e in parse_kernel_events(records)] == [("net.link_flap", "ib0")]
    assert parse_xids(records) == ()
