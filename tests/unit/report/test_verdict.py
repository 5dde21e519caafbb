"""The one verdict rule (issue 24, deliverable 1): what drains, what only degrades, and that every
output (table, JSON, Prometheus textfile) says the same thing."""

from __future__ import annotations

import pytest

from agent.core.model import Finding, Severity, Status, Waiver
from agent.report.verdict import DEGRADED, DRAIN, OK, drains, judge, verdict_json
from tests.conftest import RunCli


def _finding(check: str = "x.y", status: Status = Status.FAIL, severity: Severity = Severity.CRITICAL,
             action: str | None = None, subject: str = "node", waiver: Waiver | None = None) -> Finding:
    return Finding(check, subject, status, severity, f"{check} {subject}", "host", action=action, waiver=waiver)


@pytest.mark.parametrize("action", ["drain", "reset_gpu", "reboot", "contact_support", "replace_psu", "replace_fan"])
def test_a_critical_failure_asking_for_a_hardware_action_drains(action: str) -> None:
    assert judge([_finding(action=action)]).state == DRAIN


@pytest.mark.parametrize("action", [None, "update_firmware", "upgrade_driver", "fix_kernel_cmdline", "disable_acs"])
def test_critical_tuning_drift_degrades_and_never_drains(action: str | None) -> None:
    finding = _finding(check="host.sysctl", action=action)
    finding.remediation = "sysctl"
    assert not drains(finding)
    assert judge([finding]).state == DEGRADED


def test_only_positive_evidence_drains() -> None:
    unknown = _finding(check="gpu.lost", status=Status.UNKNOWN, action="drain")
    warning = _finding(check="gpu.xid", status=Status.FAIL, severity=Severity.WARNING, action="drain")
    waived = _finding(check="gpu.lost", action="drain",
                      waiver=Waiver("gpu.lost", "gpu7", "RMA open", "2099-01-01"))
    assert judge([unknown]).state == OK
    assert judge([warning]).state == DEGRADED
    assert judge([waived]).state == OK


def test_a_required_source_that_is_down_drains() -> None:
    assert judge([_finding(check="source.available", subject="nvml", action="check_driver")]).state == DRAIN
    # kmsg unreadable is unknown (checks/sources.py): proves nothing about the node
    kmsg = _finding(check="source.available", subject="kmsg", status=Status.UNKNOWN, severity=Severity.WARNING)
    assert judge([kmsg]).state == OK


def test_actions_are_worst_first_and_name_checks_and_subjects() -> None:
    doc = verdict_json([
        _finding(check="host.sysctl", severity=Severity.WARNING, subject="vm.swappiness"),
        _finding(check="gpu.lost", action="drain", subject="gpu7"),
        _finding(check="gpu.xid", action="drain", subject="gpu7"),
        _finding(check="gpu.ecc.mode", status=Status.UNKNOWN, subject="gpu1"),
    ])
    assert doc["verdict"] == DRAIN
    assert [a["action"] for a in doc["actions"]] == ["drain", "review"]  # not judged is left out
    first = doc["actions"][0]
    assert first["checks"] == ["gpu.lost", "gpu.xid"] and first["subjects"] == ["gpu7"] and first["drains"]
    assert doc["actions"][1]["drains"] is False


def test_every_output_carries_the_same_verdict(run_cli: RunCli) -> None:
    table = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "table", env={"COLUMNS": "120"})
    as_json = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "json").json()
    prom = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "prom").stdout
    assert as_json["verdict"] == DRAIN
    assert table.stdout.splitlines()[2].startswith("DRAIN:")
    assert 'nodewarden_verdict{verdict="DRAIN"} 1.0' in prom
    assert 'nodewarden_verdict{verdict="OK"} 0.0' in prom
    assert as_json["actions"][0]["action"] == "drain" and as_json["actions"][0]["drains"] is True
    # tuning drift is named but does not drain on its own
    remediate = next(a for a in as_json["actions"] if a["action"] == "remediate")
    assert remediate["drains"] is False and "host.sysctl" in remediate["checks"]


def test_a_healthy_node_is_ok_everywhere(run_cli: RunCli) -> None:
    as_json = run_cli("audit", "--simulate", "hgx-h100-healthy", "--format", "json").json()
    assert as_json["verdict"] == OK and as_json["actions"] == []
