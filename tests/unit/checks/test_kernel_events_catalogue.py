"""The kernel event catalogue (issue 22 item 6): every rule caught on real lines, read by grammar.

`fixtures/kernel-events/catalogue-examples.log` holds one real line per spelling the catalogue reads
(provenance per line in its SOURCES.md); with the corpus's kernel logs (`fixtures/kmsg/`) every rule of
agent/sources/kernel_events.py has a real example. The file carries no timestamps (`dmesg -t`): its
audit below is also the oracle for a log without time, which must be judged, never refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.core.facts import KmsgRecord, NodeFacts
from agent.core.model import Status
from agent.sources.kernel_events import BY_ID, match_record
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.kmsg import read_recorded_kmsg
from checks.host_kernel_events import EVENTS
from tests.conftest import REPO
from tests.factories import host, profile

EXAMPLES = REPO / "fixtures" / "kernel-events" / "catalogue-examples.log"
# A real syslog (Azure/azurehpc-health-checks, MIT): user-space lines only, an IB port losing its carrier six times
FLAP_SYSLOG = REPO / "fixtures" / "kernel-events" / "azurehpc-1dev_6flap_syslog.excerpt.log"
CORPUS_LOGS = sorted((REPO / "fixtures" / "kmsg").glob("*"))

# Every line of the capture and the event it is (None: a line of an event's context that is no event itself).
READ_AS: dict[str, str | None] = {
    "watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:2254956]": "kernel.soft_lockup",
    "INFO: task jfsmount:136986 blocked for more than 120 seconds.": "kernel.hung_task",
    "NMI watchdog: Watchdog detected hard LOCKUP on cpu 161": "kernel.hard_lockup",
    "INFO: rcu_sched detected stalls on CPUs/tasks: { 1} (detected by 0, t=60002 jiffies, g=4694188, c=4694187, "
    "q=53)": "kernel.rcu_stall",
    "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 1: b000000000000000": "mce.uncorrected",
    "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: 9c2041000000011b": "mce.corrected",
    "mce: [Hardware Error]: Machine check events logged": "mce.corrected",
    "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 5": None,
    "{1}[Hardware Error]: event severity: fatal": "mce.uncorrected",
    "{2}[Hardware Error]: It has been corrected by h/w and requires no further action": None,
    "{2}[Hardware Error]: event severity: corrected": "mce.corrected",
    "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (xxx xxx)": "edac.uncorrected",
    "nvme 0000:02:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)": "pcie.aer.corrected",
    "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: id=0008": "pcie.aer.uncorrected",
    "nvme nvme4: I/O tag 22 (2016) opcode 0x2 (Admin Cmd) QID 0 timeout, reset controller": "nvme.timeout",
    "nvme nvme4: Disabling device after reset failure: -19": "nvme.timeout",
    "block nvme0n1: no available path - failing I/O": "nvme.timeout",
    "blk_update_request: critical medium error, dev sdv, sector 21493673360 op 0x0:(READ) flags 0x1000 phys_seg 1 "
    "prio class 0": "block.io_error",
    "critical target error, dev sdd, sector 4224 op 0x1:(WRITE) flags 0x23800 phys_seg 1 prio class 0":
        "block.io_error",
    "print_req_error: critical target error, dev sdb, sector 0 flags 0": "block.io_error",
    "end_request: I/O error, dev sda, sector 63": "block.io_error",
    "Buffer I/O error on dev dm-0, logical block 1308098575, lost async page write": "block.io_error",
    "EXT4-fs (dm-0): I/O error while writing superblock": "fs.corruption",
    "EXT4-fs (md0): Remounting filesystem read-only": "fs.corruption",
    "XFS (sda6): Filesystem has been shut down due to log error (0x2).": "fs.corruption",
    "BUG: unable to handle kernel NULL pointer dereference at   (null)": "kernel.oops",
    "Oops: 0002 [#1] PREEMPT SMP": "kernel.oops",
    "divide error: 0000 [#1] PREEMPT SMP KASAN": "kernel.oops",
    "Oops: divide error: 0000 [#1] SMP NOPTI": "kernel.oops",
    "general protection fault, probably for non-canonical address 0xdffffc0000000000: 0000 [#1] SMP KASAN": "kernel.oops",
    "kernel BUG at mm/slub.c:294!": "kernel.oops",
    "invalid opcode: 0000 [#1] SMP PTI": "kernel.oops",
    "Memory cgroup out of memory: Kill process 19636 (evil-program2) score 1923 or sacrifice child":
        "mm.oom_kill.memcg",
    "Kernel panic - not syncing: Test panic triggered by crash_test module": "kernel.panic",
    "mlx5_core 0000:02:00.0 ens2f0np0: Link down": "net.link_flap",
    "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down": "net.link_flap",
    "mlx5_core 0000:01:00.1 enp1s0f1np1: Link down": "net.link_flap",
    "unregister_netdevice: waiting for vxlan1 to become free. Usage count = 11": "net.unregister_netdevice",
}
EDAC_CE_PREFIX = "EDAC MC0: 1 CE Single-symbol ChipKill ECC on 0x0000 (node:0 card:0 module:0 rank:0 bank:1026 "

# Lines that look like an event and are not one, each beside the real line of the spelling it resembles:
# a user-space trap, an empty SATA bay, an unsupported discard, a port coming up, ext4 remounting read-write.
LOOKALIKES = [
    ("traps: python3[4242] trap divide error ip:55d0c0ffee00 sp:7ffd0badf00d error:0 in python3.10[55d0c0f00000+2000]",
     "divide error: 0000 [#1] PREEMPT SMP KASAN"),
    ("traps: a.out[123] general protection fault ip:401136 sp:7ffc9e1ff0a0 error:0 in a.out[401000+1000]",
     "invalid opcode: 0000 [#1] SMP PTI"),
    ("ata5: SATA link down (SStatus 0 SControl 300)", "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down"),
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link up", "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down"),
    ("operation not supported error, dev nvme0n1, sector 0 op 0x3:(DISCARD) flags 0x800 phys_seg 1 prio class 0",
     "critical target error, dev sdd, sector 4224 op 0x1:(WRITE) flags 0x23800 phys_seg 1 prio class 0"),
    ("EXT4-fs (sda1): re-mounted 2d36df53-678c-49a7-9d59-05a1af7661df r/w. Quota mode: none.",
     "EXT4-fs (dm-0): I/O error while writing superblock"),
]


def rec(message: str, ts_s: float | None = None) -> KmsgRecord:
    return KmsgRecord(message=message, ts_usec=None if ts_s is None else int(ts_s * 1e6), wall=None)


def example_lines() -> list[str]:
    return EXAMPLES.read_text(encoding="utf-8").splitlines()


def read_as(line: str) -> str | None:
    if line.startswith(EDAC_CE_PREFIX):
        return "edac.corrected"
    return READ_AS[line]


# --- the catalogue against its real lines -------------------------------------------------------------


@pytest.mark.parametrize("line", example_lines())
def test_each_real_line_is_read_as_its_event(line: str) -> None:
    rule = match_record(rec(line))
    assert (rule.id if rule else None) == read_as(line)


def test_every_rule_has_a_real_example_in_the_corpus() -> None:
    lines = example_lines()
    assert len(lines) == len(READ_AS) + 1  # + the long EDAC CE line, matched by its prefix
    for line in lines:
        assert line in READ_AS or line.startswith(EDAC_CE_PREFIX), f"no expected reading for {line!r}"
    seen = {rule.id for line in example_lines() if (rule := match_record(rec(line))) is not None}
    for log in CORPUS_LOGS:
        records = read_recorded_kmsg(log)
        assert isinstance(records, tuple), log
        seen |= {rule.id for r in records if (rule := match_record(r)) is not None}
    assert sorted(set(BY_ID) - seen) == [], "catalogue rules without a real example line in fixtures/"
    readings = {reading for line in lines if (reading := read_as(line)) is not None}
    assert sorted(readings - set(BY_ID)) == [], "expected readings the catalogue lacks"


def source_rows() -> list[tuple[list[int], str]]:
    """SOURCES.md's table: the example lines of each row and the row's licence cell."""
    rows = []
    for row in (EXAMPLES.parent / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if row.startswith("| ") and re.fullmatch(r"\d+(?:, \d+)*", cells[0]):
            rows.append(([int(n) for n in cells[0].split(", ")], cells[4]))
    return rows


def test_every_line_has_one_source_row_with_a_licence_or_the_search_made() -> None:
    # a line without a licensed source keeps its place only with the record of the search for one (item 6)
    rows = source_rows()
    numbers = sorted(n for lines, _ in rows for n in lines)
    assert numbers == list(range(1, len(example_lines()) + 1)), "each example line needs exactly one row"
    for lines, licence in rows:
        if "none stated" in licence:
            assert "searched:" in licence and "none licensed found" in licence, lines
            continue
        texts = re.findall(r"`((?:\.\./)?LICENSES/[\w.-]+\.txt)`", licence)
        assert texts, f"lines {lines}: a licensed row names its licence text"
        for text in texts:
            assert (EXAMPLES.parent / text).is_file(), text


@pytest.mark.parametrize(("lookalike", "real"), LOOKALIKES)
def test_lookalikes_are_not_events_but_the_real_spelling_is(lookalike: str, real: str) -> None:
    assert match_record(rec(lookalike)) is None
    rule = match_record(rec(real))
    assert rule is not None and rule.id == read_as(real)


def test_the_check_reference_names_every_event_with_its_severity_and_action() -> None:
    for rule in BY_ID.values():
        assert f"{rule.id} {rule.severity.value}/{rule.action}" in EVENTS.evidence, rule.id


# --- link drops are counted per port ------------------------------------------------------------------


def _findings(records: tuple[KmsgRecord, ...]) -> dict[str, dict[str, object]]:
    facts = parse_kernel_log(NodeFacts(host=host(uptime_s=1_000_000.0), kmsg=records))
    return {f.subject: f.to_json() for f in EVENTS.run(facts, profile({}))}


def test_one_drop_on_each_port_is_not_a_flap() -> None:
    lines = [line for line in example_lines() if line.endswith(": Link down")]
    found = _findings(tuple(rec(line, 100.0 + i) for i, line in enumerate(lines)))
    flap = found["net.link_flap"]
    assert flap["status"] == "pass" and flap["observed"]["count"] == 3  # type: ignore[index]
    assert flap["observed"]["port"] == {"ens2f0np0": 1, "enp1s0f0np0": 1, "enp1s0f1np1": 1}  # type: ignore[index]


def test_a_port_dropping_twice_is_a_flap_with_its_count() -> None:
    down = "mlx5_core 0000:02:00.0 ens2f0np0: Link down"
    up = "mlx5_core 0000:02:00.0 ens2f0np0: Link up"
    found = _findings((rec(down, 10.0), rec(up, 12.0), rec(down, 3600.0), rec(up, 3601.0), rec(down, 7200.0)))
    flap = found["net.link_flap"]
    assert (flap["status"], flap["severity"], flap["action"]) == ("warn", "warning", "check_mechanicals")
    assert flap["observed"]["port"] == {"ens2f0np0": 3}  # type: ignore[index]
    assert "most on port ens2f0np0: 3" in str(flap["message"])


def test_ports_counted_are_bounded() -> None:
    records = tuple(rec(f"mlx5_core 0000:02:00.0 eth{i}: Link down", float(i + 1)) for i in range(500))
    flap = _findings(records)["net.link_flap"]
    ports = flap["observed"]["port"]  # type: ignore[index]
    assert len(ports) == 65 and ports["(other)"] == 436  # 64 ports by name, the rest counted together
    assert flap["status"] == "pass"  # 500 ports down once each: no port flapped


def audit_kernel_log(tmp_path: Path, log: Path, hostname: str, captured_at: str) -> dict[str, Any]:
    """The JSON report of `audit --snapshot` of a snapshot holding only `log` as its kernel log."""
    (tmp_path / "kmsg.txt").write_bytes(log.read_bytes())
    (tmp_path / "meta.yaml").write_text(f"hostname: {hostname}\ncaptured_at: '{captured_at}'\n"
                                        "nodewarden_version: corpus\ncaptured: [kmsg]\n", encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["audit", "--config", str(config), "--snapshot", str(tmp_path),
                                      "--format", "json"], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def kernel_events(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"] if f["check"] == "host.kernel.events"}


# --- the capture audited: a log without timestamps is judged, never refused ------------------------------


def test_the_capture_without_timestamps_is_audited(tmp_path: Path) -> None:
    found = kernel_events(audit_kernel_log(tmp_path, EXAMPLES, "corpus", "2026-01-01T00:00:00+00:00"))
    # every catalogued event of the capture is reported; link drops (one per port) pass
    events = {read_as(line) for line in example_lines()} - {None}
    assert set(found) == events
    assert found["net.link_flap"]["status"] == "pass"
    assert found["kernel.panic"]["status"] in ("warn", "fail")
    assert all(f["status"] != Status.UNKNOWN.value for f in found.values())


# --- a real syslog of an IB port flapping: the oracle of its reading ------------------------------------------


def test_the_flapping_ib_port_syslog_reads_as_an_sre_reads_it(tmp_path: Path) -> None:
    lines = FLAP_SYSLOG.read_text(encoding="utf-8").splitlines()
    # every line a user-space one; the six carrier losses of ib6 are the only events (its gains are records, no event)
    losses = [line for line in lines if line.endswith("systemd-networkd[5398]: ib6: lost carrier")]
    assert len(losses) == 6
    row = next(r for r in (EXAMPLES.parent / "SOURCES.md").read_text(encoding="utf-8").splitlines()
               if r.startswith(f"| `{FLAP_SYSLOG.name}`"))
    licence = re.findall(r"`((?:\.\./)?LICENSES/[\w.-]+\.txt)`", row)
    assert licence and all((EXAMPLES.parent / text).is_file() for text in licence) and "MIT" in row
    report = audit_kernel_log(tmp_path, FLAP_SYSLOG, "jplc7eb7-vm-0", "2025-08-17T06:20:00+00:00")
    found = kernel_events(report)
    # six carrier losses of one IB port since boot: a flapping link, warn and check its cable/optic/switch port
    assert set(found) == {"net.link_flap"}
    flap = found["net.link_flap"]
    assert (flap["status"], flap["severity"], flap["action"]) == ("warn", "warning", "check_mechanicals")
    assert flap["observed"]["port"] == {"ib6": 6} and flap["observed"]["count"] == 6
    assert "since boot" in flap["message"] and "Aug 17 06:18:01" in flap["message"]
    assert not [f for f in report["findings"] if f["severity"] == "critical" and f["status"] == "fail"]
