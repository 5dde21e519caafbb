"""nvidia-smi 595/610 output (issue 22 item 4): "KMD Version" and "CUDA UMD Version", the old version
lines kept with a "[Deprecated; ...]" suffix (or "Deprecated, see ..." in place of a value), and the
power limits grouped under "GPU Ceiling Power Limit", in text and XML.

No public `nvidia-smi -q` capture of a 610 driver with a licence we can copy exists that we found, so the
inputs are the real 595.80 L40S capture (nvidia_gpu_exporter, MIT) and the real telegraf A100 XML with
their top lines and power section rewritten as 610 prints them: the version lines as public 610.57.04
captures quote them, the ceiling section as NVIDIA's nvidia-smi documentation describes it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent.sources.importers.nvidia_smi import import_nvidia_smi
from agent.sources.importers.nvidia_smi_fields import version_text
from agent.sources.importers.nvidia_smi_text import read_text
from tests.conftest import RunCli
from tests.factories import replay, text_of

L40S = "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt"
DEPRECATED_DRIVER = "610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]"
DEPRECATED_CUDA = "13.3 [Deprecated; will be removed in CUDA 14.0. Use CUDA UMD Version instead]"


def _l40s_dump() -> str:
    """The capture's first `nvidia-smi -q` section, as printed."""
    text = text_of(L40S)
    start = text.index("==============NVSMI LOG==============")
    end = text.index("\n####", start)
    return text[start:end] + "\n"


def _as_610(dump: str, driver_line: str = DEPRECATED_DRIVER, cuda_line: str = DEPRECATED_CUDA) -> str:
    pad = " " * 39
    dump = re.sub(r"^Driver Version\s+: 595\.80$", f"Driver Version{pad}   : {driver_line}\n"
                  f"CUDA Version{pad}     : {cuda_line}\nKMD Version{pad}      : 610.57.04\n"
                  f"CUDA UMD Version{pad} : 13.3", dump, count=1, flags=re.M)
    dump = re.sub(r"^CUDA Version\s+: 13\.2\n", "", dump, count=1, flags=re.M)
    # 610: the three limits nest under "GPU Ceiling Power Limit"; distinct values show which is which.
    return dump.replace(
        "        Current Power Limit                            : 350.00 W\n"
        "        Requested Power Limit                          : 350.00 W\n"
        "        Default Power Limit                            : 350.00 W\n",
        "        GPU Ceiling Power Limit\n"
        "            Current Power Limit                        : 300.00 W\n"
        "            Requested Power Limit                      : 320.00 W\n"
        "            Default Power Limit                        : 350.00 W\n"
        "        GPU Base Power\n"
        "            Current Base Power                         : N/A\n", 1)


def test_610_text_reads_versions_without_the_deprecated_suffix(tmp_path: Path) -> None:
    dump = _as_610(_l40s_dump())
    assert "KMD Version" in dump and "[Deprecated;" in dump  # the rewrite found the lines it rewrites
    source = tmp_path / "q610.txt"
    source.write_text(dump, encoding="utf-8")
    result = import_nvidia_smi(source, tmp_path / "out")
    assert result.driver_version == "610.57.04"
    nvml = replay(json.loads((tmp_path / "out" / "nvml.json").read_text()))
    assert nvml.driver_version == "610.57.04"
    assert nvml.cuda_driver_version == "13.3"


def test_610_text_reads_the_ceiling_power_limits(tmp_path: Path) -> None:
    source = tmp_path / "q610.txt"
    source.write_text(_as_610(_l40s_dump()), encoding="utf-8")
    import_nvidia_smi(source, tmp_path / "out")
    gpu = replay(json.loads((tmp_path / "out" / "nvml.json").read_text())).gpus[0]
    assert gpu.enforced_limit_w == 300.0
    assert gpu.power_limit_w == 320.0


def test_a_deprecated_text_in_place_of_the_version_falls_back_to_kmd() -> None:
    # `nvidia-smi --version` on 610 prints 'DRIVER version : Deprecated, see "KMD version" instead'.
    dump = _as_610(_l40s_dump(), 'Deprecated, see "KMD version" instead',
                   'Deprecated, see "CUDA UMD version" instead')
    top = read_text(dump, "q610.txt").top
    assert top["driver"].text == "610.57.04"
    assert top["cuda"].text == "13.3"
    old = read_text(_l40s_dump(), "q595.txt").top  # a 595 dump, without the new lines, reads as before
    assert (old["driver"].text, old["cuda"].text) == ("595.80", "13.2")


def test_610_xml_reads_kmd_version_and_ceiling_limits(tmp_path: Path) -> None:
    xml = text_of("telegraf/a100-sxm4-v12.xml")
    driver = re.search(r"<driver_version>([^<]*)</driver_version>", xml)
    assert driver is not None
    xml = xml.replace(driver.group(0), f"<driver_version>{driver.group(1)} [Deprecated; use kmd_version]"
                      f"</driver_version>\n\t<kmd_version>610.57.04</kmd_version>", 1)
    xml = xml.replace(
        "<current_power_limit>500.00 W</current_power_limit>\n"
        "            <requested_power_limit>500.00 W</requested_power_limit>",
        "<gpu_ceiling_power_limit><current_power_limit>400.00 W</current_power_limit>"
        "<requested_power_limit>450.00 W</requested_power_limit></gpu_ceiling_power_limit>", 1)
    source = tmp_path / "q610.xml"
    source.write_text(xml, encoding="utf-8")
    assert import_nvidia_smi(source, tmp_path / "out").driver_version == "610.57.04"
    nvml = replay(json.loads((tmp_path / "out" / "nvml.json").read_text()))
    assert nvml.driver_version == "610.57.04"
    assert nvml.gpus[0].enforced_limit_w == 400.0
    assert nvml.gpus[0].power_limit_w == 450.0


def test_version_text_strips_notes_and_refuses_prose() -> None:
    assert version_text("13.3 [Deprecated; use CUDA UMD Version instead]") == "13.3"
    assert version_text("610.57.04") == "610.57.04"
    assert version_text('Deprecated, see "KMD version" instead') is None
    assert version_text("N/A") == "N/A"  # an error text stays, for error_record to read


def test_query_csv_reads_versions_without_the_deprecated_note(run_cli: RunCli, tmp_path: Path) -> None:
    """The capture's own `--query-gpu=timestamp,driver_version,kmd_version,...` CSV (a few of its columns),
    driver_version with the note 610 adds to the -q line, kmd_version 610.57.04."""
    lines = text_of(L40S).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("timestamp, driver_version, kmd_version,"))
    names, row = lines[header].split(", "), lines[header + 1].split(", ")
    assert row[1:3] == ["595.80", "595.80"] and len(names) == len(row)
    row[1:3] = ["610.57.04 [Deprecated; use kmd_version]", "610.57.04"]
    keep = [names.index(n) for n in ("timestamp", "driver_version", "kmd_version", "index", "name", "uuid",
                                     "pci.bus_id", "vbios_version")]  # a query of these columns only
    source = tmp_path / "query.csv"
    source.write_text(", ".join(names[i] for i in keep) + "\n" + ", ".join(row[i] for i in keep) + "\n",
                      encoding="utf-8")
    result = run_cli("snapshot", "import", str(source), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.stdout + result.stderr
    system = json.loads((tmp_path / "out" / "nvml.json").read_text())["system"]
    assert system["nvmlSystemGetDriverVersion"] == "610.57.04"
