"""Hostile text (ESC, NUL, newlines, bidi overrides, lone surrogates, formulas) through every output format.

The audit runs as the console script does (a subprocess, its stdout read as bytes), on a snapshot whose
hostname, a sysctl value, an NVML string and a Redfish sensor name carry such text; the fleet report
runs on audit JSONs that carry it. Every output must be valid in its format and contain none of it raw.
"""

from __future__ import annotations

import csv
import html.parser
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agent.core.sanitise import clean, clean_value, csv_cell, csv_row, is_clean, md_cell
from tests.conftest import REPO

EVIL = "\x1b[2J\x00\u202e\r\nline2\x07|=cmd*_`<b>[x](y)\u2028"
SURROGATE_JSON = "\\udcff\\u001b[31m\\u0000\\n=1+1|x"  # JSON escapes: a lone surrogate, ESC, NUL, newline
PROPERTY = settings(derandomize=True, database=None, max_examples=200, deadline=2000,
                    suppress_health_check=[HealthCheck.too_slow])


def _replace(path: Path, data: bytes) -> None:
    path.unlink()  # the snapshot copy is hard-linked to the shared capture: never write through a link
    path.write_bytes(data)


@pytest.fixture
def hostile_snapshot(drifted_copy: Path) -> Path:
    snap = drifted_copy
    _replace(snap / "fs/proc/sys/kernel/hostname", f"evil{EVIL}node\n".encode())
    _replace(snap / "fs/proc/sys/net/core/rmem_max", b"4194304\x1b]0;pwned\x07\x00x\n")
    nvml = (snap / "nvml.json").read_text(encoding="utf-8")
    assert '"96.00.74.00.0D"' in nvml
    _replace(snap / "nvml.json", nvml.replace('"96.00.74.00.0D"', f'"96.00{SURROGATE_JSON}"', 1).encode())
    thermal = snap / "redfish/v1/Chassis/System.Embedded.1/Thermal/index.json"
    body = json.loads(thermal.read_text(encoding="utf-8"))
    fan = next(f for f in body["Fans"] if f["Name"] == "System Board Fan1A")
    fan["Name"] = fan["FanName"] = json.loads(f'"Fan{SURROGATE_JSON}"')
    fan["Status"]["Health"] = "Critical"  # a failing finding: passes have no prom series of their own
    _replace(thermal, json.dumps(body).encode())  # ensure_ascii: the surrogate is written as \udcff
    return snap


def nodewarden(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The real command line, stdout as bytes (Python's own stdout encoding is part of what is tested)."""
    env = {**os.environ, "NODEWARDEN_NO_CACHE": "1", "LC_ALL": "C.UTF-8"}
    env.pop("PYTHONIOENCODING", None)
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, cwd=REPO, env=env,
                          timeout=120, check=False)


def unclean_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [] if is_clean(value) else [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in unclean_strings(k) + unclean_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in unclean_strings(v)]
    return []


def assert_no_raw_controls(text: str, allowed: str = "\n") -> None:
    bad = sorted({c for c in text if not is_clean(c) and c not in allowed})
    assert not bad, f"raw control characters in the output: {bad!r}"


@pytest.mark.parametrize("fmt", ["table", "json", "junit", "prom"])
def test_audit_output_is_valid_and_clean_in_every_format(hostile_snapshot: Path, fmt: str) -> None:
    result = nodewarden("audit", "--snapshot", str(hostile_snapshot), "--format", fmt)
    assert result.returncode == 1, result.stderr.decode(errors="replace")  # the drifts fail; nothing crashed
    assert b"Traceback" not in result.stderr and b"internal error" not in result.stderr
    text = result.stdout.decode("utf-8")  # strict: a lone surrogate written out would not decode
    assert_no_raw_controls(text, allowed="\n" if fmt != "junit" else "\n\t")
    if fmt == "json":
        doc = json.loads(text)
        assert unclean_strings(doc) == []
        assert doc["node"]["hostname"].startswith("evil\\x1b[2J\\x00\\u202e\\r\\nline2")
        vbios = next(f for f in doc["findings"] if f["check"] == "gpu.firmware.vbios" and f["subject"] == "gpu0")
        assert vbios["observed"].startswith("96.00\\xff\\x1b[31m\\x00\\n")  # visible, not dropped
    elif fmt == "junit":
        root = ET.fromstring(result.stdout)  # noqa: S314 - our own output, parsed to prove it is XML
        assert root.tag == "testsuites"
        hosts = {suite.get("hostname") for suite in root.iter("testsuite")}
        assert len(hosts) == 1 and next(iter(hosts)).startswith("evil\\x1b")  # type: ignore[union-attr]
    elif fmt == "prom":
        families = {f.name: f for f in text_string_to_metric_families(text)}
        subjects = {s.labels["subject"] for s in families["nodewarden_check_status"].samples}
        assert "Fan\\xff\\x1b[31m\\x00\n=1+1|x" in subjects  # the newline travels escaped, as the format says
    else:
        head = text.split("\n", 1)[0]
        assert head.startswith("nodewarden audit of evil\\x1b[2J\\x00\\u202e\\r\\nline2") and "(Dell" in head


# ---- the fleet report over audit JSONs that carry hostile text ----

def hostile_report(base: dict[str, Any], host: str) -> str:
    doc = json.loads(json.dumps(base))
    doc["node"]["hostname"] = host
    first = doc["findings"][0]
    first.update(status="fail", subject="-2+3", observed="@SUM(A1:A9)", message="=HYPERLINK(\"http://x\")" + EVIL)
    doc["findings"].append({"check": "gpu.firmware.vbios", "subject": "gpu0", "status": "fail",
                            "severity": "warning", "observed": "96\udcff\x1b", "expected": None,
                            "message": "+cmd|' /C calc'!A0", "waiver": None})
    return json.dumps(doc)  # ensure_ascii: the surrogate travels as the JSON escape \udcff


@pytest.fixture(scope="module")
def audit_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = nodewarden("audit", "--simulate", "hgx-h100-drifted", "--format", "json")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def hostile_fleet(tmp_path: Path, audit_json: dict[str, Any]) -> Path:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "a.json").write_text(hostile_report(audit_json, "node\x1b[31ma|b*c_\udcff<i>\n"), encoding="utf-8")
    (folder / "b.json").write_text(hostile_report(audit_json, "=cmd|' /C calc'!A0"), encoding="utf-8")
    return folder


def fleet(folder: Path, fmt: str, out: Path) -> str:
    result = nodewarden("fleet", "report", str(folder), "--format", fmt, "--output", str(out),
                        "--now", "2026-11-29T12:00:00+00:00")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return out.read_bytes().decode("utf-8")


def test_fleet_csv_neutralises_formulas_and_controls(hostile_fleet: Path, tmp_path: Path) -> None:
    text = fleet(hostile_fleet, "csv", tmp_path / "f.csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) > 100
    for row in rows:
        for cell in row:
            assert is_clean(cell), cell
            assert not cell.startswith(("=", "+", "-", "@")) or cell.lstrip("+-").replace(".", "").isdigit(), cell
    cells = {cell for row in rows for cell in row}
    assert "'=cmd|' /C calc'!A0" in cells and "'-2+3" in cells and "'@SUM(A1:A9)" in cells
    assert any(c.startswith("'=HYPERLINK(") for c in cells) and "'+cmd|' /C calc'!A0" in cells


def test_fleet_markdown_tables_stay_tables(hostile_fleet: Path, tmp_path: Path) -> None:
    text = fleet(hostile_fleet, "md", tmp_path / "f.md")
    assert_no_raw_controls(text)
    for line in text.splitlines():
        if line.startswith("|"):
            assert "<" not in line.replace("\\<", ""), line  # no raw HTML from a cell
    table = [line for line in text.splitlines() if line.startswith("| node ")]
    assert table, "no table with a node column"
    worst = text.split("## Worst nodes", 1)[1].split("##", 1)[0].strip().splitlines()
    widths = {line.replace("\\\\", "").replace("\\|", "").count("|") for line in worst if line.startswith("|")}
    assert len(widths) == 1, worst  # no cell added a column
    assert "node\\\\x1b\\[31ma\\|b\\*c\\_\\\\xff\\<i\\>\\\\n" in text


def test_fleet_html_and_json_are_valid_and_clean(hostile_fleet: Path, tmp_path: Path) -> None:
    page = fleet(hostile_fleet, "html", tmp_path / "f.html")
    assert_no_raw_controls(page)
    parser = html.parser.HTMLParser()
    parser.feed(page)
    assert "<i>" not in page and "&lt;i&gt;" in page
    doc = json.loads(fleet(hostile_fleet, "json", tmp_path / "f.json"))
    assert unclean_strings(doc) == []
    assert {n["node"] for n in doc["nodes"]} == {"node\\x1b[31ma|b*c_\\xff<i>\\n", "=cmd|' /C calc'!A0"}


# ---- the helper itself ----

ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=60)  # surrogates included


@PROPERTY
@given(ANY_TEXT)
def test_clean_text_is_one_printable_utf8_line_and_idempotent(text: str) -> None:
    out = clean(text)
    out.encode("utf-8")
    assert is_clean(out) and "\n" not in out and clean(out) == out
    if is_clean(text):
        assert out == text


@PROPERTY
@given(ANY_TEXT)
def test_csv_and_markdown_cells(text: str) -> None:
    cell = csv_cell(text)
    assert is_clean(cell)
    if cell.startswith(("=", "+", "-", "@")):
        float(cell)  # only a plain number may keep its sign
    md = md_cell(text)
    assert "\n" not in md and md.replace("\\\\", "").replace("\\|", "").count("|") == 0


@PROPERTY
@given(st.lists(ANY_TEXT | st.sampled_from(["=1+1", "-1", "\x1f=x", "a\x1f", "@", "+", ""]), max_size=6))
def test_the_fast_csv_row_agrees_with_cell_by_cell(cells: list[str]) -> None:
    assert csv_row(cells) == [csv_cell(c) for c in cells]


def test_clean_value_cleans_keys_and_nested_strings() -> None:
    assert clean_value({"a\n": ["\x1b", 1, None, {"\udcff": (True, "ok")}]}) == \
        {"a\\n": ["\\x1b", 1, None, {"\\xff": [True, "ok"]}]}
