"""host.kernel.events (issue 13): well-known kernel messages of this boot, judged per event id.

Lines are the corpus captures' (fixtures/kmsg/) or the kernel's own format strings filled in (the source
file is named in agent/sources/kernel_events.py); every rule class has a line it must catch and a
harmless line of the same subsystem it must leave alone.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.apps.cli import schema_gen
from agent.apps.cli.main import cli
from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.model import Finding, Severity, Status, Unknown, Unsupported
from agent.core.xid_catalog import ACTIONS
from agent.io.schema import Validator
from agent.policy.profiles import Profile
from agent.sources.kernel_events import BY_ID, RULES, match_event, match_record, parse_kernel_events
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.kmsg import parse_kmsg_line, parse_kmsg_text, read_recorded_kmsg
from checks.gpu_xid import XID
from checks.host_kernel_events import EVENTS, MAX_EXAMPLES
from tests.conftest import REPO
from tests.factories import exp, host, profile

KMSG = REPO / "fixtures" / "kmsg"
BASE = profile({})

CAUGHT = [
    # fs/file_table.c (corpus: os-dmesg.decode.iso.file-max.log)
    ("VFS: file-max limit 1000000 reached", "vfs.file_max"),
    # mm/oom_kill.c: __oom_kill_process (4.19+), oom_kill_process (older), the memcg message
    ("Out of memory: Killed process 2592 (stress) total-vm:8393708kB, anon-rss:7790292kB, file-rss:4kB, "
     "shmem-rss:0kB, UID:0 pgtables:15292kB oom_score_adj:0", "mm.oom_kill"),
    ("Out of memory: Kill process 456 (python) score 50 or sacrifice child", "mm.oom_kill"),
    ("Memory cgroup out of memory: Killed process 1161747 (python) total-vm:45114472kB, anon-rss:16987456kB, "
     "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:34000kB oom_score_adj:0", "mm.oom_kill.memcg"),
    # kernel/hung_task.c, kernel/watchdog*.c, kernel/rcu/tree_stall.h
    ("INFO: task kworker/u448:3:123456 blocked for more than 122 seconds.", "kernel.hung_task"),
    ("INFO: task pt_main_thread:2536443 blocked for more than 241 seconds.", "kernel.hung_task"),
    ("watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python3:4242]", "kernel.soft_lockup"),
    ("NMI watchdog: Watchdog detected hard LOCKUP on cpu 5", "kernel.hard_lockup"),
    ("rcu: INFO: rcu_preempt self-detected stall on CPU", "kernel.rcu_stall"),
    ("INFO: rcu_sched detected stalls on CPUs/tasks:", "kernel.rcu_stall"),
    # arch/x86/kernel/cpu/mce/core.c __print_mce; MCi_STATUS bit 61 (UC) decides; drivers/acpi/apei/ghes.c
    ("mce: [Hardware Error]: CPU 0: Machine Check Exception: 5 Bank 6: b200000000000185", "mce.uncorrected"),
    ("mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 7: be00000000800400", "mce.uncorrected"),
    ("{1}[Hardware Error]: event severity: fatal", "mce.uncorrected"),
    ("Memory failure: 0x1f4a3b: recovery action for dirty LRU page: Recovered", "mce.uncorrected"),
    ("mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 7: 8c00004000010090", "mce.corrected"),
    ("mce: [Hardware Error]: Machine check events logged", "mce.corrected"),
    ("{2}[Hardware Error]: event severity: corrected", "mce.corrected"),
    # drivers/edac/edac_mc.c edac_ue_error / edac_ce_error
    ("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x12345 "
     "offset:0x0 grain:32 - err_code:0x0000:0x009f)", "edac.uncorrected"),
    ("EDAC MC1: 3 CE memory read error on CPU_SrcID#1_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0x5e12f "
     "offset:0x340 grain:32 syndrome:0x0 - err_code:0x0000:0x009f)", "edac.corrected"),
    # drivers/pci/pcie/aer.c (the "...able" severity strings of newer kernels too)
    ("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0", "pcie.aer.uncorrected"),
    ("nvidia 0000:19:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
     "(Requester ID)", "pcie.aer.uncorrected"),
    ("pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, "
     "(Unregistered Agent ID)", "pcie.aer.uncorrected"),
    ("pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
     "pcie.aer.corrected"),
    ("mlx5_core 0000:1a:00.0: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)",
     "pcie.aer.corrected"),
    # drivers/nvme/host/pci.c
    ("nvme nvme0: I/O 123 QID 4 timeout, aborting", "nvme.timeout"),
    ("nvme nvme1: I/O tag 27 (101b) opcode 0x2 (Read) QID 3 timeout, reset controller", "nvme.timeout"),
    ("nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0x10", "nvme.timeout"),
    # block/blk-core.c, fs/buffer.c
    ("blk_update_request: I/O error, dev sdb, sector 123456 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0",
     "block.io_error"),
    ("Buffer I/O error on dev nvme1n1, logical block 0, async page read", "block.io_error"),
    # fs/ext4/super.c, fs/xfs/xfs_error.c
    ("EXT4-fs error (device nvme0n1p2): ext4_lookup:1785: inode #2: comm ls: deleted inode referenced: 12",
     "fs.corruption"),
    ("EXT4-fs (sda1): Remounting filesystem read-only", "fs.corruption"),
    ("XFS (dm-0): Corruption detected. Unmount and run xfs_repair", "fs.corruption"),
    ("XFS (sda4): Metadata corruption detected at xfs_dinode_verify.part.0+0x739/0x920 [xfs], inode 0x427b2d1",
     "fs.corruption"),
    # arch/x86/mm/fault.c, arch/x86/kernel/dumpstack.c, lib/bug.c
    ("BUG: kernel NULL pointer dereference, address: 0000000000000018", "kernel.oops"),
    ("BUG: unable to handle page fault for address: ffffffffdeadbeef", "kernel.oops"),
    ("Oops: 0000 [#1] SMP NOPTI", "kernel.oops"),
    # net/core/dev.c netdev_wait_allrefs_any (6.x) and the older netdev_wait_allrefs spelling
    ("unregister_netdevice: waiting for eth0 to become free. Usage count = 2", "net.unregister_netdevice"),
    ("unregister_netdevice: waiting for lo to become free. Usage count = -1", "net.unregister_netdevice"),
    ("kernel BUG at mm/slub.c:4012!", "kernel.oops"),
    ("[  T4242] BUG: kernel NULL pointer dereference, address: 0000000000000008", "kernel.oops"),  # PRINTK_CALLER
    # nvidia-peermem.c peer_err (corpus: dmesg.peermem.log.0), nv_peer_mem peer_err ("nv_mem %s:%d ")
    ("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
     "nvidia.peermem"),
    ("nv_mem nv_mem_get_pages:300 error -22 while calling nvidia_p2p_get_pages()", "nvidia.peermem"),
    # kernel/panic.c; mlx5e_update_carrier (the rest: tests/unit/checks/test_kernel_events_catalogue.py)
    ("Kernel panic - not syncing: hung_task: blocked tasks", "kernel.panic"),
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link down", "net.link_flap"),
]

HARMLESS = [
    "EDAC MC: Ver: 3.0.0",
    "EDAC MC0: Giving out device to module amd64_edac controller F19h_M10h: DEV 0000:00:18.3 (INTERRUPT)",
    "EDAC amd64: MCT channel count: 4",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 24",
    "acpi PNP0A08:00: _OSC: OS now controls [SHPCHotplug PME AER PCIeCapability]",
    "MCE: In-kernel MCE decoding enabled.",
    "RAS: Correctable Errors collector initialized.",
    "EXT4-fs (vda1): mounted filesystem 2d36df53-678c-49a7-9d59-05a1af7661df with ordered data mode. Quota mode: none.",
    "XFS (sda1): Mounting V5 Filesystem",
    "XFS (sda1): Ending clean mount",
    "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in "
    "libnccl.so.2[7f7c7ac00000+d3d3000]",
    "traps: python[123] general protection fault ip:7f0012345678 sp:7ffd12345678 error:0 in libc.so.6",
    "oom_reaper: reaped process 345646 (vector), now anon-rss:0kB, file-rss:0kB, shmem-rss:0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),",
    "I/O error, dev sr0, sector 0 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 0",
    "nvme nvme0: 8/0/0 default/read/poll queues",
    "NMI watchdog: Enabled. Permanently consumes one hw-PMU counter.",
    "nvidia_peermem: loading out-of-tree module taints kernel.",
    "perf: interrupt took too long (2509 > 2500), lowering kernel.perf_event_max_sample_rate to 79500",
    "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
]


def rec(message: str, ts_s: float | None = None, wall: str | None = None) -> KmsgRecord:
    return KmsgRecord(message=message, ts_usec=None if ts_s is None else int(ts_s * 1e6), wall=wall)


def facts(records: tuple[KmsgRecord, ...] | Unknown, *, uptime_s: float | None = None,
          observed_at: dt.datetime | None = None) -> NodeFacts:
    h = host(uptime_s=uptime_s) if uptime_s is not None else host()
    return parse_kernel_log(NodeFacts(host=h, kmsg=records, observed_at=observed_at))


def by_subject(records: tuple[KmsgRecord, ...], prof: Profile = BASE, *, uptime_s: float | None = None,
               observed_at: dt.datetime | None = None) -> dict[str, Finding]:
    return {f.subject: f for f in EVENTS.run(facts(records, uptime_s=uptime_s, observed_at=observed_at), prof)}


# --- the catalogue ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "event"), CAUGHT)
def test_each_rule_class_catches_its_real_lines(line: str, event: str) -> None:
    rule = match_record(rec(line))
    assert rule is not None and rule.id == event


@pytest.mark.parametrize("line", HARMLESS)
def test_similar_harmless_lines_are_not_events(line: str) -> None:
    assert match_record(rec(line)) is None


# Intel's link-down spellings, as the drivers print them (torvalds/linux drivers/net/ethernet/intel): igb's
# netdev_info "igb: %s NIC Link is Down" (the name twice) and its older printk, e1000e's and e1000's pr_info
# after their module prefix; igc, ixgbe (e_info), i40e and ice print netdev_info "NIC Link is Down".
INTEL_LINK_DOWN = [
    ("igb 0000:00:14.0 eth0: igb: eth0 NIC Link is Down", "eth0"),
    ("igb: eno2 NIC Link is Down", "eno2"),
    ("e1000e: enp0s31f6 NIC Link is Down", "enp0s31f6"),
    ("e1000: enp0s3 NIC Link is Down", "enp0s3"),
    ("igc 0000:03:00.0 enp3s0: NIC Link is Down", "enp3s0"),
    ("ixgbe 0000:01:00.0 eth2: NIC Link is Down", "eth2"),
    ("i40e 0000:3b:00.0 ens1f0: NIC Link is Down", "ens1f0"),
    ("ice 0000:17:00.0 ens785f0: NIC Link is Down", "ens785f0"),
]


def test_intel_link_down_spellings_count_on_their_port_and_sata_does_not() -> None:
    for line, port in INTEL_LINK_DOWN:
        matched = match_event(rec(line))
        assert matched is not None and (matched[0].id, matched[1]) == ("net.link_flap", port), line
    for line in ("ata3: SATA link down (SStatus 0 SControl 300)",
                 "igb 0000:00:14.0 eth0: igb: eth0 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: RX",
                 "e1000e: enp0s31f6 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: None"):
        assert match_event(rec(line)) is None, line
    # igb's port twice down since boot is a flap on that port, not on the driver's name
    found = by_subject((rec("igb 0000:00:14.0 eth0: igb: eth0 NIC Link is Down", 10.0),
                        rec("igb 0000:00:14.0 eth0: igb: eth0 NIC Link is Down", 900.0)), uptime_s=1000.0)
    flap = found["net.link_flap"]
    assert (flap.status, flap.observed["port"]) == (Status.WARN, {"eth0": 2})


def test_every_rule_is_exercised_and_uses_the_vocabulary() -> None:
    assert {event for _, event in CAUGHT} == set(BY_ID)
    assert len(BY_ID) == len(RULES)
    for rule in RULES:
        assert rule.action in ACTIONS, rule.id
        assert rule.reason and "\n" not in rule.reason and rule.limit >= 0
        assert (rule.severity is Severity.CRITICAL) == (rule.action == "drain"), rule.id


@pytest.mark.parametrize("capture", ["dmesg.ctime.boot.a10-535.129.03.log", "kmsg.1.log",
                                     "journalctl-short-iso.a800.log", "nccl-dmesg.decode.iso.log",
                                     "dmesg.decode.iso.log.0"])
def test_healthy_captures_hold_no_event(capture: str) -> None:
    records = read_recorded_kmsg(KMSG / capture)
    assert not isinstance(records, Unknown)
    assert parse_kernel_events(records) == ()


# --- the check ----------------------------------------------------------------------------------------


def test_file_max_capture_warns_once_per_event_with_count_and_first_last_line() -> None:
    records = read_recorded_kmsg(KMSG / "os-dmesg.decode.iso.file-max.log")
    assert not isinstance(records, Unknown)
    [finding] = EVENTS.run(facts(records), BASE)
    assert (finding.subject, finding.status, finding.severity, finding.action) == (
        "vfs.file_max", Status.WARN, Severity.WARNING, "restart_app")
    assert "2 times since boot" in finding.message
    assert "first 2025-01-21T04:41:44,285060+00:00 'VFS: file-max limit 1000000 reached'" in finding.message
    assert "last 2025-01-21T04:42:44,285060+00:00" in finding.message
    assert finding.observed == {"count": 2, "examples": ["VFS: file-max limit 1000000 reached"]}
    assert finding.expected == {"max": 0} and finding.reason == BY_ID["vfs.file_max"].reason


def test_peermem_and_oom_captures() -> None:
    peermem = read_recorded_kmsg(KMSG / "dmesg.peermem.log.0")
    memory = read_recorded_kmsg(KMSG / "memory-dmesg.decode.iso.log")
    assert not isinstance(peermem, Unknown) and not isinstance(memory, Unknown)
    [p] = EVENTS.run(facts(peermem), BASE)
    assert (p.subject, p.status, p.action, p.observed["count"]) == ("nvidia.peermem", Status.WARN,
                                                                    "contact_support", 7)
    [m] = EVENTS.run(facts(memory), BASE)  # the oom-kill:constraint summaries and oom_reaper are not kills
    assert (m.subject, m.status, m.severity, m.observed["count"]) == ("mm.oom_kill", Status.WARN,
                                                                      Severity.WARNING, 3)


def test_critical_events_fail_with_drain_and_info_events_never_degrade() -> None:
    found = by_subject((rec("watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python3:4242]", 10.0),
                        rec("Memory cgroup out of memory: Killed process 9 (python) total-vm:1kB", 11.0)))
    lockup, memcg = found["kernel.soft_lockup"], found["mm.oom_kill.memcg"]
    assert (lockup.status, lockup.severity, lockup.action) == (Status.FAIL, Severity.CRITICAL, "drain")
    assert (memcg.status, memcg.severity) == (Status.WARN, Severity.INFO)
    assert "once since boot; [10.000000] 'watchdog: BUG: soft lockup" in lockup.message


def test_no_event_is_one_pass_for_the_node() -> None:
    [finding] = EVENTS.run(facts((rec("Linux version 6.2.0-37-generic", 0.0),)), BASE)
    assert (finding.subject, finding.status, finding.severity) == ("node", Status.PASS, Severity.INFO)


def test_storms_only_count_above_their_limit_and_profiles_move_the_limit() -> None:
    line = "pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
    limit = BY_ID["pcie.aer.corrected"].limit
    assert limit > 0
    at_limit = tuple(rec(line, float(i)) for i in range(limit))
    [ok] = EVENTS.run(facts(at_limit), BASE)
    assert (ok.subject, ok.status) == ("pcie.aer.corrected", Status.PASS)
    assert f"up to {limit} is normal" in ok.message
    storm = (*at_limit, rec(line, 99.0))
    [bad] = EVENTS.run(facts(storm), BASE)
    assert (bad.status, bad.severity, bad.action) == (Status.WARN, Severity.WARNING, "check_mechanicals")
    tolerant = profile({"kernel_events": {"pcie.aer.corrected": exp("warning", max=50)}})
    assert EVENTS.run(facts(storm), tolerant)[0].status is Status.PASS
    strict = profile({"kernel_events": {"vfs.file_max": {**exp("critical", max=0), "action": "reboot"}}})
    [escalated] = EVENTS.run(facts((rec("VFS: file-max limit 65536 reached", 1.0),)), strict)
    assert (escalated.status, escalated.severity, escalated.action, escalated.reason) == (
        Status.FAIL, Severity.CRITICAL, "reboot", "test reason")


def test_examples_are_capped_and_the_count_is_not() -> None:
    records = tuple(rec(f"Out of memory: Killed process {pid} (job{pid}) total-vm:1kB", float(pid))
                    for pid in range(1, 5001))
    [finding] = EVENTS.run(facts(records), BASE)
    assert finding.observed["count"] == 5000
    assert len(finding.observed["examples"]) == MAX_EXAMPLES
    assert "first [1.000000] 'Out of memory: Killed process 1 (job1)" in finding.message
    assert "last [5000.000000] 'Out of memory: Killed process 5000 (job5000)" in finding.message
    long = rec("VFS: file-max limit 1 reached " + "x" * 5000, 1.0)
    [cut] = EVENTS.run(facts((long,)), BASE)
    assert len(cut.message) < 400


# --- this boot only -------------------------------------------------------------------------------------


def test_an_event_of_a_previous_boot_is_not_reported() -> None:
    """/dev/kmsg records of two boots: the since-boot clock restarts; the lockup before it is history."""
    lines = ["0,100,90000000000,-;watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [kworker/3:1:99]",
             "6,101,90000100000,-;reboot: Restarting system",
             "6,1,1000000,-;Linux version 6.8.0-45-generic",
             "4,2,5000000,-;VFS: file-max limit 1000000 reached"]
    records = parse_kmsg_text(lines)
    assert [e.rule for e in parse_kernel_events(records)] == ["vfs.file_max"]
    assert set(by_subject(records)) == {"vfs.file_max"}


def test_wall_clock_records_older_than_the_boot_are_dropped_and_counted() -> None:
    observed = dt.datetime(2025, 1, 21, 8, 50, tzinfo=dt.timezone.utc)
    old = parse_kmsg_line("kern  :crit  : 2025-01-10T03:00:00,000000+00:00 EXT4-fs error (device sda1): "
                          "ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0")
    new = parse_kmsg_line("kern  :warn  : 2025-01-21T08:41:44,285060+00:00 VFS: file-max limit 1000000 reached")
    assert old is not None and new is not None
    found = by_subject((old, new), uptime_s=3600.0, observed_at=observed)
    assert set(found) == {"vfs.file_max"}
    assert "(1 such records in the log predate this boot)" in found["vfs.file_max"].message
    [only_old] = EVENTS.run(facts((old,), uptime_s=3600.0, observed_at=observed), BASE)
    assert (only_old.subject, only_old.status) == ("node", Status.PASS)


# --- no kernel log: as gpu.xid ------------------------------------------------------------------------


def test_no_kernel_log_and_an_unreadable_one_behave_as_gpu_xid() -> None:
    absent = parse_kernel_log(NodeFacts(host=host(), kmsg=Unsupported("the snapshot holds no kernel log")))
    assert EVENTS.run(absent, BASE) == [] == XID.run(absent, BASE)
    reason = "/dev/kmsg is not readable (needs root or CAP_SYSLOG)"
    unreadable = parse_kernel_log(NodeFacts(host=host(), kmsg=Unknown(reason)))
    [ours] = EVENTS.run(unreadable, BASE)
    [theirs] = XID.run(unreadable, BASE)
    assert (ours.subject, ours.status, ours.severity, ours.message) == (
        theirs.subject, theirs.status, theirs.severity, theirs.message) == (
        "node", Status.UNKNOWN, Severity.WARNING, f"kernel log: {reason}")


# --- the profile schema ---------------------------------------------------------------------------------


def test_the_check_carries_its_schema_fragment_and_evidence() -> None:
    assert EVENTS.expect_path == ("kernel_events",) and EVENTS.evidence
    validator = Validator(schema_gen.generate_schema())

    def errors(section: object) -> list[object]:
        return list(validator.errors({"name": "site", "description": "d", "expect": {"kernel_events": section}}))

    assert errors({"pcie.aer.corrected": exp("warning", max=50), "edac.corrected": None,
                   "vfs.file_max": {**exp("critical", max=0), "action": "drain"}}) == []
    assert errors({"no.such_event": exp("warning", max=1)})
    assert errors({"vfs.file_max": exp("warning", equals=1)})  # a count limit: max


# --- the CLI on a snapshot with a kernel log -------------------------------------------------------------


def test_cli_audit_of_a_snapshot_with_kmsg_txt(tmp_path: Path) -> None:
    (tmp_path / "meta.yaml").write_text("hostname: n1\ncaptured_at: '2025-01-21T08:50:00+00:00'\n"
                                        "nodewarden_version: test\ncaptured: [kmsg]\n", encoding="utf-8")
    (tmp_path / "kmsg.txt").write_text(
        "6,1,1000000,-;Linux version 6.8.0-45-generic\n"
        "4,2,2000000,-;VFS: file-max limit 1000000 reached\n"
        "0,3,3000000,-;watchdog: BUG: soft lockup - CPU#7 stuck for 26s! [python3:4242]\n"
        "4,4,4000000,-;pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n",
        encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["audit", "--config", str(config), "--snapshot", str(tmp_path), "--format",
                                      "json", "--only", "host.kernel.events"], catch_exceptions=False)
    assert result.exit_code == 1, result.stderr
    findings = {f["subject"]: f for f in json.loads(result.stdout)["findings"] if f["check"] == EVENTS.id}
    assert {s: (f["status"], f["severity"], f.get("action")) for s, f in findings.items()} == {
        "kernel.soft_lockup": ("fail", "critical", "drain"),
        "vfs.file_max": ("warn", "warning", "restart_app"),
        "pcie.aer.corrected": ("pass", "warning", None),
    }
