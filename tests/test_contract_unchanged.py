"""Issue 32: moving agent/ into its floors changes no contract users depend on. `nodewarden --help` and every
subcommand's `--help`, and the JSON report of each simulated node (times aside), are what they were before
the move: tests/contract/ holds them, recorded from the layout before (`python -m tests.test_contract_unchanged
DIR` writes them from the checkout at DIR). A change that means to alter a contract rewrites these files in
the same commit, which a reviewer then sees."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

RECORDED = REPO / "tests" / "contract"
NODES = ("dgx-a100-healthy", "hgx-h100-drifted", "hgx-h100-healthy", "hgx-h100-nvsmi-import")
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


def observe(tree: Path) -> dict[str, Any]:
    helps = json.loads(_run(tree, "-c", HELP_WALK))
    reports = {node: _untimed(json.loads(_run(tree, "-m", "agent", "audit", "--simulate", node, "--format", "json")),
                              tree) for node in NODES}
    return {"help": helps, "reports": reports}


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


if __name__ == "__main__":
    source = Path(sys.argv[1]).resolve()
    seen = observe(source)
    RECORDED.mkdir(exist_ok=True)
    (RECORDED / "help.json").write_text(json.dumps(seen["help"], indent=1, sort_keys=True) + "\n")
    for name, report in seen["reports"].items():
        (RECORDED / f"report-{name}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
