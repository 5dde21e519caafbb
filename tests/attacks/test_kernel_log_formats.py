"""Hostile kernel logs and bug-report sections against the format grammars (issue 22 items 5 and 9).

A log someone crafted: `dmesg -H` offsets that run past year 9999, a stamp on 30 February, lines of a
megabyte, a syslog program quoting an Xid, bug-report sections that name paths outside /proc and /sys.
Each must be read in bounded time, keep what is a record, and never judge what is not one.
"""

from __future__ import annotations

import time

from agent.importers.bug_report import host_file
from agent.importers.kernel_log import KernelLogImporter
from agent.sources.kmsg import parse_kmsg_text
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
