"""Boot-time persistence for runtime-only tunables (THP, MTU, CPU governor).

Actions add `key = value` lines to /etc/nodewarden/boot.conf through a
journaled FileEdit, so a rollback removes them exactly like the runtime
change; `nodewarden apply-boot` (run by systemd/nodewarden-apply.service)
replays the file early at boot. The keys name tunables, never paths: the
boot command maps each key to its sysfs file after validating it, so a
tampered file cannot make it write anywhere else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from agent.sources.host import CPU_DIR, NET_DIR, THP_DIR
from remediations import FileEdit
from remediations.sysctl import conf_settings, set_conf_key

BOOT_CONF = "/etc/nodewarden/boot.conf"
HEADER = (b"# Managed by nodewarden remediate; replayed at boot by nodewarden-apply.service.\n"
          b"# Roll back with `nodewarden rollback`, not by hand, so the journal stays exact.\n")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}\Z")  # \Z: `$` would also match before a final newline
_WORD_RE = re.compile(r"^[a-z+]{1,32}\Z")


def persist(key: str, value: str) -> FileEdit:
    return FileEdit(BOOT_CONF, lambda old: set_conf_key(old, key, value, HEADER))


@dataclass(frozen=True)
class BootSetting:
    key: str
    path: str
    value: str


def _thp(which: str) -> Callable[[str], str | None]:
    return lambda value: f"{THP_DIR}/{which}" if _WORD_RE.match(value) else None


def boot_settings(text: str) -> tuple[list[BootSetting], list[str]]:
    """Parse boot.conf into validated settings, plus one problem line per rejected entry."""
    settings: list[BootSetting] = []
    problems: list[str] = []
    for key, value in conf_settings(text, sysctl_keys=False).items():
        path: str | None = None
        if key in ("thp.enabled", "thp.defrag"):
            path = _thp(key.split(".")[1])(value)
        elif key.startswith("mtu."):
            name = key[4:]
            if _IFNAME_RE.match(name) and name not in (".", "..") and value.isdigit():
                path = f"{NET_DIR}/{name}/mtu"
        elif key == "cpu.governor" and _WORD_RE.match(value):
            path = f"{CPU_DIR}/*/cpufreq/scaling_governor"
        if path is None:
            problems.append(f"ignored {key} = {value}: not a key or value nodewarden writes at boot")
        else:
            settings.append(BootSetting(key, path, value))
    return settings, problems
