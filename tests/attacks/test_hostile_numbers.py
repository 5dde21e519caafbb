"""One number never takes an audit down (issue 21, 5).

A hostile BMC (tests/peers/hostile_redfish.py, a real HTTP peer with a session login) or a hostile
snapshot (a copy of hgx-h100-drifted, or a plain `snapshot import` of a dmesg) sends numbers no
sensor reports: a 4,000-digit ReadingCelsius, `MinNumNeeded: 1e999`, `NaN`, /proc/uptime of
inf/nan/1e308, captured_at in year 1, a kernel-log stamp at offset +99:99. Each audit exits 0 or 1
with a report that is strict JSON (no NaN/Infinity tokens), the reading `unknown` with a message;
never exit 3.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.core.model import Unknown
from agent.sources.ipmi import read_ipmi_live, read_ipmi_recorded
from tests.attacks.test_hostile_bmc import audit as bmc_audit
from tests.conftest import RunCli
from tests.peers.hostile_redfish import hostile_bmc
from tests.peers.ipmi_sim import IpmiSim, ipmi_sim_fixture  # noqa: F401  (the session's shared simulator)

REPO = Path(__file__).resolve().parents[2]
CHASSIS = "/redfish/v1/Chassis/1"
DIGITS_4000 = b"9" * 4000
DRIFTED_CHASSIS = "redfish/v1/Chassis/System.Embedded.1"


def strict_json(text: str) -> dict[str, Any]:
    """The report, refusing NaN/Infinity (json.loads accepts them; jq, Go and browsers do not)."""
    def refuse(token: str) -> Any:
        raise AssertionError(f"the report holds {token}: not JSON")
    doc = json.loads(text, parse_constant=refuse)
    assert isinstance(doc, dict)
    return doc


def chassis(reading: bytes = b"41", min_needed: bytes = b"1", upper: bytes = b"47") -> dict[str, Any]:
    """A chassis with one temperature and one PSU redundancy group, the numbers as raw JSON text."""
    thermal = (b'{"@odata.id": "' + CHASSIS.encode() + b'/Thermal", "@odata.type": "#Thermal.v1_7_0.Thermal", '
               b'"Temperatures": [{"@odata.id": "' + CHASSIS.encode() + b'/Thermal#/Temperatures/0", '
               b'"MemberId": "0", "Name": "Inlet Temp", "ReadingCelsius": ' + reading + b', '
               b'"UpperThresholdCritical": ' + upper + b', "Status": {"State": "Enabled", "Health": "OK"}}]}')
    power = (b'{"@odata.id": "' + CHASSIS.encode() + b'/Power", "@odata.type": "#Power.v1_5_0.Power", '
             b'"PowerSupplies": [{"@odata.id": "' + CHASSIS.encode() + b'/Power#/PowerSupplies/0", "MemberId": "0", '
             b'"Name": "PSU1", "Status": {"State": "Enabled", "Health": "OK"}}], '
             b'"Redundancy": [{"@odata.id": "' + CHASSIS.encode() + b'/Power#/Redundancy/0", "MemberId": "0", '
             b'"Name": "PSU Redundancy", "Mode": "N+m", "MinNumNeeded": ' + min_needed + b', '
             b'"RedundancySet": [{"@odata.id": "' + CHASSIS.encode() + b'/Power#/PowerSupplies/0"}], '
             b'"Status": {"State": "Enabled", "Health": "OK"}}]}')
    return {CHASSIS: {"@odata.id": CHASSIS, "@odata.type": "#Chassis.v1_10_0.Chassis", "Id": "1",
                      "Status": {"State": "Enabled", "Health": "OK"}, "Thermal": {"@odata.id": f"{CHASSIS}/Thermal"},
                      "Power": {"@odata.id": f"{CHASSIS}/Power"}},
            f"{CHASSIS}/Thermal": thermal, f"{CHASSIS}/Power": power}


def peer_report(tmp_path: Path, resources: dict[str, Any]) -> tuple[dict[str, Any], str]:
    with hostile_bmc("normal", resources=resources) as bmc:
        result, _took, _rss = bmc_audit(tmp_path, bmc.url)
        assert any(r.path.split("?")[0].rstrip("/") == f"{CHASSIS}/Thermal" for r in bmc.requests)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return strict_json(result.stdout), result.stdout


def by_check(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check]


@pytest.mark.parametrize("reading", [DIGITS_4000, b"-" + DIGITS_4000, b"NaN", b"Infinity", b"1e999", b"-1e999"],
                         ids=["4000-digits", "minus-4000-digits", "NaN", "Infinity", "1e999", "-1e999"])
def test_a_hostile_reading_celsius_is_unknown_not_a_crash(tmp_path: Path, reading: bytes) -> None:
    report, text = peer_report(tmp_path, chassis(reading=reading))
    (inlet,) = [f for f in by_check(report, "bmc.temperatures") if f["subject"] == "Inlet Temp"]
    assert inlet["status"] == "unknown", inlet
    assert "ReadingCelsius" in inlet["message"]
    assert len(text) < 200_000  # a 4,000-digit number is named by its length, not echoed in every finding


@pytest.mark.parametrize("upper", [b"NaN", DIGITS_4000, b"1e999"], ids=["NaN", "4000-digits", "1e999"])
def test_a_hostile_threshold_is_unusable_and_named(tmp_path: Path, upper: bytes) -> None:
    report, _text = peer_report(tmp_path, chassis(upper=upper))
    unusable = [f for f in by_check(report, "bmc.reachable") if "UpperThresholdCritical" in f["message"]]
    assert unusable and all(f["status"] == "unknown" for f in unusable), by_check(report, "bmc.reachable")


@pytest.mark.parametrize("min_needed", [b"1e999", b"NaN", DIGITS_4000], ids=["1e999", "NaN", "4000-digits"])
def test_a_hostile_min_num_needed_is_unknown_not_a_crash(tmp_path: Path, min_needed: bytes) -> None:
    report, _text = peer_report(tmp_path, chassis(min_needed=min_needed))
    unusable = [f for f in by_check(report, "bmc.reachable") if "MinNumNeeded" in f["message"]]
    assert unusable and all(f["status"] == "unknown" for f in unusable), by_check(report, "bmc.reachable")
    (inlet,) = [f for f in by_check(report, "bmc.temperatures") if f["subject"] == "Inlet Temp"]
    assert inlet["status"] == "pass" and inlet["observed"]["reading"] == 41  # the rest of the BMC is judged


# --- through snapshots ------------------------------------------------------------------------------


def replace(path: Path, data: str | bytes) -> None:
    """Write a file of the hard-linked copy: unlink first, never write through to the fixture."""
    path.unlink()
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def snapshot_report(run_cli: RunCli, node: Path, config: Path, *only: str) -> dict[str, Any]:
    result = run_cli("audit", "--snapshot", str(node), "--config", str(config), "--format", "json",
                     *[x for check in only for x in ("--only", check)])
    assert result.code in (0, 1), result.stderr[-3000:]
    return strict_json(result.stdout)


@pytest.mark.parametrize("uptime", ["inf 5.0", "nan 5.0", "1e308 5.0", "-1 5.0", "9" * 4000 + " 5.0"],
                         ids=["inf", "nan", "1e308", "negative", "4000-digits"])
def test_a_hostile_proc_uptime_is_unknown_not_a_crash(run_cli: RunCli, drifted_copy: Path, empty_config: Path,
                                                      uptime: str) -> None:
    replace(drifted_copy / "fs/proc/uptime", uptime + "\n")
    report = snapshot_report(run_cli, drifted_copy, empty_config)
    replay = by_check(report, "gpu.pcie.replay")
    assert replay and all(f["status"] == "unknown" and "/proc/uptime" in f["message"] for f in replay), replay
    assert by_check(report, "gpu.xid") and by_check(report, "fabric.sxid")  # the rest is judged


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                                   "9999-12-31T23:59:59"], ids=["year-1", "year-1-plus-14h", "year-9999-minus-14h",
                                                                "year-9999"])
def test_captured_at_at_the_ends_of_time_is_not_a_crash(run_cli: RunCli, drifted_copy: Path, empty_config: Path,
                                                        stamp: str) -> None:
    meta = drifted_copy / "meta.yaml"
    text = meta.read_text()
    replace(meta, "\n".join(f'captured_at: "{stamp}"' if line.startswith("captured_at:") else line
                            for line in text.splitlines()) + "\n")
    result = run_cli("audit", "--snapshot", str(drifted_copy), "--config", str(empty_config), "--format", "json")
    assert result.code in (0, 1), result.stderr[-3000:]
    report = strict_json(result.stdout)
    assert by_check(report, "gpu.xid") and by_check(report, "bmc.events")
    assert "captured_at" in result.stderr and "not a usable time" in result.stderr


def test_a_cpu_list_of_a_billion_cpus_is_unknown_in_bounded_memory(drifted_copy: Path, empty_config: Path) -> None:
    """`0-999999999` in /sys/devices/system/cpu/online was a billion-entry tuple (MemoryError, exit 3)."""
    replace(drifted_copy / "fs/sys/devices/system/cpu/online", "0-999999999\n")

    def cap() -> None:  # 3 GiB of address space: the audit needs a fraction of it
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    result = subprocess.run([sys.executable, "-m", "agent", "audit", "--snapshot", str(drifted_copy), "--config",
                             str(empty_config), "--format", "json", "--only", "host.cpu.*"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False, preexec_fn=cap)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    governor = by_check(strict_json(result.stdout), "host.cpu.governor")
    assert governor and all(f["status"] == "unknown" and "cpu/online" in f["message"] for f in governor), governor


def test_hostile_bmc_numbers_in_a_snapshot_are_unknown(run_cli: RunCli, drifted_copy: Path,
                                                       empty_config: Path) -> None:
    thermal = drifted_copy / DRIFTED_CHASSIS / "Thermal/index.json"
    doc = json.loads(thermal.read_text())
    doc["Temperatures"][0]["ReadingCelsius"] = float("nan")
    doc["Temperatures"][1]["ReadingCelsius"] = 12345
    replace(thermal, json.dumps(doc).replace("12345", "9" * 4000))  # json.dumps writes NaN as NaN
    power = drifted_copy / DRIFTED_CHASSIS / "Power/index.json"
    replace(power, power.read_text().replace('"MinNumNeeded": 6', '"MinNumNeeded": 1e999', 1))
    report = snapshot_report(run_cli, drifted_copy, empty_config, "bmc.*")
    names = (doc["Temperatures"][0]["Name"], doc["Temperatures"][1]["Name"])
    temps = {f["subject"]: f for f in by_check(report, "bmc.temperatures")}
    assert all(temps[name]["status"] == "unknown" and "ReadingCelsius" in temps[name]["message"] for name in names)
    assert any("MinNumNeeded" in f["message"] and f["status"] == "unknown" for f in by_check(report, "bmc.reachable"))


def test_a_dmesg_stamp_at_offset_plus_99_99_via_snapshot_import(tmp_path: Path) -> None:
    """`snapshot import` of a dmesg --time-format=iso whose stamps name a zone +99:99 away, then an audit."""
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text("2024-11-15T05:39:15,491363+99:99 NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off "
                     "the bus.\n2024-11-15T05:39:16,000000+00:00 NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has "
                     "fallen off the bus.\n0001-01-01T00:00:00,000000+14:00 kernel: hello\n")
    snap = tmp_path / "snap"
    config = tmp_path / "private" / "config.yaml"
    config.parent.mkdir(mode=0o700)
    config.write_text("{}\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    imported = cli("snapshot", "import", str(dmesg), "--out", str(snap))
    assert imported.returncode == 0, imported.stderr
    result = cli("audit", "--snapshot", str(snap), "--config", str(config), "--format", "json")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = strict_json(result.stdout)
    xid = [f for f in by_check(report, "gpu.xid") if "Xid 79" in f["message"]]
    assert xid and xid[0]["status"] == "fail"  # the record is kept; only its unusable stamp is ignored


# --- a recorded IPMI answer -------------------------------------------------------------------------


@pytest.mark.parametrize("reading", [float("nan"), float("inf"), 10**4000], ids=["NaN", "inf", "4000-digits"])
def test_a_hostile_ipmi_reading_in_a_recording_is_unknown_with_a_reason(ipmi_sim: IpmiSim, reading: Any) -> None:
    """A real read of the IPMI simulator, its recording given a hostile sensor value, replayed."""
    _facts, _status, raw = read_ipmi_live(ipmi_sim.host, ipmi_sim.port, ipmi_sim.user, ipmi_sim.password, 10.0)
    sensor = next(s for s in raw["sensors"] if isinstance(s, dict) and isinstance(s.get("value"), (int, float)))
    sensor["value"] = reading
    facts, status = read_ipmi_recorded(raw)
    assert isinstance(facts, Unknown) and not status.ok
    assert "value: expected a finite number" in facts.reason, facts.reason


# --- the check itself, given facts no parser made -------------------------------------------------------


@pytest.mark.parametrize("reading", [float("nan"), float("inf")], ids=["NaN", "inf"])
def test_a_non_finite_temperature_in_the_facts_is_unknown_not_a_pass(reading: float) -> None:
    """Defence in depth for facts built elsewhere (the daemon's merges, a future source): NaN >= 87 is
    False, so a NaN reading used to pass as `normal` and reach the report as a NaN token."""
    from agent.core.facts import BmcTemperature
    from agent.policy.profiles import ProfileStore
    from checks.bmc_health import TEMPERATURES
    from tests.unit.checks.test_checks_bmc import healthy_bmc, node

    sensors = (BmcTemperature("GPU3 Temp", reading, None, 87.0, 92.0, "Enabled", "OK", "GPU"),)
    (finding,) = TEMPERATURES.run(node(healthy_bmc(temperatures=sensors)), ProfileStore().profile("hgx-h100-sxm"))
    assert finding.status.value == "unknown" and "not a finite number" in finding.message, finding
