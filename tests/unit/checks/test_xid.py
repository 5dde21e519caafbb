"""gpu.xid over the whole Xid catalogue, real kernel logs, and this boot's records only.

Real lines: fixtures/kmsg/ (byte-identical gpud test data, fixtures/SOURCES.md) and NVLink5 lines
quoted from production kmsg in leptonai/gpud pull requests #1160 and #1174.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from agent.core.facts import KmsgRecord, NodeFacts, XidEvent
from agent.core.model import Finding, Severity, Status
from agent.core.xid_catalog import ACTIONS, APPLICATION_ACTIONS, CATALOG, NVL5_ROWS, NVL5_UNITS, classify
from agent.sources.kmsg import boot_start, parse_kmsg_line, parse_kmsg_text, predates_boot, wall_time
from agent.sources.xid import parse_xid, parse_xids
from checks.gpu_xid import XID
from tests.conftest import REPO, RunCli
from tests.factories import gpu, host, node, profile

KMSG = REPO / "fixtures" / "kmsg"
UTC = dt.timezone.utc


def read(name: str) -> tuple[KmsgRecord, ...]:
    return parse_kmsg_text((KMSG / name).read_text(encoding="utf-8").splitlines())


def audit(xids: tuple[XidEvent, ...], buses: tuple[str, ...] = ("19",), observed: dt.datetime | None = None,
          uptime_s: float = 36000.0) -> dict[str, Finding]:
    """gpu.xid over GPUs on PCI only (no NVML), as the check sees a node."""
    pci = tuple(gpu(f"0000:{bus}:00.0") for bus in buses)
    facts: NodeFacts = node(host(pci=pci, uptime_s=uptime_s), xids=xids, observed_at=observed)
    return {f.subject: f for f in XID.run(facts, profile({}))}


def xid_line(code: int, text: str, bus: str = "19") -> KmsgRecord:
    return KmsgRecord(f"NVRM: Xid (PCI:0000:{bus}:00): {code}, {text}")


def one(code: int, text: str) -> Finding:
    return audit(parse_xids([xid_line(code, text)]))["gpu0"]


# --- the table --------------------------------------------------------------------------------------


def test_every_catalogue_code_has_an_action_and_a_severity() -> None:
    assert sorted(CATALOG) == list(range(1, 173))  # the catalogue as transcribed ends at Xid 172
    for code, entry in CATALOG.items():
        assert entry.action in ACTIONS and isinstance(entry.severity, Severity), code
        assert entry.mnemonic.isupper() and entry.description, code
    assert {e.action for e in CATALOG.values()} == set(ACTIONS)  # each action is used somewhere
    units = {u.name for u in NVL5_UNITS}
    assert set(NVL5_ROWS) == units and {u.xid for u in NVL5_UNITS} == set(range(144, 151))
    source = (REPO / "agent" / "core" / "xid_catalog.py").read_text(encoding="utf-8")
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in source


def test_no_application_xid_fails_however_it_is_classified() -> None:
    for code, entry in CATALOG.items():
        if entry.action in APPLICATION_ACTIONS:
            assert one(code, "pid=1, name=app, x").status is Status.WARN, code


# --- one class each ---------------------------------------------------------------------------------


def test_application_xids_from_a_real_log_are_informational_and_deduplicated() -> None:
    """629 Xid 13 and 7 Xid 43 of one training job (dmesg --decode --time-format=iso)."""
    xids = parse_xids(read("dmesg.decode.iso.log.0"))
    assert len(xids) == 636 and all(x.wall for x in xids)
    finding = audit(xids, buses=("38",), observed=dt.datetime(2025, 1, 21, 5, 0, tzinfo=UTC))["gpu0"]
    assert finding.status is Status.WARN and finding.severity is Severity.INFO
    assert finding.observed == {"13": 629, "43": 7} and finding.action == "restart_app"
    assert "Xid 13 x629" in finding.message and "Xid 43 x7" in finding.message
    assert finding.message.count("Xid ") == 2  # one part per code, not one per line


def test_reset_gpu_class() -> None:
    finding = one(62, "223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c")
    assert (finding.status, finding.severity, finding.action) == (Status.FAIL, Severity.CRITICAL, "reset_gpu")
    assert one(95, "pid='<unknown>', name=<unknown>, Uncontained: FBHUB. RST: Yes, D-RST: No").action == "reset_gpu"
    assert one(48, "pid='<unknown>', name=<unknown>, An uncorrectable double bit error").action == "reset_gpu"


def test_real_dbe_with_row_remap_is_drain_and_reset() -> None:
    """dmesg.0.log: Xid 48, then 63 (row remapped) and 94 (contained) x9 on one H100."""
    xids = parse_xids(read("dmesg.0.log"))
    finding = audit(xids, observed=dt.datetime(2024, 11, 15, 13, 0, tzinfo=UTC), uptime_s=7200)["gpu0"]
    assert finding.observed == {"48": 1, "63": 1, "94": 9}
    assert (finding.status, finding.severity, finding.action) == (Status.FAIL, Severity.CRITICAL, "drain")
    assert finding.reason is not None and finding.reason.startswith("Xid 48: ")
    assert "x9" in finding.message


@pytest.mark.parametrize(("code", "text", "action"), [
    (79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", "drain"),
    (154, "pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
          "Required)", "reboot"),
    (154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "drain"),
])
def test_reboot_and_drain_class(code: int, text: str, action: str) -> None:
    finding = one(code, text)
    assert (finding.status, finding.severity, finding.action) == (Status.FAIL, Severity.CRITICAL, action)


def test_xid_154_names_the_action_for_the_xid_before_it() -> None:
    """An RLW_REMAP status the catalogue sends to Xid 154 takes the action 154 names."""
    xids = parse_xids([
        xid_line(145, "RLW_REMAP Nonfatal XC0 i0 Link 07 (0x00000004 0x00000001 0x00000000 0x00000000)"),
        xid_line(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")])
    finding = audit(xids)["gpu0"]
    assert (finding.status, finding.action) == (Status.FAIL, "reset_gpu")
    assert finding.reason is not None and finding.reason.startswith("Xid 154")
    alone = one(145, "RLW_REMAP Nonfatal XC0 i0 Link 07 (0x00000004 0x00000001 0x00000000 0x00000000)")
    assert (alone.status, alone.action) == (Status.WARN, "restart_app")


def test_mechanicals_class() -> None:
    finding = one(54, "pid='<unknown>', name=<unknown>, Auxiliary power is not connected to the GPU board")
    assert (finding.status, finding.action) == (Status.FAIL, "check_mechanicals")


def test_firmware_class() -> None:
    finding = one(78, "pid='<unknown>', name=<unknown>, vGPU Start Error: Guest driver is incompatible with host")
    assert finding.action == "update_firmware" and finding.status is Status.FAIL


@pytest.mark.parametrize(("code", "text", "status", "action"), [
    # NVIDIA's non-fatal sub-codes warn
    (144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
     Status.WARN, "ignore"),
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
     Status.WARN, "ignore"),
    # link down, reason 38 (IntrInfo[25:20]): the catalogue's IGNORE although the driver says Fatal
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     Status.WARN, "ignore"),
    # fatal ones reset the GPU: link down caused by the peer (reason 37), NETIR, SAW status 0x2, MSE
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     Status.FAIL, "reset_gpu"),
    (149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     Status.FAIL, "reset_gpu"),
    (144, "pid='<unknown>', name=<unknown>, SAW_MVB Fatal XC0 i0 Link 02 (0x00000001 0x00000002 0x0 0x0)",
     Status.FAIL, "reset_gpu"),
    (150, "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     Status.FAIL, "reset_gpu"),
    # RXPIPE status 0x1 is promotable: IntrInfo bit 10 (V1) set means NVIDIA's action 2, RESET_GPU
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a4c2 0x00000001 0x00000000 0x00000000)",
     Status.FAIL, "reset_gpu"),
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000001 0x00000000 0x00000000)",
     Status.WARN, "ignore"),
    # unit known only by its R575+ (V2) IntrInfo code 0x0c (TLW_TX pipe 0), status 0x4 fatal
    (146, "TLW_SOMETHING Fatal XC0 i0 Link 03 (0x0000000c 0x00000004 0x00000000 0x00000000)", Status.FAIL,
     "reset_gpu"),
    # not in the decode: the driver's word decides
    (147, "TREX Nonfatal XC0 i0 Link 01 (0x00000184 0x00000040 0x00000000 0x00000000)", Status.WARN,
     "contact_support"),
])
def test_nvlink5_fatal_and_non_fatal_sub_codes(code: int, text: str, status: Status, action: str) -> None:
    finding = one(code, text)
    assert (finding.status, finding.action) == (status, action), finding.message
    assert finding.severity is (Severity.CRITICAL if status is Status.FAIL else Severity.WARNING)
    assert "NVLink5" in finding.message


def test_nvlink5_worst_sub_code_of_a_gpu_wins() -> None:
    xids = parse_xids([
        xid_line(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x0 0x0)"),
        xid_line(145, "RLW_SRC_TRACK Fatal XC0 i0 Link 13 (0x000000e2 0x00000001 0x0 0x0)"),
        xid_line(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x0 0x0)")])
    finding = audit(xids)["gpu0"]
    assert finding.status is Status.FAIL and finding.observed == {"145": 3} and "RLW_SRC_TRACK" in finding.message


def test_unknown_code_warns_with_contact_support() -> None:
    finding = one(231, "pid='<unknown>', name=<unknown>, a code from a newer driver")
    assert (finding.status, finding.severity, finding.action) == (Status.WARN, Severity.WARNING, "contact_support")
    assert "not in nodewarden's table" in finding.message
    assert classify(231).action == "contact_support"


# --- rule 12: kernel-log time ----------------------------------------------------------------------


def test_wall_clock_formats_are_read() -> None:
    journal = read("journalctl-short-iso.a800.log")  # journalctl -k -o short-iso, +0800, no fraction
    assert journal[0].message == "docker0: port 1(vetha17b2cc) entered disabled state"  # "HOST kernel: " gone
    assert wall_time(journal[0].wall) == dt.datetime(2025, 1, 2, 7, 20, 12, tzinfo=UTC)
    ctime = read("dmesg.ctime.boot.a10-535.129.03.log")  # dmesg --ctime: local time, no zone
    first = next(r for r in ctime if r.message.startswith("Linux version"))
    assert wall_time(first.wall) == dt.datetime(2024, 7, 18, 16, 3, 50) and first.ts_usec is None
    iso = read("dmesg.0.log")[0]
    assert wall_time(iso.wall) == dt.datetime(2024, 11, 15, 5, 39, 15, 491363, tzinfo=UTC)
    # journalctl -o short-precise / syslog: no year, taken from the observation time
    precise = parse_kmsg_line("Jan 02 15:20:12.123456 gpu-node-7 kernel: NVRM: Xid (PCI:0000:19:00): 79, GPU has "
                              "fallen off the bus.")
    assert precise is not None and precise.message.startswith("NVRM: Xid")
    assert wall_time(precise.wall, dt.datetime(2025, 3, 1, tzinfo=UTC)) == dt.datetime(2025, 1, 2, 15, 20, 12, 123456)
    assert wall_time(precise.wall, dt.datetime(2025, 1, 1, tzinfo=UTC)) == dt.datetime(2024, 1, 2, 15, 20, 12, 123456)
    assert wall_time(precise.wall) is None  # no year, no reference: unknown, so never dropped
    kern_log = parse_kmsg_line("Jan  2 15:20:12 node kernel: [ 4242.000001] NVRM: Xid (PCI:0000:19:00): 48, x")
    assert kern_log is not None and kern_log.ts_usec == 4_242_000_001 and kern_log.message.startswith("NVRM")
    decoded = parse_kmsg_line("kern  :warn  : [Thu Jul 18 16:03:50 2024] NVRM: Xid (PCI:0000:19:00): 13, x")
    assert decoded is not None and decoded.priority == 4 and decoded.wall == "Thu Jul 18 16:03:50 2024"


def test_records_older_than_the_boot_are_dropped() -> None:
    """dmesg.0.log's Xids were logged at 12:02 UTC: a node that booted at 12:30 did not see them."""
    xids = parse_xids(read("dmesg.0.log"))
    observed = dt.datetime(2024, 11, 15, 13, 0, tzinfo=UTC)
    rebooted = audit(xids, observed=observed, uptime_s=1800)["gpu0"]
    assert rebooted.status is Status.PASS and "11 Xid records in the log predate this boot" in rebooted.message
    assert audit(xids, observed=observed, uptime_s=7200)["gpu0"].status is Status.FAIL
    assert audit(xids, observed=None)["gpu0"].status is Status.FAIL  # boot time unknown: nothing is dropped


def test_local_time_stamps_predate_the_boot_only_in_every_time_zone() -> None:
    boot = dt.datetime(2024, 7, 20, 0, 0, tzinfo=UTC)
    assert predates_boot("Thu Jul 18 16:03:50 2024", boot)  # a day and more before, whatever the zone
    assert not predates_boot("Fri Jul 19 16:03:50 2024", boot)  # 8 h before in UTC: could be this boot
    assert not predates_boot("2024-07-19T23:55:00+00:00", boot)  # inside the slack for clock steps
    assert predates_boot("2024-07-19T16:00:00-04:00", boot)
    assert not predates_boot(None, boot) and not predates_boot("2024-07-01T00:00:00Z", None)


def test_monotonic_records_are_this_boot_unless_the_clock_restarts() -> None:
    drifted = (REPO / "fixtures" / "nodes" / "hgx-h100-drifted" / "kmsg.txt").read_text().splitlines()
    records = parse_kmsg_text(drifted)
    assert boot_start(records) == 0 and [x.xid for x in parse_xids(records)] == [79]
    next_boot = ["5,0,0,-;Linux version 5.15.0-119-generic (buildd@lcy02-amd64-075)",
                 "6,1,4000,-;Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-119-generic ro",
                 "4,2,9000000,-;NVRM: Xid (PCI:0000:19:00): 13, pid=7, name=python3, Graphics Exception"]
    both = parse_kmsg_text([*drifted, *next_boot])
    assert [x.xid for x in parse_xids(both)] == [13]  # the earlier boot's Xid 79 is gone
    plain = parse_kmsg_text(["[ 5000.000000] NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus.",
                             "[    0.000000] Linux version 6.8.0", "[   12.000000] nvidia: loading"])
    assert parse_xids(plain) == ()
    jitter = parse_kmsg_text(["[ 10.000500] a", "[ 10.000100] b (another CPU, logged a little earlier)"])
    assert boot_start(jitter) == 0


def test_the_daemon_entry_point_keeps_its_signature() -> None:
    event = parse_xid(KmsgRecord("NVRM: Xid (PCI:0000:DB:00): 79, GPU has fallen off the bus.", ts_usec=5))
    assert event is not None and (event.pci_bus_id, event.xid, event.ts_usec) == ("0000:db:00.0", 79, 5)


def test_a_snapshot_judges_its_log_from_captured_at_minus_uptime(run_cli: RunCli, drifted_copy: Path,
                                                                  empty_config: Path) -> None:
    """captured_at 2026-11-20T08:00Z minus fs/proc/uptime (268151 s): booted 2026-11-16 21:30 UTC."""
    kmsg = drifted_copy / "kmsg.txt"
    old = (KMSG / "dmesg.0.log").read_text(encoding="utf-8") + "\n"  # 2024: an earlier boot (no final newline)
    os.unlink(kmsg)
    kmsg.write_text(old + "2026-11-19T04:00:00,000001+00:00 NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', "
                    "name=<unknown>, GPU has fallen off the bus.\n", encoding="utf-8")
    result = run_cli("audit", "--snapshot", str(drifted_copy), "--config", str(empty_config), "--only", "gpu.xid",
                     "--format", "json")
    findings = {f["subject"]: f for f in json.loads(result.stdout)["findings"]}
    assert findings["gpu0"]["status"] == "pass" and "predate this boot" in findings["gpu0"]["message"]
    assert findings["gpu7"]["status"] == "fail" and findings["gpu7"]["observed"] == {"79": 1}
