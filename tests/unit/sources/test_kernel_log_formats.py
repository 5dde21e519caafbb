"""Every kernel-log format people send (issue 22 item 5), read by grammar, and the caveat of a log without time.

The inputs are real captures from fixtures/kmsg/ (fixtures/kmsg SOURCES rows): gpud's `dmesg
--time-format=iso` of an H100 node whose GPU 0000:19:00 logs Xid 48 -> 63 -> 94 (dmesg.0.log), gpud's
`journalctl -k -o short-iso` of an A800 host, and a raw pstore ERST record ("Panic#1 Part1", "<6>[...]").
The other formats are the same records printed the way `dmesg -t`, `dmesg -H`, `journalctl -o short`,
`short-monotonic` and rsyslog print them (the format rewritten, never a record), so each must reach the
same Xids; syslog files get user-space lines mixed in, one of them quoting an Xid, which must never be
judged.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import KmsgRecord, NodeFacts
from agent.policy.profiles import ProfileStore
from agent.sources.importers.kernel_log import KernelLogImporter
from agent.sources.kernel_log import parse_kernel_log
from agent.sources.kmsg import EARLIER_BOOT, line_grammar, parse_kmsg_text, predates_boot, wall_time
from agent.sources.xid import parse_xids
from checks.gpu_xid import XID
from checks.host_kernel_events import EVENTS
from tests.conftest import REPO, RunCli
from tests.factories import host

KMSG = REPO / "fixtures" / "kmsg"
ISO_LOG = KMSG / "dmesg.0.log"
JOURNAL = KMSG / "journalctl-short-iso.a800.log"
PSTORE = KMSG / "pstore-dmesg-erst-7530486857247752193.txt"
USER_XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."  # quoted by a program


def _iso_records() -> list[tuple[dt.datetime, str]]:
    """(time, message) of every line of the real `dmesg --time-format=iso` capture."""
    out = []
    for line in ISO_LOG.read_text(encoding="utf-8").splitlines():
        stamp, _, message = line.partition(" ")
        out.append((dt.datetime.fromisoformat(stamp.replace(",", ".")), message))
    return out


def _dmesg_t() -> str:
    return "".join(f"{message}\n" for _, message in _iso_records())


def _dmesg_plain() -> str:
    """Plain `dmesg`: the same records with seconds since the first as the since-boot stamp."""
    records = _iso_records()
    return "".join(f"[{(when - records[0][0]).total_seconds() + 5:12.6f}] {message}\n" for when, message in records)


def _reltime() -> str:
    """`dmesg -H`: a "[Nov15 05:39]" stamp when the minute changes, "[  +0.011128]" offsets between."""
    lines, last = [], None
    for when, message in _iso_records():
        if last is None or when.replace(second=0, microsecond=0) != last.replace(second=0, microsecond=0):
            lines.append(f"[{when:%b}{when.day} {when:%H:%M}] {message}")
        else:
            delta = (when - last).total_seconds()
            lines.append(f"[  +{delta:.6f}] {message}")
        last = when
    return "\n".join(lines) + "\n"


def _syslog(precise: bool) -> str:
    """rsyslog / `journalctl -o short(-precise)`: the kernel lines with user-space lines between them."""
    lines = []
    for i, (when, message) in enumerate(_iso_records()):
        stamp = f"{when:%b} {when.day:2d} {when:%H:%M:%S}" + (f".{when:%f}" if precise else "")
        lines.append(f"{stamp} h100-node kernel: {message}")
        lines.append(f"{stamp} h100-node dockerd[{1000 + i}]: " + (USER_XID if i == 3 else "container exited"))
    return "\n".join(lines) + "\n"


def _short_monotonic() -> str:
    start = _iso_records()[0][0]
    return "".join(f"[{(when - start).total_seconds() + 100:12.6f}] h100-node kernel: {message}\n"
                   for when, message in _iso_records())


def _iso_syslog() -> str:
    """journalctl -o short-iso of the whole journal: the A800 capture's kernel lines, user-space lines between."""
    lines = []
    for i, line in enumerate(JOURNAL.read_text(encoding="utf-8").splitlines()):
        lines.append(line)
        stamp, host_name = line.split(" ")[:2]
        lines.append(f"{stamp} {host_name} containerd[{2000 + i}]: " + (USER_XID if i == 0 else "shim exited"))
    return "\n".join(lines) + "\n"


def _import_and_audit(run_cli: RunCli, tmp_path: Path, text: str, config: Path) -> dict[str, Any]:
    log = tmp_path / "kernel.log"
    log.write_text(text, encoding="utf-8")
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(log), "--out", str(out))
    assert result.code == 0, result.stdout + result.stderr
    audit = run_cli("audit", "--snapshot", str(out), "--config", str(config), "--format", "json")
    assert audit.code in (0, 1) and "Traceback" not in audit.stderr, audit.stderr
    return json.loads(audit.stdout)  # type: ignore[no-any-return]


def _xid_findings(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"] if f["check"] == "gpu.xid"}


# --- stamped formats: imported, and the same Xids judged as of this boot -----------------------------


@pytest.mark.parametrize("fmt", ["dmesg-H", "syslog", "syslog-precise", "short-monotonic"])
def test_stamped_formats_import_and_reach_the_xids(fmt: str, run_cli: RunCli, tmp_path: Path,
                                                   empty_config: Path) -> None:
    text = {"dmesg-H": _reltime, "syslog": lambda: _syslog(False), "syslog-precise": lambda: _syslog(True),
            "short-monotonic": _short_monotonic}[fmt]()
    records = parse_kmsg_text(text.splitlines())
    assert [r.message for r in records] == [message for _, message in _iso_records()]  # kernel records, as printed
    xids = _xid_findings(_import_and_audit(run_cli, tmp_path, text, empty_config))
    gpu = xids["pci:0000:19:00.0"]
    assert (gpu["status"], gpu["severity"], gpu["action"]) == ("fail", "critical", "drain")
    assert "pci:0000:3b:00.0" not in xids  # the Xid a program quoted in a user-space line is not judged


def test_reltime_offsets_add_up_to_the_original_times() -> None:
    original = _iso_records()
    records = parse_kmsg_text(_reltime().splitlines())
    assert len(records) == len(original)
    reference = dt.datetime(2024, 12, 1)
    for (when, message), record in zip(original, records, strict=True):
        assert record.message == message
        got = wall_time(record.wall, reference)
        assert got is not None
        # the "[Nov15 05:39]" stamp has minute precision: each record lands within a minute of its time
        assert abs((got - when.replace(tzinfo=None)).total_seconds()) < 60


def test_syslog_user_space_lines_are_recognised_not_records() -> None:
    text = _syslog(False).splitlines()
    assert line_grammar(text[1]) == "syslog-user"
    records = parse_kmsg_text(text)
    assert len(records) == len(_iso_records())  # the kernel lines only
    assert all(not r.message.startswith("h100-node") for r in records)
    iso_text = _iso_syslog().splitlines()
    assert not any(x.pci_bus_id == "0000:3b:00.0" for x in parse_xids(parse_kmsg_text(iso_text)))
    assert len(parse_kmsg_text(iso_text)) == len(JOURNAL.read_text(encoding="utf-8").splitlines())
    # A kmsg.txt fed by both a journal and `dmesg --time-format=iso`: dmesg's lines name no host, and stay.
    both = parse_kmsg_text(iso_text + ISO_LOG.read_text(encoding="utf-8").splitlines())
    assert len(parse_xids(both)) == sum("NVRM: Xid" in m for _, m in _iso_records()) > 0


def test_iso_syslog_with_user_space_lines_imports(run_cli: RunCli, tmp_path: Path, empty_config: Path) -> None:
    report = _import_and_audit(run_cli, tmp_path, _iso_syslog(), empty_config)
    assert "pci:0000:3b:00.0" not in _xid_findings(report)


def test_pstore_records_are_read_with_their_level_as_an_earlier_boot() -> None:
    lines = PSTORE.read_text(encoding="utf-8").splitlines()
    assert line_grammar(lines[0]) == "pstore-header"
    records = parse_kmsg_text(lines)
    assert len(records) == len(lines) - 1 - sum(1 for line in lines if line.startswith(" ") or not line.strip())
    panic = next(r for r in records if r.message.startswith("Kernel panic"))
    assert (panic.priority, panic.ts_usec, panic.wall) == (0, None, EARLIER_BOOT)  # the crashed boot's
    assert predates_boot(panic.wall, None)
    raw = parse_kmsg_text(lines[1:])  # the same lines without the header: `dmesg -r`, this boot's
    assert next(r for r in raw if r.message.startswith("Kernel panic")).ts_usec == 3098275469
    assert KernelLogImporter().detect(PSTORE.read_bytes()[:4096], PSTORE.name)


# --- a network manager's carrier lines: user space, and the only record of an IB port's flaps ------------

FLAP_SYSLOG = REPO / "fixtures" / "kernel-events" / "azurehpc-1dev_6flap_syslog.excerpt.log"


def _kernel_events(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"] if f["check"] == "host.kernel.events"}


def test_a_syslog_of_an_ib_port_flapping_imports_and_warns_on_the_port(run_cli: RunCli, tmp_path: Path,
                                                                     empty_config: Path) -> None:
    # Azure/azurehpc-health-checks' syslog: no kernel line at all, systemd-networkd's "ib6: lost carrier" six times
    report = _import_and_audit(run_cli, tmp_path, FLAP_SYSLOG.read_text(encoding="utf-8"), empty_config)
    events = _kernel_events(report)
    assert set(events) == {"net.link_flap"}
    flap = events["net.link_flap"]
    assert (flap["status"], flap["severity"], flap["action"]) == ("warn", "warning", "check_mechanicals")
    # Five of the six losses are the same line (stamped 06:18:06): `snapshot import` drops only lines an
    # earlier file gave, never repeats within one file, so all six count as in the syslog itself.
    assert flap["observed"]["port"] == {"ib6": 6}
    assert "systemd-networkd[5398]: ib6: lost carrier" in flap["message"]
    assert not [f for f in report["findings"] if f["status"] == "fail" and f["severity"] == "critical"]


def _syslog_lines(*programs: str) -> list[str]:
    return [f"Mar  4 10:{i:02d}:00 gpu-node-7 {text}" for i, text in enumerate(programs)]


def test_one_carrier_loss_is_not_a_flap_and_another_programs_lost_carrier_is_no_record() -> None:
    lines = _syslog_lines("systemd-networkd[812]: ib0: Lost carrier", "systemd-networkd[812]: ib0: Gained carrier",
                          "sshd[4242]: ib1: Lost carrier", "sshd[4242]: ib1: Lost carrier",
                          "pppd[77]: ib1: Lost carrier")
    assert [line_grammar(line) for line in lines] == ["syslog-link"] * 2 + ["syslog-user"] * 3
    records = parse_kmsg_text(lines)
    assert [r.message for r in records] == ["systemd-networkd[812]: ib0: Lost carrier",
                                            "systemd-networkd[812]: ib0: Gained carrier"]
    assert records[0].wall == "Mar  4 10:00:00"  # the syslog stamp, as for a kernel line
    [flap] = EVENTS.run(parse_kernel_log(NodeFacts(host=host(), kmsg=records)), _base())
    assert (flap.subject, flap.status.value, flap.observed["port"]) == ("net.link_flap", "pass", {"ib0": 1})


def test_network_manager_counts_each_drop_once_in_every_spelling() -> None:
    nm = "NetworkManager[1402]: <info>  "
    lines = _syslog_lines(
        # older releases, at info: the loss, the deferred action and the state change are one drop
        "NetworkManager[810]: <info>  [1493373892.0508] device (ib0): link disconnected (deferring action for 4 "
        "seconds)",
        "NetworkManager[810]: <info>  [1493373896.1298] device (ib0): link disconnected (calling deferred action)",
        "NetworkManager[810]: <info>  [1493373896.1299] device (ib0): state change: activated -> unavailable "
        "(reason 'carrier-changed') [100 20 40]",
        "NetworkManager[810]: <info>  [1493373899.0001] device (ib0): link connected",
        # today, at info: only the state change says the carrier went
        f"{nm}[1756901211.4102] device (ib0): state change: activated -> unavailable (reason 'carrier-changed', "
        "sys-iface-state: 'managed')",
        f"{nm}[1756901214.0033] device (ib0): carrier: link connected",
        f"{nm}[1756901215.0000] device (ib1): state change: activated -> unavailable (reason 'carrier-changed', "
        "sys-iface-state: 'managed')",
        f"{nm}[1756901216.0000] device (ib1): state change: ip-config -> ip-check (reason 'none', "
        "sys-iface-state: 'managed')")
    assert [line_grammar(line) for line in lines] == ["syslog-link"] * 7 + ["syslog-user"]
    [flap] = EVENTS.run(parse_kernel_log(NodeFacts(host=host(), kmsg=parse_kmsg_text(lines))), _base())
    assert (flap.subject, flap.status.value, flap.observed["port"]) == ("net.link_flap", "warn", {"ib0": 2, "ib1": 1})


# --- no time at all: never refused; what dmesg holds, the current boot (issue 31.4) --------------------


def test_a_log_without_timestamps_is_imported_and_its_xids_are_this_boots(run_cli: RunCli, tmp_path: Path,
                                                                          empty_config: Path) -> None:
    report = _import_and_audit(run_cli, tmp_path, _dmesg_t(), empty_config)
    gpu = _xid_findings(report)["pci:0000:19:00.0"]
    # Xid 48 + 63 on one GPU in a dmesg without times: this boot's, so drain and reset, as with times
    (tmp_path / "stamped").mkdir()
    stamped = _import_and_audit(run_cli, tmp_path / "stamped", _dmesg_plain(), empty_config)
    assert (gpu["status"], gpu["severity"], gpu["action"]) == ("fail", "critical", "drain")
    assert {k: v for k, v in gpu.items() if k not in ("message", "evidence")} == {
        k: v for k, v in _xid_findings(stamped)["pci:0000:19:00.0"].items() if k not in ("message", "evidence")}
    assert "no time stamps" in gpu["message"]


def test_bare_text_detection_wants_kernel_messages() -> None:
    importer = KernelLogImporter()
    assert importer.detect(_dmesg_t().encode(), "npd-replay.txt")
    nvlink = (REPO / "fixtures" / "nvidia-smi" / "gpud" / "nvidia-smi.nvlink.status.a100.txt").read_bytes()
    assert not importer.detect(nvlink[:4096], "nvlink.txt")
    assert not importer.detect(b"Settings for eth0:\n\tSupported ports: [ TP ]\n\tSpeed: 1000Mb/s\n", "ethtool.txt")
    assert not importer.detect(b"hello: world\nfoo: bar\n", "notes.txt")  # shaped like messages, nothing kernel


def _timeless(*messages: str) -> NodeFacts:
    return parse_kernel_log(NodeFacts(host=host(), kmsg=tuple(KmsgRecord(message=m) for m in messages),
                                      observed_at=dt.datetime(2025, 2, 13, tzinfo=dt.timezone.utc)))


XID_79 = "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
BANNER = "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) (x86_64-linux-gnu-gcc-13) #45-Ubuntu SMP"
LOCKUP = "watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [python:4242]"


def test_an_xid_79_without_time_is_this_boots() -> None:
    [finding] = [f for f in XID.run(_timeless(XID_79), _base()) if f.observed == {"79": 1}]
    assert (finding.status.value, finding.severity.value) == ("fail", "critical")
    assert "no time stamps" in finding.message


def test_a_kernel_event_without_time_counts_with_the_catalogues_severity() -> None:
    [finding] = EVENTS.run(_timeless(LOCKUP), _base())
    assert (finding.subject, finding.status.value, finding.severity.value) == ("kernel.soft_lockup", "fail",
                                                                               "critical")
    assert "without time stamps" in finding.message


def test_a_boot_banner_in_timeless_text_says_what_is_an_earlier_boot() -> None:
    """A console paste of two boots: the lockup and the Xid came before the last banner, so they are history."""
    earlier = EVENTS.run(_timeless(LOCKUP, XID_79, BANNER, "NET: Registered PF_INET6 protocol family"), _base())
    assert [(f.subject, f.status.value) for f in earlier] == [("node", "pass")]
    assert all(f.status.value == "pass" for f in XID.run(_timeless(LOCKUP, XID_79, BANNER), _base()))
    after = EVENTS.run(_timeless(XID_79, BANNER, LOCKUP), _base())
    assert [(f.subject, f.status.value) for f in after] == [("kernel.soft_lockup", "fail")]


@pytest.mark.parametrize("message", [
    "BUG: kernel NULL pointer dereference, address: 0000000000000008",
    "Oops: 0000 [#1] PREEMPT SMP NOPTI",
    "general protection fault, probably for non-canonical address 0xdead000000000100: 0000 [#1] SMP NOPTI",
    "INFO: task kworker/u512:3:1234 blocked for more than 122 seconds.",
    "{1}[Hardware Error]: event severity: fatal",
    "EXT4-fs (nvme0n1p2): Remounting filesystem read-only",
    "unregister_netdevice: waiting for eth0 to become free. Usage count = 2",
    "mce: [Hardware Error]: Machine check events logged",
])
def test_kernel_records_are_read_by_their_shape_with_or_without_a_stamp(message: str) -> None:
    """The same record, bare and as dmesg prints it ([  t.tttttt]), gives the same finding."""
    bare = EVENTS.run(_timeless(message), _base())
    stamped = EVENTS.run(parse_kernel_log(NodeFacts(host=host(), kmsg=parse_kmsg_text([f"[  812.004211] {message}"]),
                                                    observed_at=dt.datetime(2025, 2, 13, tzinfo=dt.timezone.utc))),
                         _base())
    assert [f.subject for f in bare] != ["node"], bare  # a catalogued event, not "nothing"
    assert [(f.subject, f.status, f.severity) for f in bare] == [(f.subject, f.status, f.severity) for f in stamped]


def _base() -> Any:
    return ProfileStore().profile("base")


def test_import_drops_what_an_earlier_file_gave_and_keeps_repeats_within_a_file(run_cli: RunCli,
                                                                                  tmp_path: Path) -> None:
    # An EDAC storm stamps to the second in a syslog: three identical lines are three errors. The journal of
    # the same boot, imported next to it, repeats one of them: that one is the same error, read twice.
    storm = "Dec  1 02:16:37 n1 kernel: EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0\n"
    syslog, journal = tmp_path / "syslog", tmp_path / "journal.txt"
    syslog.write_text("Dec  1 02:16:30 n1 kernel: Linux version 6.1.0 (gcc) #1 SMP\n" + storm * 3, encoding="utf-8")
    journal.write_text(storm + "Dec  1 02:16:40 n1 kernel: nvme nvme0: I/O 12 QID 0 timeout, reset controller\n",
                       encoding="utf-8")
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", str(syslog), str(journal), "--out", str(out))
    assert result.code == 0, result.stdout + result.stderr
    lines = (out / "kmsg.txt").read_text(encoding="utf-8").splitlines()
    assert sum("EDAC MC0: 1 CE" in line for line in lines) == 3
    assert sum("reset controller" in line for line in lines) == 1
