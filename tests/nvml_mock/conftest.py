"""The live NVML path through the real ABI: NVIDIA's mock libnvidia-ml (../shared/peers/nvml-mock).

pynvml loads the mock exactly as it loads the driver's library, so these tests run nodewarden's live
code (not the replay). The library reads its config once per process: every run is a child process
(`python -m agent ...`) with LD_LIBRARY_PATH and MOCK_NVML_CONFIG set. A test edits a copy of a stock
config in its temp folder (`mock_config`), never the shared one. Selected by `.ci/run` with
`-m nvml_mock`; the main run deselects the marker (pyproject.toml), so a fresh clone without
../shared stays green. NODEWARDEN_NVML_MOCK names another copy of the peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO
from tests.daemon_peer import DaemonProcess, running_daemon

MOCK = Path(os.environ.get("NODEWARDEN_NVML_MOCK") or REPO.parent / "shared" / "peers" / "nvml-mock")
STOCK = ("a100", "h100", "b200", "gb200", "gb300", "l40s", "t4")
# The profile each stock config must match (issue 23, item 2).
EXPECTED_PROFILE = {"a100": "dgx-a100", "h100": "hgx-h100-sxm", "b200": "hgx-b200", "gb200": "gb200-nvl-tray",
                    "gb300": "gb200-nvl-tray", "l40s": "nvidia-pcie", "t4": "nvidia-pcie"}
# The mock's Blackwell PCI ids are placeholders its comments own up to (gb200's is the H100's 0x2330,
# b200's 0x2340 no B200 has); the copies carry the real ones, as a real tray reports them. gb300's
# placeholder is the GB200's real id, and no GB300 profile exists yet: it runs as the GB200 tray.
REAL_PCI_IDS = {"b200": 0x290110DE, "gb200": 0x294110DE}
TRAY_GPUS = 4  # gb200/gb300 configs list 8 GPUs; a compute tray has 4


def stock(name: str) -> dict[str, Any]:
    path = MOCK / "configs" / f"{name}.yaml"
    assert path.is_file(), f"the nvml-mock peer is missing ({path}); .ci/run runs this suite only beside ../shared"
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    if name in ("gb200", "gb300"):
        doc["devices"] = doc["devices"][:TRAY_GPUS]
    if name in REAL_PCI_IDS:
        doc["device_defaults"]["pci"]["device_id"] = REAL_PCI_IDS[name]
    return doc


def device(doc: dict[str, Any], index: int) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in doc["devices"] if d["index"] == index)
    return found


class _QuotedDumper(yaml.SafeDumper):
    """Every string quoted: the mock's Go YAML (1.2) reads an unquoted '0421819085498' as a number."""


_QuotedDumper.add_representer(str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                                                                  style='"'))


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.dump(doc, Dumper=_QuotedDumper, sort_keys=False), encoding="utf-8")
    return path


def mock_config(tmp: Path, name: str = "h100", edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of a stock config in the test's folder, edited by `edit`."""
    doc = stock(name)
    if edit is not None:
        edit(doc)
    return write_config(tmp / f"{name}.yaml", doc)


def mock_env(config: Path, overrides: Path | None = None, debug: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML")}
    env.update(LD_LIBRARY_PATH=str(MOCK / "lib"), MOCK_NVML_CONFIG=str(config), PYTHONPATH=str(REPO))
    if overrides is not None:
        env.update(MOCK_NVML_OVERRIDES=str(overrides), MOCK_NVML_OVERRIDES_TTL="0.2")
    if debug:
        env["MOCK_NVML_DEBUG"] = "1"
    return env


MOCK_REFUSED = "[MOCK_NVML WARNING] Failed to load"  # the mock then falls back to 8 generic A100s, silently


def nodewarden(config: Path, *args: str, timeout_s: float = 120, **env: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO, env=mock_env(config, **env),
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert MOCK_REFUSED not in done.stderr, done.stderr[:2000]
    return done


GPU_CHECKS = ("--only", "gpu.*", "--only", "crosscheck.*")  # the host's own checks judge this machine, not the mock


def audit(config: Path, *args: str, checks: Iterable[str] = GPU_CHECKS, **env: Any) -> dict[str, Any]:
    done = nodewarden(config, "audit", "--format", "json", *checks, *args, **env)
    assert done.returncode in (0, 1), f"audit exited {done.returncode}: {done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def findings(report: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {f["subject"]: f for f in report["findings"] if f["check"] == check}


def bad(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(check, subject, status) of every finding that is not a pass or a skip."""
    return {(f["check"], f["subject"], f["status"]) for f in report["findings"] if f["status"] not in ("pass", "skip")}


POLL_S = 1.0  # the NVML poll interval the daemon tests run with
OVERRIDES_TTL_S = 0.2  # mock_env: how often the mock reads the overrides file again


@contextlib.contextmanager
def mock_daemon(tmp: Path, name: str = "h100", edit: Callable[[dict[str, Any]], None] | None = None,
                debug: bool = False) -> Iterator[tuple[DaemonProcess, Path]]:
    """`nodewarden daemon` on the mock, NVML polled every POLL_S; yields it and its (empty) overrides file."""
    overrides = write_config(tmp / "overrides.yaml", {"all": {}})
    state = tmp / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    config = tmp / "config.yaml"
    config.write_text(f"state_dir: {state}\ndaemon:\n  intervals: {{nvml: {POLL_S:g}, host: 30}}\n", encoding="utf-8")
    env = mock_env(mock_config(tmp, name, edit), overrides=overrides, debug=debug)
    with running_daemon(tmp, "--config", str(config), "--log-format", "json", env=env) as daemon:
        yield daemon, overrides
        refused = [line for line in daemon.log_path.read_text(errors="replace").splitlines()
                   if line.startswith("[MOCK_NVML WARNING]")]  # a config or overrides file it could not read
        assert refused == []


def series(body: str, prefix: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith(prefix)}
