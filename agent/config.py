"""The agent's config file (/etc/nodewarden/config.yaml). CLI options win."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.schema import Validator, validate_document
from agent.yamlfile import load_yaml_file

ETC_DIR = Path("/etc/nodewarden")
DEFAULT_CONFIG = ETC_DIR / "config.yaml"
DEFAULT_STATE_DIR = Path("/var/lib/nodewarden")

_PATH = {"type": "string", "minLength": 1}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "url": {"type": "string", "pattern": "^https?://"},
        "host": {"type": "string", "minLength": 1},
        "user": {"type": "string", "minLength": 1},
        "password_file": _PATH,
        "ca_file": _PATH,
        "insecure": {"type": "boolean"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "concurrency": {"type": "integer", "minimum": 1, "maximum": 16},
    },
}
_SECONDS = {"type": "number", "exclusiveMinimum": 0}
_PER_SOURCE = {"type": "object", "additionalProperties": False,
               "properties": {name: _SECONDS for name in ("host", "nvml", "bmc_sensors", "bmc_inventory")}}
_DAEMON = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "listen": {"type": "string", "pattern": "^(\\[[0-9a-fA-F:.]+\\]|[A-Za-z0-9.\\-]+):[0-9]{1,5}$"},
        "intervals": _PER_SOURCE,
        "timeouts": _PER_SOURCE,
        "auto_apply": {"type": "boolean"},
        "auto_apply_interval_s": _SECONDS,
        "tls_cert_file": _PATH,
        "tls_key_file": _PATH,
        "basic_auth_user": {"type": "string", "minLength": 1},
        "basic_auth_password_file": _PATH,
    },
}
CONFIG_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "profile": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
        "profile_dirs": {"type": "array", "items": _PATH},
        "overrides_file": _PATH,
        "waivers_file": _PATH,
        "state_dir": _PATH,
        "bmc": _ENDPOINT,
        "ipmi": _ENDPOINT,
        "log_format": {"enum": ["text", "json"]},
        "daemon": _DAEMON,
    },
}


@dataclass
class Config:
    path: Path | None = None
    profile: str = "auto"
    profile_dirs: list[Path] = field(default_factory=list)
    overrides_file: Path | None = None
    waivers_file: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    bmc: dict[str, Any] = field(default_factory=dict)
    ipmi: dict[str, Any] = field(default_factory=dict)
    log_format: str = "text"
    daemon: dict[str, Any] = field(default_factory=dict)
    daemon_lines: dict[str, int] = field(default_factory=dict)  # daemon.KEY -> line, for error messages


def _default_if_present(path: Path) -> Path | None:
    return path if path.exists() else None


def load_config(path: Path | None) -> Config:
    """Load `path`, or the default file if it exists; a named file must exist."""
    explicit = path is not None
    path = path if explicit else _default_if_present(DEFAULT_CONFIG)
    config = Config(
        overrides_file=_default_if_present(ETC_DIR / "overrides.yaml"),
        waivers_file=_default_if_present(ETC_DIR / "waivers.yaml"),
    )
    if path is None:
        return config
    if not path.exists():
        raise ConfigError("config file does not exist", path=str(path))
    data, lines = load_yaml_file(path, ConfigError)
    if data is None:
        data = {}
    validate_document(data, lines, str(path), Validator(CONFIG_SCHEMA), ConfigError)
    base = path.parent

    def resolve(value: str) -> Path:
        return (base / value) if not Path(value).is_absolute() else Path(value)

    config.path = path
    config.profile = data.get("profile", config.profile)
    config.profile_dirs = [resolve(p) for p in data.get("profile_dirs", [])]
    if "overrides_file" in data:
        config.overrides_file = resolve(data["overrides_file"])
    if "waivers_file" in data:
        config.waivers_file = resolve(data["waivers_file"])
    if "state_dir" in data:
        config.state_dir = resolve(data["state_dir"])
    config.bmc = dict(data.get("bmc", {}))
    config.ipmi = dict(data.get("ipmi", {}))
    config.log_format = data.get("log_format", config.log_format)
    config.daemon = dict(data.get("daemon") or {})
    for key in ("tls_cert_file", "tls_key_file", "basic_auth_password_file"):
        if key in config.daemon:
            config.daemon[key] = str(resolve(config.daemon[key]))
    config.daemon_lines = {key: lines.line_for(("daemon", key)) or 0 for key in config.daemon}
    for name in ("overrides_file", "waivers_file"):
        value = getattr(config, name)
        if name in data and not value.exists():
            raise ConfigError(f"{name} {value} does not exist", path=str(path),
                              line=lines.line_for((name,)))
    return config
