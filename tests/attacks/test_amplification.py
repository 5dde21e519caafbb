"""Amplification (issue 21, item 7): a small hostile input that would make nodewarden allocate or wait
without end. A GPU count of 10^8 in nvml.json, under a memory cap (RLIMIT_AS) in a subprocess; a
Prometheus that trickles its answer a byte at a time, or answers far more than any fleet needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.apps.fleet.prometheus import read_prometheus
from agent.apps.fleet.records import FleetInputError
from agent.core.errors import SnapshotError
from agent.core.facts import NvmlFacts
from agent.core.model import Unknown
from agent.sources.nvml_facts import read_nvml
from agent.sources.nvml_replay import RecordedNvml

REPO = Path(__file__).resolve().parents[2]
MEMORY_CAP = 768 << 20  # address space: an audit needs ~200 MB of it; 10^8 GPUs would need gigabytes


def _capped() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_a_gpu_count_of_a_hundred_million_is_refused_before_any_loop(tmp_path: Path) -> None:
    snapshot = tmp_path / "node"
    shutil.copytree(REPO / "fixtures" / "nodes" / "hgx-h100-drifted", snapshot, symlinks=True)
    recording = json.loads((snapshot / "nvml.json").read_text())
    recording["system"]["nvmlDeviceGetCount"] = 100_000_000
    (snapshot / "nvml.json").write_text(json.dumps(recording))
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "agent", "audit", "--snapshot", str(snapshot), "--format", "json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_capped,  # noqa: PLW1509
                            env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - start
    assert proc.returncode in (0, 1), err.decode()[-2000:]
    nvml = json.loads(out)["sources"]["nvml"]
    assert nvml["ok"] is False and "100000000" in nvml["error"] and "not 0 to 64" in nvml["error"], nvml
    assert took < 8, took  # refused at once, not after the NVML deadline (10 s) of allocating


# ---- a hostile Prometheus ----

@contextlib.contextmanager
def hostile_prometheus(answer: str) -> Iterator[str]:
    """127.0.0.1 server: 'trickle' sends a byte every 0.3 s forever; 'flood' sends 3 MB of valid JSON."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
                if answer == "trickle":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
                    while not stop.wait(0.3):
                        conn.sendall(b" ")
                else:
                    series = ',{"metric":{"instance":"n:1","check":"c","status":"pass"},"value":[1,"1"]}'
                    body = ('{"status":"success","data":{"resultType":"vector","result":[' + series[1:]
                            + series * 40_000 + "]}}").encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_trickling_prometheus_meets_the_total_deadline() -> None:
    outcome: list[BaseException | None] = []

    def read(url: str) -> None:
        try:
            read_prometheus(url, timeout_s=2.0)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    with hostile_prometheus("trickle") as url:
        start = time.monotonic()
        reader = threading.Thread(target=read, args=(url,), daemon=True)
        reader.start()
        reader.join(8)
        took = time.monotonic() - start
        assert not reader.is_alive(), "still reading a trickling answer after 8 s"
    (error,) = outcome
    assert isinstance(error, FleetInputError) and "did not answer all queries within 2 s" in str(error), error
    assert took < 4, took


def test_an_answer_over_the_cap_is_a_clear_error_not_a_gigabyte() -> None:
    with hostile_prometheus("flood") as url, pytest.raises(FleetInputError, match="more than 1 MiB"):
        read_prometheus(url, timeout_s=10.0, max_bytes=1 << 20)


def test_fleet_report_names_the_deadline_and_its_option(tmp_path: Path) -> None:
    with hostile_prometheus("trickle") as url:
        proc = subprocess.run([sys.executable, "-m", "agent", "fleet", "report", "--prometheus", url,
                               "--prometheus-timeout", "2", "--format", "json", "--output", str(tmp_path / "r.json")],
                              cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "did not answer all queries within 2 s (--prometheus-timeout)" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_other_recorded_counts_are_bounded_before_they_drive_a_loop() -> None:
    recording = json.loads((REPO / "fixtures" / "nodes" / "hgx-h100-drifted" / "nvml.json").read_text())
    recording["devices"][0]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": n} for n in range(5000)]
    facts, status = read_nvml(RecordedNvml(recording))
    assert status.ok and isinstance(facts, NvmlFacts)
    processes = facts.gpus[0].compute_processes
    assert isinstance(processes, Unknown) and "Insufficient Size" in processes.reason, processes
    assert facts.gpus[1].compute_processes == ()  # the other GPUs read as before
    recording["devices"] = [{} for _ in range(65)]
    with pytest.raises(SnapshotError, match="65 devices recorded, more than 64"):
        RecordedNvml(recording)
