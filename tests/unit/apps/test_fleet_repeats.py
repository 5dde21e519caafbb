"""Issue 33.5: the fleet report names the repeat offenders (nodes and GPU serials) with counts and windows,
from real audits of captures whose ledger holds the history (the same fatal Xid in three boots)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from agent.core.history import GpuRef, Incident, digest
from agent.state.ledger import Ledger
from tests.conftest import REPO, RunCli

NODE = REPO / "fixtures" / "nodes" / "hgx-h100-healthy"
SERIAL = "1650124656070"  # GPU 0 of that node (nvml.json)


def _capture_with_history(tmp: Path) -> Path:
    snap = tmp / "capture"
    shutil.copytree(NODE, snap, symlinks=True)
    now = time.time()
    ledger = Ledger.open(snap / "ledger.db")
    ledger.record([Incident(ts=now - 3600 - n * 5 * 86400, kind="xid", source="kmsg", code="48",
                            gpu=GpuRef(0, "GPU-d6ad6568-e3dc-479d-c874-59eb86323ae2", SERIAL),
                            subject="0000:19:00.0", severity="critical", boot_id=f"boot-{n}",
                            detail="NVRM: Xid (PCI:0000:19:00): 48, An uncorrectable double bit error",
                            digest=digest(n)) for n in range(3)], now=now)
    ledger.close()
    # the capture's own time is now, so the ledger's last 30 days are the rule's window
    meta = (snap / "meta.yaml").read_text().splitlines()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    (snap / "meta.yaml").write_text("\n".join(f'captured_at: "{stamp}"' if line.startswith("captured_at:") else line
                                              for line in meta) + "\n")
    return snap


def test_the_fleet_report_lists_repeat_offenders_by_node_and_serial(run_cli: RunCli, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    offender = run_cli("audit", "--snapshot", str(_capture_with_history(tmp_path)), "--format", "json")
    (reports / "offender.json").write_text(offender.stdout)
    clean = run_cli("audit", "--simulate", "dgx-a100-healthy", "--format", "json")
    (reports / "clean.json").write_text(clean.stdout)
    result = run_cli("fleet", "report", str(reports), "--format", "json")
    assert result.code in (0, 1), result.stderr
    fleet = json.loads(result.stdout)
    [row] = fleet["repeat_offenders"]
    assert row["node"] == "gpu-h100-healthy-01" and row["subject"] == "gpu0" and row["gpu"] == SERIAL
    assert row["rule"] == "xid_across_reboots" and row["count"] == 3 and row["window"] == "30d"
    assert row["first"] < row["last"]
    assert fleet["summary"]["repeat_offender_nodes"] == 1
    md = run_cli("fleet", "report", str(reports), "--format", "md").stdout
    assert "## Repeat offenders" in md and f"| gpu-h100-healthy-01 | gpu0 | {SERIAL} | xid\\_across\\_reboots | 3 | 30d" in md
    html = run_cli("fleet", "report", str(reports), "--format", "html").stdout
    assert 'id="repeat"' in html and SERIAL in html


def test_a_hostile_history_finding_is_cut_not_trusted(run_cli: RunCli, tmp_path: Path) -> None:
    from agent.apps.fleet import summarize_report

    doc = json.loads(run_cli("audit", "--simulate", "dgx-a100-healthy", "--format", "json").stdout)
    doc["findings"].append({"check": "history.gpu", "subject": "gpu0" * 100, "status": "fail", "severity": "critical",
                            "message": "x", "observed": [{"rule": "r" * 500, "count": 7, "key": "k" * 999},
                                                         {"rule": "bad", "count": "7"}, "nope",
                                                         {"rule": "t", "count": True}]})
    [repeat] = summarize_report(doc, "hostile.json").repeats
    assert repeat[3] == 7 and max(len(str(x)) for x in repeat) <= 64
