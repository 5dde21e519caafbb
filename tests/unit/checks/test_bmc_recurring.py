"""bmc.events (issue 22 item 8): a critical fault the BMC clears by itself within seconds, coming back.

The real HPE Cray EX425 EventLog (fixtures/redfish/cray-ex425-amd-milan-blade) holds two Critical
`CrayAlerts.HardwareFatalFaultDetected` entries, each `...Cleared` ten seconds later, on two different
sensors (12V_HSS ECB Temperature, CPU1 VDR ABCD Voltage): once each is history, not a finding. The
same log with the CPU1 VDR fault repeated a day later (the same entries, re-dated) is the recurring case.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import BmcFacts
from agent.core.model import Finding, Severity, Status
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.redfish import RecordedRedfish, read_redfish
from checks.bmc_events import EVENTS, SELF_CLEARING_S
from tests.factories import exp, node_of, profile
from tests.peers.redfish import mockup

EX425 = "cray-ex425-amd-milan-blade"
ENTRIES = Path("redfish/v1/Managers/BMC/LogServices/EventLog/Entries")
NOW = dt.datetime(2022, 4, 14, 12, 0, tzinfo=dt.timezone.utc)  # two days after the last fault
VDR = "CPU1 VDR ABCD Voltage"


@pytest.fixture(scope="module")
def generic() -> Profile:
    return ProfileStore().profile("generic-nvidia")


def read(tree: Path) -> BmcFacts:
    facts, _status, _ = read_redfish(lambda: RecordedRedfish(tree))
    assert isinstance(facts, BmcFacts)
    return facts


def findings(bmc: BmcFacts, prof: Profile) -> dict[str, Finding]:
    return {f.subject: f for f in EVENTS.run(node_of(bmc, now=NOW), prof)}


def recurring(found: dict[str, Finding]) -> list[Finding]:
    return [f for subject, f in found.items() if subject.endswith(":recurring")]


def with_repeat(tmp_path: Path, later: dt.timedelta, clear_after_s: float = 10.0) -> Path:
    """The real tree with the CPU1 VDR fault (entries 16 and 17) happening once more, `later` after the first."""
    tree = tmp_path / EX425
    shutil.copytree(mockup(EX425), tree)
    index = tree / ENTRIES / "index.json"
    body: dict[str, Any] = json.loads(index.read_text(encoding="utf-8"))
    members = body["Members"]
    detected = next(m for m in members if m["Id"] == "16")
    cleared = next(m for m in members if m["Id"] == "17")
    start = dt.datetime.fromisoformat(detected["Created"]) + later
    for entry, at, new_id in ((detected, start, "116"), (cleared, start + dt.timedelta(seconds=clear_after_s), "117")):
        repeat = copy.deepcopy(entry)
        repeat["Id"] = new_id
        repeat["@odata.id"] = f"/redfish/v1/Managers/BMC/LogServices/EventLog/Entries/{new_id}"
        repeat["Created"] = at.isoformat()
        members.append(repeat)
    body["Members@odata.count"] = len(members)
    index.write_text(json.dumps(body), encoding="utf-8")
    return tree


def test_the_real_log_clears_each_fault_once_and_is_not_recurring(generic: Profile) -> None:
    bmc = read(mockup(EX425))
    assert isinstance(bmc.events, tuple)
    cleared = [e for e in bmc.events if e.severity == "Critical" and e.cleared_at]
    assert {e.about for e in cleared} == {"12V_HSS ECB Temperature", VDR}  # what each clearing entry names
    assert recurring(findings(bmc, generic)) == []


def test_a_fault_cleared_in_seconds_twice_on_one_sensor_warns_with_the_count(tmp_path: Path,
                                                                             generic: Profile) -> None:
    found = recurring(findings(read(with_repeat(tmp_path, dt.timedelta(days=1))), generic))
    assert len(found) == 1
    warning = found[0]
    assert (warning.status, warning.severity) == (Status.WARN, Severity.WARNING)
    assert warning.subject == "EventLog:CrayAlerts.HardwareFatalFaultDetected:recurring"
    assert warning.observed == {VDR: 2}
    assert "recurring, self-clearing" in warning.message and "2 times" in warning.message
    assert "within 10 s" in warning.message


def test_a_fault_the_bmc_cleared_hours_later_is_not_self_clearing(tmp_path: Path, generic: Profile) -> None:
    bmc = read(with_repeat(tmp_path, dt.timedelta(days=1), clear_after_s=SELF_CLEARING_S + 3600))
    assert isinstance(bmc.events, tuple)
    repeat = next(e for e in bmc.events if e.entry_id == "116")
    assert repeat.resolved is True and repeat.about == VDR  # cleared, an hour and more later
    assert recurring(findings(bmc, generic)) == []


def test_repeats_outside_the_window_are_history(tmp_path: Path, generic: Profile) -> None:
    bmc = read(with_repeat(tmp_path, dt.timedelta(days=-30)))  # the repeat is a month before the first
    assert recurring(findings(bmc, generic)) == []
    wide = profile({"bmc": {"events": exp("warning", max=0, window_days=60)}})  # both occurrences in the window
    assert [f.observed for f in recurring(findings(bmc, wide))] == [{VDR: 2}]
