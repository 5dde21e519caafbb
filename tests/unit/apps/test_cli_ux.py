"""The operator's first hour at the terminal (issue 14, deliverable 8), through the real click CLI.

Global options after the command, -v / -vv / --debug-http, colour (NO_COLOR, --color), the table's
verdict, severity, order and collapsed rows, whole subjects and human names, --only/--skip that
never change the profile and refuse a glob matching nothing, JSON warnings and errors, shell
completion, the man page and the README's sample, all produced by the command itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.apps.cli.main import cli
from agent.core.names import DASH
from tests.conftest import REPO, RunCli

DRIFTED = ("audit", "--simulate", "hgx-h100-drifted")
TABLE = (*DRIFTED, "--format", "table")
FIXED_WIDTH = {"COLUMNS": "120"}
STATUS_WORDS = {"fail", "warn", "unknown", "skip", "pass", "fixed", "waived"}
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Every run reconfigures logging (levels included); leave it as found."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in ("redfish", "urllib3", "requests", "pyghmi")}
    yield
    root.handlers[:], root.level = handlers, level
    for name, lib_level in libraries.items():
        logging.getLogger(name).setLevel(lib_level)


def without_duration(text: str) -> str:
    return re.sub(r" in \d+\.\d+ s", " in 0.05 s", text)


def rows(table: str) -> list[list[str]]:
    """The finding rows of a table: [status, severity, check, subject and message words...]."""
    return [line.split() for line in table.splitlines() if line.startswith("  ") and line.split()[0] in STATUS_WORDS
            and len(line.split()) > 2 and line.split()[1] in SEVERITIES]


def report(run_cli: RunCli, *args: str) -> dict:  # type: ignore[type-arg]
    result = run_cli(*args, "--format", "json")
    assert result.code in (0, 1), result.stderr
    return result.json()


# --- global options after the command ----------------------------------------------------------------


def test_verbose_is_accepted_after_the_subcommand(run_cli: RunCli) -> None:
    before = run_cli("-v", *TABLE, env=FIXED_WIDTH)
    after = run_cli(*TABLE, "-v", env=FIXED_WIDTH)
    assert after.code == before.code == 1, after.stderr
    assert without_duration(after.stdout) == without_duration(before.stdout)
    assert any(row[0] == "pass" for row in rows(after.stdout))  # -v shows passes ...
    assert "why: " in after.stdout  # ... and reasons
    assert "passes hidden" not in after.stdout


def test_v_shows_no_traceback_and_vv_does(run_cli: RunCli, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-snapshot")
    plain = run_cli("audit", "--snapshot", missing, "-v")
    assert plain.code == 2 and "does not exist" in plain.stderr and "Traceback" not in plain.stderr
    traced = run_cli("audit", "--snapshot", missing, "-vv")
    assert traced.code == 2 and "Traceback (most recent call last)" in traced.stderr
    assert run_cli("-v", "audit", "-v", "--snapshot", missing).stderr.count("Traceback") == 1  # -v + -v is -vv


def test_library_request_logs_only_with_debug_http(run_cli: RunCli) -> None:
    assert run_cli(*DRIFTED, "--format", "json", "-vv").code == 1
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("urllib3").level == logging.WARNING  # -vv alone keeps the libraries quiet
    assert run_cli(*DRIFTED, "--format", "json", "--debug-http").code == 1  # accepted after the command
    assert logging.getLogger("urllib3").level == logging.DEBUG
    assert logging.getLogger("redfish").level == logging.DEBUG


# --- colour ------------------------------------------------------------------------------------------


def test_color_option_and_no_color(run_cli: RunCli, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "\x1b[" not in run_cli(*TABLE).stdout  # not a terminal: auto is no colour
    always = run_cli(*TABLE, "--color", "always", env={"NO_COLOR": "1"})
    assert always.code == 1 and "\x1b[31m\x1b[1mfail" in always.stdout  # the flag wins over NO_COLOR
    assert "\x1b[" not in run_cli("--color", "never", *TABLE).stdout
    monkeypatch.setattr("agent.apps.cli.support.stdout_is_tty", lambda: True)
    assert "\x1b[" in run_cli(*DRIFTED, env={"NO_COLOR": "", "TERM": "xterm"}).stdout  # a terminal: coloured
    assert "\x1b[" not in run_cli(*DRIFTED, env={"NO_COLOR": "1", "TERM": "xterm"}).stdout  # no-color.org
    assert "\x1b[" not in run_cli(*DRIFTED, env={"NO_COLOR": "", "TERM": "dumb"}).stdout


# --- the table -----------------------------------------------------------------------------------------


def test_table_opens_with_the_verdict_and_the_actions_worst_first(run_cli: RunCli) -> None:
    drifted = run_cli(*TABLE, env=FIXED_WIDTH).stdout.splitlines()
    assert drifted[0].startswith("nodewarden audit of gpu-h100-drifted-01")
    assert drifted[2].startswith("DRAIN: ")  # GPU 7 fell off the bus: critical, and it asks for drain
    actions = [line.split()[0] for line in drifted[3:drifted.index("", 3)] if not line.startswith("   ")]
    assert actions[0] == "drain" and "gpu.lost gpu7; gpu.xid gpu7: GPU 7 has fallen off the bus" in drifted[3]
    assert actions.index("replace_psu") < actions.index("reboot") < actions.index("remediate")
    assert actions[-1] == "monitor" and len(actions) == len(set(actions))  # one line per action
    healthy = run_cli("audit", "--simulate", "hgx-h100-healthy", "--format", "table").stdout.splitlines()
    assert healthy[2] == "OK: nothing to do"
    degraded = run_cli(*TABLE, "--only", "host.*").stdout.splitlines()  # warning-level fails only
    assert degraded[2].startswith("DEGRADED: ")
    assert {line.split()[0] for line in degraded[3:degraded.index("", 3)] if not line.startswith("   ")} == {
        "upgrade_driver", "remediate"}  # a line of 3 spaces or more continues the action above it


def test_rows_show_severity_and_areas_come_by_their_worst_finding(run_cli: RunCli) -> None:
    table = run_cli(*TABLE, "-v", env=FIXED_WIDTH).stdout
    doc = report(run_cli, *DRIFTED)
    by_key = {(f["check"], f["subject"]): f for f in doc["findings"]}
    for row in rows(table):
        assert row[1] in SEVERITIES
        if (row[2], row[3]) in by_key:
            assert by_key[(row[2], row[3])]["severity"] == row[1]
    order = {"fail": 0, "unknown": 1, "warn": 2, "fixed": 3, "skip": 4, "pass": 5}
    sev = {"critical": 0, "warning": 1, "info": 2}
    worst: dict[str, tuple[int, int]] = {}
    for f in doc["findings"]:
        area = f["check"].split(".", 1)[0]
        worst[area] = min(worst.get(area, (9, 9)), (order[f["status"]], sev[f["severity"]]))
    titles = [line for line in table.splitlines() if line.isupper() and line.isalpha()]
    assert titles == [a.upper() for a in sorted(worst, key=lambda a: (worst[a], a))]
    assert titles[:3] == ["BMC", "FABRIC", "GPU"]  # critical fails, before BIOS' warnings


def test_identical_results_across_gpus_are_one_row(run_cli: RunCli) -> None:
    table = run_cli(*TABLE, env={"COLUMNS": "200"}).stdout
    retired = [row for row in rows(table) if row[2] == "gpu.retired_pages"]
    assert retired == [["skip", "warning", "gpu.retired_pages", f"gpu0{DASH}6", "retired", "pages:", "not",
                        "supported", "by", "this", "GPU", "or", "driver", "(NVML_FI_DEV_RETIRED_SBE)"]]
    persistence = [row for row in rows(table) if row[2] == "gpu.persistence_mode"]
    assert [row[3] for row in persistence] == [f"gpu0{DASH}6"]
    thermal = [row[3] for row in rows(table) if row[2] == "gpu.thermal.imbalance"]
    assert thermal == ["gpu4", "gpu5"]  # 9 and 10 C above the median: different results stay apart
    verbose = run_cli(*TABLE, "-v", env=FIXED_WIDTH).stdout
    assert re.search(rf"  pass +critical ib\.port\.state +mlx5_\{{0,3{DASH}6,9{DASH}11\}}/1 ", verbose)  # ports too, never cut


def test_subjects_are_whole_and_human_never_internal_keys(run_cli: RunCli) -> None:
    table = run_cli(*TABLE, "-v", env=FIXED_WIDTH).stdout
    assert "psu.slot.#" not in table and "|" not in table  # firmware groups are named, not keyed
    assert re.search(rf"  fail +warning +firmware\.consistency +Power Supply\.Slot\.1{DASH}6 +6 x Power", table)
    # GPU VBIOS is gpu.firmware.vbios's (one fault, one finding): firmware.consistency names no GPU group.
    assert not re.search(r"firmware\.consistency +GPU", table) and re.search(r"gpu\.firmware\.vbios +gpu0", table)
    lines = table.splitlines()
    long_row = next(i for i, line in enumerate(lines) if line.startswith("  fail ") and "bmc.psu" in line
                    and "System Board PS Redundancy" in line)
    assert lines[long_row].rstrip().endswith("System Board PS Redundancy")  # whole, alone on its line ...
    assert lines[long_row + 1].lstrip().startswith("power redundancy 'System Board PS Redundancy'")  # message below
    ps3 = next(line for line in lines if line.startswith("  fail ") and "PS3 Status health" in line)
    below = lines[long_row + 1]
    assert len(below) - len(below.lstrip()) == ps3.index("PS3 Status health")  # ... and the columns line up
    json_subjects = {f["subject"] for f in report(run_cli, *DRIFTED)["findings"]}
    assert "psu.slot.#|power supply.slot.#" in json_subjects  # the JSON contract keeps the key


# --- --only / --skip -------------------------------------------------------------------------------------


def bmc_only_copy(tmp_path: Path) -> Path:
    """The drifted node's BMC alone: a snapshot of its Redfish tree, no host, no NVML."""
    from agent.sources.snapshot import simulated_path

    source, target = simulated_path("hgx-h100-drifted"), tmp_path / "bmc-only"
    shutil.copytree(source / "redfish", target / "redfish")
    meta = (source / "meta.yaml").read_text()
    (target / "meta.yaml").write_text(re.sub(r"(?m)^captured:.*$", "captured: [redfish]", meta))
    return target


@pytest.mark.parametrize("node", ["nvml-only", "bmc-only"])
def test_only_and_skip_never_change_the_profile(run_cli: RunCli, tmp_path: Path, node: str) -> None:
    where = (("--simulate", "hgx-h100-nvsmi-import") if node == "nvml-only"
             else ("--snapshot", str(bmc_only_copy(tmp_path))))
    full = report(run_cli, "audit", *where)
    assert full["profile"] == "hgx-h100-sxm"
    for selection in (("--only", "host.*"), ("--only", "bmc.*"), ("--skip", "gpu.*", "--skip", "bmc.*")):
        narrowed = report(run_cli, "audit", *where, *selection)
        assert narrowed["profile"] == full["profile"], selection
        match = next(f for f in narrowed["findings"] if f["check"] == "profile.match")
        assert match == next(f for f in full["findings"] if f["check"] == "profile.match"), selection


def test_a_glob_matching_no_check_is_exit_2_with_the_known_ids(run_cli: RunCli) -> None:
    typo = run_cli(*DRIFTED, "--only", "hots.*", "--format", "json")
    assert typo.code == 2 and typo.stdout == ""
    assert "--only 'hots.*' matches no check" in typo.stderr
    assert "host.thp.enabled" in typo.stderr and "gpu.retired_pages" in typo.stderr
    skipped = run_cli(*DRIFTED, "--skip", "gpu.*", "--skip", "gpu.retired-pages", "--format", "json")
    assert skipped.code == 2 and "--skip 'gpu.retired-pages' matches no check" in skipped.stderr
    assert run_cli(*DRIFTED, "--only", "profile.match", "--format", "json").code == 0  # a real id is fine


# --- JSON warnings and errors -------------------------------------------------------------------------


def json_lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in text.splitlines()]


def test_errors_and_warnings_follow_log_format_json(run_cli: RunCli, tmp_path: Path) -> None:
    (missing,) = json_lines(run_cli("--log-format", "json", "audit", "--snapshot", str(tmp_path / "x")).stderr)
    assert missing["level"] == "error" and "does not exist" in missing["msg"] and missing["logger"] == "nodewarden"
    (usage,) = json_lines(run_cli("audit", "--no-such-option", "--log-format", "json").stderr)
    assert usage["level"] == "error" and "--no-such-option" in usage["msg"] and usage["exit_code"] == 2
    (root,) = json_lines(run_cli("--log-format=json", "--no-such-option").stderr)
    assert root["exit_code"] == 2
    (typo,) = json_lines(run_cli(*DRIFTED, "--only", "hots.*", "--log-format", "json").stderr)
    assert "host.thp.enabled" in typo["known_checks"]
    fleet = run_cli("fleet", "report", str(tmp_path / "none.json"), "--format", "json", "--log-format", "json")
    assert fleet.code == 2
    assert [line["level"] for line in json_lines(fleet.stderr)] == ["warning", "error"]
    text = run_cli("fleet", "report", str(tmp_path / "none.json"), "--format", "json")
    assert text.stderr.startswith("nodewarden: warning: skipped ")  # text stays text


# --- issue 26.6: every line fits the terminal ------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("verbose", [(), ("-v",)], ids=["plain", "verbose"])
def test_every_line_fits_the_terminal(run_cli: RunCli, columns: int, verbose: tuple[str, ...]) -> None:
    for color in ("never", "always"):
        result = run_cli(*TABLE, *verbose, "--color", color, env={"COLUMNS": str(columns)})
        assert result.code == 1, result.stderr
        lines = ANSI.sub("", result.stdout).splitlines()
        wide = [line for line in lines if len(line) > columns]
        assert not wide, f"{len(wide)} of {len(lines)} lines wider than {columns}: {wide[:3]}"
        # nothing lost: every failing finding's check is still shown whole
        assert "gpu.nvlink.links" in result.stdout and "System Board PS Redundancy" in ANSI.sub("", result.stdout)


def test_long_names_wrap_and_are_never_cut() -> None:
    """A subject or an action list longer than the terminal wraps; only a message is cut (without -v)."""
    from agent.core.model import Finding, Severity, Status
    from agent.engine.audit import AuditRequest, run_audit
    from agent.policy.config import Config
    from agent.report.table import render_table

    report = run_audit(AuditRequest(config=Config(), simulate="hgx-h100-healthy", only=("profile.match",)))
    subject = "nvswitch" + "x" * 150
    finding = Finding(check="fabric.sxid", subject=subject, status=Status.FAIL, severity=Severity.CRITICAL,
                      message="m " * 200, source="kmsg", action="drain")
    for width in (80, 120):
        report.findings = [finding]
        text = render_table(report, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert subject in "".join(line.strip() for line in text.splitlines())


# --- issue 26.9: each command's help describes its own options; the README names every command -----------


def test_each_commands_help_describes_its_own_options(run_cli: RunCli) -> None:
    audit = " ".join(run_cli("audit", "--help").stdout.split())
    assert "-v lists passes" in audit and "--debug-http" in audit and "--color" in audit
    for command in (("install",), ("apply-boot",), ("profiles", "validate"), ("snapshot", "import"), ("fleet", "report")):
        shown = " ".join(run_cli(*command, "--help").stdout.split())
        assert "lists passes" not in shown and "--color" not in shown, command
        assert "--debug-http" not in shown, command
        assert "-v, --verbose" in shown and "--log-format" in shown, command
    daemon = run_cli("daemon", "--help").stdout
    assert "--debug-http" in daemon and "--color" not in daemon  # it reads a BMC, prints no table
    # hidden, still accepted: a script that passes them everywhere keeps working
    assert run_cli("profiles", "validate", "--color", "never", "--debug-http",
                   str(REPO / "profiles" / "base.yaml")).code == 0


def test_the_readme_synopsis_lists_every_command() -> None:
    import click

    readme = (REPO / "README.md").read_text()
    start = readme.index("## Command line\n\n```\n")
    synopsis = readme[start:readme.index("```\n", start + 20)]
    commands: list[str] = []
    for name in cli.list_commands(click.Context(cli)):
        command = cli.get_command(click.Context(cli), name)
        if isinstance(command, click.Group):
            commands += [f"{name} {sub}" for sub in command.list_commands(click.Context(command))]
        else:
            commands.append(name)
    missing = [c for c in commands if not re.search(rf"^nodewarden {re.escape(c)}\b", synopsis, re.M)
               and not (" " in c and re.search(rf"^nodewarden {c.split()[0]} .*\b{c.split()[1]}\b", synopsis, re.M))]
    assert not missing, f"README's command synopsis lacks {missing}"


# --- completion, man page, README ---------------------------------------------------------------------


def complete(words: str) -> list[str]:
    env = {"_NODEWARDEN_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
    result = CliRunner().invoke(cli, [], prog_name="nodewarden", env=env)
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


def test_shell_completion_is_documented_and_completes_names() -> None:
    readme = (REPO / "README.md").read_text()
    assert "_NODEWARDEN_COMPLETE=bash_source nodewarden" in readme
    script = CliRunner().invoke(cli, [], prog_name="nodewarden", env={"_NODEWARDEN_COMPLETE": "bash_source"})
    assert "complete -o nosort -F _nodewarden_completion nodewarden" in script.stdout
    assert "hgx-h100-drifted" in complete("nodewarden audit --simulate hgx-")
    assert {"gpu.*", "gpu.retired_pages"} <= set(complete("nodewarden audit --only gpu"))
    assert "hgx-h100-sxm" in complete("nodewarden audit --profile hgx-h1")


def test_the_man_page_is_generated_from_the_commands() -> None:
    from agent.apps.cli.manpage import render

    page = render()
    assert (REPO / "docs" / "nodewarden.1").read_text() == page, \
        "docs/nodewarden.1 is stale: python -m agent.apps.cli.manpage > docs/nodewarden.1"
    for command in ("audit", "profiles match", "remediate", "fleet report", "baseline record", "snapshot capture"):
        assert f'.SS "nodewarden {command}' in page
    assert "\\-\\-only GLOB" in page and "NO_COLOR" in page and "\\-\\-color auto|always|never" in page
    if shutil.which("groff"):
        import subprocess

        checked = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=page, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert checked.returncode == 0 and checked.stderr == "", checked.stderr


README_SAMPLE = "$ nodewarden audit --simulate hgx-h100-drifted --format table"


def test_readme_sample_is_the_real_output(run_cli: RunCli) -> None:
    """The README's first sample is this command's output (120 columns, no colour).

    NODEWARDEN_UPDATE_README=1 writes the real output into the README instead."""
    path = REPO / "README.md"
    readme = path.read_text()
    start = readme.index("```\n" + README_SAMPLE + "\n") + len("```\n" + README_SAMPLE + "\n")
    end = readme.index("```\n", start)
    result = run_cli(*TABLE, "--color", "never", env={**FIXED_WIDTH, "NO_COLOR": "1"})
    assert result.code == 1, result.stderr
    real = without_duration(result.stdout)
    if os.environ.get("NODEWARDEN_UPDATE_README") == "1":
        path.write_text(readme[:start] + real + readme[end:])
        return
    assert without_duration(readme[start:end]) == real, \
        "the README's sample is stale: NODEWARDEN_UPDATE_README=1 pytest tests/unit/apps/test_cli_ux.py -k readme"


def test_profiles_list_columns_fit_the_longest_name(run_cli: RunCli) -> None:
    """Issue 36.9: names longer than the old 18-character column pushed the kind column out of line."""
    result = run_cli("profiles", "list")
    assert result.code == 0
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    names = [line.split()[0] for line in lines]
    assert max(map(len, names)) > 18  # the shipped profiles hold such a name
    kind_at = {line.index(f" {line.split()[1]} ", len(line.split()[0])) for line in lines}
    assert len(kind_at) == 1, lines  # every kind starts in the same column


def test_a_plan_of_a_simulated_node_names_the_copy_to_make_not_apply(run_cli: RunCli) -> None:
    """Issue 36.8: `--apply` is refused on a simulated node, so its plan must not end with 'run again with --apply'."""
    result = run_cli("remediate", "--simulate", "hgx-h100-drifted", "--format", "table")
    assert result.code in (0, 1), result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert "run again with --apply" not in result.stdout
    assert "snapshot capture --simulate hgx-h100-drifted --out DIR" in last and "--snapshot DIR --apply" in last
