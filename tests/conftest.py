"""Shared test helpers: drive the real click CLI in-process, build facts and profiles."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from tests.peers import processes
from tests.private_state import PrivateState

REPO = Path(__file__).resolve().parents[1]
PRIVATE_STATE: list[PrivateState | None] = [None]  # the session's, once pytest_configure made it


# --- peers never outlive the run (tests/peers/processes.py) ------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """The session's own /var/lib/nodewarden first, while pytest is one thread (tests/private_state.py);
    then atexit and SIGTERM/SIGHUP handlers, in the main thread, before any peer starts."""
    from agent.policy.config import DEFAULT_STATE_DIR

    PRIVATE_STATE[0] = PrivateState(DEFAULT_STATE_DIR)
    PRIVATE_STATE[0].enter()
    processes.install_safety_net()


def pytest_unconfigure(config: pytest.Config) -> None:
    if PRIVATE_STATE[0] is not None:
        PRIVATE_STATE[0].leave()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the session's fixtures
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Peers a fixture did not stop (an interrupted or failed run) stop with the session."""
    processes.stop_all()


@pytest.fixture(scope="session", autouse=True)
def machine_state_untouched() -> Iterator[None]:
    """No test writes /var/lib/nodewarden (a stale state file there changes what health-check answers):
    one listing before the session, one after. As root the folder is the session's own, private one
    (tests/private_state.py), so this is what the tests did, whatever the machine's daemons do."""
    from agent.policy.config import DEFAULT_STATE_DIR
    from tests.daemon_peer import changed_files, state_listing

    before = state_listing()
    yield
    wrote = changed_files(before, state_listing())
    assert not wrote, f"tests wrote under {DEFAULT_STATE_DIR}: {wrote} (give them a state_dir under tmp_path)"


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


@pytest.fixture(scope="session")
def drifted_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One writable copy of hgx-h100-drifted, made as operators make it (`snapshot capture --simulate`)."""
    out = tmp_path_factory.mktemp("drifted-capture") / "node"
    result = CliRunner().invoke(cli, ["snapshot", "capture", "--simulate", "hgx-h100-drifted", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


@pytest.fixture
def drifted_copy(tmp_path: Path, drifted_capture: Path) -> Path:
    """A per-test copy to remediate. Hard links keep the 10k-file copy cheap; safe because every
    nodewarden write replaces a file by rename, and tests replace files (unlink, write) too."""
    return Path(shutil.copytree(drifted_capture, tmp_path / "node", symlinks=True, copy_function=os.link))


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private parse cache (tests of agent.io.yamlfile's cache): the folder its entries go to."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.delenv("NODEWARDEN_NO_CACHE", raising=False)
    return tmp_path / "cache" / "nodewarden" / "yaml"
