"""The Redfish source against a real Redfish server (sushy-static) and a fault-injecting proxy."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agent.core.facts import BmcFacts
from agent.core.model import Unknown
from agent.io.credentials import Secret
from agent.sources.redfish import LiveRedfish, RecordedRedfish, RecordingRedfish, read_redfish
from tests.conftest import RunCli
from tests.peers.redfish import (
    FaultProxy,
    RedfishPeer,
    fault_proxy,
    mockup,
    self_signed_tls,
    silent_listener,
    sushy_static,
)

PASSWORD = "s3cret-Pa55word!"  # must never show up in any output


@pytest.fixture(scope="module")
def hpe() -> RedfishPeer:  # type: ignore[misc]
    with sushy_static(mockup("hpe-dl380a-gen11")) as peer:
        yield peer


@pytest.fixture
def proxy(hpe: RedfishPeer) -> FaultProxy:  # type: ignore[misc]
    with fault_proxy(hpe.url) as px:
        yield px


def live(url: str, **kw: object) -> tuple[BmcFacts | Unknown, object, object]:
    timeout = float(kw.pop("timeout_s", 5.0))  # type: ignore[arg-type]
    deadline = float(kw.pop("deadline_s", 30.0))  # type: ignore[arg-type]
    return read_redfish(lambda: LiveRedfish(url, "admin", PASSWORD, timeout_s=timeout, backoff_s=0.05,
                                            **kw),  # type: ignore[arg-type]
                        deadline_s=deadline, insecure=bool(kw.get("insecure")))


def test_live_read_equals_the_recorded_read(hpe: RedfishPeer) -> None:
    facts, status, _transport = live(hpe.url)
    recorded, _, _ = read_redfish(lambda: RecordedRedfish(mockup("hpe-dl380a-gen11")))
    assert isinstance(facts, BmcFacts) and isinstance(recorded, BmcFacts)
    assert status.ok and status.detail["auth"] == "basic"  # sushy-static has no sessions: basic fallback
    assert facts._replace(requests=0, problems=()) == recorded._replace(requests=0, problems=())
    assert len(facts.problems) == len(recorded.problems) == 4  # the mockup has no log entries
    assert facts.vendor == "HPE" and facts.model == "ProLiant DL380a Gen11 -- SIMULATED"
    assert isinstance(facts.bios_attributes, dict)  # iLO's lower-case link was fixed against /Systems/1
    assert facts.bios_attributes["PowerRegulator"] == "DynamicPowerSavings"
    assert [g.name for g in facts.gpus] == ["NVIDIA H100 NVL", "NVIDIA H100 NVL"]  # type: ignore[union-attr]


def test_no_resource_is_fetched_twice(proxy: FaultProxy) -> None:
    facts, _status, _ = live(proxy.url)
    assert isinstance(facts, BmcFacts)
    counts = proxy.requests("GET")
    assert counts and max(counts.values()) == 1, {p: n for p, n in counts.items() if n > 1}


@pytest.mark.parametrize(("rule", "part", "reason"), [
    ("/Chassis/1/Thermal$ status 500", "temperatures", "HTTP 500"),
    ("/Chassis/1/Thermal$ body this-is-not-json", "temperatures", "not JSON"),
    ("/UpdateService/FirmwareInventory$ reset", "firmware", "connection reset"),
    ("/Managers/1$ missing", "manager_firmware", "HTTP 404"),
])
def test_faults_become_precise_unknowns(proxy: FaultProxy, rule: str, part: str, reason: str) -> None:
    proxy.set_rules([rule])
    facts, status, _ = live(proxy.url)
    assert isinstance(facts, BmcFacts)
    value = getattr(facts, part)
    if part == "temperatures":  # Thermal is gone, ThermalSubsystem still answers: no temperatures from it
        assert any(reason in p for p in facts.problems), facts.problems
    else:
        assert isinstance(value, Unknown) and reason in value.reason, value
    assert status.error and "failed" in status.error
    assert isinstance(facts.psus, tuple)  # everything else was still read


def test_server_errors_are_retried_but_a_401_is_not(proxy: FaultProxy) -> None:
    proxy.set_rules(["/Chassis/1/Power$ status 503"])
    live(proxy.url)
    assert proxy.requests("GET")["/redfish/v1/Chassis/1/Power"] == 3  # 1 + 2 retries with backoff
    proxy.reset_requests()
    proxy.set_rules(["/redfish/v1.* status 401"])
    facts, status, _ = live(proxy.url)
    assert isinstance(facts, Unknown) and "authentication failed" in facts.reason
    assert status.detail.get("auth_failed") is True
    # The library reads the root to find the login URL, then one session POST gets the 401:
    # no basic-auth attempt with the same credentials, no retries.
    assert proxy.requests() == {"/redfish/v1/": 1, "/redfish/v1/SessionService/Sessions": 1}
    assert proxy.requests("POST") == {"/redfish/v1/SessionService/Sessions": 1}


def test_slow_resources_are_waited_for(proxy: FaultProxy) -> None:
    proxy.set_rules(["/Chassis/1/Thermal$ delay 1.5"])
    start = time.monotonic()
    facts, _status, _ = live(proxy.url)
    assert isinstance(facts, BmcFacts) and isinstance(facts.temperatures, tuple) and facts.temperatures
    assert 1.5 <= time.monotonic() - start < 8


def test_a_hung_resource_times_out_and_the_rest_is_read(proxy: FaultProxy) -> None:
    proxy.set_rules(["/Chassis/1/Thermal$ hang 60"])
    start = time.monotonic()
    facts, _status, _ = live(proxy.url, timeout_s=1.0, deadline_s=20.0)
    elapsed = time.monotonic() - start
    assert isinstance(facts, BmcFacts)
    assert any("Thermal: timed out" in p for p in facts.problems), facts.problems
    assert isinstance(facts.psus, tuple) and elapsed < 10


def test_a_bmc_that_never_answers_is_bounded() -> None:
    with silent_listener() as (host, port):
        start = time.monotonic()
        facts, status, _ = live(f"http://{host}:{port}", timeout_s=1.0, deadline_s=4.0)
        elapsed = time.monotonic() - start
    assert isinstance(facts, Unknown) and not status.ok
    assert elapsed < 6.5


def test_tls_is_verified_unless_told_otherwise(tmp_path: Path) -> None:
    tls = self_signed_tls(tmp_path)
    with sushy_static(mockup("supermicro-x10"), tls=tls) as peer:
        assert peer.url.startswith("https://")
        facts, status, _ = live(peer.url)
        assert not status.ok
        assert isinstance(facts, Unknown) and "TLS certificate verification failed" in facts.reason
        verified, _verified_status, _ = live(peer.url, ca_file=str(tls.ca))
        assert isinstance(verified, BmcFacts) and not verified.insecure
        insecure, _status, _ = live(peer.url, insecure=True)
        assert isinstance(insecure, BmcFacts) and insecure.insecure


def test_supermicro_redfish_1_0_with_absent_sensors(redfish_x10: RedfishPeer) -> None:
    facts, _status, _ = live(redfish_x10.url)
    assert isinstance(facts, BmcFacts)
    assert facts.redfish_version == "1.0.1"
    assert isinstance(facts.temperatures, tuple) and {t.state for t in facts.temperatures} == {"Absent"}
    assert isinstance(facts.events, tuple) and len(facts.events) == 65
    assert isinstance(facts.firmware, Unknown)  # linked but 404 on this BMC


@pytest.fixture(scope="module")
def redfish_x10() -> RedfishPeer:  # type: ignore[misc]
    with sushy_static(mockup("supermicro-x10")) as peer:
        yield peer


def password_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "bmc-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(mode)
    return path


def test_audit_with_a_bmc_never_leaks_the_password(run_cli: RunCli, proxy: FaultProxy, tmp_path: Path) -> None:
    proxy.set_rules(["/Chassis/1/Thermal$ status 500"])
    secret = password_file(tmp_path)
    # The mockup is a GPU-less ProLiant (profile no-nvidia-gpu: no BIOS tuning); judge it as a GPU node.
    result = run_cli("-vv", "--log-format", "json", "audit", "--bmc", proxy.url, "--bmc-user", "admin",
                     "--bmc-password-file", str(secret), "--format", "json", "--skip", "gpu.*",
                     "--profile", "generic-nvidia")
    assert result.code in (0, 1), result.stderr
    report = result.json()
    assert report["sources"]["redfish"]["ok"] is True
    bios = {f["subject"]: f for f in report["findings"] if f["check"] == "bios.attribute"}
    assert bios["PowerRegulator"]["status"] == "fail" and bios["PowerRegulator"]["observed"] == "DynamicPowerSavings"
    assert any(f["check"] == "bmc.reachable" and "Thermal" in f["subject"] for f in report["findings"])
    for text in (result.stdout, result.stderr, json.dumps(report)):
        assert PASSWORD not in text
    assert "Secret('***')" not in result.stdout


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_password_file_readable_by_others_is_refused(run_cli: RunCli, tmp_path: Path, mode: int) -> None:
    secret = password_file(tmp_path, mode)
    result = run_cli("audit", "--bmc", "https://127.0.0.1:1", "--bmc-user", "admin", "--bmc-password-file",
                     str(secret), "--format", "json")
    assert result.code == 2 and "accessible by group or others" in result.stderr and "chmod 600" in result.stderr
    assert PASSWORD not in result.stderr


def test_systemd_credential_is_used(run_cli: RunCli, hpe: RedfishPeer, tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    password_file(creds).rename(creds / "bmc-password")
    result = run_cli("audit", "--bmc", hpe.url, "--bmc-user", "admin", "--format", "json", "--only", "bmc.*",
                     env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert result.code in (0, 1), result.stderr
    assert result.json()["sources"]["redfish"]["ok"] is True


def test_secret_does_not_print_itself() -> None:
    secret = Secret(PASSWORD)
    assert PASSWORD not in repr(secret) and PASSWORD not in str(secret) and PASSWORD not in f"{secret}"
    assert secret.reveal() == PASSWORD


def test_recording_round_trips_through_the_mockup_layout(hpe: RedfishPeer, tmp_path: Path) -> None:
    recorder: list[RecordingRedfish] = []

    def make() -> RecordingRedfish:
        recorder.append(RecordingRedfish(LiveRedfish(hpe.url, "admin", PASSWORD, timeout_s=5)))
        return recorder[0]

    facts, _status, _ = read_redfish(make)
    recorder[0].write(tmp_path)
    assert (tmp_path / "redfish" / "v1" / "index.json").is_file()
    replayed, _, _ = read_redfish(lambda: RecordedRedfish(tmp_path))
    assert isinstance(facts, BmcFacts) and isinstance(replayed, BmcFacts)
    assert replayed._replace(requests=0, problems=()) == facts._replace(requests=0, problems=())
    assert not any(PASSWORD in p.read_text() for p in tmp_path.rglob("*.json"))
    assert os.environ.get("CREDENTIALS_DIRECTORY") is None


def test_snapshot_capture_records_the_bmc(run_cli: RunCli, hpe: RedfishPeer, tmp_path: Path) -> None:
    secret = password_file(tmp_path)
    out = tmp_path / "snap"
    result = run_cli("snapshot", "capture", "--out", str(out), "--bmc", hpe.url, "--bmc-user", "admin",
                     "--bmc-password-file", str(secret))
    assert result.code == 0, result.stderr
    assert "redfish" in result.stdout
    assert (out / "redfish" / "v1" / "Systems" / "1" / "index.json").is_file()
    replay = run_cli("audit", "--snapshot", str(out), "--format", "json", "--only", "bios.*",
                     "--profile", "generic-nvidia")  # a GPU-less ProLiant: judged as a GPU node would be
    bios = {f["subject"]: f["observed"] for f in replay.json()["findings"] if f["check"] == "bios.attribute"}
    assert bios["PowerRegulator"] == "DynamicPowerSavings"
    assert not any(PASSWORD in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())


def test_a_silent_bmc_gets_a_progress_line_and_a_final_message_with_its_url(tmp_path: Path) -> None:
    """Issue 36.9: a BMC that accepts TCP and never answers looked like a hung audit for the whole deadline."""
    import subprocess
    import sys

    secret = password_file(tmp_path)
    with silent_listener() as (host, port):
        url = f"http://{host}:{port}"
        config = tmp_path / "config.yaml"
        config.write_text(json.dumps({"bmc": {"url": url, "user": "admin", "password_file": str(secret),
                                              "timeout_s": 30, "deadline_s": 7}}))
        started = time.monotonic()
        done = subprocess.run([str(Path(sys.executable).with_name("nodewarden")), "audit", "--config", str(config),
                               "--only", "bmc.*", "--format", "json"], capture_output=True, text=True, timeout=120,
                              check=False)
        elapsed = time.monotonic() - started
    assert f"still waiting for the BMC at {url}" in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout)
    said = " ".join(f["message"] for f in report["findings"])
    assert f"the BMC at {url} did not answer the login within 7 s (gave up after" in said, said[:1000]
    assert elapsed < 60 and PASSWORD not in done.stdout + done.stderr
