"""`snapshot import-nvidia-smi` on the real dumps: real `nvidia-smi -q` / `-q -x` dumps
(fixtures/nvidia-smi/SOURCES.md) become nvml.json recordings that replay through RecordedNvml and the
real NvmlReader, so every value asserted here went dump -> importer -> nvml.json -> reader -> GpuFacts.
Also: every fixture is listed with its license, T.Limit-relative thresholds, the snapshot written on
disk, the CLI, and the other nvidia-smi outputs in the folder that are refused as not dumps. Anything
that is not a complete dump gets one SnapshotError, never a traceback (also under random truncation
and byte flips of every real dump).

Hand-edited and hand-written dumps (error texts, old layouts, encodings, truncation, refusal
messages): tests/unit/sources/importers/test_import_nvidia_smi_handmade.py.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import __version__
from agent.core.errors import SnapshotError
from agent.core.facts import GpuFacts, NvmlFacts
from agent.core.model import Unsupported
from agent.sources.importers.nvidia_smi import import_nvidia_smi, parse_nvidia_smi
from agent.sources.nvml import RecordedNvml, read_nvml
from agent.sources.snapshot import open_snapshot
from tests.conftest import REPO, RunCli
from tests.factories import NVIDIA_SMI_DUMPS as FIXTURES
from tests.factories import replay, text_of

H100 = ("NVIDIA H100 80GB HBM3", "10de:2330")
A100 = ("NVIDIA A100-SXM4-80GB", "10de:20b2")

# file -> (format, driver, per GPU: (bus id, (name, pci id), ECC mode, GPU temp C, power limit W, persistence)),
# every value read off the dump by eye.
IMPORTABLE: dict[str, tuple[str, str, list[tuple[str, tuple[str, str], str, int, float, str]]]] = {
    "gpud/nvidia-smi-query.535.129.03.out.0.valid.a10.txt": (
        "text", "535.129.03", [("0000:07:00.0", ("NVIDIA A10", "10de:2236"), "enabled", 33, 150.0, "enabled")]),
    "gpud/nvidia-smi-query.535.161.08.out.0.valid.txt": ("text", "535.161.08", [
        ("0000:19:00.0", H100, "enabled", 29, 700.0, "enabled"), ("0000:3b:00.0", H100, "enabled", 29, 700.0, "enabled"),
        ("0000:4c:00.0", H100, "enabled", 30, 700.0, "enabled"), ("0000:5d:00.0", H100, "enabled", 30, 700.0, "enabled"),
        ("0000:9b:00.0", H100, "enabled", 31, 700.0, "enabled"), ("0000:bb:00.0", H100, "enabled", 32, 700.0, "enabled"),
        ("0000:cb:00.0", H100, "enabled", 32, 700.0, "enabled"), ("0000:db:00.0", H100, "enabled", 31, 700.0, "enabled"),
    ]),
    "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": (
        "text", "590.48.01", [("0000:00:09.0", H100, "enabled", 41, 700.0, "enabled")]),
    "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt": (
        "text", "590.48.01", [("0000:00:09.0", H100, "enabled", 42, 700.0, "enabled")]),
    "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt": (
        "text", "590.48.01", [("0000:83:00.0", ("NVIDIA H200", "10de:2335"), "enabled", 28, 700.0, "enabled")]),
    "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt": (
        "text", "595.80", [("0000:01:00.0", ("NVIDIA L40S", "10de:26b9"), "enabled", 64, 350.0, "disabled")]),
    "telegraf/a100-sxm4-v12.xml": ("xml", "535.54.03", [("0000:01:00.0", A100, "enabled", 27, 500.0, "disabled")]),
    # telegraf masked this dump's PCI ids to 000000DE: the importer keeps what the dump says.
    "telegraf/a10g.xml": ("xml", "515.105.01", [
        ("0000:00:1e.0", ("NVIDIA A10G", "00de:0000"), "enabled", 17, 300.0, "disabled")]),
    "telegraf/rtx-4000-sff-ada-v13.xml": ("xml", "595.84", [
        ("0000:06:00.0", ("NVIDIA RTX 4000 SFF Ada Generation", "10de:27b0"), "disabled", 38, 70.0, "enabled")]),
    "telegraf/tesla-t4.xml": ("xml", "515.105.01", [
        ("0000:00:1e.0", ("Tesla T4", "10de:1eb8"), "enabled", 40, 70.0, "disabled")]),
    "thamada-gls/A10.q.txt": ("text", "550.90.12", [
        ("0000:08:00.0", ("NVIDIA A10", "10de:2236"), "enabled", 33, 150.0, "enabled")]),
    "thamada-gls/A100SXMx4.q.txt": ("text", "555.42.02", [
        ("0000:68:00.0", A100, "enabled", 25, 500.0, "enabled"), ("0000:9e:00.0", A100, "enabled", 22, 500.0, "enabled"),
        ("0000:c2:00.0", A100, "enabled", 23, 500.0, "enabled"), ("0000:d4:00.0", A100, "enabled", 23, 500.0, "enabled"),
    ]),
    "thamada-gls/H100SXMx8.q.txt": ("text", "565.57.01", [
        ("0000:18:00.0", H100, "enabled", 30, 700.0, "enabled"), ("0000:2a:00.0", H100, "enabled", 30, 700.0, "enabled"),
        ("0000:3a:00.0", H100, "enabled", 31, 700.0, "enabled"), ("0000:5d:00.0", H100, "enabled", 29, 700.0, "enabled"),
        ("0000:9a:00.0", H100, "enabled", 28, 700.0, "enabled"), ("0000:ab:00.0", H100, "enabled", 30, 700.0, "enabled"),
        ("0000:ba:00.0", H100, "enabled", 29, 700.0, "enabled"), ("0000:db:00.0", H100, "enabled", 29, 700.0, "enabled"),
    ]),
    "thamada-gls/H200.q.txt": ("text", "550.90.12", [
        ("0000:03:00.0", ("NVIDIA H200", "10de:2335"), "enabled", 28, 700.0, "enabled")]),
    "thamada-gls/L40S.q.txt": ("text", "550.127.05", [
        ("0000:a1:00.0", ("NVIDIA L40S", "10de:26b9"), "enabled", 30, 350.0, "enabled")]),
    # R460 prints "Ecc Mode" (not "ECC Mode") and Single/Double Bit ECC totals; Hyper-V PCI domains.
    "azhpc-diagnostics/nvidia-smi-q.4xV100-PCIE-16GB.txt": ("text", "460.32.03", [
        (f"000{n}:00:00.0", ("Tesla V100-PCIE-16GB", "10de:1db4"), "enabled", temp, 250.0, "disabled")
        for n, temp in ((1, 32), (2, 31), (3, 30), (4, 31))]),
}
# `nvidia-smi -q -d PAGE_RETIREMENT`: only the Retired Pages sections.
RETIRED_ONLY = ("azurehpc/orig_nvsmi8_output.txt", "azurehpc/bad_nvsmi8_output.txt")
CORRUPTED = "gpud/nvidia-smi-query.535.183.01.out.0.invalid.txt"
NOT_DUMPS = (
    "azhpc-diagnostics/nvidia-smi-inforom.8xV100.txt",
    "azhpc-diagnostics/nvidia-smi-nvlink-status.bad.8xV100.txt",
    "azhpc-diagnostics/nvidia-smi-query-gpu.retired-remapped.csv",
    "azhpc-diagnostics/cuda-bandwidthTest.A100-SXM4-40GB.txt",  # CUDA samples' bandwidthTest, not nvidia-smi
    "azurehpc/bad_nvlink_status.txt",
    "azurehpc/good_nvlink_status.txt",
    "gpud/nvidia-smi.550.90.07.out.0.valid.txt",
    "gpud/nvidia-smi.nvlink.status.a100.txt",
    "thamada-gls/A10.table.txt",
    "thamada-gls/A100SXMx4.table.txt",
    "thamada-gls/H100SXMx8.table.txt",
    "thamada-gls/H200.table.txt",
    "thamada-gls/L40S.table.txt",
)
ALL_FIXTURES = (*IMPORTABLE, *RETIRED_ONLY, CORRUPTED, *NOT_DUMPS)


@functools.cache
def imported(rel: str) -> tuple[dict[str, Any], NvmlFacts]:
    document = parse_nvidia_smi(text_of(rel), rel)
    return document, replay(document)


def gpus(rel: str) -> tuple[GpuFacts, ...]:
    return imported(rel)[1].gpus


def device(rel: str, index: int) -> dict[str, Any]:
    return imported(rel)[0]["devices"][index]  # type: ignore[no-any-return]


# --- the fixtures themselves ----------------------------------------------------------------------------


def license_files() -> dict[str, str]:
    """fixture -> the license text its SOURCES.md row names (fixtures/LICENSES/<owner>_<repo>.txt)."""
    sources = (FIXTURES / "SOURCES.md").read_text(encoding="utf-8").splitlines()
    named = {}
    for rel in ALL_FIXTURES:
        row = next(line for line in sources if line.startswith(f"| `{rel}` |"))
        named[rel] = row.split("[", 1)[1].split("]", 1)[0].replace("/", "_") + ".txt"
    return named


def test_every_fixture_is_listed_in_sources_with_its_license() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.is_file()} - {"SOURCES.md"}
    assert on_disk == set(ALL_FIXTURES)
    for rel, license_name in license_files().items():
        assert (REPO / "fixtures" / "LICENSES" / license_name).is_file(), rel


# --- every real dump round-trips ------------------------------------------------------------------------


@pytest.mark.parametrize("rel", sorted(IMPORTABLE))
def test_real_dump_values_reach_the_facts(rel: str) -> None:
    fmt, driver, expected = IMPORTABLE[rel]
    document, facts = imported(rel)
    assert document["format"] == "nodewarden.nvml/v1"
    assert facts.driver_version == driver
    assert facts.device_count == len(expected) == len(facts.gpus)
    for gpu, (bus, (name, pci_id), ecc, temperature, limit_w, persistence) in zip(facts.gpus, expected, strict=True):
        assert gpu.lost is None
        assert (gpu.pci_bus_id, gpu.name, gpu.pci_id) == (bus, name, pci_id)
        assert (gpu.ecc_mode, gpu.temperature_c, gpu.power_limit_w, gpu.persistence_mode) == \
            (ecc, temperature, limit_w, persistence)
        assert gpu.compute_mode == "Default"
        assert isinstance(gpu.uuid, str) and gpu.uuid.startswith("GPU-")
        assert isinstance(gpu.shutdown_c, int) and isinstance(gpu.slowdown_c, int)
        assert gpu.shutdown_c > gpu.slowdown_c > temperature
        assert isinstance(gpu.clock_events, int)
        # nvidia-smi -q has no NVLink section and no compute capability: "not in this recording", never a value.
        assert isinstance(gpu.compute_capability, Unsupported)
        assert "not in this recording" in gpu.compute_capability.reason
        assert isinstance(gpu.nvlink_states, Unsupported)
    assert fmt == ("xml" if rel.endswith(".xml") else "text")


def test_cuda_version_and_device_count_are_system_calls() -> None:
    document, facts = imported("gpud/nvidia-smi-query.535.161.08.out.0.valid.txt")
    assert document["system"] == {"nvmlSystemGetDriverVersion": "535.161.08",
                                  "nvmlSystemGetCudaDriverVersion_v2": 12020, "nvmlDeviceGetCount": 8}
    assert facts.cuda_driver_version == "12.2"
    assert imported("nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt")[1].cuda_driver_version == "13.2"


def test_h100_power_brake_slowdown_is_active_on_all_eight() -> None:
    rel = "gpud/nvidia-smi-query.535.161.08.out.0.valid.txt"
    assert [g.clock_events for g in gpus(rel)] == [0x8 | 0x80] * 8  # HW Slowdown + HW Power Brake Slowdown
    assert all(device(rel, i)["nvmlDeviceGetCurrentClocksEventReasons"] == 0x88 for i in range(8))
    assert [g.pcie_replays for g in gpus(rel)] == [67, 63, 52, 43, 49, 53, 82, 67]
    assert {(g.fabric_state, g.fabric_status) for g in gpus(rel)} == {("completed", "success")}


def test_a100_remapped_row_pending_on_9e_only() -> None:
    rel = "thamada-gls/A100SXMx4.q.txt"
    assert [(g.pci_bus_id, g.remap_pending) for g in gpus(rel)] == [
        ("0000:68:00.0", False), ("0000:9e:00.0", True), ("0000:c2:00.0", False), ("0000:d4:00.0", False)]
    assert [device(rel, i)["nvmlDeviceGetFieldValues"]["NVML_FI_DEV_REMAPPED_PENDING"] for i in range(4)] == [0, 1, 0, 0]
    assert [g.remapped_correctable for g in gpus(rel)] == [0, 1, 1, 0]
    assert {(g.remapped_uncorrectable, g.remap_failure) for g in gpus(rel)} == {(0, False)}
    assert [g.memory_max_c for g in gpus(rel)] == [95] * 4  # "Memory Max Operating Temp : 95 C"


def test_a10_has_four_uncorrectable_remapped_rows_pending() -> None:
    (gpu,) = gpus("gpud/nvidia-smi-query.535.129.03.out.0.valid.a10.txt")
    assert (gpu.remapped_correctable, gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failure) == \
        (0, 4, True, False)
    assert (gpu.shutdown_c, gpu.slowdown_c, gpu.gpu_max_c) == (101, 98, 91)  # absolute thresholds, no T.Limit
    assert isinstance(gpu.mig_mode, Unsupported)  # "MIG Mode / Current : N/A"
    assert isinstance(gpu.memory_temperature_c, Unsupported)  # "Memory Current Temp : N/A"
    assert gpu.clock_events == 0x1  # Idle


def test_healthy_h100_node() -> None:
    rel = "thamada-gls/H100SXMx8.q.txt"
    for gpu in gpus(rel):
        assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected, gpu.ecc_aggregate_corrected) == (0, 0, 0)
        assert (gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failure) == (0, False, False)
        assert (gpu.fabric_state, gpu.fabric_status, gpu.recovery_action) == ("completed", "success", 0)
        assert (gpu.pcie_gen, gpu.pcie_width, gpu.mig_mode) == (5, 16, "disabled")
        assert isinstance(gpu.retired_sbe, Unsupported)  # "Single Bit ECC : N/A" on Hopper
    assert [g.pcie_replays for g in gpus(rel)] == [7, 0, 0, 0, 0, 4, 15, 0]


def test_injected_retired_page_faults() -> None:
    """bad_nvsmi8_output.txt is orig_nvsmi8_output.txt with retired pages injected on five GPUs."""
    def retired(rel: str) -> list[tuple[Any, ...]]:
        return [(g.pci_bus_id, g.retired_sbe, g.retired_dbe, g.retired_pending) for g in gpus(rel)]

    buses = [f"000{n}:00:00.0" for n in range(1, 9)]
    assert retired("azurehpc/orig_nvsmi8_output.txt") == [(bus, 0, 0, False) for bus in buses]
    assert retired("azurehpc/bad_nvsmi8_output.txt") == [
        (buses[0], 60, 5, False), (buses[1], 2, 61, True), (buses[2], 0, 0, False), (buses[3], 6, 0, True),
        (buses[4], 0, 0, False), (buses[5], 20, 45, True), (buses[6], 0, 0, False), (buses[7], 8, 56, True)]
    gpu = gpus("azurehpc/bad_nvsmi8_output.txt")[0]
    assert isinstance(gpu.name, Unsupported) and "not in this recording" in gpu.name.reason
    assert imported("azurehpc/bad_nvsmi8_output.txt")[1].driver_version == "535.86.10"


def test_corrupted_dump_is_refused_with_one_clear_message() -> None:
    with pytest.raises(SnapshotError) as caught:
        parse_nvidia_smi(text_of(CORRUPTED), CORRUPTED)
    assert caught.value.message == "dump says 8 attached GPUs but holds 1 GPU section (truncated or corrupted?)"
    assert caught.value.line == 7  # the "Attached GPUs" line


def test_telegraf_xml_dumps() -> None:
    (t4,) = gpus("telegraf/tesla-t4.xml")
    assert (t4.persistence_mode, t4.pcie_width, t4.pcie_width_max, t4.pcie_gen, t4.pcie_gen_max) == \
        ("disabled", 8, 16, 3, 3)
    assert (t4.retired_sbe, t4.retired_dbe, t4.retired_pending) == (0, 0, False)
    assert isinstance(t4.remapped_correctable, Unsupported)  # <remapped_rows>N/A</remapped_rows>
    assert (t4.shutdown_c, t4.slowdown_c, t4.gpu_max_c, t4.power_w, t4.enforced_limit_w) == (96, 93, 85, 26.78, 70.0)
    (a10g,) = gpus("telegraf/a10g.xml")
    assert (a10g.persistence_mode, a10g.pcie_width, a10g.pcie_width_max, a10g.pcie_gen, a10g.pcie_gen_max) == \
        ("disabled", 8, 16, 1, 4)
    (ada,) = gpus("telegraf/rtx-4000-sff-ada-v13.xml")
    assert (ada.ecc_mode, ada.ecc_pending) == ("disabled", "disabled")
    assert isinstance(ada.ecc_volatile_uncorrected, Unsupported)  # counters N/A with ECC off
    assert (ada.architecture, ada.serial, ada.recovery_action) == (8, "REDACTED", 0)
    (a100,) = gpus("telegraf/a100-sxm4-v12.xml")
    assert (a100.persistence_mode, a100.mig_mode, a100.mig_pending) == ("disabled", "enabled", "enabled")
    assert isinstance(a100.fabric_state, Unsupported)  # <fabric><state>N/A</state>
    assert device("telegraf/a100-sxm4-v12.xml", 0)["nvmlDeviceGetGpuFabricInfoV"]["error"] == \
        "NVML_ERROR_NOT_SUPPORTED"


def test_old_drivers_clock_throttle_reasons_replay_through_the_fallback() -> None:
    rel = "telegraf/a10g.xml"  # driver 515: <clocks_throttle_reasons>
    assert device(rel, 0)["nvmlDeviceGetCurrentClocksEventReasons"]["error"] == "NVML_ERROR_FUNCTION_NOT_FOUND"
    assert device(rel, 0)["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0x1
    assert gpus(rel)[0].clock_events == 0x1
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in device("telegraf/a100-sxm4-v12.xml", 0)


def test_power_limits_follow_the_nvidia_smi_field_meanings() -> None:
    """"Requested Power Limit" is the software limit (power.limit), "Current Power Limit" the enforced one."""
    dev = device("nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt", 0)
    assert dev["nvmlDeviceGetPowerManagementLimit"] == dev["nvmlDeviceGetEnforcedPowerLimit"] == 350000
    assert dev["nvmlDeviceGetPowerManagementLimitConstraints"] == [100000, 350000]
    assert dev["nvmlDeviceGetPowerUsage"] == 183280  # "Average Power Draw : 183.28 W" (NVML's power.draw)
    gpu = gpus("gpud/nvidia-smi-query.535.161.08.out.0.valid.txt")[0]
    assert (gpu.power_w, gpu.default_limit_w, gpu.min_limit_w, gpu.max_limit_w) == (67.74, 700.0, 200.0, 700.0)
    capped = text_of("thamada-gls/H200.q.txt").replace(
        "Requested Power Limit             : 700.00 W", "Requested Power Limit             : 500.00 W")
    (gpu,) = replay(parse_nvidia_smi(capped, "h200")).gpus
    assert (gpu.power_limit_w, gpu.enforced_limit_w) == (500.0, 700.0)


# --- T.Limit-relative thresholds ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rel", "index", "shutdown", "slowdown", "gpu_max"), [
    # 29 C + margin 56 C: T.Limit 85 C; shutdown -8, slowdown -2, max operating 0 C on the margin scale.
    ("gpud/nvidia-smi-query.535.161.08.out.0.valid.txt", 0, 93, 87, 85),
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", 0, 95, 89, 87),  # 41 + 46
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt", 0, 95, 89, 87),  # 42 + 45
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt", 0, 95, 89, 87),  # 28 + 59
    ("nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt", 0, 93, 90, 88),  # 64 + 24, shutdown -5
    ("telegraf/rtx-4000-sff-ada-v13.xml", 0, 94, 89, 87),  # 38 + 49, <gpu_temp_max_tlimit_threshold>-7 C
    ("thamada-gls/H100SXMx8.q.txt", 6, 91, 85, 83),  # 29 + 54
])
def test_thresholds_derived_from_t_limit_offsets(rel: str, index: int, shutdown: int, slowdown: int,
                                                 gpu_max: int) -> None:
    gpu = gpus(rel)[index]
    assert (gpu.shutdown_c, gpu.slowdown_c, gpu.gpu_max_c) == (shutdown, slowdown, gpu_max)
    dev = device(rel, index)  # converted values are real values: plain integers, no "note"
    assert [dev[f"nvmlDeviceGetTemperatureThreshold({i})"] for i in (0, 1, 3)] == [shutdown, slowdown, gpu_max]


def test_memory_threshold_relative_to_an_unprinted_limit_is_left_out(tmp_path: Path) -> None:
    rel = "thamada-gls/H200.q.txt"  # "Memory Max Operating T.Limit Temp : 0 C", no memory margin printed
    assert "nvmlDeviceGetTemperatureThreshold(2)" not in device(rel, 0)
    assert "not in this recording" in str(gpus(rel)[0].memory_max_c)
    result = import_nvidia_smi(FIXTURES / rel, tmp_path / "snap")
    assert "thresholds derived from T.Limit-relative values (threshold = current temperature + T.Limit margin" \
           " - offset)" in result.warnings
    assert any("Memory Max Operating T.Limit Temp" in w for w in result.warnings)


def test_mig_capture_ignores_mig_devices() -> None:
    rel = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
    (gpu,) = gpus(rel)
    assert (gpu.mig_mode, gpu.mig_pending, gpu.ecc_volatile_uncorrected) == ("enabled", "enabled", 0)
    assert (gpu.memory_temperature_c, gpu.pcie_replays, gpu.power_w) == (48, 9, 71.27)


# --- snapshots on disk -------------------------------------------------------------------------------------


def test_import_writes_a_snapshot_the_audit_opens(tmp_path: Path) -> None:
    rel = "gpud/nvidia-smi-query.535.161.08.out.0.valid.txt"
    out = tmp_path / "node"
    result = import_nvidia_smi(FIXTURES / rel, out)
    assert (result.gpu_count, result.driver_version, result.format) == (8, "535.161.08", "text")
    assert sorted(p.name for p in out.iterdir()) == ["meta.yaml", "nvml.json"]
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    assert meta == {"hostname": "nvidia-smi-query.535.161.08.out.0.valid", "captured_at": "2024-07-31T11:22:39",
                    "nodewarden_version": __version__, "captured": ["nvml"],
                    "source": "nvidia-smi import of nvidia-smi-query.535.161.08.out.0.valid.txt",
                    "driver_version": "535.161.08", "warnings": result.warnings}
    raw = (out / "nvml.json").read_text()
    assert raw == json.dumps(json.loads(raw), indent=1, sort_keys=True) + "\n"
    snapshot = open_snapshot(out)
    assert snapshot.has("nvml") and not snapshot.has("host")
    facts, status = read_nvml(RecordedNvml.from_file(out / "nvml.json"))
    assert status.ok and isinstance(facts, NvmlFacts) and facts.device_count == 8
    assert [p.name for p in tmp_path.iterdir()] == ["node"]  # no temporary directory left behind


def test_import_of_xml_reports_its_format(tmp_path: Path) -> None:
    result = import_nvidia_smi(FIXTURES / "telegraf/a100-sxm4-v12.xml", tmp_path / "a100")
    assert (result.format, result.gpu_count, result.driver_version) == ("xml", 1, "535.54.03")
    # telegraf kept one of the four <gpu> elements: a selection, recorded as such.
    assert result.warnings == ["dump says 4 attached GPUs but holds 1 <gpu> element (a dump of selected GPUs, "
                               "nvidia-smi -q -x -i?): only those are recorded"]
    assert yaml.safe_load((tmp_path / "a100" / "meta.yaml").read_text())["captured_at"] == "2023-08-04T11:44:30"


def test_capture_file_with_two_dumps_imports_the_first_with_a_warning(tmp_path: Path) -> None:
    result = import_nvidia_smi(FIXTURES / "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt",
                               tmp_path / "h200")
    assert result.warnings[0] == ("the file holds 2 nvidia-smi -q dumps (banners at lines 1480, 1826); "
                                  "imported the first, lines 1481-1735")
    assert result.warnings[1].startswith("ignored ") and result.gpu_count == 1


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(SnapshotError, match="refusing to overwrite"):
        import_nvidia_smi(FIXTURES / "thamada-gls/A10.q.txt", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert import_nvidia_smi(FIXTURES / "thamada-gls/A10.q.txt", empty).gpu_count == 1
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SnapshotError, match="refusing to overwrite"):
        import_nvidia_smi(FIXTURES / "thamada-gls/A10.q.txt", afile)


def test_a_refused_dump_leaves_no_output(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError):
        import_nvidia_smi(FIXTURES / CORRUPTED, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SnapshotError, match="cannot read"):
        import_nvidia_smi(tmp_path / "missing.txt", tmp_path / "out")


# --- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", NOT_DUMPS)
def test_other_nvidia_smi_outputs_are_not_dumps(rel: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        parse_nvidia_smi(text_of(rel), rel)
    assert caught.value.message.startswith("not an nvidia-smi -q dump: ")
    assert caught.value.path == rel


def test_cli_command(run_cli: RunCli, tmp_path: Path) -> None:
    ok = run_cli("snapshot", "import-nvidia-smi", str(FIXTURES / "thamada-gls/A100SXMx4.q.txt"),
                 "--out", str(tmp_path / "a100"))
    assert ok.code == 0 and "imported 4 GPU(s), driver 555.42.02" in ok.stdout
    bad = run_cli("snapshot", "import-nvidia-smi", str(FIXTURES / CORRUPTED), "--out", str(tmp_path / "bad"))
    assert bad.code == 2
    assert "dump says 8 attached GPUs but holds 1 GPU section (truncated or corrupted?)" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "bad").exists()


def test_fuzzed_dumps_import_or_fail_cleanly() -> None:
    """Random truncations and byte flips of every real dump: a result that replays, or a SnapshotError."""
    rng = random.Random(20240731)  # noqa: S311 - a fixed seed, for reproducible test data
    imported_ok = refused = 0
    for rel in (*IMPORTABLE, *RETIRED_ONLY, CORRUPTED):
        data = (FIXTURES / rel).read_bytes()
        variants = [data[: rng.randrange(len(data))] for _ in range(4)]
        for _ in range(4):
            flipped = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            variants.append(bytes(flipped))
        for variant in variants:
            try:
                document = parse_nvidia_smi(variant.decode("utf-8", errors="replace"), rel)
            except SnapshotError:
                refused += 1
                continue
            replay(document)
            imported_ok += 1
    assert imported_ok and refused


def test_the_table_of_an_imported_dump_says_unknown_host_not_a_question_mark(tmp_path: Path, run_cli: RunCli) -> None:
    """Issue 36.9: nvidia-smi -q prints no host name; the audit's first line says so in words."""
    out = tmp_path / "snap"
    dump = REPO / "fixtures" / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
    assert run_cli("snapshot", "import-nvidia-smi", str(dump), "--out", str(out)).code == 0
    result = run_cli("audit", "--snapshot", str(out), "--format", "table")
    first = result.stdout.splitlines()[0]
    assert first.startswith("nodewarden audit of unknown host (unknown model)"), first
