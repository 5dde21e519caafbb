"""A hostile BMC cannot steer, hold or flood an audit, and no secret reaches a log (issue 12, 7 and 8).

Every test runs the real `nodewarden audit` as a process against tests/peers/hostile_redfish.py on
127.0.0.1: redirects to another origin, a body trickled a byte at a time, 300 MB, JSON nested
100,000 deep, collections that fan out without end, `@odata.id` paths hiding `..` and control
characters. Bounded: each audit has a total BMC deadline of a few seconds and a subprocess timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.peers.hostile_redfish import TOKEN, hostile_bmc

REPO = Path(__file__).resolve().parents[2]
PASSWORD = 'p"a\\ss\'w\\"rd-Z9'  # quotes and backslashes: the library's own mask breaks on them
# Runs the audit as the only child, then prints that child's peak RSS (KiB) on the last stderr line.
RSS_WRAPPER = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(r.returncode)")


def password_file(tmp: Path, password: str = PASSWORD) -> Path:
    path = tmp / "bmc-password"
    path.write_text(password + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def audit(tmp: Path, url: str, *extra: str, deadline_s: float = 4, timeout_s: float = 2, limit_s: float = 60,
          password: str = PASSWORD, only: str = "bmc.*") -> tuple[subprocess.CompletedProcess[str], float, int]:
    """`nodewarden audit` of the simulated healthy host with BMC `url`: (result, seconds, peak RSS KiB)."""
    config = tmp / "config.yaml"
    config.write_text(f"bmc:\n  deadline_s: {deadline_s}\n  timeout_s: {timeout_s}\n")
    argv = [sys.executable, "-m", "agent", *extra, "audit", "--simulate", "hgx-h100-healthy", "--config",
            str(config), "--bmc", url, "--bmc-user", "monitor", "--bmc-password-file", str(password_file(tmp, password)),
            "--only", only, "--format", "json"]
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], cwd=REPO, capture_output=True, text=True,
                            timeout=limit_s, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    took = time.monotonic() - start
    result.stderr, _, rss = result.stderr.rpartition("PEAK_RSS_KIB ")
    return result, took, int(rss.strip())


def report_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def messages(report: dict[str, Any]) -> str:
    return json.dumps(report["findings"]) + json.dumps(report["sources"])


def test_a_redirect_to_another_origin_is_not_followed(tmp_path: Path) -> None:
    with hostile_bmc("normal", host="127.0.0.2") as elsewhere, hostile_bmc(
            "redirect", redirect_to=elsewhere.url) as bmc:
        result, _took, _rss = audit(tmp_path, bmc.url)
        report = report_of(result)
    assert elsewhere.requests == []  # neither the password nor the session token went there
    assert "redirect not followed" in messages(report)
    assert any(r.path.rstrip("/") == "/redfish/v1" for r in bmc.requests)


def test_a_trickling_bmc_cannot_hold_the_audit_past_its_deadline(tmp_path: Path) -> None:
    with hostile_bmc("trickle", trickle_s=0.2) as bmc:
        result, took, _rss = audit(tmp_path, bmc.url, deadline_s=3, timeout_s=2, limit_s=40)
        report = report_of(result)
    assert took < 3 + 6, took  # the deadline, plus interpreter start-up and exit: nothing joins the reader
    assert report["sources"]["redfish"]["ok"] is False
    assert "deadline" in messages(report)


def test_300_mb_from_the_bmc_costs_bounded_memory(tmp_path: Path) -> None:
    with hostile_bmc("huge") as bmc:
        result, took, rss_kib = audit(tmp_path, bmc.url, deadline_s=20, timeout_s=10, limit_s=60)
        report = report_of(result)
    assert "exceeds the 8 MiB cap" in messages(report)
    assert rss_kib < 100 * 1024, rss_kib
    assert took < 30


def test_json_nested_100000_deep_is_an_unknown_not_a_crash(tmp_path: Path) -> None:
    with hostile_bmc("deep") as bmc:
        result, _took, _rss = audit(tmp_path, bmc.url)
        report = report_of(result)
    assert "/redfish/v1/Chassis" in messages(report)
    assert "RecursionError" not in result.stderr


def test_collections_that_fan_out_forever_stop_at_the_caps(tmp_path: Path) -> None:
    with hostile_bmc("fanout", fanout=1000) as bmc:
        result, took, rss_kib = audit(tmp_path, bmc.url, deadline_s=30, timeout_s=5, limit_s=90)
        assert took < 30 + 10
        report = report_of(result)
        served = len(bmc.requests)
    text = messages(report)
    assert "fan-out cap" in text or "only the first 512 read" in text
    assert served <= 4000 + 10  # MAX_RESOURCES, plus login and logout
    assert rss_kib < 100 * 1024, rss_kib


def test_paths_hiding_dotdot_or_control_characters_are_never_requested(tmp_path: Path) -> None:
    with hostile_bmc("dotdot") as bmc:
        result, _took, _rss = audit(tmp_path, bmc.url)
        report = report_of(result)
    asked = " ".join(bmc.paths()).lower()
    assert "%2e" not in asked and "%2f" not in asked and "%0d" not in asked
    assert "/redfish/v1/Chassis/1" in bmc.paths()  # the honest member is still read
    assert "refusing an unexpected resource path" in messages(report)


def test_plain_http_with_credentials_warns(tmp_path: Path) -> None:
    with hostile_bmc("normal") as bmc:
        report = report_of(audit(tmp_path, bmc.url)[0])
    (clear,) = [f for f in report["findings"] if f["check"] == "bmc.reachable" and f["subject"] == "cleartext"]
    assert clear["status"] == "warn" and "credentials sent in clear" in clear["message"]


@pytest.mark.parametrize("verbosity", [["-v"], ["-vv"], ["-vv", "--debug-http"], ["-vv", "--log-format", "json"]])
def test_no_password_or_session_token_in_any_log(tmp_path: Path, verbosity: list[str]) -> None:
    with hostile_bmc("normal") as bmc:
        result, _took, _rss = audit(tmp_path, bmc.url, *verbosity)
        report_of(result)
        sent = [r for r in bmc.requests if r.headers.get("X-Auth-Token") == TOKEN]
    assert sent, "the session login was not used: the test would prove nothing"
    everything = result.stdout + result.stderr
    for secret in (PASSWORD, json.dumps(PASSWORD)[1:-1], repr(PASSWORD)[1:-1], TOKEN):
        assert secret not in everything, secret
    if "--debug-http" in verbosity:
        assert "redfish.rest.v1" in result.stderr  # the library's request log is there, redacted
    else:
        assert "Attempt 1 of" not in result.stderr  # and otherwise kept out
