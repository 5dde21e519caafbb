"""`nodewarden apply-boot`: replay /etc/nodewarden/boot.conf early at boot.

Runtime-only tunables (THP, MTU, CPU governor) do not survive a reboot;
remediate records the values it applied in boot.conf (journaled, so
rollback removes them) and nodewarden-apply.service replays them here.
Every key is validated and mapped to its own sysfs file; a missing
interface or a value the kernel rejects is reported and the rest continue.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agent.io.jsonfile import read_bounded
from agent.sources.host import CPU_DIR
from remediations.boot import BOOT_CONF, boot_settings

_CPU_RE = re.compile(r"^cpu\d+$")
MAX_BOOT_CONF = 1 << 20  # remediate writes a few lines; a larger file is not ours


@dataclass
class BootApplyResult:
    applied: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0


def _real(root: str, path: str) -> str:
    return path if root == "/" else os.path.join(root, path.lstrip("/"))


def _write(real: str, value: str) -> None:
    # O_TRUNC is ignored by sysfs and makes a plain file (tests, chroots) hold just the value.
    fd = os.open(real, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _text_lines(raw: bytes, problems: list[str]) -> str:
    """The lines of `raw` that are UTF-8; each other line is reported (escaped) and left out, so one
    bad byte costs that line, not every tunable in the file."""
    kept = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:
            kept.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            shown = ascii(line[:80])[2:-1] + ("..." if len(line) > 80 else "")
            problems.append(f"ignored line {number} of {BOOT_CONF}: not UTF-8 text ({shown})")
    return "\n".join(kept)


def apply_boot(root: str = "/") -> BootApplyResult:
    result = BootApplyResult()
    try:
        raw = read_bounded(Path(_real(root, BOOT_CONF)), MAX_BOOT_CONF)
    except FileNotFoundError:
        return result  # nothing was ever persisted
    except OSError as exc:
        result.problems.append(f"cannot read {BOOT_CONF}: {exc.strerror or exc}")
        return result
    if len(raw) > MAX_BOOT_CONF:
        result.problems.append(f"{BOOT_CONF} is larger than {MAX_BOOT_CONF} bytes: not a file remediate wrote")
        return result
    unreadable: list[str] = []
    settings, problems = boot_settings(_text_lines(raw, unreadable))
    result.problems = unreadable + problems
    for setting in settings:
        paths = [setting.path]
        if "*" in setting.path:  # cpu.governor: every CPU with cpufreq
            cpus = sorted(n for n in os.listdir(_real(root, CPU_DIR)) if _CPU_RE.match(n))
            paths = [f"{CPU_DIR}/{n}/cpufreq/scaling_governor" for n in cpus
                     if os.path.exists(_real(root, f"{CPU_DIR}/{n}/cpufreq/scaling_governor"))]
        try:
            for path in paths:
                _write(_real(root, path), setting.value)
        except OSError as exc:
            result.problems.append(f"{setting.key} = {setting.value}: {os.strerror(exc.errno or 0)} ({path})")
            continue
        result.applied.append(f"{setting.key} = {setting.value}")
    return result
