"""BMC credentials: from a file only its owner can read, or a systemd credential.

Passwords never go on the command line (the process list shows it), into
logs, reports, metrics or exception text: they live in a `Secret` whose
repr and str are masked.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ConfigError
from agent.io.log import register_secret

SYSTEMD_CREDENTIAL = "bmc-password"  # LoadCredential=bmc-password:/etc/nodewarden/bmc-password


class Secret:
    """A password that will not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        register_secret(value)  # masked in every log line from now on, whatever logs it

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", len(self._value)))


MAX_PASSWORD_FILE_BYTES = 4096


def read_password_file(path: Path) -> Secret:
    """The first line of `path`, which must be a regular file readable by its owner only.

    Opened without following a symlink, and refused in a folder others can write to: either
    would let another user swap the file for one they control (or point it at one of ours).
    """
    trusted = _under_credentials_directory(path)
    if not trusted:
        _check_folder(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError("the password file is a symlink; name the file itself", path=str(path)) from None
        raise ConfigError(f"cannot read the password file: {exc.strerror}", path=str(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("the password file must be a regular file", path=str(path))
        if trusted:
            pass  # systemd made it readable for this service alone (owner root plus an ACL on newer systemd)
        elif info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError("the password file is accessible by group or others (mode "
                              f"{stat.S_IMODE(info.st_mode):04o}); run chmod 600 on it", path=str(path))
        elif info.st_uid != os.geteuid():
            raise ConfigError("the password file must be owned by the user running nodewarden", path=str(path))
        data = os.read(fd, MAX_PASSWORD_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the password file: {type(exc).__name__}", path=str(path)) from None
    finally:
        os.close(fd)
    if len(data) > MAX_PASSWORD_FILE_BYTES:
        raise ConfigError(f"the password file is larger than {MAX_PASSWORD_FILE_BYTES} bytes", path=str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("cannot read the password file: not UTF-8", path=str(path)) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ConfigError("the password file is empty", path=str(path))
    return Secret(password)


def _check_folder(path: Path) -> None:
    """The folder holding the password file must not be writable by group or others (sticky or not)."""
    folder = path.absolute().parent
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise ConfigError(f"cannot read the password file's folder: {exc.strerror}", path=str(folder)) from None
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"the password file sits in a folder others can write to (mode "
                          f"{stat.S_IMODE(info.st_mode):04o}); keep it in a folder only its owner can change",
                          path=str(folder))


def _under_credentials_directory(path: Path) -> bool:
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return False
    try:
        return path.resolve().parent == Path(directory).resolve()
    except OSError:
        return False


def systemd_credential() -> Path | None:
    """$CREDENTIALS_DIRECTORY/bmc-password when systemd passed it (LoadCredential=)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / SYSTEMD_CREDENTIAL
    return path if path.is_file() else None


@dataclass(frozen=True)
class BmcOptions:
    """How to reach the BMC. `url` for Redfish, `ipmi_host` for IPMI (either or both)."""

    url: str | None = None
    ipmi_host: str | None = None
    ipmi_port: int = 623
    user: str | None = None
    password: Secret | None = None
    ca_file: str | None = None
    insecure: bool = False
    timeout_s: float = 10.0
    deadline_s: float = 60.0
    concurrency: int = 4

    @property
    def configured(self) -> bool:
        return bool(self.url or self.ipmi_host)


def resolve_bmc_options(config_bmc: dict[str, object], config_ipmi: dict[str, object], *, url: str | None,
                        ipmi: str | None, user: str | None, password_file: Path | None, ca_file: Path | None,
                        insecure: bool) -> BmcOptions:
    """Command line over config file; the password from a file or a systemd credential."""
    url = url or _text(config_bmc.get("url"))
    ipmi = ipmi or _text(config_ipmi.get("host"))
    if not (url or ipmi):
        return BmcOptions()
    user = user or _text(config_bmc.get("user")) or _text(config_ipmi.get("user"))
    source = password_file or _path(config_bmc.get("password_file")) or _path(
        config_ipmi.get("password_file")) or systemd_credential()
    if user and source is None:
        raise ConfigError("a BMC user needs --bmc-password-file (or LoadCredential=bmc-password under systemd)")
    password = read_password_file(source) if source is not None else None
    host, port = None, 623
    if ipmi:
        host, _, port_text = ipmi.partition(":")
        try:
            port = int(port_text) if port_text else int(str(config_ipmi.get("port", 623)))
        except ValueError:
            raise ConfigError(f"--ipmi takes HOST[:PORT], got {ipmi!r}") from None
        if not 0 < port < 65536 or not host:
            raise ConfigError(f"--ipmi takes HOST[:PORT], got {ipmi!r}")
    ca = str(ca_file) if ca_file else _text(config_bmc.get("ca_file"))
    if ca and not Path(ca).is_file():
        raise ConfigError(f"the BMC CA file {ca} does not exist")
    timeout = config_bmc.get("timeout_s", 10.0)
    deadline = config_bmc.get("deadline_s", 60.0)
    concurrency = config_bmc.get("concurrency", 4)
    return BmcOptions(url=url, ipmi_host=host, ipmi_port=port, user=user, password=password, ca_file=ca,
                      insecure=insecure or bool(config_bmc.get("insecure", False)),
                      timeout_s=float(timeout) if isinstance(timeout, (int, float)) else 10.0,
                      deadline_s=float(deadline) if isinstance(deadline, (int, float)) else 60.0,
                      concurrency=concurrency if isinstance(concurrency, int) else 4)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _path(value: object) -> Path | None:
    return Path(value) if isinstance(value, str) and value else None
