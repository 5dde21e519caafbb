"""Issue 33: a real kernel log replayed through a real daemon across boots fills the ledger once, and
the history rules see the pattern no single boot shows.

The log is gpud's real capture fixtures/kmsg/dmesg.0.log (Xid 48 double-bit ECC, 63 row remap and 94
contained errors on 0000:19:00, which is GPU 0 of fixtures/nodes/hgx-h100-healthy). Each "boot" is a
copy of that node with its own boot id and the log's wall times moved five days on. A daemon reads
each boot; one is killed with SIGKILL and started again mid-way (the history stays, nothing is
counted twice); after the third boot the same fatal Xid on the same board is `xid_across_reboots`.
Then the board is swapped (same slot, new serial): the new board starts clean, the old serial's
history stays findable with `ledger show --gpu`. Finally a snapshot carrying the ledger is judged by
a one-shot `audit --snapshot` through the real CLI.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.engine.history import copy_ledger
from tests.daemon_peer import DaemonProcess, running_daemon

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "fixtures" / "kmsg" / "dmesg.0.log"
NODE = REPO / "fixtures" / "nodes" / "hgx-h100-healthy"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
OLD_SERIAL = "1650124656070"  # GPU 0 of the healthy node (nvml.json)
NEW_SERIAL = "1650124999999"
XID_LINES = sum(1 for line in LOG.read_text().splitlines() if "NVRM: Xid" in line)
CAPTURED = dt.datetime(2024, 11, 15, 13, 0, tzinfo=dt.timezone.utc)  # an hour after the log's last line
# The boots are moved to the last weeks (retention is 30 days by the wall clock, as on a live node)
BASE = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(days=14)


def _boot(tmp: Path, n: int, *, days: float, log: bool = True, serial: str = OLD_SERIAL) -> Path:
    snap = tmp / f"boot{n}"
    shutil.copytree(NODE, snap, symlinks=True)
    shift = BASE - CAPTURED + dt.timedelta(days=days)
    lines = []
    for line in (LOG.read_text().splitlines() if log else []):
        match = STAMP.match(line)
        moved = dt.datetime.fromisoformat(match.group(1)) + shift if match else None
        lines.append(moved.strftime("%Y-%m-%dT%H:%M:%S") + line[match.end():] if match and moved else line)
    if log:
        (snap / "kmsg.txt").write_text("\n".join(lines) + "\n")
    captured = CAPTURED + shift
    meta = (snap / "meta.yaml").read_text()
    (snap / "meta.yaml").write_text(re.sub(r"(?m)^captured_at: .*$", f'captured_at: "{captured:%Y-%m-%dT%H:%M:%SZ}"',
                                           meta))
    random = snap / "fs" / "proc" / "sys" / "kernel" / "random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text(f"0000000{n}-5e1f-4c1b-9a6e-8d2c7b3a1f0{n}\n")
    if serial != OLD_SERIAL:
        nvml = json.loads((snap / "nvml.json").read_text())
        nvml["devices"][0]["nvmlDeviceGetSerial"] = serial
        nvml["devices"][0]["nvmlDeviceGetUUID"] = "GPU-00000000-1111-2222-3333-444444444444"
        (snap / "nvml.json").write_text(json.dumps(nvml))
    return snap


def _incidents(state: Path, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "agent", "ledger", "show", "--state-dir", str(state), "--since",
                          "all", "--format", "json", *args], capture_output=True, text=True, timeout=60, check=True,
                         cwd=REPO)
    return list(json.loads(out.stdout)["incidents"])


def _evaluated(daemon: DaemonProcess) -> str:
    """A scrape once the history was judged (the ledger source reported)."""
    def judged() -> str | None:
        text = daemon.settled_scrape()
        return text if 'nodewarden_source_up{source="ledger"} 1.0' in text else None

    return str(daemon.wait_for(judged, what="the ledger judged"))


def _series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three boots of the real log through real daemons, one killed and restarted; then a swap."""
    tmp = tmp_path_factory.mktemp("ledger-replay")
    state = tmp / "state"
    state.mkdir(mode=0o700)
    seen: dict[str, Any] = {"state": state, "tmp": tmp, "scrapes": []}
    for n in range(3):
        snap = _boot(tmp, n, days=5.0 * n)
        with running_daemon(tmp, "--snapshot", str(snap), "--state-dir", str(state)) as daemon:
            seen["scrapes"].append(_evaluated(daemon))
            if n == 1:  # killed mid-way and started again on the same boot
                daemon.stop(signal.SIGKILL)
                seen["after_kill"] = len(_incidents(state, "--kind", "xid"))
                with running_daemon(tmp, "--snapshot", str(snap), "--state-dir", str(state)) as again:
                    seen["scrapes"][-1] = _evaluated(again)
        seen[f"xids_after_boot{n}"] = len(_incidents(state, "--kind", "xid"))
    swapped = _boot(tmp, 3, days=12.0, log=False, serial=NEW_SERIAL)
    with running_daemon(tmp, "--snapshot", str(swapped), "--state-dir", str(state)) as daemon:
        seen["swapped"] = _evaluated(daemon)
    seen["last_boot"] = tmp / "boot2"
    return seen


def test_each_kernel_line_is_one_incident_whatever_reads_it_again(replay: dict[str, Any]) -> None:
    assert XID_LINES == 11  # the fixture: if it changes, so do the counts below
    assert [replay[f"xids_after_boot{n}"] for n in range(3)] == [XID_LINES, 2 * XID_LINES, 3 * XID_LINES]
    assert replay["after_kill"] == 2 * XID_LINES  # SIGKILL then a restart re-reading the log: no double count
    xids = _incidents(replay["state"], "--kind", "xid")
    assert len({i["boot_id"] for i in xids}) == 3
    assert {i["gpu"]["serial"] for i in xids} == {OLD_SERIAL} and {i["subject"] for i in xids} == {"0000:19:00.0"}
    assert {i["code"] for i in xids} == {"48", "63", "94"}
    totals = _series(replay["scrapes"][2], "nodewarden_incidents_total")
    assert totals['nodewarden_incidents_total{kind="xid"}'] == 3 * XID_LINES


def test_the_same_fatal_xid_in_three_boots_is_found_on_the_third(replay: dict[str, Any]) -> None:
    first, _, third = replay["scrapes"]

    def history_status(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("nodewarden_check_status{")
                and 'check="history.gpu"' in line and 'subject="gpu0"' in line]

    assert history_status(first) == []
    assert 'nodewarden_repeat_offender{rule="xid_across_reboots"} 0.0' in first
    [line] = history_status(third)
    assert 'severity="critical"' in line and 'action="inspect_hardware"' in line and line.endswith(" 5.0")
    assert 'nodewarden_repeat_offender{rule="xid_across_reboots"} 1.0' in third
    assert 'nodewarden_checks{check="history.gpu",status="pass"} 7.0' in third  # the other seven boards


def test_a_board_swapped_into_the_slot_starts_clean_and_the_old_serial_stays_findable(
        replay: dict[str, Any]) -> None:
    swapped = replay["swapped"]
    assert 'nodewarden_checks{check="history.gpu",status="pass"} 8.0' in swapped
    assert 'nodewarden_repeat_offender{rule="xid_across_reboots"} 0.0' in swapped
    old = _incidents(replay["state"], "--gpu", OLD_SERIAL)
    assert len(old) >= 3 * XID_LINES and not _incidents(replay["state"], "--gpu", NEW_SERIAL)


def test_a_snapshot_carrying_its_ledger_is_judged_with_it(replay: dict[str, Any], tmp_path: Path) -> None:
    snap = tmp_path / "capture"
    shutil.copytree(replay["last_boot"], snap, symlinks=True)
    # as `snapshot capture` copies it: SQLite's backup, whole while a daemon may still be writing (a plain
    # copy of ledger.db alone misses what is still in its write-ahead log)
    assert copy_ledger(replay["state"], snap / "ledger.db") == ""
    before = (snap / "ledger.db").read_bytes()
    result = CliRunner().invoke(cli, ["audit", "--snapshot", str(snap), "--format", "json"])
    report = json.loads(result.stdout)
    found = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert found[("history.gpu", "gpu0")]["severity"] == "critical"
    rules = {o["rule"] for o in found[("history.gpu", "gpu0")]["observed"]}
    assert "xid_across_reboots" in rules
    assert report["sources"]["ledger"]["ok"] is True
    assert (snap / "ledger.db").read_bytes() == before  # read, never written
    # without the ledger the same capture is judged as before: no history checks, no ledger source
    (snap / "ledger.db").unlink()
    bare = json.loads(CliRunner().invoke(cli, ["audit", "--snapshot", str(snap), "--format", "json"]).stdout)
    assert not [f for f in bare["findings"] if f["check"].startswith("history.")]
    assert "ledger" not in bare["sources"]
