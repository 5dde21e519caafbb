"""Issue #16: NVML calls per GPU per daemon poll (<= 16 from the second poll on) on the recorded
8-GPU node, statics re-read after a driver reload, an NVML re-init or a new Xid; and the replay
needs no `pynvml` (its own constants and exception classes, equal to the real binding's)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pynvml

from agent.core.facts import NvmlFacts
from agent.sources import nvml_const
from agent.sources.nvml import NvmlSession, RecordedHandle, RecordedNvml, StaticCache, read_nvml
from tests.conftest import REPO

NODE = REPO / "fixtures" / "nodes" / "hgx-h100-healthy" / "nvml.json"
TARGET = 16


class CountingNvml:
    """The replay backend, counting every call per GPU (the handle lookup counts for its GPU)."""

    def __init__(self, backend: RecordedNvml) -> None:
        self.backend = backend
        self.per_gpu: Counter[int] = Counter()
        self.names: list[tuple[int, str]] = []
        self.inits = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.backend, name)
        if not name.startswith("nvml") or not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args: Any) -> Any:
            if name == "nvmlInit":
                self.inits += 1
            if name == "nvmlDeviceGetHandleByIndex":
                gpu: int | None = int(args[0])
            else:
                gpu = int(args[0]) if args and isinstance(args[0], RecordedHandle) else None
            if gpu is not None:
                self.per_gpu[gpu] += 1
                self.names.append((gpu, name))
            return attr(*args)

        return call

    def take(self) -> tuple[dict[int, int], list[tuple[int, str]]]:
        counts, names = dict(self.per_gpu), list(self.names)
        self.per_gpu.clear()
        self.names.clear()
        return counts, names


def data() -> dict[str, Any]:
    return json.loads(NODE.read_text())


def poll(session: NvmlSession) -> NvmlFacts:
    facts, status = session.read(10.0)
    assert status.ok, status.error
    assert isinstance(facts, NvmlFacts)
    return facts


def _same(a: NvmlFacts, b: NvmlFacts) -> bool:
    strip = [g._replace(calls=0) for g in a.gpus], [g._replace(calls=0) for g in b.gpus]
    return strip[0] == strip[1] and a._replace(gpus=(), calls=0) == b._replace(gpus=(), calls=0)


def test_at_most_16_calls_per_gpu_from_the_second_poll_on() -> None:
    counter = CountingNvml(RecordedNvml(data()))
    session = NvmlSession(lambda: counter, recorded=True)
    first = poll(session)
    cold, _ = counter.take()
    assert len(cold) == 8 and min(cold.values()) > TARGET  # the first poll reads the statics too
    audit, _ = read_nvml(RecordedNvml(data()))
    assert isinstance(audit, NvmlFacts) and _same(first, audit)
    for _ in range(3):
        facts = poll(session)
        counts, names = counter.take()
        assert len(counts) == 8 and max(counts.values()) <= TARGET, counts
        assert not {n for _, n in names} & {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo",
                                            "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetPowerUsage"}
        assert _same(facts, audit)  # cached statics and batched power: the same facts as an audit
        assert all(g.calls <= TARGET for g in facts.gpus)
    assert counter.inits == 1  # NVML stays initialised between polls


def test_a_driver_version_change_re_reads_every_gpus_statics() -> None:
    recording = data()
    counter = CountingNvml(RecordedNvml(recording))
    session = NvmlSession(lambda: counter, recorded=True)
    poll(session), poll(session)
    counter.take()
    recording["system"]["nvmlSystemGetDriverVersion"] = "550.127.05"  # a driver reload
    facts = poll(session)
    counts, names = counter.take()
    assert min(counts.values()) > TARGET and sum(1 for _, n in names if n == "nvmlDeviceGetUUID") == 8
    assert facts.driver_version == "550.127.05"
    poll(session)
    assert max(counter.take()[0].values()) <= TARGET


def test_a_new_xid_re_reads_that_gpus_statics_only() -> None:
    recording = data()
    counter = CountingNvml(RecordedNvml(recording))
    session = NvmlSession(lambda: counter, recorded=True)
    facts = poll(session)
    poll(session)
    counter.take()
    bus = facts.gpus[3].pci_bus_id
    assert isinstance(bus, str) and session.gpu_event(bus)
    recording["devices"][3]["nvmlDeviceGetVbiosVersion"] = "96.00.99.00.01"  # e.g. flashed, then reset
    after = poll(session)
    counts, names = counter.take()
    assert counts[3] > TARGET and ("nvmlDeviceGetVbiosVersion" in {n for g, n in names if g == 3})
    assert all(counts[g] <= TARGET for g in counts if g != 3)
    assert after.gpus[3].vbios == "96.00.99.00.01"
    assert not session.gpu_event("0000:ff:00.0")  # not one of ours: nothing dropped


def test_nvml_re_init_and_a_hung_read_drop_the_cache() -> None:
    counter = CountingNvml(RecordedNvml(data()))
    cache = StaticCache()
    read_nvml(counter, cache=cache)
    read_nvml(counter, cache=cache)
    counter.take()
    cache.lost_session()  # a failed or hung read: initialise again, and so re-read
    read_nvml(counter, cache=cache)
    assert counter.inits == 2 and min(counter.take()[0].values()) > TARGET


def test_an_audit_without_a_cache_still_inits_and_shuts_down() -> None:
    backend = RecordedNvml(data())
    facts, status = read_nvml(backend)
    assert status.ok and isinstance(facts, NvmlFacts)
    assert max(backend.calls_per_device.values()) <= 40  # Figure 2's per-audit target


def test_the_replay_constants_and_errors_match_pynvml() -> None:
    for name in dir(nvml_const):
        if name.startswith(("NVML_", "nvml")) and isinstance(getattr(nvml_const, name), int):
            assert getattr(pynvml, name) == getattr(nvml_const, name), name
    for code, name in nvml_const.ERROR_NAMES.items():
        ours, real = nvml_const.NVMLError(code), pynvml.NVMLError(code)
        assert type(ours).__name__ == type(real).__name__ and ours.value == code
        if code in pynvml.NVMLError._errcode_to_string:
            assert str(ours) == str(real), name


def test_the_replay_answers_the_power_fields_and_calls_from_either_recording() -> None:
    recording = data()
    device = recording["devices"][0]
    usage = device.pop("nvmlDeviceGetPowerUsage")
    device["nvmlDeviceGetFieldValues"]["NVML_FI_DEV_POWER_AVERAGE:0"] = usage
    backend = RecordedNvml(recording)
    assert backend.nvmlDeviceGetPowerUsage(RecordedHandle(0)) == usage
    backend.nvmlDeviceSetPowerManagementLimit(RecordedHandle(1), 500000)
    facts, _ = read_nvml(backend)
    assert isinstance(facts, NvmlFacts)
    assert facts.gpus[0].power_w == round(usage / 1000, 3)
    assert (facts.gpus[1].power_limit_w, facts.gpus[1].enforced_limit_w) == (500.0, 500.0)


def test_a_recorded_audit_does_not_import_pynvml() -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "agent", "audit", "--simulate",
                             "hgx-h100-drifted", "--format", "json"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert json.loads(result.stdout)["sources"]["nvml"]["ok"] is True
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "agent.sources.nvml_replay" in imported and "pynvml" not in imported
