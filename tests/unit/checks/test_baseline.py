"""Node baselines: `baseline record` / `baseline show`, loading, and the baseline.drift check."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import click
import pynvml
import pytest
from click.testing import CliRunner

from agent.apps.cli.baseline import baseline, write_baseline
from agent.core.facts import NO_BASELINE, Baseline, BaselineGpu, BmcFacts, BmcTemperature, NodeFacts, gpu_activity
from agent.core.model import Finding, Severity, SourceStatus, Status, Unknown, Unsupported
from agent.io.fsutil import FileSafetyError
from agent.policy.profiles import Profile, ProfileStore
from agent.sources.baseline import BASELINE_SCHEMA, load_baseline, parse_baseline
from agent.sources.nvml import RecordedNvml, _to_jsonable, read_nvml
from checks.baseline_drift import DRIFT
from tests.conftest import REPO, CliResult, RunCli
from tests.factories import exp, gpu_facts, nvml_node, profile

HEALTHY_BASELINE = REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "baseline.json"


def nodewarden() -> click.Group:
    """`nodewarden` holding the baseline group: agent.apps.cli.main.cli once it is wired there, else an equivalent root."""
    from agent.apps.cli.main import NodewardenGroup, cli

    if "baseline" in cli.commands:
        return cli
    return NodewardenGroup("nodewarden", commands={"baseline": baseline})


def run(*args: str) -> CliResult:
    result = CliRunner().invoke(nodewarden(), list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config whose state_dir is a temporary folder (never /var/lib/nodewarden)."""
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


@pytest.fixture
def healthy_copy(tmp_path: Path) -> Path:
    """A writable copy of hgx-h100-healthy (with its baseline), made as operators make one."""
    from agent.apps.cli.main import cli

    out = tmp_path / "healthy"
    result = CliRunner().invoke(cli, ["snapshot", "capture", "--simulate", "hgx-h100-healthy", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def edit_nvml(node: Path, change: Any) -> None:
    path = node / "nvml.json"
    data = json.loads(path.read_text())
    change(data["devices"])
    path.write_text(json.dumps(data))


# --- record -------------------------------------------------------------------------------------


def test_record_on_a_simulated_node_writes_the_shipped_baseline(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "b" / "baseline.json"
    out.parent.mkdir()  # --out names a file in an existing folder (a missing one is exit 2)
    result = run("baseline", "record", "--simulate", "hgx-h100-healthy", "--config", str(config), "--out", str(out))
    assert result.code == 0, result.stderr
    assert result.stderr == ""  # idle GPUs, a BMC: nothing to warn about
    assert f"into {out}" in result.stdout and "8 GPU(s), 12 BMC temperature sensor(s)" in result.stdout
    # The fixture generator records the healthy node's own baseline the same way, byte for byte.
    assert out.read_bytes() == HEALTHY_BASELINE.read_bytes()
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in out.parent.iterdir()] == ["baseline.json"]  # no temporary file left behind
    doc = json.loads(out.read_text())
    assert doc["schema"] == BASELINE_SCHEMA and doc["recorded_at"] == "2026-11-20T08:00:00+00:00"
    assert doc["node"] == {"hostname": "gpu-h100-healthy-01", "model": "Dell Inc. PowerEdge XE9680",
                           "profile": "hgx-h100-sxm"}
    assert sorted(doc["gpus"], key=int) == [str(i) for i in range(8)]
    gpu0 = doc["gpus"]["0"]
    assert gpu0["uuid"].startswith("GPU-") and gpu0["serial"] == "1650124656070"
    assert (gpu0["power_w"], gpu0["temperature_c"], gpu0["memory_temperature_c"]) == (69.874, 31, 38)
    assert (gpu0["sm_clock_mhz"], gpu0["memory_clock_mhz"], gpu0["utilization_gpu_pct"]) == (345, 2619, 0)
    bmc = doc["bmc"]
    assert bmc["protocol"] == "redfish" and bmc["temperatures_c"]["System Board Inlet Temp"] == 22.0
    assert bmc["fans"]["System Board Fan1A"] == {"reading": 8640.0, "units": "RPM"}
    assert bmc["psu_output_w"]["PS1 Status"] == 466.0 and bmc["power_consumed_w"] == 2910.0


def test_a_simulated_node_needs_out(config: Path) -> None:
    result = run("baseline", "record", "--simulate", "hgx-h100-healthy", "--config", str(config))
    assert result.code == 2 and "read-only: give --out FILE" in result.stderr


def test_record_into_a_snapshot_and_the_state_dir_by_default(healthy_copy: Path, config: Path,
                                                             tmp_path: Path) -> None:
    (healthy_copy / "baseline.json").unlink()
    result = run("baseline", "record", "--snapshot", str(healthy_copy), "--config", str(config))
    assert result.code == 0, result.stderr
    assert json.loads((healthy_copy / "baseline.json").read_bytes()) == json.loads(HEALTHY_BASELINE.read_bytes())
    # A live node's default: <state_dir>/baseline.json (what `show` reads by default too).
    from agent.apps.cli.baseline import baseline_path
    from agent.policy.config import load_config
    from agent.sources.fsroot import LiveFs
    from agent.sources.node import NodeSource

    assert baseline_path(NodeSource("live", LiveFs("/")), load_config(config)) == tmp_path / "state" / "baseline.json"


def test_the_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "baseline.json"
    path.write_text("old\n")

    def crash(src: str, dst: str, **_dir_fds: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(FileSafetyError, match="disk gone"):  # an operator message, exit 3
        write_baseline(path, {"schema": BASELINE_SCHEMA})
    assert path.read_text() == "old\n"  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]  # and no temporary file
    monkeypatch.undo()
    write_baseline(path, {"schema": BASELINE_SCHEMA})
    assert json.loads(path.read_text()) == {"schema": BASELINE_SCHEMA}


def test_refuses_while_a_gpu_is_busy_unless_forced(healthy_copy: Path, config: Path, tmp_path: Path) -> None:
    def busy(devices: list[dict[str, Any]]) -> None:
        devices[2]["nvmlDeviceGetUtilizationRates"] = {"gpu": 87, "memory": 40}
        devices[5]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": 4242, "usedGpuMemory": 1 << 30}]

    edit_nvml(healthy_copy, busy)
    out = tmp_path / "busy.json"
    result = run("baseline", "record", "--snapshot", str(healthy_copy), "--config", str(config), "--out", str(out))
    assert result.code == 1
    assert "GPU 2 (0000:4c:00.0): utilization 87 % (idle is <= 5 %)" in result.stderr
    assert "GPU 5 (0000:bb:00.0): compute processes running (PID 4242)" in result.stderr
    assert "2 GPU(s) not idle" in result.stderr and "--force" in result.stderr
    assert not out.exists()
    forced = run("baseline", "record", "--snapshot", str(healthy_copy), "--config", str(config), "--out", str(out),
                  "--force")
    assert forced.code == 0, forced.stderr
    doc = json.loads(out.read_text())
    assert doc["forced"] is True and doc["gpus"]["2"]["utilization_gpu_pct"] == 87
    assert any("GPU 2" in note and "87 %" in note for note in doc["notes"])
    assert parse_baseline(doc, str(out)).forced


def test_a_gpu_off_the_bus_is_refused_or_recorded_as_incomplete(config: Path, tmp_path: Path) -> None:
    """Issue 36.9: the drifted node's GPU 7 has fallen off the bus: never a clean 8-GPU baseline."""
    out = tmp_path / "lost.json"
    result = run("baseline", "record", "--simulate", "hgx-h100-drifted", "--config", str(config), "--out", str(out))
    assert result.code == 1 and not out.exists()
    assert "GPUs of this node cannot be read" in result.stderr and "GPU is lost (fallen off the bus)" in result.stderr
    assert "0000:db:00.0 (the lost GPU)" in result.stderr  # PCI still lists it; NVML cannot open it
    forced = run("baseline", "record", "--simulate", "hgx-h100-drifted", "--config", str(config), "--out", str(out),
                  "--force")
    assert forced.code == 0, forced.stderr
    assert "(incomplete: GPUs it could not read are named in it)" in forced.stdout
    doc = json.loads(out.read_text())
    assert doc["forced"] is True and any("fallen off the bus" in line for line in doc["incomplete"])
    assert parse_baseline(doc, str(out)).forced


def test_a_gpu_on_pci_that_nvml_does_not_list_is_refused(healthy_copy: Path, config: Path, tmp_path: Path) -> None:
    path = healthy_copy / "nvml.json"  # NVML counts and lists 7 (as with a GPU its driver gave up on); PCI shows 8
    data = json.loads(path.read_text())
    data["devices"].pop(3)
    data["system"]["nvmlDeviceGetCount"] = 7
    path.write_text(json.dumps(data))
    out = tmp_path / "short.json"
    result = run("baseline", "record", "--snapshot", str(healthy_copy), "--config", str(config), "--out", str(out))
    assert result.code == 1 and not out.exists(), result.stderr
    assert "is on PCI but NVML does not list it" in result.stderr
    whole = run("baseline", "record", "--simulate", "hgx-h100-healthy", "--config", str(config), "--out", str(out))
    assert whole.code == 0 and "incomplete" not in json.loads(out.read_text())  # the whole board records clean


def test_five_percent_is_still_idle_and_an_unreadable_utilization_is_not() -> None:
    assert gpu_activity(gpu_facts(0, utilization_gpu_pct=5)) is None
    assert gpu_activity(gpu_facts(0, utilization_gpu_pct=6)) == "utilization 6 % (idle is <= 5 %)"
    old = gpu_activity(gpu_facts(0, utilization_gpu_pct=Unsupported("not in this recording")))
    assert isinstance(old, Unsupported) and "not in this recording" in old.reason
    # An unreadable process list does not decide: the utilization does.
    assert gpu_activity(gpu_facts(0, compute_processes=Unknown("no permission"))) is None


def test_a_recording_without_utilization_refuses_to_record(healthy_copy: Path, config: Path) -> None:
    def old_recording(devices: list[dict[str, Any]]) -> None:
        for device in devices:
            for key in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo(1)", "nvmlDeviceGetClockInfo(2)",
                        "nvmlDeviceGetComputeRunningProcesses"):
                del device[key]

    edit_nvml(healthy_copy, old_recording)
    result = run("baseline", "record", "--snapshot", str(healthy_copy), "--config", str(config))
    assert result.code == 1 and "8 GPU(s) not idle" in result.stderr
    assert "cannot tell whether it is idle" in result.stderr and "not in this recording" in result.stderr


# --- the NVML reader's new facts ----------------------------------------------------------------


def test_the_reader_reads_utilization_clocks_and_processes() -> None:
    data = json.loads((REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "nvml.json").read_text())
    data["devices"][1]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": 7, "usedGpuMemory": 1}, {"pid": 3}]
    data["devices"][2]["nvmlDeviceGetClockInfo(1)"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    for key in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo(2)", "nvmlDeviceGetComputeRunningProcesses"):
        del data["devices"][3][key]  # a recording from before these calls: never a crash
    facts, status = read_nvml(RecordedNvml(data))
    assert status.ok and not isinstance(facts, Unknown)
    gpus = facts.gpus
    assert (gpus[0].utilization_gpu_pct, gpus[0].utilization_memory_pct) == (0, 0)
    assert (gpus[0].sm_clock_mhz, gpus[0].memory_clock_mhz, gpus[0].compute_processes) == (345, 2619, ())
    assert gpus[1].compute_processes == (3, 7)
    assert isinstance(gpus[2].sm_clock_mhz, Unsupported) and gpus[2].memory_clock_mhz == 2619
    for value in (gpus[3].utilization_gpu_pct, gpus[3].memory_clock_mhz, gpus[3].compute_processes):
        assert isinstance(value, Unsupported) and "not in this recording" in value.reason


def test_an_imported_nvidia_smi_dump_records_a_baseline_from_its_clocks_and_utilization(tmp_path: Path,
                                                                                        config: Path) -> None:
    data = json.loads((REPO / "fixtures" / "nodes" / "hgx-h100-nvsmi-import" / "nvml.json").read_text())
    facts, _status = read_nvml(RecordedNvml(data))
    assert not isinstance(facts, Unknown)
    gpu = facts.gpus[0]  # the dump: "Clocks: SM 86 MHz, Memory 2619 MHz", "Utilization: Gpu 0 %, Memory 0 %"
    assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz, gpu.utilization_gpu_pct, gpu.utilization_memory_pct) == (
        86, 2619, 0, 0)
    assert isinstance(gpu.compute_processes, Unsupported)  # the importer records no process list
    out = tmp_path / "imported.json"
    result = run("baseline", "record", "--simulate", "hgx-h100-nvsmi-import", "--config", str(config),
                 "--out", str(out))
    assert result.code == 0, result.stderr
    assert "warning: BMC: not recorded (no BMC configured" in result.stderr
    doc = json.loads(out.read_text())
    assert doc["bmc"] is None and doc["node"]["hostname"] is None and len(doc["gpus"]) == 8
    assert doc["gpus"]["0"]["sm_clock_mhz"] == 86 and doc["notes"] == [
        "BMC: not recorded (no BMC configured; --bmc URL or --ipmi HOST)"]


def test_pynvml_process_entries_are_recorded_as_objects() -> None:
    entry = pynvml.nvmlFriendlyObject({"pid": 4242, "usedGpuMemory": 1 << 30})
    assert _to_jsonable([entry]) == [{"pid": 4242, "usedGpuMemory": 1 << 30}]


# --- load and show ------------------------------------------------------------------------------


def test_load_missing_unreadable_and_older_files(tmp_path: Path) -> None:
    assert load_baseline(tmp_path / "none.json") == NO_BASELINE
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    broken = load_baseline(bad)
    assert isinstance(broken, Unknown) and not isinstance(broken, Unsupported) and "not JSON" in broken.reason
    bad.write_text(json.dumps({"schema": "something/v9"}))
    wrong = load_baseline(bad)
    assert isinstance(wrong, Unknown) and "not a nodewarden.baseline/v1 file" in wrong.reason
    bad.write_text(json.dumps({"schema": BASELINE_SCHEMA, "recorded_at": "x", "gpus": {"0": {"power_w": "hot"}}}))
    typed = load_baseline(bad)
    assert isinstance(typed, Unknown) and "gpus.0.power_w: expected a number or null" in typed.reason
    # A minimal, older file: GPUs without clocks, no BMC part.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": BASELINE_SCHEMA, "recorded_at": "2026-01-01T00:00:00+00:00",
                               "gpus": {"0": {"uuid": "GPU-a", "temperature_c": 30}}}))
    loaded = load_baseline(old)
    assert isinstance(loaded, Baseline)
    assert loaded.gpus == (BaselineGpu(0, "GPU-a", temperature_c=30.0),)
    assert loaded.bmc_temperatures_c == {} and loaded.hostname is None
    shipped = load_baseline(HEALTHY_BASELINE)
    assert isinstance(shipped, Baseline) and len(shipped.gpus) == 8 and len(shipped.bmc_fans) == 12


def test_show_prints_a_table_or_the_json(config: Path) -> None:
    table = run("baseline", "show", "--file", str(HEALTHY_BASELINE), "--format", "table")
    assert table.code == 0, table.stderr
    lines = table.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("GPU")))
    title = " ".join(line.strip() for line in lines[:head] if line and not line.startswith("file:"))
    assert title == ("baseline of gpu-h100-healthy-01 (Dell Inc. PowerEdge XE9680), profile hgx-h100-sxm, "
                     "recorded 2026-11-20T08:00:00+00:00")
    assert all(len(line) <= 100 for line in lines[:head])  # fitted to the terminal (100 columns here)
    lines = lines[head - 3:]
    assert lines[3].split() == ["GPU", "UUID", "serial", "power", "W", "temp", "C", "mem", "C", "SM", "MHz", "mem",
                                "MHz", "util", "%"]
    gpu0 = lines[4].split()
    assert gpu0[0] == "0" and gpu0[2:] == ["1650124656070", "69.874", "31", "38", "345", "2619", "0"]
    assert "BMC (redfish)" in lines and "    System Board Inlet Temp    22 C" in lines
    assert "    System Board Fan1A  8640 RPM" in lines and "  power consumed  2910 W" in lines
    as_json = run("baseline", "show", "--file", str(HEALTHY_BASELINE), "--format", "json")
    assert json.loads(as_json.stdout) == json.loads(HEALTHY_BASELINE.read_text())
    missing = run("baseline", "show", "--config", str(config))
    assert missing.code == 2 and "no baseline recorded here" in missing.stderr and "state/baseline.json" in missing.stderr


def test_show_rejects_a_file_that_is_not_a_baseline(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": "nodewarden.report/v1"}))
    result = run("baseline", "show", "--file", str(path))
    assert result.code == 2 and "not a nodewarden.baseline/v1 file" in result.stderr and result.stdout == ""


def test_record_takes_the_same_source_options_as_every_other_command() -> None:
    from agent.apps.cli.main import cli

    def options(command: click.Command) -> dict[str, dict[str, Any]]:
        return {p.name or "": p.to_info_dict() for p in command.params if isinstance(p, click.Option)}

    # Looked up as a command line does (the global options are added then, to both alike).
    ctx = click.Context(cli)
    match = cli.get_command(ctx, "profiles").commands["match"]  # type: ignore[union-attr]  # source options only
    record = cli.get_command(ctx, "baseline").commands["record"]  # type: ignore[union-attr]
    ours = options(record)
    assert set(ours) - set(options(match)) == {"out", "force"}
    assert {k: v for k, v in ours.items() if k not in ("out", "force")} == options(match)


# --- the check, as a pure function --------------------------------------------------------------


@pytest.fixture(scope="module")
def h100() -> Profile:
    return ProfileStore().profile("hgx-h100-sxm")


def base_of(then: list[Any], **overrides: Any) -> Baseline:
    """A baseline recorded from these GPU facts (temperature, power) on an idle node."""
    entries = tuple(BaselineGpu(g.index, g.uuid, g.serial, power_w=g.power_w, temperature_c=float(g.temperature_c))
                    for g in then)
    values: dict[str, Any] = {"path": "/b.json", "recorded_at": "2026-11-20T08:00:00+00:00", "hostname": "n1",
                              "model": "m", "profile": "hgx-h100-sxm", "gpus": entries,
                              "bmc_temperatures_c": {}, "bmc_fans": {}, "psu_output_w": {}}
    values.update(overrides)
    return Baseline(**values)


def drift(facts: NodeFacts, prof: Profile) -> dict[str, Finding]:
    findings = DRIFT.run(facts, prof)
    subjects = [f.subject for f in findings]
    assert len(subjects) == len(set(subjects)), subjects  # one series per subject in metrics
    return {f.subject: f for f in findings}


def test_rise_above_the_threshold_fails_and_at_or_below_passes(h100: Profile) -> None:
    then = [gpu_facts(i, temperature_c=30, power_w=70.0) for i in range(3)]
    now = [gpu_facts(0, temperature_c=39, power_w=70.0), gpu_facts(1, temperature_c=38, power_w=100.0),
           gpu_facts(2, temperature_c=31, power_w=100.5)]
    found = drift(nvml_node(now, baseline=base_of(then)), h100)
    hot = found["gpu0:temperature"]
    assert hot.status is Status.FAIL and hot.severity is Severity.WARNING and hot.observed == 9
    assert hot.expected == {"max": 8} and hot.action == "check_cooling" and hot.source == "nvml"
    assert hot.message == ("GPU 0 (0000:19:00.0) idle temperature 39 C, 30 C in the baseline of 2026-11-20: "
                           "rise (C) is 9, expected <= 8")
    assert "airflow" in (hot.reason or "")
    assert found["gpu1:temperature"].status is Status.PASS and found["gpu1:temperature"].observed == 8
    assert found["gpu1:power"].status is Status.PASS and found["gpu1:power"].observed == 30  # not above 30 W
    power = found["gpu2:power"]
    assert power.status is Status.FAIL and power.observed == 30.5 and power.expected == {"max": 30}
    assert found["gpu0:power"].observed == 0 and found["gpu2:temperature"].status is Status.PASS
    # The profile's threshold, not a constant: a site that allows 10 C passes 9.
    lenient = profile({"baseline": {"gpu_idle_temperature_rise_c": exp(max=10)}})
    assert drift(nvml_node(now, baseline=base_of(then)), lenient)["gpu0:temperature"].status is Status.PASS


def test_a_busy_gpu_is_skipped_with_the_reason(h100: Profile) -> None:
    then = [gpu_facts(i, temperature_c=30) for i in range(2)]
    now = [gpu_facts(0, temperature_c=60, utilization_gpu_pct=93), gpu_facts(1, temperature_c=31)]
    sensors = (BmcTemperature("Inlet Temp", 35.0), BmcTemperature("GPU1 Temp", 60.0))
    facts = nvml_node(now, baseline=base_of(then, bmc_temperatures_c={"Inlet Temp": 22.0, "GPU1 Temp": 30.0}),
                      bmc=BmcFacts("redfish", temperatures=sensors))
    facts.sources["redfish"] = SourceStatus("redfish", ok=True)
    found = drift(facts, h100)
    busy = found["gpu0:temperature"]
    assert busy.status is Status.SKIP
    assert busy.message == ("GPU 0 (0000:19:00.0) idle temperature: not compared, the GPU is not idle "
                            "(utilization 93 % (idle is <= 5 %))")
    assert found["gpu0:power"].status is Status.SKIP
    assert found["gpu1:temperature"].status is Status.PASS
    # BMC sensors read load, not drift, while a GPU is busy.
    inlet = found["Inlet Temp"]
    assert inlet.status is Status.SKIP and "GPU(s) 0 not idle" in inlet.message and inlet.source == "redfish"
    processes = nvml_node([gpu_facts(0, compute_processes=(11,))], baseline=base_of(then[:1]))
    assert drift(processes, h100)["gpu0:temperature"].status is Status.SKIP
    unknown = nvml_node([gpu_facts(0, utilization_gpu_pct=Unsupported("not in this recording"))],
                        baseline=base_of(then[:1]))
    old = drift(unknown, h100)["gpu0:temperature"]
    assert old.status is Status.SKIP and "cannot tell whether the GPU is idle" in old.message


def test_bmc_sensors_compare_by_name_on_an_idle_node(h100: Profile) -> None:
    then = [gpu_facts(0)]
    sensors = (BmcTemperature("Inlet Temp", 31.0), BmcTemperature("Exhaust Temp", 40.0),
               BmcTemperature("GPU1 Temp", None, state="Absent"))
    facts = nvml_node([gpu_facts(0)], bmc=BmcFacts("ipmi", temperatures=sensors), baseline=base_of(
        then, bmc_temperatures_c={"Inlet Temp": 22.0, "Exhaust Temp": 38.5, "GPU1 Temp": 30.0}))
    facts.sources["ipmi"] = SourceStatus("ipmi", ok=True)
    found = drift(facts, h100)
    inlet = found["Inlet Temp"]
    assert inlet.status is Status.FAIL and inlet.observed == 9 and inlet.source == "ipmi"
    assert inlet.message == ("BMC sensor Inlet Temp 31 C, 22 C in the baseline of 2026-11-20: rise (C) is 9, "
                             "expected <= 8")
    assert found["Exhaust Temp"].status is Status.PASS and found["Exhaust Temp"].observed == 1.5
    gone = found["GPU1 Temp"]
    assert gone.status is Status.SKIP and "not reported by the BMC now" in gone.message
    no_bmc = nvml_node([gpu_facts(0)], bmc=Unsupported("no BMC configured"),
                       baseline=base_of(then, bmc_temperatures_c={"Inlet Temp": 22.0}))
    assert set(drift(no_bmc, h100)) == {"gpu0:temperature", "gpu0:power"}


def test_gpus_are_matched_by_uuid_and_a_replaced_one_warns(h100: Profile) -> None:
    then = [gpu_facts(0, temperature_c=30), gpu_facts(1, temperature_c=40)]
    # The same two boards, enumerated the other way round now, and both 1 C warmer.
    swapped = [gpu_facts(0, uuid="GPU-00000001", temperature_c=41), gpu_facts(1, uuid="GPU-00000000", temperature_c=31)]
    found = drift(nvml_node(swapped, baseline=base_of(then)), h100)
    assert found["gpu0:temperature"].observed == 1 and found["gpu1:temperature"].observed == 1
    replaced = [gpu_facts(0, temperature_c=30), gpu_facts(1, uuid="GPU-new", serial="999", temperature_c=45)]
    found = drift(nvml_node(replaced, baseline=base_of(then)), h100)
    warn = found["gpu1"]
    assert warn.status is Status.WARN and warn.action == "record_baseline" and warn.observed == "GPU-new"
    assert "GPU replaced since the baseline (re-record" in warn.message
    assert "gpu1:temperature" not in found and found["gpu0:temperature"].status is Status.PASS


def test_a_lost_gpu_and_missing_values(h100: Profile) -> None:
    then = [gpu_facts(0), gpu_facts(1)]
    lost = gpu_facts(1)._replace(lost="GPU is lost (fallen off the bus)")
    facts = nvml_node([gpu_facts(0, power_w=Unknown("nvmlDeviceGetPowerUsage: Unknown Error")), lost],
                      baseline=base_of(then, gpus=(BaselineGpu(0, "GPU-00000000", temperature_c=None, power_w=70.0),
                                                   BaselineGpu(1, "GPU-00000001", temperature_c=30.0))))
    found = drift(facts, h100)
    assert found["gpu1"].status is Status.SKIP and "is lost now (gpu.lost reports it)" in found["gpu1"].message
    assert found["gpu0:temperature"].status is Status.SKIP and "not in the baseline" in found["gpu0:temperature"].message
    power = found["gpu0:power"]
    assert power.status is Status.UNKNOWN and "Unknown Error" in power.message


def test_no_baseline_says_nothing_and_a_broken_one_says_why(h100: Profile) -> None:
    assert DRIFT.run(nvml_node(), h100) == []  # NodeFacts' default: no baseline recorded
    assert DRIFT.run(nvml_node(baseline=NO_BASELINE), h100) == []
    (broken,) = DRIFT.run(nvml_node(baseline=Unknown("baseline unusable: /b.json: not JSON")), h100)
    assert broken.status is Status.UNKNOWN and broken.subject == "baseline" and "not JSON" in broken.message
    nothing_expected = profile({"gpu": {"temperature": exp(max=80)}})
    assert DRIFT.run(nvml_node(baseline=base_of([gpu_facts(0)])), nothing_expected) == []


# --- end to end: the drifted node against the healthy node's baseline --------------------------


def test_drifted_node_against_the_healthy_baseline(run_cli: RunCli, drifted_copy: Path) -> None:
    (drifted_copy / "baseline.json").write_bytes(HEALTHY_BASELINE.read_bytes())
    result = run_cli("audit", "--snapshot", str(drifted_copy), "--only", "baseline.drift", "--format", "json")
    assert result.code == 1, result.stderr
    report = result.json()
    found = {f["subject"]: f for f in report["findings"] if f["check"] == "baseline.drift"}
    # GPUs 4-7 run 8-11 C hotter than at arrival: above 8 C fails, exactly 8 passes, the lost GPU 7 is skipped.
    assert {s: found[f"gpu{s}:temperature"]["status"] for s in range(7)} == {
        0: "pass", 1: "pass", 2: "pass", 3: "pass", 4: "fail", 5: "fail", 6: "pass"}
    assert (found["gpu4:temperature"]["observed"], found["gpu5:temperature"]["observed"],
            found["gpu6:temperature"]["observed"]) == (11, 11, 8)
    assert found["gpu7"]["status"] == "skip" and "lost" in found["gpu7"]["message"]
    assert {found[f"gpu{i}:power"]["observed"] for i in range(4, 7)} == {3.6}  # leakage, under 30 W
    # The BMC's GPU sensors saw it too (GPU8 is NVML's lost GPU 7).
    assert {s for s, f in found.items() if f["status"] == "fail"} == {
        "gpu4:temperature", "gpu5:temperature", "GPU5 Temp", "GPU6 Temp", "GPU8 Temp"}
    assert found["System Board Inlet Temp"]["status"] == "pass" and found["GPU5 Temp"]["source"] == "redfish"
    assert report["sources"]["nvml"]["ok"] and report["sources"]["redfish"]["ok"]  # read for this check alone


def test_a_swapped_gpu_in_a_snapshot_warns(run_cli: RunCli, healthy_copy: Path) -> None:
    def swap(devices: list[dict[str, Any]]) -> None:
        devices[3]["nvmlDeviceGetUUID"] = "GPU-11111111-2222-3333-4444-555555555555"
        devices[3]["nvmlDeviceGetSerial"] = "1650124999999"

    edit_nvml(healthy_copy, swap)
    result = run_cli("audit", "--snapshot", str(healthy_copy), "--only", "baseline.drift", "--format", "json")
    assert result.code == 0, result.stderr
    found = {f["subject"]: f for f in result.json()["findings"] if f["check"] == "baseline.drift"}
    assert found["gpu3"]["status"] == "warn" and "GPU replaced since the baseline" in found["gpu3"]["message"]
    assert "gpu3:temperature" not in found
    assert {f["status"] for s, f in found.items() if s != "gpu3"} == {"pass"}


def test_simulated_nodes_with_and_without_a_baseline(run_cli: RunCli) -> None:
    healthy = run_cli("audit", "--simulate", "hgx-h100-healthy", "--format", "json").json()
    drift_findings = [f for f in healthy["findings"] if f["check"] == "baseline.drift"]
    assert len(drift_findings) == 8 * 2 + 12 and {f["status"] for f in drift_findings} == {"pass"}
    drifted = run_cli("audit", "--simulate", "hgx-h100-drifted", "--format", "json").json()
    assert not [f for f in drifted["findings"] if f["check"] == "baseline.drift"]  # no baseline recorded there
