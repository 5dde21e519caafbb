"""Issue 33.4: a kernel log of several boots (`journalctl -k -o json`, with _BOOT_ID; or journalctl's text
with its "-- Boot ID --" lines) fills the history of a capture that has no ledger, boot by boot.

The log is gpud's real dmesg.0.log (Xid 48, 63 and 94 on 0000:19:00) as journald would have kept it over
three boots five days apart; the GPUs are gpud's real `nvidia-smi -q` of an H100 board whose GPU 0 is
0000:19:00.0. The same fatal Xid in three boots is xid_across_reboots, but an earlier boot's board cannot
be named from a log (the serial is today's): counted by slot, a warning that says so, never a critical.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any

from tests.conftest import REPO, RunCli

LOG = REPO / "fixtures" / "kmsg" / "dmesg.0.log"
NVSMI = REPO / "fixtures" / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d),(\d{6})\+00:00 (.*)$")
BOOTS = [f"{n + 1:x}" * 32 for n in range(3)]


def _journal(path: Path, boots: list[str]) -> Path:
    """The log's lines as journald records, one boot every five days ending a week ago."""
    lines = [m for m in (STAMP.match(line) for line in LOG.read_text().splitlines()) if m]
    first = dt.datetime.fromisoformat(lines[0].group(1)).replace(tzinfo=dt.timezone.utc)
    end = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=7)
    out = []
    for n, boot in enumerate(boots):
        shift = end - dt.timedelta(days=5 * (len(boots) - 1 - n)) - first - dt.timedelta(hours=7)
        for i, m in enumerate(lines):
            when = dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.timezone.utc) + shift
            usec = int(when.timestamp()) * 1_000_000 + int(m.group(2))
            out.append(json.dumps({"__REALTIME_TIMESTAMP": str(usec), "_BOOT_ID": boot, "_TRANSPORT": "kernel",
                                   "_SOURCE_MONOTONIC_TIMESTAMP": str(3_600_000_000 + i * 1000),
                                   "MESSAGE": m.group(3), "PRIORITY": "3"}))
    path.write_text("\n".join(out) + "\n")
    return path


def _audit(run_cli: RunCli, tmp: Path, boots: list[str]) -> tuple[Path, dict[str, Any]]:
    snap = tmp / "snap"
    done = run_cli("snapshot", "import", str(_journal(tmp / "kernel.json", boots)), str(NVSMI), "--out", str(snap))
    assert done.code == 0, done.stderr
    report = json.loads(run_cli("audit", "--snapshot", str(snap), "--format", "json").stdout)
    return snap, report


def test_three_boots_of_the_same_fatal_xid_warn_by_slot(run_cli: RunCli, tmp_path: Path) -> None:
    snap, report = _audit(run_cli, tmp_path, BOOTS)
    separators = [line for line in (snap / "kmsg.txt").read_text().splitlines() if line.startswith("-- Boot ")]
    assert separators == [f"-- Boot {b} --" for b in BOOTS]
    found = {(f["check"], f["subject"]): f for f in report["findings"]}
    gpu0 = found[("history.gpu", "gpu0")]
    assert gpu0["status"] == "fail" and gpu0["severity"] == "warning"  # the rule's critical, capped: by slot
    assert "counted by slot" in gpu0["message"]
    rule = next(o for o in gpu0["observed"] if o["rule"] == "xid_across_reboots")
    assert rule["count"] == 3 and rule["key"] == "index:0"
    assert not [f for f in report["findings"] if f["check"].startswith("history.") and f["severity"] == "critical"]
    assert report["sources"]["ledger"]["ok"] is True
    assert not (snap / "ledger.db").exists()  # read, never written


def test_one_boot_is_no_history(run_cli: RunCli, tmp_path: Path) -> None:
    _snap, report = _audit(run_cli, tmp_path, BOOTS[:1])
    assert not [f for f in report["findings"] if f["check"].startswith("history.")]
    assert "ledger" not in report["sources"]


def test_journal_text_separators_are_kept_and_read(run_cli: RunCli, tmp_path: Path) -> None:
    from agent.sources.kmsg import parse_kmsg_text

    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 86400))
    text = [f"-- Boot {BOOTS[0]} --", f"{now},000001+00:00 host kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=1, DBE",
            f"-- Boot {BOOTS[1]} --", f"{now},000002+00:00 host kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=2, DBE",
            "-- Boot not-an-id --"]
    records = [r for r in parse_kmsg_text(text) if "Xid" in r.message]
    assert [r.boot for r in records] == [BOOTS[0], BOOTS[1]]
    path = tmp_path / "journal.txt"
    path.write_text("\n".join(text) + "\n")
    snap = tmp_path / "snap"
    assert run_cli("snapshot", "import", str(path), "--out", str(snap)).code == 0
    kept = (snap / "kmsg.txt").read_text().splitlines()
    assert [line for line in kept if line.startswith("-- Boot ")] == [f"-- Boot {b} --" for b in BOOTS[:2]]
