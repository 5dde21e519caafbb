"""Shared test helpers: drive the real click CLI in-process, build facts and profiles."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli import cli

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)  # type: ignore[no-any-return]


RunCli = Callable[..., CliResult]


@pytest.fixture
def run_cli() -> RunCli:
    """Invoke `nodewarden ARGS...` through click, exactly as the console script does."""

    def run(*args: str, env: dict[str, str] | None = None) -> CliResult:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def empty_config(tmp_path: Path) -> Path:
    """A config file that points waivers/overrides nowhere, isolating tests from /etc."""
    path = tmp_path / "config.yaml"
    path.write_text("{}\n")
    return path
