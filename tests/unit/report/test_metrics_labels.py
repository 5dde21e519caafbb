"""Labels that hold up (issue 26.9): a lost GPU keeps its identity, subjects are names people read,
no empty `action=""`, ECC counts are counters."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.facts_nvml import GpuFacts, NvmlFacts
from agent.core.names import DASH
from agent.engine.audit import AuditRequest, run_audit
from agent.policy.config import Config
from agent.report.metrics import GpuLabels, NodeMetrics
from agent.report.model import Report
from agent.report.prom import render_prom


@pytest.fixture(scope="module")
def drifted() -> Report:
    return run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))


def samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples]


def with_gpu_lost(report: Report, index: int) -> Report:
    assert report.facts is not None and isinstance(report.facts.nvml, NvmlFacts)
    nvml = report.facts.nvml
    gpus = tuple(GpuFacts(index=g.index, lost="GPU is lost") if g.index == index else g for g in nvml.gpus)
    lost = copy.copy(report)
    lost.facts = dataclasses.replace(report.facts, nvml=nvml._replace(gpus=gpus))
    return lost


def test_a_lost_gpu_keeps_the_uuid_bus_id_and_model_it_had(drifted: Report) -> None:
    seen = GpuLabels()
    before = NodeMetrics(drifted, None, seen=seen).render().decode()
    (was,) = [labels for labels, _ in samples(before, "nodewarden_gpu_up") if labels["gpu"] == "3"]
    assert was["UUID"].startswith("GPU-") and was["pci_bus_id"] and was["modelName"]
    after = NodeMetrics(with_gpu_lost(drifted, 3), None, seen=seen).render().decode()
    (now,) = [(labels, value) for labels, value in samples(after, "nodewarden_gpu_up") if labels["gpu"] == "3"]
    assert now == (was, 0.0)
    # without the daemon's memory (a GPU already lost when it started) the labels are unknown
    fresh = NodeMetrics(with_gpu_lost(drifted, 3), None, seen=GpuLabels()).render().decode()
    (blank,) = [labels for labels, _ in samples(fresh, "nodewarden_gpu_up") if labels["gpu"] == "3"]
    assert blank["UUID"] == ""


def test_another_board_in_the_slot_borrows_nothing() -> None:
    seen = GpuLabels()
    assert seen.labels(0, ["0", "GPU-a", "00000000:19:00.0", "H100"]) == ["0", "GPU-a", "00000000:19:00.0", "H100"]
    assert seen.labels(0, ["0", "GPU-b", "", ""]) == ["0", "GPU-b", "", ""]
    assert seen.labels(0, ["0", "", "", ""]) == ["0", "GPU-a", "00000000:19:00.0", "H100"]


def test_subjects_are_names_not_grouping_keys(drifted: Report) -> None:
    assert any("|" in f.subject for f in drifted.findings if f.status.value == "fail")  # the fixture has one
    text = render_prom(drifted)
    subjects = {labels["subject"] for labels, _ in samples(text, "nodewarden_check_status")}
    assert not [s for s in subjects if "|" in s or ".#" in s]
    assert f"Power Supply.Slot.1{DASH}6" in subjects


def test_no_empty_action_or_remediation_labels(drifted: Report) -> None:
    text = render_prom(drifted)
    assert 'action=""' not in text and 'remediation=""' not in text
    series = samples(text, "nodewarden_check_status")
    assert any("action" in labels for labels, _ in series) and any("action" not in labels for labels, _ in series)


def test_ecc_counts_are_counters(drifted: Report) -> None:
    text = NodeMetrics(drifted, None).render().decode()
    assert "# TYPE nodewarden_gpu_ecc_errors_total counter" in text
    assert samples(text, "nodewarden_gpu_ecc_errors")  # the parser names the family without _total
    assert "nodewarden_gpu_ecc_errors{" not in text
