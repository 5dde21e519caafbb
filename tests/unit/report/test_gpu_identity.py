"""Issue 24.4: findings keep GPU UUIDs, so a per-device consumer (a device plugin, a cordon controller,
NVSentinel-style tooling) can act on the board rather than on `gpu7`.

One identity object per GPU (agent.report.gpu_identity), the same in the JSON report's findings and
actions, JUnit's properties, the health-check state file and the decision trail. The expected values
come from the fixture's own recordings (nvml.json, the Redfish mockup), not from the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.apps.scheduler.answer import parse_summary, summarise
from agent.apps.scheduler.state import DaemonStateFile, read_state
from agent.core.facts_nvml import GpuFacts
from agent.core.model import Unknown
from agent.engine.audit import AuditRequest, run_audit
from agent.policy.config import Config
from agent.report.gpu_identity import gpu_identities
from agent.report.model import Report
from tests.conftest import RunCli
from tests.decisions import decisions
from tests.peers.slurm import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[3]
DRIFTED = REPO / "fixtures" / "nodes" / "hgx-h100-drifted"
NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
LOST = 7  # GPU 7 (0000:db:00.0) fell off the bus in hgx-h100-drifted


def recorded_gpus() -> list[dict[str, Any]]:
    """What NVML said of each GPU in the recording: {index, uuid, serial, pci_bus_id}, or {} when lost."""
    devices = json.loads((DRIFTED / "nvml.json").read_text())["devices"]
    out: list[dict[str, Any]] = []
    for device in devices:
        if "nvmlDeviceGetUUID" not in device:
            out.append({})
            continue
        out.append({"uuid": device["nvmlDeviceGetUUID"], "serial": device["nvmlDeviceGetSerial"],
                    "pci_bus_id": device["nvmlDeviceGetPciInfo"]["busIdLegacy"].lower()})  # as NVML facts hold it
    return out


def bmc_processors() -> list[dict[str, Any]]:
    folder = DRIFTED / "redfish" / "v1" / "Systems" / "System.Embedded.1" / "Processors"
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("*/index.json"))]
    return [d for d in docs if d.get("ProcessorType") == "GPU"]


def the_bmcs_gpu7() -> dict[str, Any]:
    """The one GPU processor the BMC lists whose serial NVML does not report: the lost one's."""
    serials = {gpu.get("serial") for gpu in recorded_gpus()}
    (left,) = [p for p in bmc_processors() if p["SerialNumber"] not in serials]
    return left


def audit_json(run_cli: RunCli, *args: str) -> dict[str, Any]:
    result = run_cli("audit", *args, "--format", "json")
    assert result.code == 1, result.stderr  # the drifted node fails
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_every_gpu_finding_carries_the_uuid_nvml_reports(run_cli: RunCli) -> None:
    doc = audit_json(run_cli, "--simulate", "hgx-h100-drifted")
    recorded = recorded_gpus()
    seen = set()
    for finding in doc["findings"]:
        if not finding["subject"].startswith("gpu"):
            assert "gpu" not in finding, finding  # only GPU subjects are named as GPUs
            continue
        index = int(finding["subject"][3:])
        gpu = finding["gpu"]
        assert gpu["index"] == index
        if index != LOST:
            assert {k: gpu[k] for k in ("uuid", "serial", "pci_bus_id")} == recorded[index], finding["check"]
            assert gpu["source"] == "nvml"
            seen.add(index)
    assert seen == set(range(8)) - {LOST}


def test_the_lost_gpu_carries_what_the_bmc_knows_and_nothing_invented(run_cli: RunCli) -> None:
    doc = audit_json(run_cli, "--simulate", "hgx-h100-drifted")
    bmc = the_bmcs_gpu7()
    lost = [f for f in doc["findings"] if f["subject"] == f"gpu{LOST}"]
    assert {f["check"] for f in lost} >= {"gpu.lost", "gpu.xid"}
    for finding in lost:
        # NVML answers nothing for it: the BMC's view (the one processor no NVML GPU pairs with),
        # and its bus address, the one NVIDIA GPU address on the bus no other GPU has
        assert finding["gpu"] == {"index": LOST, "uuid": "GPU-" + bmc["UUID"], "pci_bus_id": "0000:db:00.0",
                                  "serial": bmc["SerialNumber"], "source": "bmc"}
    others = {g["uuid"] for g in recorded_gpus() if g}
    assert lost[0]["gpu"]["uuid"] not in others


def test_without_a_bmc_the_lost_gpu_has_no_uuid(run_cli: RunCli, drifted_copy: Path) -> None:
    shutil.rmtree(drifted_copy / "redfish")  # unlinks the copy's links only
    meta = drifted_copy / "meta.yaml"
    text = meta.read_text().replace("captured: [host, kmsg, nvml, redfish]", "captured: [host, kmsg, nvml]")
    meta.unlink()  # the copy is hard-linked to the shared capture: replace, never write through
    meta.write_text(text)
    doc = audit_json(run_cli, "--snapshot", str(drifted_copy))
    lost = next(f for f in doc["findings"] if f["check"] == "gpu.lost" and f["subject"] == f"gpu{LOST}")
    assert lost["gpu"] == {"index": LOST, "pci_bus_id": "0000:db:00.0"}
    present = next(f for f in doc["findings"] if f["check"] == "gpu.lost" and f["subject"] == "gpu0")
    assert present["gpu"]["uuid"] == recorded_gpus()[0]["uuid"]


def test_two_unidentified_gpus_borrow_nothing_from_the_bmc() -> None:
    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))
    facts = report.facts
    assert facts is not None and not isinstance(facts.nvml, Exception)
    nvml = facts.nvml
    gpus = list(nvml.gpus)  # type: ignore[union-attr]
    gpus[6] = GpuFacts(index=6, lost="GPU is lost")  # two GPUs unknown to NVML, two BMC GPUs left over
    ids = gpu_identities(dataclasses.replace(facts, nvml=nvml._replace(gpus=tuple(gpus))))  # type: ignore[union-attr]
    # two addresses left over on the bus too: which is whose is not known, so neither is said
    assert ids["gpu6"] == {"index": 6}
    assert ids["gpu7"] == {"index": 7}
    assert ids["gpu0"]["source"] == "nvml"


def test_actions_name_their_gpus(run_cli: RunCli) -> None:
    doc = audit_json(run_cli, "--simulate", "hgx-h100-drifted")
    by_subject = {f["subject"]: f["gpu"] for f in doc["findings"] if "gpu" in f}
    assert all("gpus" in action for action in doc["actions"])
    drain = doc["actions"][0]
    assert drain["action"] == "drain" and drain["subjects"] == [f"gpu{LOST}"]
    assert drain["gpus"] == [by_subject[f"gpu{LOST}"]]
    for action in doc["actions"]:
        named = [s for s in action["subjects"] if s in by_subject]
        assert action["gpus"] == [by_subject[s] for s in named], action["action"]
    reset = next(a for a in doc["actions"] if a["action"] == "reset_gpu")
    assert [g["uuid"] for g in reset["gpus"]] == [recorded_gpus()[int(s[3:])]["uuid"] for s in reset["subjects"]]


def test_junit_names_the_gpu_in_the_testcase_properties(run_cli: RunCli) -> None:
    result = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "junit")
    root = ET.fromstring(result.stdout)  # noqa: S314 - our own output
    case = next(c for c in root.iter("testcase") if c.get("classname") == "gpu.nvlink.links" and c.get("name") == "gpu6")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {"gpu.uuid": recorded_gpus()[6]["uuid"], "gpu.pci_bus_id": "0000:cb:00.0",
                     "gpu.serial": recorded_gpus()[6]["serial"]}
    node = next(c for c in root.iter("testcase") if c.get("name") == "node")
    assert not list(node.iter("property"))


# --- the health-check state file and trail carry the same objects ----------------------------------

def drifted_report() -> Report:
    return run_audit(AuditRequest(config=Config(), simulate="hgx-h100-drifted"))


def test_the_state_file_summary_carries_the_gpu_objects_and_reads_back(run_cli: RunCli) -> None:
    doc = audit_json(run_cli, "--simulate", "hgx-h100-drifted")
    summary = summarise(drifted_report())
    assert [a["gpus"] for a in summary["actions"]] == [a["gpus"] for a in doc["actions"]]
    assert summary["gpus"][f"gpu{LOST}"] == "GPU-" + the_bmcs_gpu7()["UUID"]
    answer = parse_summary(json.loads(json.dumps(summary)), "state file")
    assert answer.drained_gpus()[0] == doc["actions"][0]["gpus"][0]
    assert [g["index"] for g in answer.drained_gpus()] == [LOST, 6, 5]  # drain, then reset_gpu's


def test_the_daemon_remembers_a_uuid_nvml_gave_before_the_gpu_was_lost(tmp_path: Path) -> None:
    healthy = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-healthy"))
    state = tmp_path / "state"
    writer = DaemonStateFile(state, {"host": 60.0, "nvml": 15.0})
    writer.update(healthy, 1.0, {})
    report = drifted_report()
    # No BMC this time: only the daemon's memory of NVML's earlier word can name GPU 7.
    assert report.facts is not None
    report.facts = dataclasses.replace(report.facts, bmc=Unknown("not configured"))
    writer.update(report, 2.0, {})
    doc = json.loads((state / "scheduler" / "daemon.json").read_text())
    before = json.loads((REPO / "fixtures/nodes/hgx-h100-healthy/nvml.json").read_text())["devices"][LOST]
    assert doc["actions"][0]["gpus"][0]["uuid"] == before["nvmlDeviceGetUUID"]
    assert doc["actions"][0]["gpus"][0]["source"] == "earlier"
    answer = read_state(state, 1e12, judged=doc["reading"])
    assert answer is not None and answer.drained_gpus()[0]["uuid"] == before["nvmlDeviceGetUUID"]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:  # noqa: F811
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def test_the_trail_of_a_drain_names_the_gpus(cluster: SlurmCluster, tmp_path: Path, run_cli: RunCli) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nhealth_check:\n  slurm_conf: {cluster.conf}\n")
    done = subprocess.run([NODEWARDEN, "health-check", "--slurm", "--config", str(config), "--simulate",
                           "hgx-h100-drifted"], env={"SLURMD_NODENAME": cluster.node, "PWD": "/"}, cwd="/",
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert cluster.state()[1].startswith("nodewarden: gpu.lost gpu7")  # the reason stays short
    entry = decisions(tmp_path / "state")[-1]
    report = audit_json(run_cli, "--simulate", "hgx-h100-drifted")
    drains = [g for a in report["actions"] if a["drains"] for g in a["gpus"]]
    assert entry["action"] == "drain" and entry["gpus"] == drains
