"""`nodewarden install` lays out the documented deployment, and the units it writes are the ones
systemd accepts (issue 14, 6): real `systemd-analyze verify` and `security --offline=yes` on the
installed tree; the example config and docs/config.md come from the config schema.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from agent.apps.cli.install import LAYOUT_BIN, UNITS, own_console_script
from agent.io.schema import Validator
from agent.policy.config import CONFIG_SCHEMA
from agent.policy.config_doc import example_config, reference_markdown
from tests.conftest import REPO, RunCli
from tests.integration.test_systemd_units import analyze, exposure

SYSTEM = "etc/systemd/system"


def installed(run_cli: RunCli, prefix: Path, *extra: str) -> str:
    result = run_cli("install", "--prefix", str(prefix), *extra)
    assert result.code == 0, result.stderr
    return result.stdout


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_install_lays_out_units_config_credential_and_state(run_cli: RunCli, tmp_path: Path) -> None:
    out = installed(run_cli, tmp_path)
    for name in UNITS:
        unit = tmp_path / SYSTEM / name
        assert mode(unit) == 0o644, name
        text = unit.read_text()
        assert LAYOUT_BIN not in text or own_console_script() == LAYOUT_BIN
        assert all(line.split("=", 1)[1].split()[0] == own_console_script()
                   for line in text.splitlines() if re.match(r"^Exec(Start|StartPre)=/", line)
                   and "nodewarden" in line), name
    assert mode(tmp_path / "etc/nodewarden/config.yaml") == 0o644
    assert mode(tmp_path / "etc/nodewarden/bmc-password") == 0o600
    assert (tmp_path / "etc/nodewarden/bmc-password").read_bytes() == b""
    assert mode(tmp_path / "var/lib/nodewarden") == 0o755  # root's; the unprivileged daemon reads the baseline
    assert "systemctl daemon-reload" in out
    # issue 26.9: the paths really written, under the prefix
    assert f"wrote  {tmp_path}/etc/systemd/system/nodewarden.service\n" in out
    assert f"wrote  {tmp_path}/etc/nodewarden/bmc-password\n" in out and "wrote  /etc" not in out


def test_installed_units_verify_and_are_hardened(run_cli: RunCli, tmp_path: Path) -> None:
    installed(run_cli, tmp_path)
    for name in ("nodewarden.service", "nodewarden-audit.timer", "nodewarden-apply.service", "nodewarden-gate.path"):
        proc = analyze("verify", "--man=no", str(tmp_path / SYSTEM / name))
        assert proc.returncode == 0 and proc.stderr.strip() == "", (name, proc.stderr)
    assert exposure(tmp_path / SYSTEM / "nodewarden.service") <= 2.0


def test_a_second_install_keeps_the_operators_files(run_cli: RunCli, tmp_path: Path) -> None:
    installed(run_cli, tmp_path)
    config, password = tmp_path / "etc/nodewarden/config.yaml", tmp_path / "etc/nodewarden/bmc-password"
    config.write_text("profile: hgx-h100-sxm\n")
    password.write_text("s3cret\n")
    out = installed(run_cli, tmp_path)
    assert config.read_text() == "profile: hgx-h100-sxm\n" and password.read_text() == "s3cret\n"
    assert f"kept   {tmp_path}/etc/nodewarden/config.yaml (exists)" in out
    assert (tmp_path / "etc/nodewarden/config.yaml.example").read_text() == example_config()


def test_install_never_writes_through_a_planted_symlink(run_cli: RunCli, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    prefix = tmp_path / "root"
    (prefix / SYSTEM).mkdir(parents=True)
    (prefix / SYSTEM / "nodewarden.service").symlink_to(outside)
    installed(run_cli, prefix)
    assert outside.read_text() == "precious\n"
    assert not (prefix / SYSTEM / "nodewarden.service").is_symlink()


def test_install_into_a_missing_prefix_is_a_usage_error(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli("install", "--prefix", str(tmp_path / "nowhere"))
    assert result.code == 2 and "does not exist" in result.stderr


def test_every_key_of_the_example_config_is_valid_when_uncommented() -> None:
    text = example_config()
    uncommented = "\n".join(re.sub(r"^(\s*)#(\w+:)", r"\1\2", line) for line in text.splitlines()
                            if re.match(r"^\s*#\w+:", line))
    data = yaml.safe_load(uncommented)
    for section in ("daemon",):  # keys without a default stay empty when uncommented: drop those
        data[section] = {k: v for k, v in data[section].items() if v is not None}
    data = {k: v for k, v in data.items() if v is not None}
    assert Validator(CONFIG_SCHEMA).errors(data) == []
    documented = set(re.findall(r"^\s*#(\w+):", text, re.MULTILINE))
    assert {"deadline_s", "bmc_sensors", "basic_auth_password_file", "concurrency", "listen"} <= documented


def test_the_config_reference_is_generated_from_the_schema() -> None:
    assert (REPO / "docs" / "config.md").read_text() == reference_markdown(), (
        "docs/config.md is stale: run `python -m agent.policy.config_doc > docs/config.md`")
    # Every row has the header's four cells: an enum's `a | b` must not open extra columns.
    rows = [line for line in reference_markdown().splitlines() if line.startswith("| `")]
    assert rows and all(len(re.split(r"(?<!\\)\|", row)) == 6 for row in rows), [
        row for row in rows if len(re.split(r"(?<!\\)\|", row)) != 6]


def test_units_point_at_the_documented_layout() -> None:
    readme = (REPO / "README.md").read_text()
    assert "/opt/nodewarden" in readme and "nodewarden install" in readme
    for name in (u for u in UNITS if u.endswith(".service")):  # the timer starts a service, runs nothing
        text = (REPO / "systemd" / name).read_text()
        commands = re.findall(r"^Exec\w*=(\S+)", text, re.MULTILINE)
        assert [c for c in commands if "nodewarden" in c] and all(
            c == LAYOUT_BIN for c in commands if "nodewarden" in c), name


def test_installed_units_pass_systemd_analyze_security_offline(tmp_path: Path, run_cli: RunCli) -> None:
    installed(run_cli, tmp_path)
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                           str(tmp_path / SYSTEM / "nodewarden-audit.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "Overall exposure level" in proc.stdout
