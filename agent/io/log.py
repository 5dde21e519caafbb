"""Logging to stderr as text or JSON lines (journald and log shippers read both)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import urllib.parse
from typing import TextIO

from agent.core.lazyre import lazy_compile

# Loggers of the libraries under us. The DMTF redfish client logs every request at INFO and, at
# DEBUG, headers with the session token (it redacts only `Authorization`) and login bodies whose
# password mask breaks on a quote: they stay at WARNING unless --debug-http asks for them.
LIBRARY_LOGGERS = ("redfish", "urllib3", "requests", "pyghmi")
MASK = "<REDACTED>"
# A secret's key (JSON `"Password":`, a dict repr's `'X-Auth-Token':`, a header line `Cookie: `,
# a query's `token=`): its value is found by structure below, never by a pattern that stops at a quote.
_SECRET_KEY = lazy_compile(r"(?i)(?<![\w./-])(['\"]?)([\w-]*(?:password|passwd|passphrase|secret|token|authorization"
                           r"|cookie))\1(\s*[:=]\s*)")
_HEADER_KEYS = ("token", "authorization", "cookie")  # their unquoted value runs to the end of the line
_MAX_PARSED_LINE = 64 * 1024  # a logged body longer than this on one line is not parsed to find a mask's end
_secrets: dict[str, str] = {}  # each form of a registered secret -> what replaces it
_sessions: dict[str, dict[str, str]] = {}  # recent session tokens -> their forms, oldest first
MAX_SESSION_SECRETS = 16  # a daemon logs in again and again: keep the newest tokens, not every one
_secrets_lock = threading.Lock()


def secret_forms(value: str) -> dict[str, str]:
    """Every way `value` is written in a log line, and what replaces each form.

    Raw, JSON-escaped (ASCII and not), repr'd (str and UTF-8 bytes) and URL-encoded; and the tail
    that a mask stopping at the first quote leaves: the DMTF client's `"Password": ".*?"` cuts the
    JSON string at its first escaped quote and logs the rest, which is masked here as the tail it is.
    """
    escaped = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms = {value, *escaped, repr(value)[1:-1], repr(value.encode("utf-8", "surrogatepass"))[2:-1],
             urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value), urllib.parse.quote(value)}
    out = {form: MASK for form in forms}
    for form in escaped:
        if '"' in form:
            out[f'{MASK}"{form.split(chr(34), 1)[1]}"'] = f'{MASK}"'
    return out


def register_secret(value: str, *, session: bool = False) -> None:
    """Every later log line has `value`, in each form it can be written in, replaced.

    `session`: a session token, one of many over a daemon's life; only the newest are kept.
    """
    if len(value) < 3:
        return  # too short to mask without mangling ordinary text; such passwords are refused anyway
    forms = secret_forms(value)
    with _secrets_lock:
        if not session:
            _secrets.update(forms)
            return
        _sessions.pop(value, None)
        _sessions[value] = forms
        while len(_sessions) > MAX_SESSION_SECRETS:
            del _sessions[next(iter(_sessions))]


def redact(text: str) -> str:
    """`text` with every registered secret and every secret-keyed value masked."""
    with _secrets_lock:
        merged = dict(_secrets)
        for forms in _sessions.values():
            merged.update(forms)
    known = sorted(merged.items(), key=lambda item: len(item[0]), reverse=True)
    for secret, replacement in known:
        if secret in text:
            text = text.replace(secret, replacement)
    return _redact_keyed(text)


def _redact_keyed(text: str) -> str:
    out: list[str] = []
    done = 0
    for match in _SECRET_KEY().finditer(text):
        if match.start() < done:
            continue  # inside a value already masked
        start = match.end()
        end = _value_end(text, start, match.group(2).lower(), ":" in match.group(3))
        if end > start:
            quote = text[start] if text[start] in "'\"" else ""
            out.append(text[done:start] + f"{quote}{MASK}{quote}")
            done = end
    out.append(text[done:])
    return "".join(out)


def _value_end(text: str, start: int, key: str, colon: bool) -> int:
    """Where the value at `start` ends: a quoted one at its closing quote (escapes skipped); else the line."""
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    if start >= len(text):
        return start
    quote = text[start]
    if quote in "'\"":
        end = _string_end(text, start + 1, quote, line_end)
        if quote == '"' and text[start + 1:end - 1] == MASK and not _json_continues(text, start, end, line_end):
            end = _string_end(text, end, '"', line_end)  # an upstream mask stopped at an escaped quote: its tail
        return end
    if colon and not any(k in key for k in _HEADER_KEYS):
        return start  # "password: refused" is prose; the known secret bytes are masked anyway
    if not colon:  # a query's or a form's `token=value`
        return next((i for i in range(start, line_end) if text[i] in " \t&;,"), line_end)
    after = _SECRET_KEY().search(text, start, line_end)  # a second header on the line is masked on its own
    stop = after.start() if after else line_end
    while stop > start + 1 and text[stop - 1] in " \t":
        stop -= 1
    return stop


def _string_end(text: str, index: int, quote: str, limit: int) -> int:
    """Just past the first unescaped `quote` from `index` (a truncated string: the line's end)."""
    while index < limit:
        char = text[index]
        if char == "\\":
            index += 2
        elif char == quote:
            return index + 1
        else:
            index += 1
    return limit


def _json_continues(text: str, value_start: int, value_end: int, line_end: int) -> bool:
    """Whether the JSON object around a masked value parses with the value ending at `value_end`."""
    brace = text.find("{", text.rfind("\n", 0, value_start) + 1, value_start)  # the body's outer object
    if brace < 0 or line_end - brace > _MAX_PARSED_LINE:  # a huge line of masked values: no parse per value
        return text[value_end:line_end].lstrip()[:1] in ("", ",", "}", "]")
    try:
        _doc, used = json.JSONDecoder().raw_decode(text[brace:line_end])
    except ValueError:
        return False
    return not text[brace + used:line_end].strip()


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
