"""The NVML source end to end: replay, recording round trip, hangs, lost GPUs, NotSupported."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.core.model import Unknown, Unsupported
from agent.sources.fsroot import LiveFs
from agent.sources.nvml import RecordedNvml, RecordingNvml, read_nvml
from agent.sources.snapshot import capture_live
from tests.conftest import REPO, RunCli

H100 = REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "nvml.json"


def recording() -> dict[str, Any]:
    return json.loads(H100.read_text())


class Hanging(RecordedNvml):
    """A driver that never returns from one call on one GPU."""

    def __init__(self, data: dict[str, Any], hang_on: str, gpu: int) -> None:
        super().__init__(data)
        self.hang_on, self.gpu = hang_on, gpu
        self.release = threading.Event()

    def _replay(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == self.hang_on and args and int(args[0]) == self.gpu:
            self.release.wait(30)
        return super()._replay(name, args)


def test_a_hung_call_becomes_unknown_within_the_deadline() -> None:
    # Not nvmlDeviceGetPowerUsage: the power draw now comes in the field-value batch (issue #16).
    backend = Hanging(recording(), "nvmlDeviceGetUtilizationRates", gpu=3)
    start = time.monotonic()
    facts, status = read_nvml(backend, timeout_s=0.5)
    elapsed = time.monotonic() - start
    backend.release.set()
    assert elapsed < 2.0
    assert not status.ok and "stuck in nvmlDeviceGetUtilizationRates after 3 GPU(s)" in (status.error or "")
    assert not isinstance(facts, Unknown)
    assert len(facts.gpus) == 3 and facts.incomplete  # the GPUs read before the hang are kept


def test_hung_nvml_in_an_audit_reports_and_finishes(run_cli: RunCli, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.sources.local_sources import NvmlSource

    backend = Hanging(recording(), "nvmlDeviceGetEccMode", gpu=0)

    def hanging_read(self: Any, node: Any, snap: Any, options: Any) -> Any:
        from agent.sources import nvml

        facts, status = nvml.read_nvml(backend, 0.3)
        return facts, {"nvml": status}

    monkeypatch.setattr(NvmlSource, "read_recorded", hanging_read)
    result = run_cli("audit", "--simulate", "hgx-h100-healthy", "--format", "json")
    backend.release.set()
    report = result.json()
    assert result.code == 1  # NVML down with GPUs on PCI is a failure, not a crash
    assert report["sources"]["nvml"]["ok"] is False
    source = next(f for f in report["findings"] if f["check"] == "source.available" and f["subject"] == "nvml")
    assert source["status"] == "fail" and "did not answer within 0.3 s" in source["message"]
    gpu_findings = [f for f in report["findings"] if f["check"].startswith("gpu.") and f["check"] != "gpu.xid"]
    assert gpu_findings and {f["status"] for f in gpu_findings} == {"unknown"}


def test_gpu_lost_in_the_middle_of_a_read() -> None:
    data = recording()
    data["devices"][2]["nvmlDeviceGetPowerUsage"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    facts, status = read_nvml(RecordedNvml(data))
    assert status.ok and not isinstance(facts, Unknown)
    assert facts.gpus[2].lost and "GPU is lost" in facts.gpus[2].lost
    assert [g.lost is None for g in facts.gpus].count(True) == 7  # the others are read on


def test_not_supported_everywhere_gives_unsupported_facts_not_errors() -> None:
    data = recording()
    device = data["devices"][0]
    for key in list(device):
        device[key] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    facts, status = read_nvml(RecordedNvml(data))
    assert status.ok and not isinstance(facts, Unknown)
    gpu = facts.gpus[0]
    for value in (gpu.ecc_mode, gpu.temperature_c, gpu.power_limit_w, gpu.nvlink_states, gpu.fabric_state,
                  gpu.pcie_width, gpu.vbios):
        assert isinstance(value, Unsupported), value


def test_library_missing_is_a_source_error() -> None:
    class NoLibrary(RecordedNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    facts, status = read_nvml(NoLibrary(recording()))
    assert isinstance(facts, Unknown) and not status.ok
    assert "is the NVIDIA driver installed?" in (status.error or "")


def test_recording_wrapper_round_trips_through_replay(tmp_path: Path) -> None:
    """RecordingNvml over a backend, written and replayed, reads the same facts."""
    original = RecordedNvml(recording())
    recorder = RecordingNvml(original)
    facts_live, status = read_nvml(recorder)
    assert status.ok
    replayed, status2 = read_nvml(RecordedNvml(json.loads(json.dumps(recorder.to_json()))))
    assert status2.ok
    assert replayed == facts_live


def test_snapshot_capture_records_nvml(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/hostname").write_text("gpu-node\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,100,-;hello\n")
    out = tmp_path / "snap"
    captured = capture_live(out, [], root=LiveFs(str(root)), kmsg_device=str(kmsg),
                            nvml_backend=RecordedNvml(recording()))
    assert captured == ["host", "kmsg", "nvml"]
    replayed, status = read_nvml(RecordedNvml.from_file(out / "nvml.json"))
    direct, _ = read_nvml(RecordedNvml(recording()))
    assert status.ok and replayed == direct


def test_broken_recordings_are_clear_errors(tmp_path: Path) -> None:
    from agent.core.errors import SnapshotError

    path = tmp_path / "nvml.json"
    path.write_text("{not json")
    with pytest.raises(SnapshotError, match="unreadable NVML recording"):
        RecordedNvml.from_file(path)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(SnapshotError, match=r"not a nodewarden\.nvml/v1 recording"):
        RecordedNvml.from_file(path)
    path.write_text(json.dumps({"format": "nodewarden.nvml/v1", "devices": {"0": {}}}))
    with pytest.raises(SnapshotError, match="`devices` a list"):
        RecordedNvml.from_file(path)
