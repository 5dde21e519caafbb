"""accept.gpu.lost over hand-built recordings: a GPU the node has but NVML cannot read, one that leaves
NVML or PCI during the run, a full board NVML counts short of, each a critical failure; views that
cannot be compared (a container's PCI, a partial board, no board size) are said, never failed; the
stored inventory is hostile input when read back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.core.model import Status
from agent.core.series import RecordingError, from_json
from checks.accept import gpu_inventory, judge
from tests.accept.test_accept_judgement import PROFILE, by, gpu, recording

BUSES = [f"0000:{b:02x}:00.0" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)]


def node(count: int = 8, *, pci: list[str] | None = None, pci_end: list[str] | None = None, board: int | None = 8,
         full: bool = True, unreadable: list[dict[str, Any]] | None = None, end_count: int | None = None) -> Any:
    gpus = [gpu(i) for i in range(count)]
    for track, bus in zip(gpus, BUSES, strict=False):
        track.pci_bus_id = bus
    rec = recording(*gpus)
    start: dict[str, Any] = {"nvml_count": count + len(unreadable or []), "unreadable": unreadable or [],
                             "pci": pci, "board_gpus": board, "board_full": full,
                             "board_why": "8 of the board's 8 GPUs in view" if full else "a partial view"}
    rec.inventory = {"start": start, "end": {"nvml_count": end_count if end_count is not None else start["nvml_count"],
                                             "unreadable": [], "pci": pci_end if pci_end is not None else pci}}
    return rec


def failures(rec: Any) -> dict[str, str]:
    return {f.subject: f.message for f in gpu_inventory(rec) if f.status is Status.FAIL}


def test_all_gpus_read_on_a_whole_board_with_pci_agreeing_passes() -> None:
    found = by(judge(node(pci=BUSES), PROFILE), "accept.gpu.lost")
    assert list(found) == ["node"] and found["node"].status is Status.PASS
    assert "NVML counts 8, the board has 8" in found["node"].message and "PCI lists the same 8" in found["node"].message


def test_a_gpu_nvml_counts_but_cannot_read_at_the_start_fails_critical() -> None:
    rec = node(7, pci=BUSES, unreadable=[{"gpu": "gpu7", "pci_bus_id": BUSES[7], "why": "GPU is lost"}])
    found = by(judge(rec, PROFILE), "accept.gpu.lost")
    assert found["gpu7"].status is Status.FAIL and found["gpu7"].severity.value == "critical"
    assert "counted by NVML but could not be read at the start" in found["gpu7"].message
    assert "node" not in found  # no pass beside a failure


def test_a_gpu_on_pci_that_nvml_does_not_list_fails_with_its_address() -> None:
    assert failures(node(7, pci=BUSES)) == {"pci": f"1 NVIDIA GPU(s) on PCI that NVML does not list: {BUSES[7]}",
                                            "node": "NVML counts 7 of the board's 8 GPUs (8 of the board's 8 GPUs "
                                                    "in view)"}


def test_a_gpu_that_leaves_pci_or_nvml_by_the_end_fails() -> None:
    assert "left PCI during the run: " + BUSES[3] in failures(node(pci=BUSES, pci_end=BUSES[:3] + BUSES[4:]))["pci"]
    assert failures(node(pci=BUSES, end_count=7))["node"] == "NVML counted 8 GPU(s) at the start and 7 at the end"


def test_a_track_lost_during_the_run_is_this_checks_failure_not_an_error_count() -> None:
    rec = node(pci=BUSES)
    rec.gpus[6].lost, rec.gpus[6].lost_at = "GPU is lost (fallen off the bus)", 20.0
    findings = judge(rec, PROFILE)
    assert "during steady" in by(findings, "accept.gpu.lost")["gpu6"].message
    assert "gpu6" not in by(findings, "accept.errors")


def test_views_that_cannot_be_compared_are_said_never_failed() -> None:
    # a container or the mock: PCI shows none of the GPUs NVML reads, a board not shown whole, no board size
    for rec in (node(4, pci=[], full=False), node(4, pci=None, board=None), node(2, pci=["0000:01:00.0"], full=False)):
        found = by(gpu_inventory(rec), "accept.gpu.lost")
        assert found["node"].status is Status.UNKNOWN and found["node"].severity.value == "warning", found
        assert "cannot be told" in found["node"].message
    # a partial view is not compared with the board, but PCI that agrees still counts as a view
    partial = by(gpu_inventory(node(4, pci=BUSES[:4], full=False)), "accept.gpu.lost")["node"]
    assert partial.status is Status.PASS and "PCI lists the same 4" in partial.message


def test_a_recording_without_an_inventory_is_unknown_not_pass() -> None:
    found = by(gpu_inventory(recording()), "accept.gpu.lost")
    assert found["node"].status is Status.UNKNOWN


def test_the_inventory_round_trips_and_is_read_as_hostile_input() -> None:
    rec = node(7, pci=BUSES, unreadable=[{"gpu": "gpu7", "pci_bus_id": BUSES[7], "why": "GPU is lost"}])
    back = from_json(rec.to_json())
    assert back.inventory == rec.inventory | {"start": {**rec.inventory["start"], "pci_error": None, "error": None},
                                             "end": {**back.inventory["end"]}}
    assert failures(back) == failures(rec)
    for path, value in ((("start", "pci"), "0000:01:00.0"), (("start", "nvml_count"), -1),
                        (("start", "nvml_count"), True), (("start", "unreadable"), [{}] * 65),
                        (("end",), ["not", "an", "object"]), (("start", "pci"), ["x"] * 500)):
        doc = copy.deepcopy(rec.to_json())
        target = doc["inventory"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(RecordingError, match="inventory"):
            from_json(doc)
