"""Issue 33.3 through NVIDIA's mock libnvidia-ml: counters stepped across daemon runs, a reset among them.

A real daemon reads the mock's counters and keeps the day's sample in its ledger; between runs the
test moves the stored samples three days back (the days a real node would have waited) and steps the
mock's counters through its live overrides file. GPU 2's remapped rows grow from 0 to 4: history.counters
warns on it. GPU 3's count goes from 5 to 1 (an InfoROM cleared, then a new remap): a reset, counted
from zero, so +1 and a warning that says so, where a difference of totals would read -4 and pass.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.nvml_mock.conftest import mock_daemon, write_config

pytestmark = pytest.mark.nvml_mock


def _status(body: str, subject: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith("nodewarden_check_status{")
            and 'check="history.counters"' in line and f'subject="{subject}"' in line]


def _judged(daemon: object) -> str:
    def ready() -> str | None:
        text = daemon.settled_scrape()  # type: ignore[attr-defined]
        return text if 'nodewarden_source_up{source="ledger"} 1.0' in text else None

    return str(daemon.wait_for(ready, what="the ledger judged"))  # type: ignore[attr-defined]


def _age(state: Path, days: int) -> None:
    """The stored samples as if taken `days` earlier (the daemon is stopped)."""
    with sqlite3.connect(state / "ledger.db") as conn:
        conn.execute("UPDATE counters SET ts = ts - ?, day = date(ts - ?, 'unixepoch')",
                     (days * 86400, days * 86400))


def test_growth_across_runs_warns_and_a_reset_does_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with mock_daemon(tmp_path) as (daemon, overrides):
        write_config(overrides, {"devices": {"3": {"remapped_rows": {"correctable": 5}}}})
        first = _judged(daemon)
        daemon.wait_for(lambda: _rows(state, "remapped_correctable", 3) == 5, what="GPU 3's sample")
    assert 'nodewarden_checks{check="history.counters",status="skip"} 8.0' in first  # one reading: no rate yet
    _age(state, 3)
    with mock_daemon(tmp_path) as (daemon, overrides):
        write_config(overrides, {"devices": {"2": {"remapped_rows": {"correctable": 4}},
                                             "3": {"remapped_rows": {"correctable": 1}}}})
        daemon.wait_for(lambda: _rows(state, "remapped_correctable", 2) == 4, what="GPU 2's new count")
        def both_judged() -> str | None:
            body = _judged(daemon)
            return body if _status(body, "gpu2") and _status(body, "gpu3") else None

        later = daemon.wait_for(both_judged, what="history.counters on GPUs 2 and 3")
        changed = {e["subject"]: e["msg"] for e in daemon.log_events()
                   if e.get("event") == "finding_changed" and e.get("check") == "history.counters"}
    for gpu in ("gpu2", "gpu3"):
        [line] = _status(later, gpu)
        assert 'severity="warning"' in line and 'action="field_diagnostics"' in line
    assert "up 4 in 7d" in changed["gpu2"] and "reset" not in changed["gpu2"]
    assert "up 1 in 7d" in changed["gpu3"] and "1 reset counted from zero" in changed["gpu3"]
    assert 'nodewarden_checks{check="history.counters",status="pass"} 6.0' in later
    assert 'nodewarden_repeat_offender{rule="remapped_rows_growth"} 2.0' in later


def _rows(state: Path, counter: str, gpu: int) -> int | None:
    """GPU `gpu`'s newest stored value of `counter` (the mock's serials end in the index)."""
    try:
        with sqlite3.connect(f"file:{state / 'ledger.db'}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT value FROM counters WHERE counter = ? AND key LIKE ? ORDER BY ts DESC "
                               "LIMIT 1", (counter, f"%{gpu}")).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else int(row[0])
