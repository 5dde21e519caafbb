"""What one acceptance run is asked to do (the CLI's options), checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.core.errors import ConfigError
from agent.core.series import MAX_SAMPLES
from agent.io.credentials import BmcOptions
from agent.policy.config import Config
from agent.sources.nvml_live import NvmlSession


@dataclass
class AcceptRequest:
    config: Config
    profile: str | None = None
    load: str = "none"
    argv: tuple[str, ...] = ()
    duration_s: float = 600.0
    interval_s: float = 1.0
    idle_s: float = 30.0
    ramp_s: float = 120.0
    cooldown_s: float = 60.0
    grace_s: float = 10.0
    bmc_interval_s: float = 10.0
    state_dir: Path | None = None
    new_baseline: bool = False
    bmc: BmcOptions = field(default_factory=BmcOptions)
    session: NvmlSession | None = None  # tests and benchmarks: a session of their own

    def validate(self) -> None:
        if self.duration_s < 10:
            raise ConfigError("--duration must be at least 10 s")
        if not 0.05 <= self.interval_s <= 60:
            raise ConfigError("--interval must be between 0.05 and 60 s")
        total = self.idle_s + self.ramp_s + self.duration_s + self.cooldown_s
        if total / self.interval_s > MAX_SAMPLES:
            raise ConfigError(f"the run would take {total / self.interval_s:.0f} samples per GPU, more than "
                              f"{MAX_SAMPLES}: use a longer --interval or a shorter --duration")
