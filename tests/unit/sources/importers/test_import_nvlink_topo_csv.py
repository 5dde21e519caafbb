"""`snapshot import` of `nvidia-smi nvlink -s`, `topo -m` and `--query-gpu --format=csv` (issue 15).

Real captures from fixtures/nvidia-smi/ (kinds nvidia-smi-nvlink, nvidia-smi-query-csv in
fixtures/expect/MANIFEST.yaml) and synthetic samples in fixtures/import-samples/ (SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
S = F / "import-samples"
NVLINK_A100 = F / "nvidia-smi" / "gpud" / "nvidia-smi.nvlink.status.a100.txt"
NVLINK_GOOD = F / "nvidia-smi" / "azurehpc" / "good_nvlink_status.txt"
NVLINK_ALL_DOWN = F / "nvidia-smi" / "azurehpc" / "bad_nvlink_status.txt"
NVLINK_V100 = F / "nvidia-smi" / "azhpc-diagnostics" / "nvidia-smi-nvlink-status.bad.8xV100.txt"
CSV_REAL = F / "nvidia-smi" / "azhpc-diagnostics" / "nvidia-smi-query-gpu.retired-remapped.csv"
Q_A100X4 = F / "nvidia-smi" / "thamada-gls" / "A100SXMx4.q.txt"
STATE = "NVML_FI_DEV_NVLINK_GET_STATE"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Site profiles with the NVLink count of the captured GPUs (no shipped profile is a V100 or a 4x A100)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for name, links in (("v100-links-test", 6), ("a100-links-test", 12)):
        (profiles / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "description": "test", "extends": "generic-nvidia",
            "expect": {"gpu": {"nvlink": {"active_links": {"equals": links, "severity": "critical",
                                                            "reason": "test"}}}}}))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"profile_dirs": [str(profiles)]}))
    return path


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> dict[str, Any]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text())  # type: ignore[no-any-return]


def _audit(run_cli: RunCli, out: Path, config: Path, profile: str) -> dict[tuple[str, str], dict[str, Any]]:
    result = run_cli("audit", "--snapshot", str(out), "--config", str(config), "--profile", profile,
                     "--format", "json")
    assert result.code in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return {(f["check"], f["subject"]): f for f in json.loads(result.stdout)["findings"]}


def _nvml(out: Path) -> dict[str, Any]:
    return json.loads((out / "nvml.json").read_text())  # type: ignore[no-any-return]


def _states(device: dict[str, Any]) -> dict[int, int]:
    fields = device.get("nvmlDeviceGetFieldValues", {})
    return {int(k.split(":")[1]): v for k, v in fields.items() if k.startswith(STATE + ":")}


# --- nvlink -s -------------------------------------------------------------------------------------------


def test_a100_nvlink_status_alone_is_twelve_active_links_per_gpu(run_cli: RunCli, tmp_path: Path,
                                                                  config: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, NVLINK_A100)
    assert meta["inputs"][0]["kind"] == "nvidia-smi-nvlink"
    devices = _nvml(out)["devices"]
    assert len(devices) == 8
    assert all(_states(d) == dict.fromkeys(range(12), 1) for d in devices)
    assert devices[0]["nvmlDeviceGetUUID"] == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    assert devices[0]["nvmlDeviceGetName"] == "NVIDIA A100-SXM4-80GB"
    findings = _audit(run_cli, out, config, "a100-links-test")
    assert [findings[("gpu.nvlink.links", f"gpu{i}")]["status"] for i in range(8)] == ["pass"] * 8


def test_v100_status_with_inactive_links_fails_those_gpus(run_cli: RunCli, tmp_path: Path, config: Path) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, NVLINK_V100)
    devices = _nvml(out)["devices"]
    assert len(devices) == 7  # the capture shows GPUs 0-6
    assert _states(devices[3]) == {0: 1, 1: 1, 2: 1, 3: 0, 4: 1, 5: 0}
    findings = _audit(run_cli, out, config, "v100-links-test")
    status = {i: findings[("gpu.nvlink.links", f"gpu{i}")]["status"] for i in range(7)}
    assert status == {0: "pass", 1: "pass", 2: "pass", 3: "fail", 4: "fail", 5: "fail", 6: "fail"}
    assert "links down: 3, 5" in findings[("gpu.nvlink.links", "gpu3")]["message"]


def test_one_gpu_with_every_link_inactive_records_them_down(run_cli: RunCli, tmp_path: Path, config: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, NVLINK_ALL_DOWN)
    devices = _nvml(out)["devices"]
    assert len(devices) == 7 and devices[:6] == [{}] * 6  # GPUs 0-5 are not in this capture
    assert _states(devices[6]) == dict.fromkeys(range(12), 0)  # an A100 SXM4 has 12
    assert "all links inactive" in meta["inputs"][0]["contributed"][0]
    findings = _audit(run_cli, out, config, "a100-links-test")
    assert findings[("gpu.nvlink.links", "gpu6")]["status"] == "fail"
    assert findings[("gpu.nvlink.links", "gpu0")]["status"] == "skip"
    assert "not in this recording" in findings[("gpu.nvlink.links", "gpu0")]["message"]


def test_one_healthy_gpu_status(run_cli: RunCli, tmp_path: Path, config: Path) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, NVLINK_GOOD)
    assert _states(_nvml(out)["devices"][7]) == dict.fromkeys(range(12), 1)
    assert _audit(run_cli, out, config, "a100-links-test")[("gpu.nvlink.links", "gpu7")]["status"] == "pass"


@pytest.mark.parametrize("order", ["dump-first", "dump-last"])
def test_nvlink_and_csv_add_facts_to_a_q_dump_in_any_order(run_cli: RunCli, tmp_path: Path, config: Path,
                                                            order: str) -> None:
    extra = [S / "nvlink-s.a100x4.txt", S / "query-gpu.a100x4.csv"]
    inputs = [Q_A100X4, *extra] if order == "dump-first" else [*extra, Q_A100X4]
    out = tmp_path / "snap"
    meta = _import(run_cli, out, *inputs)
    fed = meta["fed_by"]["nvml"]
    assert str(Q_A100X4) in fed and str(S / "nvlink-s.a100x4.txt") in fed
    devices = _nvml(out)["devices"]
    assert len(devices) == 4
    assert [d["nvmlDeviceGetPciInfo"]["busId"] for d in devices] == [
        "00000000:68:00.0", "00000000:9E:00.0", "00000000:C2:00.0", "00000000:D4:00.0"]
    assert _states(devices[2]) == {**dict.fromkeys(range(12), 1), 4: 0, 9: 0}
    assert devices[0]["nvmlDeviceGetVbiosVersion"] == "92.00.9E.00.02"  # from the -q dump
    findings = _audit(run_cli, out, config, "a100-links-test")
    assert findings[("gpu.nvlink.links", "gpu2")]["status"] == "fail"
    assert "links down: 4, 9" in findings[("gpu.nvlink.links", "gpu2")]["message"]
    assert findings[("gpu.nvlink.links", "gpu0")]["status"] == "pass"
    # First input wins; the later input's different value is named as skipped, with the input that won.
    csv = next(e for e in meta["inputs"] if e["kind"] == "nvidia-smi-query-csv")
    dump = next(e for e in meta["inputs"] if e["name"] == str(Q_A100X4))
    if order == "dump-last":  # the CSV's values stand: 400 W, one uncorrectable remapped row pending on GPU 1
        assert devices[0]["nvmlDeviceGetPowerManagementLimit"] == 400000
        assert findings[("gpu.row_remap", "gpu1")]["status"] in ("warn", "fail")
        assert f"GPU 0 nvmlDeviceGetPowerManagementLimit: already given by {csv['name']}" in dump["skipped"]
    else:  # the dump's values stand; the CSV had nothing new
        assert devices[0]["nvmlDeviceGetPowerManagementLimit"] != 400000
        assert f"GPU 0 nvmlDeviceGetPowerManagementLimit: already given by {dump['name']}" in csv["skipped"]


def test_import_nvidia_smi_stays_strict(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli("snapshot", "import-nvidia-smi", str(NVLINK_A100), "--out", str(tmp_path / "x"))
    assert result.code == 2 and "Traceback" not in result.stderr


# --- CSV -------------------------------------------------------------------------------------------------


def test_real_retired_pages_csv(run_cli: RunCli, tmp_path: Path, config: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, CSV_REAL)
    assert meta["inputs"][0]["kind"] == "nvidia-smi-query-csv"
    devices = _nvml(out)["devices"]
    assert len(devices) == 4
    first = devices[0]
    assert first["nvmlDeviceGetSerial"] == "0000000000001"
    assert first["nvmlDeviceGetPciInfo"]["busId"] == "00000001:00:00.0"
    assert devices[2]["nvmlDeviceGetPciInfo"]["domain"] == 0xA
    fields = first["nvmlDeviceGetFieldValues"]
    assert fields["NVML_FI_DEV_RETIRED_DBE"] == 0 and fields["NVML_FI_DEV_RETIRED_SBE"] == 0
    assert fields["NVML_FI_DEV_REMAPPED_FAILURE"]["error"] == "NVML_ERROR_NOT_SUPPORTED"
    findings = _audit(run_cli, out, config, "generic-nvidia")
    retired = [f for (check, _), f in findings.items() if check == "gpu.retired_pages"]
    assert retired and all(f["status"] in ("pass", "skip") for f in retired)
    assert not [f for f in findings.values() if f["status"] == "fail" and f["check"].startswith("gpu.")]


def test_csv_units_and_pairs(run_cli: RunCli, tmp_path: Path) -> None:
    sample = tmp_path / "q.csv"
    sample.write_text("index, pci.bus_id, power.limit [W], power.draw [W], clocks.sm [MHz], ecc.mode.current, "
                      "utilization.gpu [%], utilization.memory [%], fan.speed [%]\n"
                      "0, 00000000:19:00.0, 700.00 W, 71.23 W, 345 MHz, Enabled, 0 %, 1 %, [N/A]\n")
    out = tmp_path / "snap"
    meta = _import(run_cli, out, sample)
    device = _nvml(out)["devices"][0]
    assert device["nvmlDeviceGetPowerManagementLimit"] == 700000
    assert device["nvmlDeviceGetPowerUsage"] == 71230
    assert device["nvmlDeviceGetClockInfo(1)"] == 345
    assert device["nvmlDeviceGetUtilizationRates"] == {"gpu": 0, "memory": 1}
    assert "nvmlDeviceGetEccMode" not in device  # NVML answers current and pending together
    skipped = meta["inputs"][0]["skipped"]
    assert any("ecc.mode.current" in s and "pair" in s for s in skipped)
    assert any("fan.speed" in s for s in skipped)


# --- topo -m ---------------------------------------------------------------------------------------------


def test_topo_matrix_is_read_and_named_not_invented(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, S / "topo-m.txt", CSV_REAL)
    topo = meta["inputs"][0]
    assert topo["kind"] == "nvidia-smi-topo" and not topo.get("error")
    assert any("GPU0" in s and "mlx5_0 (PIX)" in s for s in topo["skipped"])
    assert any("topology.gpu_nic reads the PCIe tree" in s for s in topo["skipped"])
    assert not (out / "fs").exists()


# --- hostile input ---------------------------------------------------------------------------------------


def _hostile(tmp_path: Path) -> dict[str, bytes]:
    wide = ",".join(["index", "uuid", *(f"f{i}" for i in range(10_000))])
    return {
        "junk.bin": bytes(range(256)) * 64,
        "long-nvlink.txt": b"GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-678a-b1a8-60f0-c90406537486)\n"
                           b"         Link 0: 25 GB/s\n" + b"A" * (10 << 20) + b"\n",
        "long.csv": b"index, name\n0, " + b"x" * (10 << 20) + b"\n",
        "wide.csv": (wide + "\n" + ",".join("0" for _ in range(10_002)) + "\n").encode(),
        "mismatch.csv": b"index, name, serial\n0, NVIDIA A100-SXM4-80GB, 1\n1, NVIDIA A100-SXM4-80GB\n",
        "twice.txt": b"GPU 0: X (UUID: GPU-5269b708-678a-b1a8-60f0-c90406537486)\n\t Link 0: 25 GB/s\n"
                     b"GPU 0: X (UUID: GPU-5269b708-678a-b1a8-60f0-c90406537486)\n\t Link 0: 25 GB/s\n",
        "topo-cut.txt": b"\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV12\t0-47\t0\n",
    }


def test_hostile_inputs_are_one_error_each_and_the_rest_imports(run_cli: RunCli, tmp_path: Path) -> None:
    names = []
    for name, data in _hostile(tmp_path).items():
        path = tmp_path / name
        path.write_bytes(data)
        names.append(path)
    out = tmp_path / "snap"
    result = run_cli("snapshot", "import", *(str(p) for p in names), str(NVLINK_A100), "--out", str(out))
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    by_name = {Path(e["name"]).name: e for e in meta["inputs"]}
    assert by_name["junk.bin"]["kind"] == "unknown"
    for name in ("wide.csv", "mismatch.csv", "long.csv", "twice.txt", "topo-cut.txt"):
        error = by_name[name].get("error")
        assert error and "\n" not in error, (name, by_name[name])
        assert any(name in line for line in result.stderr.splitlines()), name
    assert "10002 columns" in by_name["wide.csv"]["error"]
    assert "line 3" in by_name["mismatch.csv"]["error"]
    # the 10 MB line is not part of nvlink -s: the links before it still import
    assert by_name["long-nvlink.txt"]["kind"] == "nvidia-smi-nvlink"
    assert len(_nvml(out)["devices"]) == 8
