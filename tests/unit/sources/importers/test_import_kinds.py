"""`snapshot import` kinds beyond the GPU ones (issue 15): ipmitool, ibstat/ibstatus; and the report of an
imported snapshot naming its inputs (node.snapshot.inputs, each source's `inputs`). Real captures from
fixtures/real/ (see each folder's SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.sources.fsroot_snapshot import SnapshotFs
from agent.sources.rdma import rate_gbps, read_rdma_devices
from tests.conftest import REPO, RunCli

F = REPO / "fixtures"
IPMI = F / "real" / "ipmi"
IB = F / "real" / "linux"
LSPCI = F / "sources" / "gpud-dell-xe9680" / "lspci-vvv.txt"
DMIDECODE = F / "sources" / "gpud-dell-xe9680" / "dmidecode.txt"
NVSMI = F / "nvidia-smi" / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid.txt"
DMESG = F / "kmsg" / "dmesg.decode.iso.log.0"
IPMITOOL = sorted(p for p in IPMI.glob("*/ipmitool-*.txt"))
IBSTAT = [*sorted((IB / "gpud-ib").glob("ibstat.*.txt")), IB / "azhpc-diagnostics" / "ibstatus.txt"]


def _import(run_cli: RunCli, out: Path, *inputs: Path) -> dict[str, Any]:
    result = run_cli("snapshot", "import", *(str(p) for p in inputs), "--out", str(out))
    assert result.code == 0, result.stderr
    return yaml.safe_load((out / "meta.yaml").read_text())  # type: ignore[no-any-return]


def _audit(run_cli: RunCli, out: Path, config: Path) -> dict[str, Any]:
    result = run_cli("audit", "--snapshot", str(out), "--config", str(config), "--format", "json")
    assert result.code in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


# --- the report names the inputs ---------------------------------------------------------------------


def test_the_report_names_each_input_and_the_sources_it_fed(run_cli: RunCli, tmp_path: Path,
                                                             empty_config: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, LSPCI, DMIDECODE, NVSMI, DMESG)
    report = _audit(run_cli, out, empty_config)
    inputs = report["node"]["snapshot"]["inputs"]
    assert [i["name"] for i in inputs] == [str(p) for p in (LSPCI, DMIDECODE, NVSMI, DMESG)]
    assert [i["sha256"] for i in inputs] == [e["sha256"] for e in meta["inputs"]]
    assert [i["kind"] for i in inputs] == ["lspci", "dmidecode", "nvidia-smi", "kernel-log"]
    assert all(i["contributed"] and isinstance(i["skipped"], int) for i in inputs)
    sources = report["sources"]
    assert sources["host"]["inputs"] == sorted([str(LSPCI), str(DMIDECODE)])
    assert sources["nvml"]["inputs"] == [str(NVSMI)]
    assert sources["kmsg"]["inputs"] == [str(DMESG)]


def test_a_captured_snapshot_lists_no_inputs(run_cli: RunCli, empty_config: Path) -> None:
    result = run_cli("audit", "--simulate", "hgx-h100-drifted", "--config", str(empty_config), "--format", "json")
    report = result.json()
    assert "inputs" not in report["node"]["snapshot"]
    assert all("inputs" not in s for s in report["sources"].values())


# --- ipmitool --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", IPMITOOL, ids=lambda p: p.name)
def test_each_real_ipmitool_output_imports_and_audits_without_failing(path: Path, run_cli: RunCli, tmp_path: Path,
                                                                      empty_config: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, path)
    entry, = meta["inputs"]
    assert entry["kind"] == "ipmitool" and entry["contributed"] and meta["captured"] == ["ipmi"]
    report = _audit(run_cli, out, empty_config)
    assert report["sources"]["ipmi"]["ok"] and report["sources"]["ipmi"]["inputs"] == [str(path)]
    assert not [f for f in report["findings"] if f["status"] == "fail"]


def test_ipmitool_na_sensors_are_not_fitted_never_a_failure(run_cli: RunCli, tmp_path: Path,
                                                            empty_config: Path) -> None:
    path = IPMI / "linuxfabrik" / "ipmitool-sensor-list.thirtyeight-sensors-ok.txt"
    _import(run_cli, tmp_path / "snap", path)
    sensors = {s["name"]: s for s in json.loads((tmp_path / "snap" / "ipmi.json").read_text())["sensors"]}
    cpu2 = sensors["03-CPU 2"]  # "na | | na": the second socket is empty
    assert cpu2["unavailable"] is True and cpu2["value"] is None and cpu2["health"] == 0
    inlet = sensors["01-Inlet Ambient"]
    assert inlet["type"] == "Temperature" and inlet["units"] == "°C" and inlet["value"] == 23.0
    assert inlet["thresholds"] == {"uc": 42.0, "unr": 47.0}  # the "na" thresholds are not set
    psu = sensors["Power Supply 1"]
    assert psu["type"] == "Power Supply" and psu["states"] == ["Present"]
    report = _audit(run_cli, tmp_path / "snap", empty_config)
    subjects = [f for f in report["findings"] if "03-CPU 2" in f["message"]]
    assert all(f["status"] != "fail" for f in subjects)


def test_ipmitool_sel_pre_init_is_undated_and_dated_entries_keep_their_time(run_cli: RunCli, tmp_path: Path,
                                                                            empty_config: Path) -> None:
    sel = tmp_path / "sel-elist.txt"
    sel.write_text(
        "   1 | Pre-Init  |  0000000012 | System Event #0x01 | Timestamp Clock Sync | Asserted\n"
        "   2 | 03/14/2024 | 09:26:53 | Power Supply PSU2 Status | Power Supply AC lost | Asserted\n"
        "  1a | 03/14/2024 | 09:27:10 | Temperature CPU1 Temp | Upper Critical going high | Asserted"
        " | Reading 101 > Threshold 100 degrees C\n")
    fru = tmp_path / "fru.txt"
    fru.write_text("FRU Device Description : Builtin FRU Device (ID 0)\n Chassis Type          : Rack Mount Chassis\n"
                   " Board Mfg             : Supermicro\n Board Product         : X13DEG-OAD\n"
                   " Product Manufacturer  : Supermicro\n Product Name          : SYS-821GE-TNHR\n\n"
                   "FRU Device Description : PSU1 (ID 1)\n Product Name          : PWS-3K04G\n")
    _import(run_cli, tmp_path / "snap", sel, fru)
    recorded = json.loads((tmp_path / "snap" / "ipmi.json").read_text())
    first, second, third = recorded["sel"]
    assert first["timecode"] is None and first["component_type"] == "System Event"
    assert second["timecode"] == 1710408413 and second["component"] == "PSU2 Status"
    assert third["record_id"] == 0x1a and third["component_type"] == "Temperature"
    assert recorded["fru"]["fields"]["Product name"] == "SYS-821GE-TNHR"  # FRU 0, not the PSU's
    report = _audit(run_cli, tmp_path / "snap", empty_config)
    assert report["node"]["model"] == "Supermicro SYS-821GE-TNHR"
    assert report["sources"]["ipmi"]["sel_entries"] == 3


def test_dcmi_power_joins_the_sdr_sensors_in_either_order(run_cli: RunCli, tmp_path: Path) -> None:
    dcmi, sdr = IPMI / "telegraf" / "ipmitool-dcmi-power-reading.txt", IPMI / "telegraf" / "ipmitool-sdr-elist.v2-curated.txt"
    for n, order in enumerate(((dcmi, sdr), (sdr, dcmi))):
        out = tmp_path / f"snap{n}"
        meta = _import(run_cli, out, *order)
        assert all(e["contributed"] and not e.get("skipped") for e in meta["inputs"]), meta["inputs"]
        names = [s["name"] for s in json.loads((out / "ipmi.json").read_text())["sensors"]]
        assert "System Power (DCMI)" in names and "Fan1" in names


# --- ibstat / ibstatus -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", IBSTAT, ids=lambda p: p.name)
def test_each_real_ibstat_output_becomes_sysfs_the_rdma_reader_reads(path: Path, run_cli: RunCli,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "snap"
    meta = _import(run_cli, out, path)
    assert meta["inputs"][0]["kind"] == "ibstat" and meta["host_parts"] == ["rdma"]
    devices = read_rdma_devices(SnapshotFs(out), counters=False)
    assert isinstance(devices, tuple) and devices
    text = path.read_text()
    assert len(devices) == text.count("CA '") + text.count("Infiniband device '")
    for device in devices:
        assert isinstance(device.ports, tuple) and device.ports
        for port in device.ports:
            assert port.state in ("ACTIVE", "DOWN", "INIT", "ARMED") and isinstance(port.rate, str)
            assert rate_gbps(port.rate) > 0 and port.link_layer in ("InfiniBand", "Ethernet")


def test_ibstat_down_ports_and_firmware_are_as_printed(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, IB / "gpud-ib" / "ibstat.47.0.h100.some.down.with.polling.1.txt")
    ib = out / "fs" / "sys" / "class" / "infiniband"
    assert (ib / "mlx5_0" / "fw_ver").read_text() == "28.39.1002\n"
    assert (ib / "mlx5_0" / "hca_type").read_text() == "MT4129\n"
    assert (ib / "mlx5_0" / "ports" / "1" / "rate").read_text() == "400 Gb/sec\n"
    states = {p.read_text() for p in ib.glob("*/ports/1/phys_state")}
    assert "2: Polling\n" in states and "5: LinkUp\n" in states


def test_ibstatus_keeps_the_kernel_text(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    _import(run_cli, out, IB / "azhpc-diagnostics" / "ibstatus.txt")
    port = out / "fs" / "sys" / "class" / "infiniband" / "mlx5_ib0" / "ports" / "1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "rate").read_text() == "200 Gb/sec (4X HDR)\n"
    assert (port / "link_layer").read_text() == "InfiniBand\n"


# --- dmidecode ---------------------------------------------------------------------------------------

DMI_T39 = [IB / "ironlib-dell-r6515" / "dmidecode-t39-psu.txt", IB / "ironlib-supermicro-x11dph-t" / "dmidecode-t39-psu.txt"]


@pytest.mark.parametrize("path", DMI_T39, ids=lambda p: p.parent.name)
def test_a_dmidecode_dump_without_bios_system_board_or_chassis_records_is_refused_by_name(
        path: Path, run_cli: RunCli, tmp_path: Path) -> None:
    """`dmidecode -t 39` (power supplies only) feeds nothing /sys/class/dmi/id shows: one clear refusal."""
    result = run_cli("snapshot", "import", str(path), "--out", str(tmp_path / "s"))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "no DMI record of type 0, 1, 2 or 3" in result.stderr and "types in it: 39" in result.stderr
    assert not (tmp_path / "s").exists()


def test_a_dmidecode_dump_without_system_records_next_to_another_input_is_an_error_of_its_own(
        run_cli: RunCli, tmp_path: Path) -> None:
    meta = _import(run_cli, tmp_path / "snap", DMI_T39[0], LSPCI)
    by_name = {Path(e["name"]).name: e for e in meta["inputs"]}
    assert "no DMI record of type 0, 1, 2 or 3" in by_name["dmidecode-t39-psu.txt"]["error"]
    assert by_name["lspci-vvv.txt"]["contributed"] and meta["host_parts"] == ["pci", "pci_links"]
    assert not (tmp_path / "snap" / "fs" / "sys" / "class" / "dmi").exists()
