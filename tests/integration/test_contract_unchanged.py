"""Issue 32: moving agent/ into its floors changes no contract users depend on. `nodewarden --help` and every
subcommand's `--help`, the JSON report of each simulated node (times aside) and the series and labels of a
simulated daemon's /metrics (values aside) are what they were before the move: tests/contract/ holds them, recorded from the layout before (`python -m tests.integration.test_contract_unchanged
DIR` writes them from the checkout at DIR). A change that means to alter a contract rewrites these files in
the same commit, which a reviewer then sees."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

RECORDED = REPO / "tests" / "contract"
NODES = ("dgx-a100-healthy", "hgx-h100-drifted", "hgx-h100-healthy", "hgx-h100-nvsmi-import")
METRIC_NODES = ("hgx-h100-drifted", "hgx-h100-healthy")
TIMES = frozenset({"started_at", "duration_s"})
# Walks the click tree in a child (the group lives where the checkout's layout puts it).
HELP_WALK = """
import json, sys
import click
from click.testing import CliRunner
try:
    from agent.apps.cli.main import cli
except ImportError:
    from agent.cli import cli
out = {}
def walk(group, path):
    ctx = click.Context(group, info_name="nodewarden")
    names = group.list_commands(ctx) if isinstance(group, click.Group) else []
    out[" ".join(path) or "nodewarden"] = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100).output
    for name in names:
        walk(group.get_command(ctx, name), [*path, name])
walk(cli, [])
json.dump(out, sys.stdout, indent=1, sort_keys=True)
"""


SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")  # "host answered in 0.028 s": a time, not the contract


def _untimed(value: Any, tree: Path) -> Any:
    """The report without its times, and with the checkout's path (profiles, simulated snapshots) as <checkout>."""
    if isinstance(value, dict):
        return {k: _untimed(v, tree) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_untimed(v, tree) for v in value]
    if isinstance(value, str):
        return SECONDS.sub("<t> s", value.replace(str(tree), "<checkout>"))
    return value


def _run(tree: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100", "NODEWARDEN_CONFIG": "/nonexistent"}
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


# A scrape's series whose label values are this process's or this machine's, not the contract: kept by name.
PROCESS_SERIES = re.compile(r"^(process_|python_)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s")
LABEL_VALUES_OF_THE_RUN = frozenset({"version", "pid", "hostname", "listen"})


def metric_series(text: str) -> list[str]:
    """Each sample of a scrape as its series: the name and its labels (values of the run's own labels
    blanked), no sample value, no comment lines, sorted and unique."""
    seen = set()
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels = match.group(1), match.group(2) or ""
        if PROCESS_SERIES.match(name):
            labels = ""
        labels = re.sub(r'(\w+)="((?:[^"\\]|\\.)*)"',
                        lambda m: f'{m.group(1)}="<run>"' if m.group(1) in LABEL_VALUES_OF_THE_RUN else m.group(0),
                        labels)
        seen.add(name + labels)
    return sorted(seen)


def daemon_scrape(tree: Path, node: str) -> str:
    from tests.daemon_peer import running_daemon

    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp), "--simulate", node, cwd=tree) as daemon:
        return daemon.settled_scrape(timeout=120)


def observe(tree: Path) -> dict[str, Any]:
    helps = json.loads(_run(tree, "-c", HELP_WALK))
    reports = {node: _untimed(json.loads(_run(tree, "-m", "agent", "audit", "--simulate", node, "--format", "json")),
                              tree) for node in NODES}
    metrics = {node: metric_series(daemon_scrape(tree, node)) for node in METRIC_NODES}
    return {"help": helps, "reports": reports, "metrics": metrics}


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return observe(REPO)


def test_every_help_text_is_what_it_was(now: dict[str, Any]) -> None:
    recorded = json.loads((RECORDED / "help.json").read_text())
    assert sorted(now["help"]) == sorted(recorded)
    assert {k: v for k, v in now["help"].items() if v != recorded[k]} == {}


@pytest.mark.parametrize("node", NODES)
def test_each_simulated_report_is_what_it_was(now: dict[str, Any], node: str) -> None:
    recorded = json.loads((RECORDED / f"report-{node}.json").read_text())
    assert now["reports"][node] == recorded


@pytest.mark.parametrize("node", METRIC_NODES)
def test_each_simulated_daemons_series_and_labels_are_what_they_were(now: dict[str, Any], node: str) -> None:
    recorded = json.loads((RECORDED / f"metrics-{node}.json").read_text())
    assert {"gone": sorted(set(recorded) - set(now["metrics"][node])),
            "new": sorted(set(now["metrics"][node]) - set(recorded))} == {"gone": [], "new": []}


def test_the_series_of_a_scrape_are_its_names_and_labels() -> None:
    scrape = ('# HELP x y\nnodewarden_gpu_temp_celsius{gpu="0",uuid="GPU-1"} 41.0\n'
              'nodewarden_build_info{version="0.1.0",python="3.11"} 1.0\nprocess_cpu_seconds_total 0.5\n'
              'nodewarden_gpu_temp_celsius{gpu="0",uuid="GPU-1"} 42.0\n')
    assert metric_series(scrape) == ['nodewarden_build_info{version="<run>",python="3.11"}',
                                      'nodewarden_gpu_temp_celsius{gpu="0",uuid="GPU-1"}', "process_cpu_seconds_total"]


if __name__ == "__main__":
    source = Path(sys.argv[1]).resolve()
    seen = observe(source)
    RECORDED.mkdir(exist_ok=True)
    (RECORDED / "help.json").write_text(json.dumps(seen["help"], indent=1, sort_keys=True) + "\n")
    for name, report in seen["reports"].items():
        (RECORDED / f"report-{name}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    for name, series in seen["metrics"].items():
        (RECORDED / f"metrics-{name}.json").write_text(json.dumps(series, indent=1) + "\n")
