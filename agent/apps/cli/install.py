"""`nodewarden install [--prefix DIR]`: lay out a node the way the units expect it.

The documented layout: nodewarden in a venv at /opt/nodewarden (its console script
/opt/nodewarden/bin/nodewarden is what every unit's Exec*= runs), configuration in
/etc/nodewarden, state in /var/lib/nodewarden. This command writes, under `--prefix` (default /):

  etc/systemd/system/nodewarden{,-audit,-apply,-gate}.service, nodewarden-audit.timer, nodewarden-gate.path
      the shipped units, with Exec*= pointing at this installation's console script when it
      is not /opt/nodewarden/bin/nodewarden (`--bin` overrides);
  etc/nodewarden/config.yaml    0644, every key commented out (agent.policy.config_doc); an existing
                                config is kept and the example goes to config.yaml.example;
  etc/nodewarden/bmc-password   0600, empty (the units' LoadCredential= needs the file); kept;
  var/lib/nodewarden            0755, root's: remediation journal (0700 inside), baseline (the
                                daemon, an unprivileged dynamic user, reads it).

Every file goes through agent.io.fsutil (atomic, never through a planted symlink); an existing
folder is never chmod'ed. Nothing is enabled or started: the command prints the systemctl lines.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.errors import ConfigError
from agent.io.fsutil import replace_file
from agent.policy.config_doc import example_config
from agent.policy.profiles import data_dir

UNITS = ("nodewarden.service", "nodewarden-audit.service", "nodewarden-audit.timer", "nodewarden-apply.service",
         "nodewarden-gate.service", "nodewarden-gate.path")
LAYOUT_BIN = "/opt/nodewarden/bin/nodewarden"


@dataclass
class InstallResult:
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def own_console_script() -> str:
    """This installation's `nodewarden` script (the venv the running interpreter belongs to)."""
    found = shutil.which("nodewarden", path=str(Path(sys.executable).parent))
    return os.path.abspath(found) if found else LAYOUT_BIN


def _folder(path: Path, mode: int, result: InstallResult, prefix: Path) -> None:
    if path.is_symlink():
        raise ConfigError("is a symlink; refusing to install through it", path=str(path))
    if not path.exists():
        path.mkdir(mode=mode)
        os.chmod(path, mode)  # mkdir's mode is masked by the umask; this folder is ours, just made
        result.written.append(f"/{path.relative_to(prefix)}/")


def install(prefix: Path, binary: str | None = None) -> InstallResult:
    if not prefix.is_dir():
        raise ConfigError("the install prefix does not exist", path=str(prefix))
    binary = binary or own_console_script()
    result = InstallResult()
    for rel, mode in (("etc", 0o755), ("etc/systemd", 0o755), ("etc/systemd/system", 0o755),
                      ("etc/nodewarden", 0o755), ("var", 0o755), ("var/lib", 0o755), ("var/lib/nodewarden", 0o755)):
        _folder(prefix / rel, mode, result, prefix)
    units = data_dir("systemd")
    for name in UNITS:
        text = (units / name).read_text(encoding="utf-8").replace(LAYOUT_BIN, binary)
        replace_file(prefix / "etc/systemd/system" / name, text, 0o644)
        result.written.append(f"/etc/systemd/system/{name}")
    config = prefix / "etc/nodewarden/config.yaml"
    if config.exists() or config.is_symlink():
        replace_file(config.with_name("config.yaml.example"), example_config(), 0o644)
        result.kept.append("/etc/nodewarden/config.yaml")
        result.written.append("/etc/nodewarden/config.yaml.example")
    else:
        replace_file(config, example_config(), 0o644)
        result.written.append("/etc/nodewarden/config.yaml")
    password = prefix / "etc/nodewarden/bmc-password"
    if password.exists() or password.is_symlink():
        result.kept.append("/etc/nodewarden/bmc-password")
    else:
        replace_file(password, b"", 0o600)
        result.written.append("/etc/nodewarden/bmc-password")
    return result


def summary(result: InstallResult, prefix: Path = Path("/")) -> str:
    """What was written and kept, by the paths really written (under `prefix`), then what to run."""
    def real(path: str) -> str:
        return str(prefix / path.lstrip("/")) + ("/" if path.endswith("/") else "")

    lines = [f"wrote  {real(path)}" for path in result.written] + [
        f"kept   {real(path)} (exists)" for path in result.kept]
    staged = "" if prefix.resolve() == Path("/") else f" (on the system {prefix} is the root of)"
    lines.append(f"next{staged}: put the BMC password in /etc/nodewarden/bmc-password (or leave it empty), then\n"
                 "  systemctl daemon-reload && systemctl enable --now nodewarden.service nodewarden-audit.timer")
    return "\n".join(lines)
