"""`nodewarden health-check --npd` (node-problem-detector's custom plugin protocol) and the shipped
monitor config in deploy/kubernetes/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from agent.apps.cli.health_check import health_check

REPO = Path(__file__).resolve().parents[3]
NODEWARDEN = str(Path(sys.executable).with_name("nodewarden"))
MONITOR = REPO / "deploy" / "kubernetes" / "nodewarden-monitor.json"


def npd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([NODEWARDEN, "health-check", "--npd", "--state-dir", str(tmp_path / "state"), *args],
                          capture_output=True, timeout=60, check=False, env={"PWD": "/"}, cwd="/")


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    snapshot = tmp_path_factory.mktemp("npd") / "degraded"
    shutil.copytree(REPO / "fixtures" / "nodes" / "hgx-h100-healthy", snapshot)
    (snapshot / "fs/proc/sys/vm/zone_reclaim_mode").write_text("1\n")  # tuning drift only
    return snapshot


@pytest.mark.parametrize(("source", "extra", "code", "head"), [
    (("--simulate", "hgx-h100-healthy"), (), 0, b"OK: nothing to do"),
    (("--snapshot", "DEGRADED"), (), 0, b"DEGRADED: host.sysctl vm.zone_reclaim_mode"),
    (("--snapshot", "DEGRADED"), ("--fail-on", "DEGRADED"), 1, b"DEGRADED: host.sysctl"),
    (("--simulate", "hgx-h100-drifted"), (), 1, b"DRAIN: gpu.lost gpu7"),
    (("--simulate", "hgx-h100-drifted"), ("--deadline", "0.001"), 2, b"UNKNOWN: audit deadline hit"),
])
def test_npd_exit_code_and_one_short_line_per_verdict(tmp_path: Path, degraded: Path, source: tuple[str, str],
                                                     extra: tuple[str, ...], code: int, head: bytes) -> None:
    kind, value = source
    done = npd(tmp_path, kind, str(degraded) if value == "DEGRADED" else value, *extra)
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80, lines
    assert lines[0].startswith(head), lines[0]
    assert lines[0].isascii()


def test_npd_bad_usage_is_unknown_for_npd(tmp_path: Path) -> None:
    done = npd(tmp_path, "--node", "bad name;rm")
    assert done.returncode == 2  # NPD reads 2 as Unknown: never NonOK on our own mistake


def _invocation(rule: dict[str, object]) -> list[str]:
    argv = [str(rule["path"]), *(str(a) for a in rule.get("args", []))]  # type: ignore[attr-defined]
    assert "health-check" in argv, argv
    return argv


def test_the_shipped_npd_monitor_is_well_formed_and_calls_our_cli() -> None:
    doc = json.loads(MONITOR.read_text())
    assert doc["plugin"] == "custom"
    config = doc["pluginConfig"]
    assert config["max_output_length"] == 80
    timeout = int(config["timeout"].rstrip("s"))
    assert timeout < int(config["invoke_interval"].rstrip("s"))
    conditions = {c["type"]: c for c in doc["conditions"]}
    assert set(conditions) == {"NodewardenDrain"}
    kinds = {}
    for rule in doc["rules"]:
        assert re.fullmatch(r"\d+s", rule["timeout"]) and int(rule["timeout"][:-1]) <= timeout
        kinds[rule["type"]] = rule
        argv = _invocation(rule)
        assert argv[0] == "/usr/sbin/chroot" and argv[2] == "/usr/local/bin/nodewarden"
        args = argv[argv.index("health-check") + 1:]
        ctx = health_check.make_context("health-check", list(args))  # our parser: unknown options fail here
        assert ctx.params["npd"] is True
        deadline = ctx.params["deadline"] or 45
        assert deadline < int(rule["timeout"][:-1]), "the one-shot audit must end before NPD kills it"
    assert kinds["permanent"]["condition"] == "NodewardenDrain"
    assert "--fail-on" not in kinds["permanent"]["args"]  # only DRAIN sets the condition
    temporary = kinds["temporary"]["args"]
    assert temporary[temporary.index("--fail-on") + 1] == "DEGRADED"  # warnings are events


def test_the_monitor_test_catches_an_option_we_do_not_have() -> None:
    with pytest.raises(click.NoSuchOption):
        health_check.make_context("health-check", ["--npd", "--no-such-option"])
