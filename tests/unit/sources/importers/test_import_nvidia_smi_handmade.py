"""`snapshot import-nvidia-smi` on hand-edited and hand-written input: real dumps re-encoded
(Windows UTF-16), with an unknown XML version, truncated, or with nvidia-smi's error texts, infoROM
warnings and lost-GPU lines put in; a dump in the layout of old drivers; and the one clear
SnapshotError for what is not a dump (empty, binary, HTML, entity declarations, other tools' output).

The real dumps as captured: tests/unit/sources/importers/test_import_nvidia_smi.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.errors import SnapshotError
from agent.core.model import Unknown, Unsupported
from agent.sources.importers.nvidia_smi import import_nvidia_smi, parse_nvidia_smi
from tests.conftest import REPO
from tests.factories import replay, text_of

# --- real dumps re-encoded ----------------------------------------------------------------------------------


def test_windows_utf16_output_imports(tmp_path: Path) -> None:
    source = tmp_path / "a10.txt"
    source.write_bytes(text_of("thamada-gls/A10.q.txt").replace("\n", "\r\n").encode("utf-16"))
    assert import_nvidia_smi(source, tmp_path / "out").gpu_count == 1
    assert replay(json.loads((tmp_path / "out" / "nvml.json").read_text())).gpus[0].name == "NVIDIA A10"


# --- refusals ------------------------------------------------------------------------------------------------


def test_not_dumps_say_what_they_look_like() -> None:
    def why(text: str) -> str:
        with pytest.raises(SnapshotError) as caught:
            parse_nvidia_smi(text, "f")
        return caught.value.message

    assert "default nvidia-smi table" in why(text_of("thamada-gls/H100SXMx8.table.txt"))
    assert "nvlink" in why(text_of("gpud/nvidia-smi.nvlink.status.a100.txt"))
    assert "CSV" in why(text_of("azhpc-diagnostics/nvidia-smi-query-gpu.retired-remapped.csv"))
    assert "JSON" in why('{"format": "nodewarden.nvml/v1", "devices": []}\n')
    lspci = (REPO / "fixtures" / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt")
    if lspci.is_file():
        assert "lspci" in why(lspci.read_text(encoding="utf-8", errors="replace"))
    assert "lspci" in why("19:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n")
    assert "found no GPUs" in why("No devices were found\n")


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty file"),
    ("\n  \n\t\n", "empty file"),
    ("\x00\x01\x02binary\x00" * 40, "binary data"),
    ("".join(chr(c) for c in range(1, 32)) * 20, "binary data"),
    ("==============NVSMI LOG==============\n\nTimestamp : Wed Jul 31 11:22:39 2024\n", "no 'Attached GPUs' line"),
    ("<html><body>hi</body></html>", "not an nvidia-smi -q -x dump: the XML root element is <html>"),
    ("<?xml version='1.0'?><nvidia_smi_log><driver_version>1</driver_version>", "malformed XML"),
    ("<nvidia_smi_log><attached_gpus>1</attached_gpus><gpu id='x'><foo>1</foo></gpu></nvidia_smi_log>",
     "none of the elements this importer reads"),
    ("<nvidia_smi_log><driver_version>550</driver_version></nvidia_smi_log>", "no <attached_gpus> element"),
])
def test_refusals_have_one_clear_message(text: str, message: str) -> None:
    with pytest.raises(SnapshotError, match=message.replace("(", r"\(").replace("?", r"\?")):
        parse_nvidia_smi(text, "dump.txt")


def test_entity_declarations_are_refused_before_parsing() -> None:
    laughs = ('<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n <!ENTITY a "aaaaaaaaaa">\n'
              ' <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">\n]>\n<nvidia_smi_log>&b;</nvidia_smi_log>\n')
    with pytest.raises(SnapshotError, match="declares entities") as caught:
        parse_nvidia_smi(laughs, "laughs.xml")
    assert caught.value.line == 3


def test_unknown_xml_version_imports_with_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "t4-v99.xml"
    source.write_text(text_of("telegraf/tesla-t4.xml").replace("nvsmi_device_v11.dtd", "nvsmi_device_v99.dtd"))
    result = import_nvidia_smi(source, tmp_path / "out")
    assert result.warnings == ["unknown nvidia-smi XML version nvsmi_device_v99.dtd: imported the elements "
                               "this importer knows"]
    assert replay(json.loads((tmp_path / "out" / "nvml.json").read_text())).gpus[0].name == "Tesla T4"


def test_truncated_dumps_are_refused() -> None:
    lines = text_of("thamada-gls/A100SXMx4.q.txt").splitlines(keepends=True)
    with pytest.raises(SnapshotError, match="dump says 4 attached GPUs but holds 2 GPU sections"):
        parse_nvidia_smi("".join(lines[:400]), "a100")  # cut inside the second GPU, at a line end
    single = text_of("thamada-gls/H200.q.txt")
    with pytest.raises(SnapshotError, match=r"GPU section 00000000:03:00.0 ends before its 'Processes' line"):
        parse_nvidia_smi(single[:single.index("    Temperature")], "h200")
    with pytest.raises(SnapshotError, match="ends in the middle of a line"):
        parse_nvidia_smi(single[:single.index("Processes") - 20], "h200")
    with pytest.raises(SnapshotError, match=r"holds 0 GPU sections"):
        parse_nvidia_smi(single[:single.index("GPU 00000000:03:00.0")], "h200")
    xml = text_of("telegraf/tesla-t4.xml")
    with pytest.raises(SnapshotError, match="malformed XML") as caught:
        parse_nvidia_smi(xml[: len(xml) // 2], "t4.xml")
    assert caught.value.line is not None and caught.value.line > 100


# --- what nvidia-smi prints instead of values -----------------------------------------------------------------


def test_error_texts_become_nvml_errors() -> None:
    text = text_of("thamada-gls/H200.q.txt")
    text = text.replace("Power Draw                        : 74.58 W", "Power Draw                        : [Unknown Error]")
    text = text.replace("GPU Current Temp                  : 28 C", "GPU Current Temp                  : [N/A]")
    text = text.replace("Replays Since Reset               : 0", "Replays Since Reset               : Insufficient Permissions")
    text = text.replace("Max Power Limit                   : 700.00 W", "Max Power Limit                   : 7O0.00 W")
    document = parse_nvidia_smi(text, "h200")
    dev = document["devices"][0]
    assert dev["nvmlDeviceGetPowerUsage"] == {"error": "NVML_ERROR_UNKNOWN", "note": "Unknown Error in nvidia-smi"}
    assert dev["nvmlDeviceGetTemperatureV(0)"] == {"error": "NVML_ERROR_NOT_SUPPORTED", "note": "N/A in nvidia-smi"}
    assert dev["nvmlDeviceGetFieldValues"]["NVML_FI_DEV_PCIE_REPLAY_COUNTER"]["error"] == "NVML_ERROR_NO_PERMISSION"
    assert dev["nvmlDeviceGetPowerManagementLimitConstraints"]["error"] == "NVML_ERROR_UNKNOWN"
    gpu = replay(document).gpus[0]
    assert type(gpu.power_w) is Unknown and isinstance(gpu.temperature_c, Unsupported)
    assert type(gpu.pcie_replays) is Unknown and type(gpu.max_limit_w) is Unknown
    # Without the current temperature the T.Limit offsets cannot be converted: left out, with a warning.
    assert "nvmlDeviceGetTemperatureThreshold(1)" not in dev


def test_inforom_warning_and_lost_gpu_lines(tmp_path: Path) -> None:
    text = text_of("azurehpc/orig_nvsmi8_output.txt")
    lost = "GPU 00000008:00:00.0\n    Retired Pages\n        Single Bit ECC                    : 0\n" \
           "        Double Bit ECC                    : 0\n        Pending Page Blacklist            : No\n"
    assert lost in text
    text = "WARNING: infoROM is corrupted at gpu 0003:00:00.0\n" + text.replace(
        lost, "Unable to determine the device handle for GPU 00000008:00:00.0: GPU is lost\n")
    source = tmp_path / "nvsmi.txt"
    source.write_text(text)
    result = import_nvidia_smi(source, tmp_path / "out")
    assert result.gpu_count == 8
    assert "nvidia-smi warned (line 1): WARNING: infoROM is corrupted at gpu 0003:00:00.0" in result.warnings
    facts = replay(json.loads((tmp_path / "out" / "nvml.json").read_text()))
    assert facts.gpus[2].inforom_valid == "nvmlDeviceValidateInforom: Corrupted infoROM"
    assert isinstance(facts.gpus[0].inforom_valid, Unsupported)
    assert facts.gpus[7].lost is not None and "lost" in facts.gpus[7].lost
    assert facts.gpus[6].lost is None and facts.gpus[6].retired_sbe == 0


def test_old_driver_layout_single_double_bit_ecc_and_power_readings() -> None:
    """A hand-written dump in the layout of drivers 450-470 (Volta): no such real dump is in fixtures/."""
    text = """
==============NVSMI LOG==============

Timestamp                                 : Mon Jun 14 10:00:00 2021
Driver Version                            : 460.32.03
CUDA Version                              : 11.2

Attached GPUs                             : 1
GPU 00000001:00:00.0
    Product Name                          : Tesla V100-SXM2-32GB
    Product Architecture                  : Volta
    Persistence Mode                      : Disabled
    PCI
        Bus                               : 0x00
        Device                            : 0x00
        Domain                            : 0x0001
        Device Id                         : 0x1DB510DE
        Bus Id                            : 00000001:00:00.0
        Sub System Id                     : 0x124910DE
    Clocks Throttle Reasons
        Idle                              : Not Active
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Active
            HW Thermal Slowdown           : Active
            HW Power Brake Slowdown       : Not Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
        Display Clock Setting             : Not Active
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 3
                Register File             : 0
                Texture Memory            : N/A
                Total                     : 3
            Double Bit
                Device Memory             : 1
                Total                     : 1
        Aggregate
            Single Bit
                Total                     : 12
            Double Bit
                Total                     : 2
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : Yes
    Temperature
        GPU Current Temp                  : 40 C
        GPU Shutdown Temp                 : 90 C
        GPU Slowdown Temp                 : 87 C
        GPU Max Operating Temp            : 83 C
        Memory Current Temp               : 38 C
        Memory Max Operating Temp         : 85 C
    Power Readings
        Power Management                  : Supported
        Power Draw                        : 43.73 W
        Power Limit                       : 250.00 W
        Default Power Limit               : 300.00 W
        Enforced Power Limit              : 250.00 W
        Min Power Limit                   : 150.00 W
        Max Power Limit                   : 300.00 W
    Processes                             : None
"""
    # nvidia-smi pads these two headers with trailing blanks.
    text = text.replace("Single Bit\n", "Single Bit            \n").replace("Double Bit\n", "Double Bit            \n")
    document = parse_nvidia_smi(text, "v100")
    (gpu,) = replay(document).gpus
    assert (gpu.name, gpu.pci_id, gpu.pci_bus_id, gpu.architecture) == \
        ("Tesla V100-SXM2-32GB", "10de:1db5", "0001:00:00.0", 5)
    assert (gpu.ecc_volatile_corrected, gpu.ecc_volatile_uncorrected) == (3, 1)
    assert (gpu.ecc_aggregate_corrected, gpu.ecc_aggregate_uncorrected) == (12, 2)
    assert (gpu.retired_sbe, gpu.retired_dbe, gpu.retired_pending) == (2, 1, True)
    assert (gpu.power_limit_w, gpu.default_limit_w, gpu.enforced_limit_w) == (250.0, 300.0, 250.0)
    assert (gpu.shutdown_c, gpu.slowdown_c, gpu.gpu_max_c, gpu.memory_max_c) == (90, 87, 83, 85)
    assert gpu.clock_events == 0x4 | 0x8 | 0x40
    assert document["devices"][0]["nvmlDeviceGetCurrentClocksEventReasons"]["error"] == \
        "NVML_ERROR_FUNCTION_NOT_FOUND"
    assert "nvmlDeviceGetGpuFabricInfoV" not in document["devices"][0]
