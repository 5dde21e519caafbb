"""Well-known kernel messages an SRE acts on, from the kernel log's records (the catalogue of host.kernel.events).

Each rule of `RULES` is one kind of event with a stable id, the message texts that report it (as the
kernel prints them; the source file is named beside each), and what it asks of the operator: a
severity, an action of the Xid catalogue's vocabulary (agent/xid_catalog.ACTIONS: critical ones
`drain`) and `limit`, the count since boot that is still normal (0: any occurrence counts; the corrected-error
storms allow a few). Profiles override severity, reason, action and limit per id under
`expect.kernel_events` (checks/host_kernel_events.py).

The first rule that matches a record wins, so the specific texts come first: `BUG: soft lockup` is a
lockup, not a generic `BUG:`. `parse_kernel_events` reads the records the kmsg reader already holds
(never the log again), keeps the log's last boot (`kmsg.boot_start`, as `parse_xids` does) and
leaves the wall-clock boot cut (`kmsg.predates_boot`) to the check, which has the boot time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from agent.core.facts import KernelEvent, KmsgRecord
from agent.core.lazyre import lazy_compile
from agent.core.model import Severity
from agent.sources.kmsg import boot_start


class Rule(NamedTuple):
    id: str
    title: str  # what happened, a few words
    severity: Severity
    action: str
    reason: str  # why an SRE acts, one line (the finding's reason)
    patterns: tuple[str, ...]  # regular expressions searched in the record's message
    limit: int = 0  # events since boot that are still normal
    needle: tuple[str, ...] = ()  # literal text every matching message holds (the fast pre-filter)
    per: str = ""  # a named group of the patterns: the limit applies per value of it (per port), not per node


_W, _C, _I = Severity.WARNING, Severity.CRITICAL, Severity.INFO

# An MCE bank status (MCi_STATUS) with bit 61 (UC) set: the top hex digit is one of 2 3 6 7 a b e f.
_UC_NIBBLE = "[2367abefABEF]"
_CORRECTED_NIBBLE = "[014589cdCD]"
# NetworkManager's carrier lines as kmsg.py keeps them (the program's tag, then level, stamp and device)
_NM_PORT = r"^NetworkManager\[\d{1,10}\]: [^(]{0,40}\((?P<port>[^\s:/()]{1,15})\): "
_NM_CARRIER_STATE = r"(?:device )?state change: [a-z-]{1,20} -> unavailable \(reason 'carrier-changed'"

RULES: tuple[Rule, ...] = (
    # kernel/watchdog.c, kernel/watchdog_hld.c / watchdog_buddy.c, kernel/rcu/tree_stall.h
    Rule("kernel.soft_lockup", "soft lockup (a CPU stuck in the kernel)", _C, "drain",
         "A CPU looped in kernel mode for tens of seconds: the node is unreliable; drain it, then reboot",
         (r"BUG: soft lockup - CPU#?\d+ stuck for",), needle=("soft lockup",)),
    Rule("kernel.hard_lockup", "hard lockup (a CPU stopped taking interrupts)", _C, "drain",
         "A CPU stopped servicing interrupts: the node is unreliable; drain it, then reboot",
         (r"Watchdog detected hard LOCKUP on cpu",), needle=("hard LOCKUP",)),
    Rule("kernel.rcu_stall", "RCU stall", _W, "contact_support",
         "A CPU or task held off RCU grace periods for tens of seconds; it precedes lockups and hangs",
         (r"INFO: rcu_\w+ (?:self-)?detected (?:expedited )?stalls?",),
         needle=("detected stall", "detected expedited stall")),
    # kernel/hung_task.c
    Rule("kernel.hung_task", "task blocked (hung task)", _W, "contact_support",
         "A task waited in the kernel for minutes (storage, NFS or a driver); jobs touching it hang too",
         (r"INFO: task .+:\d+ blocked for more than \d+ seconds",), needle=("blocked for more than",)),
    # arch/x86/kernel/cpu/mce/core.c (__print_mce, mce_panic), drivers/acpi/apei/ghes.c, mm/memory-failure.c
    Rule("mce.uncorrected", "uncorrected machine check (CPU, memory or bus hardware)", _C, "drain",
         "The hardware reported an error it could not correct: drain the node and have the part named replaced",
         (r"Machine Check Exception:",
          rf"Machine Check: [0-9a-fA-F]+ Bank \d+: {_UC_NIBBLE}[0-9a-fA-F]{{15}}\b",
          r"Kernel panic - not syncing: Fatal [Mm]achine check",
          r"\[Hardware Error\]: +event severity: (?:fatal|recoverable)",
          r"Kernel panic - not syncing: (?:GHES: )?Fatal hardware error",
          r"Memory failure: 0x[0-9a-f]+: recovery action for",
          r"mce: Uncorrected hardware memory error in user-access at"),
         needle=("Machine Check", "Machine check", "Hardware Error", "hardware error", "Memory failure")),
    Rule("mce.corrected", "corrected machine checks", _W, "contact_support",
         "Corrected machine checks beyond a few since boot predict an uncorrected one: have the part checked",
         (rf"Machine Check: [0-9a-fA-F]+ Bank \d+: {_CORRECTED_NIBBLE}[0-9a-fA-F]{{15}}\b",
          r"Machine check events logged",
          r"\[Hardware Error\]: +event severity: corrected"),
         limit=10, needle=("Machine Check", "Machine check", "Hardware Error")),
    # drivers/edac/edac_mc.c (edac_ue_error, edac_ce_error: "EDAC MC0: 1 UE ..." / "1 CE ...")
    Rule("edac.uncorrected", "uncorrected memory error (EDAC)", _C, "drain",
         "The memory controller reported an uncorrected error: data was lost; drain and replace the DIMM",
         (r"EDAC MC\d+: (?:\d+ )?UE\b",), needle=("EDAC",)),
    Rule("edac.corrected", "corrected memory errors (EDAC)", _W, "contact_support",
         "A storm of corrected memory errors points at a failing DIMM before it fails uncorrectably",
         (r"EDAC MC\d+: (\d+ )?CE\b",), limit=100, needle=("EDAC",)),
    # drivers/pci/pcie/aer.c (aer_print_error: "PCIe Bus Error: severity=%s, ..."; strings
    # "Uncorrected (Fatal)", "Uncorrected (Non-Fatal)", "Corrected", "...able" since 6.x)
    Rule("pcie.aer.uncorrected", "uncorrected PCIe error (AER)", _C, "drain",
         "A PCIe device or link reported an uncorrectable error: the device named may be lost; drain, then reseat "
         "or replace it",
         (r"(?:PCIe|CXL) Bus Error: severity=Uncorrect(?:ed|able) \((?:Non-)?Fatal\)",
          r"AER: (?:Multiple )?Uncorrect(?:ed|able) \((?:Non-)?Fatal\) error (?:message )?received"),
         needle=("Bus Error", "AER:")),
    Rule("pcie.aer.corrected", "corrected PCIe errors (AER)", _W, "check_mechanicals",
         "A storm of corrected PCIe errors means a marginal link (riser, cable, slot) that tends to get worse",
         (r"(?:PCIe|CXL) Bus Error: severity=Correct(?:ed|able)",), limit=10, needle=("Bus Error",)),
    # drivers/nvme/host/pci.c (nvme_timeout, nvme_warn_reset, nvme_reset_work, nvme_error_detected),
    # drivers/nvme/host/core.c (nvme_wait_ready), drivers/nvme/host/multipath.c (nvme_ns_head_submit_bio)
    Rule("nvme.timeout", "NVMe command timeouts or controller resets", _W, "contact_support",
         "An NVMe drive stopped answering (timeouts, controller reset): failing drive, firmware or link",
         (r"nvme\d+: I/O (?:tag )?\d+ .*QID \d+ timeout",
          r"nvme\d+: (?:controller is down; will reset|frozen state error detected, reset controller)",
          r"nvme\d+: (?:Removing after probe failure|Disabling device after reset failure|Abort status: 0x)",
          r"nvme\d+: Device not ready; aborting (?:reset|initiali[sz]ation)",
          r"^block nvme\d+n\d+: no available path - failing I/O"), needle=("nvme",)),
    # block/blk-core.c (blk_errors[] names, printed by blk_print_req_error as "%s error, dev %s, sector %llu",
    # before 5.x by print_req_error / blk_update_request as "%s: %s error, ...", before 4.x by end_request);
    # fs/buffer.c. One grammar for every spelling: "I/O", "critical medium", "critical target", "timeout", ...
    Rule("block.io_error", "block device I/O errors", _W, "contact_support",
         "Reads or writes failed on a disk: a failing drive or path; data on it is at risk",
         (r"(?:^|: )(?!operation not supported)[A-Za-z/ ]{1,40} error, dev (?!sr\d|fd\d|loop\d)[^\s,]+, sector",
          r"Buffer I/O error on dev(?:ice)? (?!sr\d|fd\d|loop\d)"), needle=(" error, dev ", "Buffer I/O error")),
    # fs/ext4/super.c (__ext4_error*, ext4_handle_error: "Remounting filesystem read-only", ext4_commit_super),
    # fs/jbd2/journal.c (jbd2_journal_abort), fs/xfs/xfs_error.c, xfs_fsops.c (xfs_do_force_shutdown),
    # fs/btrfs/messages.c ("forced readonly")
    Rule("fs.corruption", "filesystem error, corruption or read-only remount (ext4, XFS, btrfs)", _C, "drain",
         "A filesystem found corruption, lost its journal or went read-only: drain the node, unmount and repair "
         "(fsck, xfs_repair)",
         (r"EXT[234]-fs error \(device",
          r"(?:EXT[234]-fs|XFS|BTRFS)(?: \w+)? \(\S+\):? .*(?:Remounting filesystem read-only|forced readonly)",
          r"EXT[234]-fs \(\S+\): I/O error while writing superblock",
          r"^Aborting journal on device \S+",
          r"XFS \(\S+\): (?:Metadata )?[Cc]orruption (?:of in-memory data )?detected",
          r"XFS \(\S+\): .*[Ff]ilesystem has been shut down"),
         needle=("EXT2-fs", "EXT3-fs", "EXT4-fs", "XFS", "BTRFS", "Aborting journal")),
    # arch/x86/mm/fault.c (page_fault_oops: "BUG: unable to handle ..."), arch/x86/kernel/traps.c (do_trap /
    # die: "<trap name>: 0000 [#1]", "Oops: " before it since 6.9), arch/x86/kernel/dumpstack.c (__die),
    # arch/arm64/kernel/traps.c ("Internal error: Oops"), lib/bug.c ("kernel BUG at"). The die counter "[#N]"
    # tells a kernel trap from a user-space one ("traps: python[123] general protection fault ip:...").
    Rule("kernel.oops", "kernel oops or BUG", _C, "drain",
         "The kernel hit a bug or a bad memory access; it is tainted and may misbehave: drain, then reboot",
         (r"^BUG: ", r"^Oops: ", r"^Internal error: Oops", r"^kernel BUG at \S+:\d+!", r"^general protection fault",
          r"^(?:divide error|invalid opcode|stack segment|double fault|alignment check|invalid TSS"
          r"|segment not present|bounds|overflow|int3)\b[^\[]{0,120}\[#\d+\]"),
         needle=("BUG", "Oops", "general protection fault", "[#")),
    # kernel/panic.c (panic: "Kernel panic - not syncing: %s"); the machine-check and GHES panics are caught
    # above as what they are. Seen in this boot's log only when the panic did not reboot (panic=0) or in a
    # log that spans boots: the node stopped.
    Rule("kernel.panic", "kernel panic", _C, "drain",
         "The kernel panicked: the node stopped; drain it and find the cause in the lines before the panic",
         (r"^Kernel panic - not syncing: ",), needle=("Kernel panic",)),
    # fs/file_table.c (alloc_empty_file: "VFS: file-max limit %lu reached")
    Rule("vfs.file_max", "file-handle table exhausted (fs.file-max)", _W, "restart_app",
         "The host ran out of file handles: opens fail everywhere; find the leaking process or raise fs.file-max",
         (r"VFS: file-max limit \d+ reached",), needle=("file-max",)),
    # mm/oom_kill.c (__oom_kill_process: "%s: Killed process %d (%s) ...", message "Out of memory" for the
    # host, "Memory cgroup out of memory" for a cgroup's limit; "Kill process ... or sacrifice child" before 4.19)
    Rule("mm.oom_kill", "OOM killer killed processes (host out of memory)", _W, "restart_app",
         "The host ran out of memory and the kernel killed processes: jobs overcommit host RAM (or something leaks)",
         (r"^Out of memory: Kill(?:ed)? process",), needle=("Out of memory",)),
    Rule("mm.oom_kill.memcg", "OOM killer in a memory cgroup (a job's own limit)", _I, "restart_app",
         "A container or job hit its own memory limit: the job's sizing, not the node",
         (r"^Memory cgroup out of memory: Kill(?:ed)? process",), needle=("Memory cgroup out of memory",)),
    # NVIDIA open-gpu-kernel-modules kernel-open/nvidia-peermem/nvidia-peermem.c (peer_err: "nvidia-peermem
    # %s:%d ERROR "), Mellanox nv_peer_mem (peer_err: "nv_mem %s:%d ")
    Rule("nvidia.peermem", "nvidia-peermem (GPUDirect RDMA) errors", _W, "contact_support",
         "GPUDirect RDMA memory registration failed or was torn down under a live mapping; repeats break RDMA jobs",
         (r"nvidia-peermem \S+:\d+ ERROR ", r"^nv_mem(?:ERR)? \S+:\d+ "), needle=("nvidia-peermem", "nv_mem")),
    # net/core/dev.c (netdev_wait_allrefs / netdev_wait_allrefs_any): a device that keeps references after
    # unregister, printed every 10 s while it waits (a refcount leak: container network namespaces cannot be
    # torn down, pods stick in Terminating, `ip netns del` hangs; only a reboot frees it).
    Rule("net.unregister_netdevice", "network device stuck unregistering (leaked references)", _W, "reboot",
         "A network device waits forever for its last references: namespace teardown hangs (containers stuck "
         "terminating) until the node reboots",
         (r"unregister_netdevice: waiting for \S+ to become free\. Usage count = -?\d+",),
         needle=("unregister_netdevice: waiting for",)),
    # drivers/net/ethernet/mellanox/mlx5/core/en_main.c (mlx5e_update_carrier: "Link down"), mlx4/en_netdev.c
    # ("Link Down"), intel igc/ixgbe/i40e/ice and broadcom bnxt_en/bnx2x (netdev_info "NIC Link is Down"), tg3
    # ("Link is down."); intel/igb/igb_main.c (netdev_info "igb: %s NIC Link is Down", the name twice; printk
    # "igb: %s ..." before), e1000e/netdev.c and e1000 (pr_info "%s NIC Link is Down" after "e1000e: "), atl1c.
    # User space (kmsg.py's syslog-link records, the program's tag first): systemd-networkd's "PORT: Lost
    # carrier" (networkd-link.c) and NetworkManager's carrier loss (nm-device.c) -- an IPoIB port's carrier
    # changes reach the log only that way (the kernel prints them at debug level). Counted per port (group
    # `port`): one drop per port since boot is a port coming up or a planned switch reboot; a second drop of the
    # same port is a flap (cable, optic, switch port). SATA's "link down" (libata, an empty bay) is not a network
    # port and is not matched; nor is another program's "Lost carrier" (sshd, pppd: a session's modem line).
    Rule("net.link_flap", "network port link dropped (Ethernet / InfiniBand netdev)", _W, "check_mechanicals",
         "A port lost its link more than once since boot: a marginal cable, optic or switch port; RDMA and NCCL "
         "jobs on it stall or fail",
         (r"^[\w-]{1,20} [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d (?P<port>[^\s:]{1,31}): "
          r"(?:Link down|(?:NIC )?Link is [Dd]own)\b",
          r"^(?:[\w-]{1,20} [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d(?: [^\s:]{1,31})?: )?[\w-]{1,20}: "
          r"(?P<port>[^\s:]{1,31}) NIC Link is [Dd]own\b",
          r"^mlx4_en: (?P<port>[^\s:]{1,31}): Link Down\b",
          r"^systemd-networkd\[\d{1,10}\]: (?P<port>[^\s:/()]{1,15}): [Ll]ost carrier$",
          # one drop: "link disconnected" (bare, or the deferral that starts it), not the deferred call after it
          rf"{_NM_PORT}(?:carrier: )?link disconnected(?: \(deferring action for [^)]{{1,40}}\))?$",
          rf"{_NM_PORT}{_NM_CARRIER_STATE}"),
         limit=1, needle=("Link down", "Link Down", "Link is Down", "Link is down", "Lost carrier", "lost carrier",
                          "link disconnected", "carrier-changed"), per="port"),
)

BY_ID = {rule.id: rule for rule in RULES}
_CALLER_RE = lazy_compile(r"^\[\s*[TC]\d+\] ")  # CONFIG_PRINTK_CALLER's "[  T123] " before the text
_NM_STATE_RE = lazy_compile(_NM_PORT + _NM_CARRIER_STATE)
_MAX_PORTS = 1024  # NetworkManager ports remembered between a carrier loss and its state change
_NEEDLES = re.compile("|".join(sorted({re.escape(n) for rule in RULES for n in rule.needle})))


@functools.cache
def _compiled() -> tuple[tuple[Rule, tuple[re.Pattern[str], ...]], ...]:
    """Every rule's patterns, compiled when a record first passes the needles (~2 ms, not paid for a log without
    any catalogued text)."""
    return tuple((rule, tuple(re.compile(p) for p in rule.patterns)) for rule in RULES)


def match_event(record: KmsgRecord) -> tuple[Rule, str] | None:
    """The first rule whose text the record's message holds, with its `per` key; or None."""
    message = record.message
    if not _NEEDLES.search(message):
        return None
    message = _CALLER_RE().sub("", message, count=1)
    for rule, patterns in _compiled():
        for pattern in patterns:
            found = pattern.search(message)
            if found is not None:
                return rule, (found.group(rule.per) or "") if rule.per else ""
    return None


def match_record(record: KmsgRecord) -> Rule | None:
    """The first rule whose text the record's message holds, or None."""
    matched = match_event(record)
    return None if matched is None else matched[0]


def _events(records: Iterable[KmsgRecord]) -> Iterator[KernelEvent]:
    # NetworkManager logs one drop twice where it logs "link disconnected" (older releases, or at debug level): then,
    # the link still down, its state change for the carrier. Counted once: the state change of a port whose
    # "link disconnected" was counted is the same drop.
    disconnected: set[str] = set()
    for record in records:
        matched = match_event(record)
        if matched is None:
            continue
        rule, key = matched
        if rule.id == "net.link_flap" and record.message.startswith("NetworkManager["):
            if _NM_STATE_RE().match(record.message):
                if key in disconnected:
                    disconnected.discard(key)
                    continue
            elif len(disconnected) < _MAX_PORTS:
                disconnected.add(key)
        yield KernelEvent(rule.id, record, key)


def parse_kernel_events(records: Iterable[KmsgRecord]) -> tuple[KernelEvent, ...]:
    """The catalogued events of the log's last boot (all of it unless its since-boot clock restarts)."""
    kept = records if isinstance(records, (list, tuple)) else tuple(records)
    return tuple(_events(kept[boot_start(kept):]))
