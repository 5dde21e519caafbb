"""Record/replay parity (issue 23, item 5): `snapshot capture` of the live mock, then `audit --snapshot` of it,
gives the live audit's findings, JSON for JSON, for every stock mock config and faulty ones.

This is what makes a recorded fixture trustworthy: the replay runs the reader above the same binding
names, so any call the recording drops or answers differently shows here as a finding that differs.
Only timings and the reason a BMC protocol was skipped ("not configured" live, "not in snapshot"
replayed) may differ, both in `source.available`, and the message text of host findings (the machine
running the test is live: its process count moves between the audit and the capture).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_mock.conftest import STOCK, device, mock_config, nodewarden
from tests.nvml_mock.test_faults import faulty


def _mid_read(doc: dict[str, Any]) -> None:
    device(doc, 3)["failure"] = {"mode": "fallen_off_bus", "after_calls": 12}  # the same call trips in both


CASES: dict[str, tuple[str, Callable[[dict[str, Any]], None] | None]] = {
    **{name: (name, None) for name in STOCK}, "h100-faulty": ("h100", faulty), "h100-mid-read": ("h100", _mid_read)}

pytestmark = pytest.mark.nvml_mock


def comparable(report: dict[str, Any]) -> list[str]:
    out = []
    for finding in report["findings"]:
        kept = finding
        if finding["check"] == "source.available":  # "answered in 0.004 s"; "not configured" vs "not in snapshot"
            kept = {k: finding[k] for k in ("check", "subject", "status", "severity", "source")}
        elif finding["source"] == "host":  # this machine moves on ("among 102 processes"): all but the text
            kept = {k: v for k, v in finding.items() if k != "message"}
        out.append(json.dumps(kept, sort_keys=True))
    return sorted(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_capture_then_replay_gives_the_live_findings(tmp_path: Path, case: str) -> None:
    name, edit = CASES[case]
    config = mock_config(tmp_path, name, edit)
    live = nodewarden(config, "audit", "--format", "json")
    captured = nodewarden(config, "snapshot", "capture", "--out", str(tmp_path / "snap"))
    assert captured.returncode == 0, captured.stderr[-2000:]
    replay = nodewarden(config, "audit", "--format", "json", "--snapshot", str(tmp_path / "snap"))
    assert live.returncode == replay.returncode, (live.stderr[-1000:], replay.stderr[-1000:])
    live_report, replay_report = json.loads(live.stdout), json.loads(replay.stdout)
    assert replay_report["profile"] == live_report["profile"]
    assert comparable(replay_report) == comparable(live_report)
    assert any(f["source"] == "nvml" for f in live_report["findings"])
