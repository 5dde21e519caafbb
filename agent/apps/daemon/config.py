"""What the daemon judges by (config, settings, profiles, waivers, baseline) and how it is reloaded.

A reload builds a whole new `Judging` and the daemon adopts it only when every part loaded (and,
once facts are cached, judged them): a typo in waivers.yaml, an override, a profile or the config
keeps the last good `Judging`, which goes on judging new facts (an Xid still becomes a finding).
`ReloadStatus` is what /metrics says about it (`nodewarden_config_reload_*`, docs/metrics.md).

The waivers file is watched (one `stat` a second): the daemon used to re-read it at every
evaluation, so an edit is still picked up without SIGHUP, and so is the fix of a file a failed
reload named.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.errors import ConfigError, NodewardenError
from agent.core.facts import Baseline
from agent.core.model import Unknown, Waiver
from agent.core.sanitise import clean
from agent.engine.audit import AuditRequest
from agent.io.credentials import BmcOptions, read_password_file
from agent.policy.config import Config, load_config
from agent.policy.profiles import ProfileStore, load_overrides
from agent.policy.waivers import load_waivers
from agent.report.metrics import ServerSettings
from agent.sources.baseline import load_node_baseline
from agent.sources.registry import polls
from agent.sources.source import NodeView
from checks import all_checks

DEFAULT_LISTEN = ("127.0.0.1", 9847)
# Seconds, each source's own (agent.sources.registry). NVML reads every GPU fact in one pass of cheap
# driver calls, so its fast interval covers configuration too.
DEFAULT_INTERVALS = {poll.name: poll.interval_s for poll in polls()}
DEFAULT_TIMEOUTS = {poll.name: poll.timeout_s for poll in polls()}
FILE_LABEL_MAX = 300  # characters of a failed file's path in a label


@dataclass(frozen=True)
class DaemonSettings:
    server: ServerSettings = field(default_factory=ServerSettings)
    intervals: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_INTERVALS))
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    auto_apply: bool = False
    auto_apply_interval_s: float = 300.0


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen address must be HOST:PORT, got {text!r}")
    return host, int(port)


def daemon_settings(config: Config, listen: str | None) -> DaemonSettings:
    """Settings from the config's `daemon:` section; --listen wins over it."""
    section = config.daemon
    host, port = parse_listen(listen or section.get("listen") or f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}")
    cert, key = section.get("tls_cert_file"), section.get("tls_key_file")
    if bool(cert) != bool(key):
        raise ConfigError("daemon: tls_cert_file and tls_key_file go together", path=str(config.path),
                          line=config.daemon_lines.get("tls_cert_file") or config.daemon_lines.get("tls_key_file"))
    user, password_file = section.get("basic_auth_user"), section.get("basic_auth_password_file")
    if bool(user) != bool(password_file):
        raise ConfigError("daemon: basic_auth_user and basic_auth_password_file go together", path=str(config.path),
                          line=config.daemon_lines.get("basic_auth_user"))
    password = read_password_file(Path(password_file)) if password_file else None
    return DaemonSettings(
        server=ServerSettings(host=host, port=port, tls_cert=Path(cert) if cert else None,
                              tls_key=Path(key) if key else None, user=user, password=password),
        intervals={**DEFAULT_INTERVALS, **section.get("intervals", {})},
        timeouts={**DEFAULT_TIMEOUTS, **section.get("timeouts", {})},
        auto_apply=bool(section.get("auto_apply", False)),
        auto_apply_interval_s=float(section.get("auto_apply_interval_s", 300.0)),
    )


def load_daemon_waivers(path: Path | None) -> tuple[Waiver, ...]:
    """The waivers file's waivers (ConfigError naming file and line when it cannot be used)."""
    return () if path is None else tuple(load_waivers(path, (c.id for c in all_checks())))


class LoadedProfiles(ProfileStore):
    """The profiles as they were at (re)load, every file read and validated then.

    Matching lists the profile folders at each evaluation: a file dropped or broken there later (a
    half-done package upgrade, a typo in a site profile) would otherwise stop the judging without a
    SIGHUP. The daemon matches over this set until a reload that works replaces it.
    """

    def __init__(self, extra_dirs: list[Path], overrides_file: Path | None) -> None:
        super().__init__(extra_dirs, overrides_file)
        self._loaded = super().names()
        self.match_rules()  # reads every file now: a bad one fails this load, naming the file
        if overrides_file is not None:
            self._overlay = load_overrides(overrides_file)  # the same: read once, now

    def names(self) -> list[str]:
        return list(self._loaded)


@dataclass(frozen=True)
class Judging:
    """Everything one evaluation judges by; replaced whole by a reload that worked, never in part."""

    request: AuditRequest
    settings: DaemonSettings
    store: ProfileStore
    waivers: tuple[Waiver, ...]
    baseline: Baseline | Unknown


def first_judging(request: AuditRequest, settings: DaemonSettings, node: NodeView) -> Judging:
    """At start: a waivers or profile file that cannot be used is a bad configuration (exit 2)."""
    config = request.config
    return Judging(request, settings, LoadedProfiles(config.profile_dirs, config.overrides_file),
                   load_daemon_waivers(config.waivers_file), load_node_baseline(node, config))


REPLAY_STATE_PREFIX = "nodewarden-daemon-state-"


def is_system_state_dir(path: Path) -> bool:
    """The machine's own state folder (/var/lib/nodewarden), by what it is, not by how it is spelled."""
    from agent.policy.config import DEFAULT_STATE_DIR

    return os.path.realpath(path) == os.path.realpath(DEFAULT_STATE_DIR)  # links and `..` resolved, existing or not


def replay_state_dir() -> Path:
    """A private folder for a daemon replaying a recorded node (--simulate, --snapshot) without --state-dir.

    Its state file and health-check's decisions are the recording's, never this host's: they are kept
    out of the system state folder (issue 36.3), in $TMPDIR, removed when the daemon exits.
    """
    made = Path(tempfile.mkdtemp(prefix=f"{REPLAY_STATE_PREFIX}{os.getpid()}-"))  # 0700, root's
    atexit.register(shutil.rmtree, made, True)
    return made


def load_judging(running: Judging, config_path: Path | None, listen_override: str | None,
                 cli_bmc: Callable[[Config], BmcOptions], node: NodeView, profile: str | None, *,
                 state_dir: Path | None = None) -> Judging:
    """A whole new `Judging` from the files (SIGHUP); raises NodewardenError naming the file that failed.

    `profile`: the one the node is judged by now, built with the new overrides so a bad one fails here.
    `state_dir`: the command line's (or a replay's own), which the config's never replaces.
    """
    config = load_config(config_path)
    if state_dir is not None:
        config = dataclasses.replace(config, state_dir=state_dir)
    settings = daemon_settings(config, listen_override)
    store = LoadedProfiles(config.profile_dirs, config.overrides_file)
    forced = running.request.profile if running.request.profile not in (None, "auto") else None
    for name in dict.fromkeys(n for n in (forced, profile) if n is not None):
        store.profile(name)
    request = dataclasses.replace(running.request, config=config, bmc=cli_bmc(config))
    return Judging(request, settings, store, load_daemon_waivers(config.waivers_file),
                   load_node_baseline(node, config))


def with_waivers(running: Judging) -> Judging:
    """The running `Judging` with its waivers file read again (its change was seen without SIGHUP)."""
    return dataclasses.replace(running, waivers=load_daemon_waivers(running.request.config.waivers_file))


@dataclass
class ReloadStatus:
    """How the last reload went: `nodewarden_config_reload_success` and its companions."""

    ok: bool = True
    last_success_s: float = field(default_factory=time.time)  # the start's load counts as one
    failed_file: str | None = None  # the file the last failed reload could not use
    error: str | None = None
    whole: bool = False  # the failed reload was a SIGHUP's: retried whole when its file changes

    def succeeded(self) -> None:
        self.ok, self.last_success_s, self.failed_file, self.error, self.whole = True, time.time(), None, None, False

    def failed(self, exc: NodewardenError, whole: bool, default_file: str) -> None:
        self.ok, self.error, self.whole = False, str(exc), whole or self.whole
        self.failed_file = clean(exc.path or default_file)[:FILE_LABEL_MAX]


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class FileWatch:
    """Whether any of some files changed (replaced, rewritten, created or removed) since last asked."""

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[int, int, int, int] | None] = {}

    def changed(self, paths: list[Path]) -> bool:
        now = {path: _signature(path) for path in paths}
        moved = any(path in self._seen and self._seen[path] != sig for path, sig in now.items())
        self._seen = now
        return moved
