"""The agent's config file (/etc/nodewarden/config.yaml). CLI options win."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import ConfigError
from agent.io.schema import Validator, validate_document
from agent.io.yamlfile import load_yaml_file
from agent.policy.polls import Poll, polls

ETC_DIR = Path("/etc/nodewarden")
DEFAULT_CONFIG = ETC_DIR / "config.yaml"
DEFAULT_STATE_DIR = Path("/var/lib/nodewarden")

_PATH = {"type": "string", "minLength": 1}


def _doc(schema: dict[str, Any], description: str, default: Any = None, example: Any = None) -> dict[str, Any]:
    """A schema node with the text `docs/config.md` and the example config are generated from."""
    out = {**schema, "description": description}
    if default is not None:
        out["default"] = default
    if example is not None:
        out["examples"] = [example]
    return out


_ENDPOINT_KEYS: dict[str, dict[str, Any]] = {
    "user": _doc({"type": "string", "minLength": 1}, "BMC user name (read-only operator role is enough for audits)",
                 example="monitor"),
    "password_file": _doc(_PATH, "File holding the password on its first line: regular file, owner-only (0600), "
                          "in a folder only its owner can write; under systemd use LoadCredential=bmc-password instead",
                          example="/etc/nodewarden/bmc-password"),
    "ca_file": _doc(_PATH, "PEM bundle the BMC's TLS certificate is verified against (default: the system bundle)",
                    example="/etc/nodewarden/bmc-ca.pem"),
    "insecure": _doc({"type": "boolean"}, "Skip TLS verification (a warning finding says so on every audit)", False),
    "timeout_s": _doc({"type": "number", "exclusiveMinimum": 0}, "Seconds one request may take", 10),
    "deadline_s": _doc({"type": "number", "exclusiveMinimum": 0},
                       "Seconds the whole BMC read may take: login, every resource, retries", 60),
    "concurrency": _doc({"type": "integer", "minimum": 1, "maximum": 16},
                        "Requests in flight at once (and HTTP connections kept); BMCs are small", 4),
}
_BMC = {"type": "object", "additionalProperties": False, "description": "The BMC over Redfish", "properties": {
    "url": _doc({"type": "string", "pattern": "^https?://"}, "Redfish service, https://HOST[:PORT]",
                example="https://10.0.0.17"),
    **_ENDPOINT_KEYS,
}}
_IPMI = {"type": "object", "additionalProperties": False,
         "description": "The BMC over IPMI (RMCP+), for BMCs without usable Redfish", "properties": {
             "host": _doc({"type": "string", "minLength": 1}, "BMC address, HOST or HOST:PORT", example="10.0.0.17"),
             "port": _doc({"type": "integer", "minimum": 1, "maximum": 65535}, "UDP port", 623),
             **_ENDPOINT_KEYS,
         }}
_SECONDS = {"type": "number", "exclusiveMinimum": 0}


def _per_poll(what: str, seconds: Callable[[Poll], float]) -> dict[str, Any]:
    """One key per daemon poll of a source (agent.policy.polls), with that poll's default."""
    return {"type": "object", "additionalProperties": False, "description": what, "properties": {
        poll.name: _doc(_SECONDS, f"Seconds, for {poll.what}", _plain(seconds(poll))) for poll in polls()}}


def _plain(seconds: float) -> float | int:
    return int(seconds) if seconds.is_integer() else seconds  # the docs show 60, not 60.0


_DAEMON = {
    "type": "object",
    "additionalProperties": False,
    "description": "`nodewarden daemon`: polling and the /metrics endpoint",
    "properties": {
        "listen": _doc({"type": "string", "pattern": "^(\\[[0-9a-fA-F:.]+\\]|[A-Za-z0-9.\\-]+):[0-9]{1,5}$"},
                       "HOST:PORT of /metrics (a remote Prometheus needs a non-loopback address)", "127.0.0.1:9847"),
        "intervals": _per_poll("How often each source is read", lambda poll: poll.interval_s),
        "timeouts": _per_poll("How long one read of each source may take before it counts as down",
                              lambda poll: poll.timeout_s),
        "auto_apply": _doc({"type": "boolean"}, "Apply `safe` remediations on its own (needs root; see the unit)",
                           False),
        "auto_apply_interval_s": _doc(_SECONDS, "Seconds between auto-apply runs", 300),
        "tls_cert_file": _doc(_PATH, "Serve /metrics over HTTPS with this certificate (PEM)"),
        "tls_key_file": _doc(_PATH, "The certificate's private key (PEM); give it as a systemd credential"),
        "basic_auth_user": _doc({"type": "string", "minLength": 1}, "Require HTTP basic auth with this user"),
        "basic_auth_password_file": _doc(_PATH, "Its password (owner-only file, first line)"),
    },
}
_HEALTH_CHECK = {
    "type": "object",
    "additionalProperties": False,
    "description": "`nodewarden health-check`: the scheduler's gate (Slurm HealthCheckProgram, node-problem-detector)",
    "properties": {
        "max_age_s": _doc(_SECONDS, "Oldest daemon state file (seconds since the daemon last confirmed its "
                          "facts) a health-check answers from; default: 3 of the daemon's host/NVML poll intervals",
                          example=180),
        "deadline_s": _doc(_SECONDS, "Total time of one health-check: the one-shot audit (when no daemon state "
                           "file exists) and every scontrol/sinfo call; keep it below slurmd's 60 s kill", 50),
        "drain_on": _doc({"enum": ["DRAIN", "DEGRADED"]}, "The verdict that drains (and is NonOK for --npd)", "DRAIN"),
        "resume_after": _doc({"type": "integer", "minimum": 1, "maximum": 100},
                             "Consecutive healthy checks before nodewarden resumes its own drain", 2),
        "breaker_percent": _doc({"type": "number", "minimum": 0, "maximum": 100},
                                "Circuit breaker: no drain once this share of the partition is drained by "
                                "nodewarden (or breaker_min_nodes, whichever is larger)", 10),
        "breaker_min_nodes": _doc({"type": "integer", "minimum": 0}, "The breaker's limit on a small partition", 5),
        "require_accept": _doc({"type": "boolean"}, "Resume only after a passing `nodewarden accept` run that "
                               "finished after the drain (STATE_DIR/accept/last.json)", False),
        "slurm_bin_dir": _doc(_PATH, "Folder of scontrol and sinfo (default: the first of /usr/bin, "
                              "/usr/local/bin, /opt/slurm/bin that has them; slurmd gives no PATH)",
                              example="/opt/slurm/bin"),
        "slurm_conf": _doc(_PATH, "slurm.conf for scontrol/sinfo (slurmd gives no SLURM_CONF)",
                           example="/etc/slurm/slurm.conf"),
        "slurm_timeout_s": _doc(_SECONDS, "Seconds one scontrol/sinfo call may take", 10),
    },
}
CONFIG_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "description": "nodewarden's configuration, /etc/nodewarden/config.yaml; command-line options win",
    "properties": {
        "profile": _doc({"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
                        "Profile that judges this node, or auto to match it from the hardware", "auto"),
        "profile_dirs": _doc({"type": "array", "items": _PATH},
                             "Extra folders of site profiles, searched before the shipped ones; each folder "
                             "and file must be root's (or the running user's) and writable by nobody else",
                             example=["/etc/nodewarden/profiles"]),
        "overrides_file": _doc(_PATH, "Site overrides merged over the chosen profile (owned by root or the "
                               "running user, writable by nobody else, like the folders above it)",
                               "/etc/nodewarden/overrides.yaml"),
        "waivers_file": _doc(_PATH, "Waivers (check, subject, reason, expiry)", "/etc/nodewarden/waivers.yaml"),
        "state_dir": _doc(_PATH, "Remediation journal and state (owned by root, not group/other-writable)",
                          str(DEFAULT_STATE_DIR)),
        "bmc": _BMC,
        "ipmi": _IPMI,
        "log_format": _doc({"enum": ["text", "json"]}, "Log lines as text or JSON (the daemon logs JSON)", "text"),
        "daemon": _DAEMON,
        "health_check": _HEALTH_CHECK,
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
    health_check: dict[str, Any] = field(default_factory=dict)  # agent.apps.scheduler.settings reads it


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
    data, lines = load_yaml_file(path, ConfigError, trusted="config file")
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
    config.health_check = dict(data.get("health_check") or {})
    for key in ("slurm_bin_dir", "slurm_conf"):
        if key in config.health_check:
            config.health_check[key] = str(resolve(config.health_check[key]))
    config.daemon_lines = {key: lines.line_for(("daemon", key)) or 0 for key in config.daemon}
    for name in ("overrides_file", "waivers_file"):
        value = getattr(config, name)
        if name in data and not value.exists():
            raise ConfigError(f"{name} {value} does not exist", path=str(path),
                              line=lines.line_for((name,)))
    return config
