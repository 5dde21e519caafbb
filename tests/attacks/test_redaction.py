"""No password or session token reaches a log, whatever the password holds (issue 21, 9).

The production bug: with password `pa"ss\\word$x`, `--debug-http` logged the DMTF client's login
body as `"Password": "<REDACTED>"ss\\\\word$x"`: the library's mask stops at the first (escaped)
quote and ours stopped there too. Here the real `nodewarden audit` logs in to a real Redfish peer
(tests/peers/hostile_redfish.py, session login, token TOKEN) at every verbosity, and no form of the
password (raw, JSON-escaped, repr'd, URL-encoded) nor any tail of it is in stdout or stderr; and
agent.io.log.redact masks secret-keyed values by structure even for secrets it was never told.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from agent.io.log import redact
from tests.attacks.test_hostile_bmc import audit, report_of
from tests.peers.hostile_redfish import TOKEN, hostile_bmc

ISSUE = 'pa"ss\\word$x'  # the password of the bug report
UNICODE = 'pässwörd"€\\ü-Zz'  # JSON writes it as \u00e4... (and the library's mask cuts it at the quote)
SUBSTRING = 'Chassis"'  # also in the BMC's answers (`"Name": "Chassis"`), logged with --debug-http
VERBOSITIES = [[], ["-v"], ["-vv"], ["-vv", "--debug-http"], ["--debug-http", "--log-format", "json"]]


def leaked_forms(password: str) -> set[str]:
    """Every way the password (or the tail a mask stopping at a quote leaves) can show up in a log."""
    forms = {password, repr(password)[1:-1], repr(password.encode())[2:-1], urllib.parse.quote(password),
             urllib.parse.quote_plus(password), urllib.parse.quote(password, safe="")}
    for escaped in (json.dumps(password)[1:-1], json.dumps(password, ensure_ascii=False)[1:-1]):
        forms.add(escaped)
        forms.add(json.dumps(escaped)[1:-1])  # inside a JSON log line
        if '"' in escaped:
            tail = escaped.split('"', 1)[1]
            forms.update({tail, json.dumps(tail)[1:-1]})
    if '"' in password:
        forms.add(password.split('"', 1)[1])
    return {form for form in forms if len(form) >= 4}


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


def readable(stdout: str, stderr: str) -> list[str]:
    """What a reader sees: the report's and JSON log lines' strings decoded (a JSON string's closing quote
    after `.../Chassis` is no leak of `Chassis"`), every other line as it is."""
    texts = strings(json.loads(stdout))
    for line in stderr.splitlines():
        try:
            texts.extend(strings(json.loads(line)) if line.startswith("{") else [line])
        except ValueError:
            texts.append(line)
    return texts


@pytest.mark.parametrize("password", [ISSUE, UNICODE, SUBSTRING], ids=["quote-backslash-dollar", "unicode",
                                                                      "substring-of-bmc-text"])
def test_no_form_or_tail_of_the_password_in_any_log_at_any_verbosity(tmp_path: Path, password: str) -> None:
    for verbosity in VERBOSITIES:
        with hostile_bmc("normal") as bmc:
            result, _took, _rss = audit(tmp_path, bmc.url, *verbosity, password=password)
            report = report_of(result)
            logins = [r for r in bmc.requests if r.method == "POST"]
            sent = [r for r in bmc.requests if r.headers.get("X-Auth-Token") == TOKEN]
        assert logins and sent, "the session login was not used: the test would prove nothing"
        assert report["sources"]["redfish"]["ok"] is True, verbosity  # masking never touches the audit
        texts = readable(result.stdout, result.stderr)
        for form in sorted(leaked_forms(password) | {TOKEN}):
            assert not any(form in text for text in texts), (verbosity, form, [t for t in texts if form in t][:3])
        if "--debug-http" in verbosity:  # the login body is logged, masked whole: nothing after the mask
            assert "HTTP REQUEST (POST)" in result.stderr, verbosity
            assert re.search(r'Password\\?": \\?"<REDACTED>\\?"(, |})', result.stderr), result.stderr[-2000:]


# --- redact() by structure, for secrets it was never told -------------------------------------------


def dmtf_masked(body: dict[str, str]) -> str:
    """What the DMTF client logs: its own mask, a regex that stops at the first quote."""
    return re.sub(r'"Password"\s*:\s*".*?"', '"Password": "<REDACTED>"', json.dumps(body))


@pytest.mark.parametrize("password", ['un"told\\pass$1', 'x", "UserName": "y', 'a"} tail-Q9', 'ü"tail-€ß'])
def test_a_mask_cut_at_a_quote_is_completed_by_structure(password: str) -> None:
    body = dmtf_masked({"UserName": "monitor", "Password": password, "Then": "kept"})
    line = f"HTTP REQUEST (POST) for /redfish/v1/SessionService/Sessions:\nBody: {body}\n"
    clean = redact(line)
    assert json.loads(clean.split("Body: ", 1)[1]) == {"UserName": "monitor", "Password": "<REDACTED>", "Then": "kept"}, clean


@pytest.mark.parametrize("text, secret", [
    ('\tX-Auth-Token: tok"en-Q7 more\n', 'en-Q7 more'),
    ("{'X-Auth-Token': 'tok\\'en-Q7', 'Other': 1}", "en-Q7"),
    ('Cookie: session=tok"en-Q7; path=/\n', "en-Q7"),
    ('Authorization: Basic bW9u"aXRvcjpw\n', 'aXRvcjpw'),
])
def test_a_secret_header_or_field_is_masked_past_its_quotes(text: str, secret: str) -> None:
    assert secret not in redact(text), redact(text)


def test_a_session_token_the_bmc_echoes_in_a_body_is_masked(tmp_path: Path) -> None:
    """The token is no secret-keyed value there (`"Description": TOKEN`): it is masked as a known secret."""
    echo = {"/redfish/v1/Chassis/1": {"@odata.id": "/redfish/v1/Chassis/1", "@odata.type": "#Chassis.v1_10_0.Chassis",
                                      "Id": "1", "Description": f"session {TOKEN} echoed",
                                      "Status": {"State": "Enabled", "Health": "OK"}}}
    with hostile_bmc("normal", resources=echo) as bmc:
        result, _took, _rss = audit(tmp_path, bmc.url, "-vv", "--debug-http")
        report_of(result)
        assert "/redfish/v1/Chassis/1" in bmc.paths()
    assert "echoed" in result.stderr  # the body was logged
    assert TOKEN not in result.stderr
