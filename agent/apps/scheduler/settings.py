"""health-check's settings: the config file's `health_check:` section (agent.policy.config declares and
documents it) with its defaults, command-line options winning."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.policy.config import Config
from agent.report.verdict import DEGRADED, DRAIN

# The whole run, audit and every scontrol/sinfo call: below slurmd's 60 s kill of HealthCheckProgram,
# with room for the interpreter to start and the trail to be written.
DEFAULT_DEADLINE_S = 50.0
MIN_UPDATE_S = 3.0  # the least time left an `scontrol update` starts with (more after slow calls)
DEFAULT_MAX_AGE_S = 180.0  # 3 x the daemon's 60 s host poll: used when the state file names none
SLURM_BIN_DIRS = (Path("/usr/bin"), Path("/usr/local/bin"), Path("/opt/slurm/bin"))


@dataclass(frozen=True)
class HealthSettings:
    state_dir: Path
    deadline_s: float = DEFAULT_DEADLINE_S
    max_age_s: float | None = None  # None: what the daemon wrote into the state file, else DEFAULT_MAX_AGE_S
    drain_on: str = DRAIN
    resume_after: int = 2
    breaker_percent: float = 10.0
    breaker_min_nodes: int = 5
    require_accept: bool = False
    slurm_bin_dir: Path | None = None
    slurm_conf: Path | None = None
    slurm_timeout_s: float = 10.0
    # Whether the daemon's state file may answer. Not for --simulate/--snapshot unless --state-dir names
    # the folder: a recording is never the node the configured daemon judges (a stale state file of a
    # test daemon once made every simulated check Unknown), so it is audited once instead.
    daemon_state: bool = True

    def bad(self, verdict: str) -> bool:
        """Whether `verdict` drains (and is NonOK for node-problem-detector)."""
        return verdict == DRAIN or (self.drain_on == DEGRADED and verdict == DEGRADED)


class Deadline:
    """One total deadline for a health-check run, counted from when the process started (slurmd's
    clock starts then, not when this module was imported)."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.at = time.monotonic() + total_s - min(max(_process_age_s(), 0.0), total_s)

    def left(self) -> float:
        return self.at - time.monotonic()


def _process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where that cannot be read)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read(4096).rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted after the command name
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0


def settings_from(config: Config, *, state_dir: Path | None = None, deadline_s: float | None = None,
                  max_age_s: float | None = None, recording: bool = False) -> HealthSettings:
    section: dict[str, Any] = config.health_check

    def path(key: str) -> Path | None:
        return Path(section[key]) if key in section else None

    return HealthSettings(
        state_dir=state_dir or config.state_dir,
        deadline_s=deadline_s or float(section.get("deadline_s", DEFAULT_DEADLINE_S)),
        max_age_s=max_age_s or (float(section["max_age_s"]) if "max_age_s" in section else None),
        drain_on=str(section.get("drain_on", DRAIN)),
        resume_after=int(section.get("resume_after", 2)),
        breaker_percent=float(section.get("breaker_percent", 10.0)),
        breaker_min_nodes=int(section.get("breaker_min_nodes", 5)),
        require_accept=bool(section.get("require_accept", False)),
        slurm_bin_dir=path("slurm_bin_dir"),
        slurm_conf=path("slurm_conf"),
        slurm_timeout_s=float(section.get("slurm_timeout_s", 10.0)),
        daemon_state=not recording or state_dir is not None,
    )
