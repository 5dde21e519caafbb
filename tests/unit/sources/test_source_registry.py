"""One source interface (issue 16, item 2): the registry drives the daemon's pollers, capture and config.

A source added to the registry is polled and reported by the daemon, recorded by `snapshot capture` and
documented as config keys without touching those modules; the one-shot audit and the daemon say the
same thing about a source the snapshot lacks; capture and import write recordings with one encoder.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import agent.apps.daemon.service as daemon_mod
import agent.sources.snapshot as snapshot_mod
from agent.apps.daemon.service import DEFAULT_INTERVALS, DEFAULT_TIMEOUTS, Daemon, DaemonSettings
from agent.core.model import SourceStatus
from agent.engine.audit import AuditRequest, run_audit
from agent.io.credentials import BmcOptions
from agent.policy.config import CONFIG_SCHEMA, load_config
from agent.policy.polls import Poll
from agent.report.metrics import ServerSettings
from agent.sources import registry
from agent.sources.kmsg import read_recorded_kmsg
from agent.sources.local_sources import kmsg_recording
from agent.sources.node import open_node
from agent.sources.snapshot import capture_live
from agent.sources.source import CaptureOptions, NodeView, ReadOptions, Recording, Source
from tests.conftest import REPO


class FanSource(Source):
    """A made-up source (say, a fan controller): one poll, one status, one recorded file."""

    name = "fans"
    statuses = ("fanctl",)
    facts_field = "fans"
    recorded_as = ("fanctl",)
    files = ("fanctl.json",)
    polls = (Poll("fanctl", 30.0, 5.0, "the fan controller"),)

    def read(self, node: NodeView, options: ReadOptions) -> tuple[Any, dict[str, SourceStatus]]:
        return {"rpm": 9000}, {"fanctl": SourceStatus("fanctl", ok=True, detail={"fans": 1})}

    def captured(self, node: NodeView) -> bool:
        return True

    def record(self, out: Path, options: CaptureOptions, done: Recording) -> None:
        (out / "fanctl.json").write_text('{"rpm": 9000}\n')
        done.captured.append("fanctl")


def test_every_poll_of_every_source_is_a_config_key_with_that_default() -> None:
    daemon_props = CONFIG_SCHEMA["properties"]["daemon"]["properties"]
    for key, defaults, seconds in (("intervals", DEFAULT_INTERVALS, "interval_s"),
                                   ("timeouts", DEFAULT_TIMEOUTS, "timeout_s")):
        keys = daemon_props[key]["properties"]
        assert list(keys) == [poll.name for poll in registry.polls()] == list(defaults)
        for poll in registry.polls():
            assert keys[poll.name]["default"] == getattr(poll, seconds) == defaults[poll.name]
    names = registry.status_names()
    assert len(names) == len(set(names)) and set(names) == {"host", "kmsg", "nvml", "redfish", "ipmi"}


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for daemon in made:  # its /metrics server was bound at construction (port 0: any free one)
        daemon.server.start()
        daemon.server.stop()


def _daemon(made: list[Daemon], request: AuditRequest, settings: DaemonSettings | None = None) -> Daemon:
    settings = dataclasses.replace(settings or DaemonSettings(), server=ServerSettings(host="127.0.0.1", port=0))
    made.append(Daemon(request, settings, None, None, lambda _config: request.bmc))
    return made[-1]


def _poll_all(daemon: Daemon) -> None:
    for poller in daemon.pollers:
        daemon._on_result(poller.name, poller._poll())


def test_the_daemon_polls_each_poll_of_each_source_the_node_has(daemons: list[Daemon]) -> None:
    request = AuditRequest(config=load_config(None), simulate="hgx-h100-drifted")
    daemon = _daemon(daemons, request)
    assert [(p.name, p.reports) for p in daemon.pollers] == [
        ("host", ("host",)), ("nvml", ("nvml",)), ("bmc_inventory", ("redfish",)), ("bmc_sensors", ("redfish",))]
    _host, _nvml, _bmc, sources = daemon._sources_now()  # nothing polled yet: pending, not "down"
    assert {n: (s.error, s.detail.get("pending")) for n, s in sources.items() if n != "kmsg"} == {
        "host": ("not read yet", True), "nvml": ("not read yet", True), "redfish": ("not read yet", True),
        "ipmi": ("not configured", None)}


def test_a_source_added_to_the_registry_is_polled_and_reported_by_the_daemon(
        monkeypatch: pytest.MonkeyPatch, daemons: list[Daemon]) -> None:
    monkeypatch.setattr(daemon_mod, "SOURCES", (*registry.SOURCES, FanSource()))
    settings = DaemonSettings(intervals={**DEFAULT_INTERVALS, "fanctl": 30.0},
                              timeouts={**DEFAULT_TIMEOUTS, "fanctl": 5.0})
    daemon = _daemon(daemons, AuditRequest(config=load_config(None), simulate="hgx-h100-healthy"), settings)
    assert [p.name for p in daemon.pollers][-1] == "fanctl"
    _poll_all(daemon)
    report = daemon.evaluate()
    assert report.sources["fanctl"].ok and report.sources["fanctl"].detail == {"fans": 1}
    assert report.sources["host"].ok and report.sources["nvml"].ok and report.sources["redfish"].ok


def test_snapshot_capture_records_through_every_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(snapshot_mod, "SOURCES", (FanSource(),))
    out = tmp_path / "snap"
    assert capture_live(out, []) == ["fanctl"]
    assert json.loads((out / "fanctl.json").read_text()) == {"rpm": 9000}
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    assert meta["captured"] == ["fanctl"] and meta["hostname"] == "unknown"


def test_a_failed_host_poll_says_why_instead_of_not_read_yet(daemons: list[Daemon]) -> None:
    request = AuditRequest(config=load_config(None), simulate="hgx-h100-healthy")
    daemon = _daemon(daemons, request)
    failed = daemon_mod.PollResult(None, {"host": SourceStatus("host", ok=False, error="timed out after 20 s")}, 1.0)
    daemon._on_result("host", failed)
    host, _nvml, _bmc, sources = daemon._sources_now()
    assert sources["host"].error == "timed out after 20 s" and not sources["host"].detail.get("pending")
    assert host.sysctl == {} and "timed out after 20 s" in str(host.kernel_release)


def test_audit_and_daemon_report_a_source_the_snapshot_lacks_alike(daemons: list[Daemon]) -> None:
    snap = REPO / "fixtures" / "nodes" / "hgx-h100-nvsmi-import"
    meta = yaml.safe_load((snap / "meta.yaml").read_text())
    assert "host" not in meta["captured"] and "nvml" in meta["captured"]
    request = AuditRequest(config=load_config(None), snapshot=snap)
    audited = run_audit(request).sources
    daemon = _daemon(daemons, request)
    _poll_all(daemon)
    polled = daemon._sources_now()[3]
    for name in ("host", "redfish"):
        assert (audited[name].configured, audited[name].error) == (polled[name].configured, "not in snapshot") or (
            name == "redfish" and polled[name].error == "not configured")
    assert not audited["host"].configured and not polled["host"].configured
    assert audited["nvml"].ok and polled["nvml"].ok


def test_the_bmc_named_on_the_command_line_is_read_live_even_for_a_snapshot() -> None:
    node = open_node(AuditRequest(config=load_config(None), simulate="hgx-h100-drifted"))
    recorded, named = ReadOptions(), ReadOptions(bmc=BmcOptions(ipmi_host="127.0.0.1"))
    assert not registry.BMC.reads_live(node, recorded) and registry.BMC.reads_live(node, named)
    assert registry.BMC.protocols(node, BmcOptions()) == ("redfish",)
    assert registry.BMC.protocols(node, named.bmc) == ("ipmi",)
    _facts, statuses = registry.BMC.read(node, recorded)
    assert statuses["redfish"].ok and statuses["ipmi"].error == "not in snapshot"


def test_a_recorded_bmc_without_ipmi_json_imports_no_ipmi_code() -> None:
    code = ("import sys; from agent.policy.config import load_config; from agent.engine.audit import AuditRequest; "
            "from agent.sources.node import open_node; from agent.sources.registry import BMC; "
            "from agent.sources.source import ReadOptions; "
            "node = open_node(AuditRequest(config=load_config(None), simulate='hgx-h100-drifted')); "
            "facts, st = BMC.read(node, ReadOptions()); assert st['redfish'].ok; "
            "print(sorted(m for m in sys.modules if 'ipmi' in m or m.startswith('pyghmi')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_kmsg_is_written_in_parts_that_read_back_whole(tmp_path: Path) -> None:
    lines = [f"6,{i},{i * 1000},-;line {i}" for i in range(20_001)]
    parts = list(kmsg_recording(lines, per_part=8192))
    assert len(parts) == 3 and all(part.endswith(b"\n") for part in parts)
    path = tmp_path / "kmsg.txt"
    path.write_bytes(b"".join(parts))
    records = read_recorded_kmsg(path)
    assert isinstance(records, tuple) and [r.message for r in records[:2]] == ["line 0", "line 1"]
    assert len(records) == 20_001


def test_sources_declare_what_they_are() -> None:
    for src in registry.SOURCES:
        assert src.name and src.statuses and src.facts_field and src.recorded_as and src.files
        assert registry.source(src.name) is src
    with pytest.raises(KeyError):
        registry.source("dcgm")


def test_every_registered_source_reads_both_ways_and_records_itself() -> None:
    def own(src: Source, hook: str) -> bool:
        return any(hook in vars(cls) for cls in type(src).__mro__ if cls is not Source)

    for src in registry.SOURCES:
        assert own(src, "read") or (own(src, "read_live") and own(src, "read_recorded")), src.name
        assert own(src, "record"), src.name
    assert not own(FanSource(), "read_live") and own(FanSource(), "read")  # the detector tells them apart
