"""Logging to stderr as text or JSON lines (journald and log shippers read both)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import TextIO

from agent.lazyre import lazy_compile

# Loggers of the libraries under us. The DMTF redfish client logs every request at INFO and, at
# DEBUG, headers with the session token (it redacts only `Authorization`) and login bodies whose
# password mask breaks on a quote: they stay at WARNING unless --debug-http asks for them.
LIBRARY_LOGGERS = ("redfish", "urllib3", "requests", "pyghmi")
_SECRET_HEADER = lazy_compile(
    r"(?i)\b(x-auth-token|authorization|cookie|set-cookie|proxy-authorization)(['\"]?\s*[:=]\s*['\"]?)"
    r"(?:basic |bearer )?[^\s'\",}]+")
_SECRET_FIELD = lazy_compile(r"(?i)(\"(?:password|token|sessiontoken|x-auth-token)\"\s*:\s*)\"(?:[^\"\\]|\\.)*\"")
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Every later log line has `value` (and its JSON- and repr-escaped forms) replaced."""
    if len(value) < 3:
        return  # too short to mask without mangling ordinary text; such passwords are refused anyway
    forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1]}
    with _secrets_lock:
        _secrets.update(forms)


def redact(text: str) -> str:
    with _secrets_lock:
        known = sorted(_secrets, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, "<REDACTED>")
    text = _SECRET_HEADER().sub(lambda m: f"{m.group(1)}{m.group(2)}<REDACTED>", text)
    return _SECRET_FIELD().sub(lambda m: f'{m.group(1)}"<REDACTED>"', text)


class RedactingFilter(logging.Filter):
    """Masks registered secrets and token/password fields in every record, at any level."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = {k: redact(v) if isinstance(v, str) else v for k, v in fields.items()}
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str)


def setup_logging(verbosity: int, fmt: str, stream: TextIO | None = None, debug_http: bool = False) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug_http else logging.WARNING)
