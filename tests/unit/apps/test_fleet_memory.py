"""`nodewarden fleet report` at scale: what the parent keeps per node, outputs unchanged, hostile inputs.

The golden outputs under tests/data/fleet_small/ were written by the fleet
report before it streamed (issue #16) from the inputs `write_small_fleet`
makes; every format must still come out byte for byte the same.
"""

from __future__ import annotations

import datetime as dt
import gc
import importlib.util
import json
import random
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.apps.fleet import (
    MAX_FILE_BYTES,
    FleetOptions,
    Interner,
    build_fleet,
    build_report,
    input_files,
    newest_per_node,
    read_reports,
    summarize_report,
)
from agent.apps.fleet.render import render_html, render_json, render_md
from agent.core.sanitise import md_cell
from agent.io.fsutil import FileSafetyError, write_output_stream
from tests.conftest import REPO, RunCli

NOW = "2026-11-29T12:00:00+00:00"
DATA = Path(__file__).resolve().parents[2] / "data" / "fleet_small"
FORMATS = ("json", "md", "html", "csv")

CHECKS = [
    ("gpu.ecc.mode", "critical"), ("gpu.persistence", "warning"), ("host.sysctl", "warning"),
    ("host.thp.enabled", "info"), ("ib.link.rate", "critical"), ("pcie.link.width", "warning"),
]


def _finding(check: str, subject: str, status: str, severity: str, observed: Any = None, message: str = "",
             waiver: Any = None, expected: Any = None) -> dict[str, Any]:
    return {"check": check, "subject": subject, "status": status, "severity": severity, "observed": observed,
            "expected": expected, "message": message or f"{check} on {subject}: {status}", "waiver": waiver}


def small_node(rng: random.Random, number: int) -> dict[str, Any]:
    """One varied audit report (no dependency on the simulated nodes: the golden files stay valid)."""
    profile = "dgx-a100" if number % 4 == 3 else "hgx-h100-sxm"
    findings: list[dict[str, Any]] = []
    for check, severity in CHECKS:
        for gpu in range(2 if check.startswith("gpu.") else 1):
            status = rng.choices(["pass", "fail", "warn", "skip"], [0.7, 0.12, 0.1, 0.08])[0]
            findings.append(_finding(check, f"gpu{gpu}" if check.startswith("gpu.") else "node", status, severity,
                                     observed=rng.choice([1, "on", None, {"rate": 400}, [1, 2]]), expected="on"))
    bmc = "5.00.00.00" if number == 5 else ("7.10.50.00" if rng.random() < 0.8 else "7.00.00.00")
    findings.append(_finding("bmc.firmware", "bmc", "pass" if bmc >= "7" else "fail", "warning", observed=bmc))
    findings.append(_finding("bmc.firmware", "bios", "pass", "warning", observed="2.19.1" if number % 5 else "2.18"))
    findings.append(_finding("gpu.firmware.vbios", "gpu0", "pass", "warning",
                             observed="96.00.89.00.01" if number % 7 else "96.00.5E.00.01"))
    findings.append(_finding("host.driver.version", "node", "pass", "warning", observed="550.90.07"))
    for gpu in range(4):
        hot = 11 if (number, gpu) in ((9, 2), (14, 0)) else 0
        findings.append(_finding("gpu.temperature", f"gpu{gpu}", "pass", "warning",
                                 observed=34 + gpu + rng.randint(-2, 2) + hot + (0.5 if number % 3 == 0 else 0)))
    xid: dict[str, int] = {"79": 1 + number % 3} if number % 6 == 1 else ({"48": 2, "13": 1} if number == 8 else {})
    findings.append(_finding("gpu.xid", "gpu1", "fail" if xid else "pass", "critical", observed=xid))
    if number % 5 == 2:
        findings.append(_finding("baseline.drift", "gpu0:temperature", "fail" if number % 2 else "warn",
                                 "warning", observed=7.5, message=f"gpu0 runs {number % 9} °C above its baseline"))
    elif number % 5 == 4:
        findings.append(_finding("baseline.drift", "gpu1:power", "pass", "info", observed=0.5))
    if number % 6 == 0:
        target = next((f for f in findings if f["status"] in ("fail", "warn")), findings[0])
        target["waiver"] = {"reason": ["vendor RMA open", "known issue <b>", 42][number % 3],
                            "expires": ["2026-12-03", "2027-03-01T00:00:00Z", "2026-12-10"][number % 3]}
    # Strings a renderer must neutralise: control characters, a CSV formula, HTML and Markdown syntax.
    findings.append(_finding("host.sysctl", "kernel.msg\x1b[31m", "warn", "warning",
                             message="=HYPERLINK(\"x\") | *bold* <script>alert(1)</script>\u202e"))
    sources: dict[str, Any] = {"host": {"ok": True, "configured": True}}
    if number % 8 == 3:
        sources["redfish"] = {"ok": False, "configured": True, "error": "timed out after 60 s"}
        sources["ipmi"] = {"ok": False, "configured": False, "error": "not configured"}
    ages = [0.5, 1, 2, 3, 30, 72]
    stamp = dt.datetime(2026, 11, 29, 12, tzinfo=dt.timezone.utc) - dt.timedelta(hours=ages[number % 6])
    started = None if number == 11 else stamp.isoformat() if number % 2 else stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    node: dict[str, Any] = {"hostname": f"node-{number:02d}", "model": "XE9680" if number % 2 else None}
    if number == 13:
        del node["hostname"]  # the file name stands in
    return {"schema": "nodewarden.report/v1", "node": node, "profile": profile, "started_at": started,
            "sources": sources, "findings": findings, "summary": {}}


def write_small_fleet(out: Path, nodes: int = 24) -> Path:
    """The inputs of the golden outputs, and an --expect-nodes file (returned)."""
    rng = random.Random(16)  # noqa: S311 - reproducible test data
    out.mkdir(parents=True, exist_ok=True)
    for number in range(nodes):
        report = small_node(rng, number)
        name = report["node"].get("hostname", "from-file-name")
        (out / f"{name}.json").write_text(json.dumps(report))
        if number in (1, 4):  # fetched twice: an older and a newer copy of the same node
            older = dict(report, started_at="2026-11-20T00:00:00+00:00")
            (out / f"{name}.old.json").write_text(json.dumps(older))
    (out / "broken-truncated.json").write_text('{"schema": "nodewarden.report/v1", "node": {')
    (out / "broken-foreign.json").write_text('{"unrelated": "json"}')
    (out / "broken-binary.json").write_bytes(b"\x00\xff not json")
    (out / "broken-deep.json").write_text("[" * 100 + "]" * 100)
    (out / "broken-findings.json").write_text(json.dumps({"schema": "nodewarden.report/v1", "node": {},
                                                          "findings": {"not": "a list"}}))
    (out / "broken-finding.json").write_text(json.dumps({"schema": "nodewarden.report/v1", "node": {},
                                                         "findings": [1, 2]}))
    expect = out.parent / "expected-nodes.txt"
    expect.write_text("# inventory\n" + "".join(f"node-{n:02d} rack1\n" for n in range(nodes + 2)))
    return expect


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("fleet_generator", REPO / "benchmarks" / "fleet_generator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- every format byte for byte as before ----

@pytest.mark.parametrize("fmt", FORMATS)
def test_outputs_are_unchanged(run_cli: RunCli, tmp_path: Path, fmt: str) -> None:
    inputs = tmp_path / "in"
    expect = write_small_fleet(inputs)
    out = tmp_path / f"report.{fmt}"
    args = ["fleet", "report", str(inputs), "--format", fmt, "--now", NOW, "--expect-nodes", str(expect)]
    result = run_cli(*args, "--output", str(out))
    assert result.code == 0, result.stderr
    golden = (DATA / f"report.{fmt}").read_text()

    def placeholder(text: str) -> str:  # the golden files name the input folder {IN}
        return text.replace(md_cell(str(inputs)), "{IN}").replace(str(inputs), "{IN}")

    assert placeholder(out.read_text()) == golden
    assert placeholder(run_cli(*args).stdout) == golden  # stdout streams the same bytes


def test_the_api_renders_what_the_command_writes(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    write_small_fleet(inputs)
    files, _ = input_files([inputs])
    reader = read_reports(files, workers=1)
    summaries = [summarize_report(json.loads(Path(p).read_text()), p) for p in files
                 if not Path(p).name.startswith("broken-")]
    kept, duplicates = newest_per_node(summaries)
    options = FleetOptions(now=dt.datetime.fromisoformat(NOW))
    assert duplicates == reader.duplicates()
    streamed = build_report(reader.records(), [], reader.duplicates(), options)
    whole = build_fleet(kept, [], duplicates, options)
    assert render_json(streamed) == render_json(whole) == json.dumps(whole, indent=1) + "\n"
    assert render_html(streamed) == render_html(whole) and render_md(streamed) == render_md(whole)


# ---- what the report process keeps per node ----

def test_under_5_kib_retained_per_node_at_2000_nodes(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    _generator().generate(fleet, 2000, seed=16, broken=0, duplicates=0)
    files, _ = input_files([fleet])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader = read_reports(files, workers=1)  # in this process, so tracemalloc sees what is kept
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(reader.by_name) == 2000
    per_node = retained / 2000
    assert per_node < 5 * 1024, f"{per_node:.0f} bytes retained per node (issue #16: < 5 KiB; was ~17 KiB)"


def test_interning_keeps_types_and_time_zones_apart() -> None:
    intern = Interner()
    one, one_float, true = intern(1), intern(1.0), intern(True)
    assert (type(one), type(one_float), type(true)) == (int, float, bool)
    utc = dt.datetime(2026, 11, 29, 12, tzinfo=dt.timezone.utc)
    plus_one = dt.datetime(2026, 11, 29, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert intern(utc) is utc and intern(plus_one) is plus_one  # equal instants, different text
    a, b = intern(("gpu.xid", "gpu1")), intern(("gpu.xid", "gpu1"))
    assert a is b and intern((1, 2)) == (1, 2) and intern((1.0, 2.0))[0].__class__ is float
    odd = {"a": [1]}
    assert intern(odd) is odd and intern(("x", odd))[1] is odd  # unhashable: kept, never an error


# ---- hostile inputs: refused per file, the report goes on ----

def test_hostile_files_are_refused_one_by_one(run_cli: RunCli, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = random.Random(5)  # noqa: S311
    for number in range(230):  # more than one chunk of 200: the worker pool reads them
        (inputs / f"good-{number:03d}.json").write_text(json.dumps(small_node(rng, number)))
    base = small_node(rng, 99)
    hostile: dict[str, Any] = {
        "huge": None,  # a sparse file over the size limit: refused before it is read
        "deep": "[" * 5000 + "]" * 5000,
        "deep-object": '{"a":' * 200 + "1" + "}" * 200,
        "findings-dict": dict(base, findings={"a": 1}),
        "finding-int": dict(base, findings=[7]),
        "check-list": dict(base, findings=[{"check": ["x"]}]),
        "node-string": dict(base, node="host"),
        "hot-int": dict(base, findings=[{"check": "gpu.temperature", "subject": "gpu0", "observed": 10 ** 400}]),
        "xid-code": dict(base, findings=[{"check": "gpu.xid", "subject": "gpu0", "observed": {"\u00b2": 1}}]),
        "xid-huge": dict(base, findings=[{"check": "gpu.xid", "subject": "gpu0", "observed": {"9" * 5000: 1}}]),
        "schema": dict(base, schema="nodewarden.report/v2"),
        "array": [base],
    }
    for name, content in hostile.items():
        path = inputs / f"bad-{name}.json"
        if content is None:
            with path.open("wb") as handle:
                handle.truncate(MAX_FILE_BYTES + 1)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
    # Odd but readable: values of the wrong type are shown as text, never taken as their kind.
    odd = dict(base, node={"hostname": ["a", "b"], "model": {"x": 1}}, started_at=12345, profile=None,
               sources=[1], findings=[{"check": "gpu.temperature", "subject": None, "observed": "hot",
                                       "message": {"m": 1}, "waiver": [1], "status": "fail"},
                                      {"check": "host.sysctl", "waiver": {"reason": {"r": 1}, "expires": 5}}])
    (inputs / "odd.json").write_text(json.dumps(odd))
    result = run_cli("fleet", "report", str(inputs), "--format", "json", "--now", NOW)
    assert result.code == 0, result.stderr
    fleet = result.json()
    assert fleet["summary"]["nodes"] == 231  # 230 good nodes and the odd one
    skipped = {Path(s["path"]).stem.removeprefix("bad-"): s["reason"] for s in fleet["inputs"]["skipped"]}
    assert set(skipped) == set(hostile), skipped
    assert "too big" in skipped["huge"] and "deeper than 64" in skipped["deep"]
    assert "deeper than 64" in skipped["deep-object"] and "OverflowError" in skipped["hot-int"]
    assert result.stderr.count("warning: skipped") == len(hostile)
    node = next(n for n in fleet["nodes"] if n["node"] == "['a', 'b']")
    assert node["model"] == {"x": 1} and node["started_at"] is None and node["compliant"] is False
    for fmt in ("html", "md", "csv"):
        assert run_cli("fleet", "report", str(inputs), "--format", fmt, "--now", NOW).code == 0


# ---- the streaming writer (agent.io.fsutil.write_output_stream) ----

def test_stream_writer_replaces_atomically_and_keeps_the_mode(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_output_stream(out, iter(["a" * 10, b"b" * (3 << 20), "c"]))
    assert out.read_bytes() == b"a" * 10 + b"b" * (3 << 20) + b"c"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    out.chmod(0o600)
    write_output_stream(out, ["new\n"])
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o600


def test_stream_writer_leaves_the_old_file_when_the_producer_fails(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    out.write_text("old\n")

    def chunks() -> Iterator[str]:
        yield "x" * (2 << 20)
        raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError):
        write_output_stream(out, chunks())
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_stream_writer_follows_write_output_for_everything_else(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FileSafetyError, match="does not exist"):
        write_output_stream(tmp_path / "missing" / "x.json", ["x"])
    with pytest.raises(FileSafetyError, match="is a folder"):
        write_output_stream(tmp_path, ["x"])
    write_output_stream("-", ["to ", "stdout\n"])
    assert capsys.readouterr().out == "to stdout\n"
    planted = tmp_path / "planted"
    planted.write_text("target stays\n")
    link = tmp_path / "link.json"
    link.symlink_to(planted)
    write_output_stream(link, ["through the operator's own link\n"])  # a link we made in our folder: followed
    assert planted.read_text() == "through the operator's own link\n"
