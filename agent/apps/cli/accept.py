"""`nodewarden accept`: acceptance of a node under full load (agent.apps.accept), as a click command."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from agent.apps.cli.options import FILE_PATH, PATH, bmc_options, load_cli_config, source_options
from agent.apps.cli.support import State, complete_profiles, use_color

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")


def seconds(text: str, what: str) -> float:
    """'10s', '10m', '1h', '250ms' or plain seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r}: a number with s, m, h or ms (e.g. 10m)", param_hint=what)
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


@click.command("accept", context_settings={"allow_interspersed_args": False})
@source_options
@click.option("--profile", metavar="NAME|auto", shell_complete=complete_profiles,
              help="Profile to judge by (default: match automatically).")
@click.option("--load", "load", type=click.Choice(["torch", "command", "none"]), default="none", show_default=True,
              help="The load: built-in PyTorch burn (nodewarden[load]), the command after --, or none "
                   "(observe a workload already running).")
@click.option("--duration", default="10m", show_default=True, metavar="DURATION",
              help="Steady phase (at least 10s).")
@click.option("--interval", default="1s", show_default=True, metavar="DURATION", help="Sampling interval.")
@click.option("--idle", "idle", default="30s", show_default=True, metavar="DURATION",
              help="Idle readings before the load starts.")
@click.option("--ramp", default="2m", show_default=True, metavar="DURATION",
              help="Longest wait for every GPU to reach load.")
@click.option("--cooldown", default="1m", show_default=True, metavar="DURATION", help="Readings after the load.")
@click.option("--grace", default="10s", show_default=True, metavar="DURATION",
              help="Between SIGTERM and SIGKILL when stopping the load.")
@click.option("--state-dir", type=PATH, metavar="DIR",
              help="Where runs, the baseline and last.json go (default: the config's state_dir)/accept.")
@click.option("--new-baseline", is_flag=True, help="Make this run (if it passes) the baseline drift is judged by.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "junit", "prom"]),
              help="Output format (default: table on a terminal, json otherwise).")
@click.option("--output", type=FILE_PATH, metavar="FILE", help="Write the report to FILE (atomically).")
@click.option("--html", "html", type=FILE_PATH, metavar="FILE",
              help="Also write the picture: per-GPU power, temperature and clock curves (self-contained HTML).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def accept(state: State, /, config_path: Path | None, profile: str | None, load: str, duration: str, interval: str,
           idle: str, ramp: str, cooldown: str, grace: str, state_dir: Path | None, new_baseline: bool,
           fmt: str | None, output: Path | None, html: Path | None, command: tuple[str, ...], **bmc: Any) -> None:
    """Accept a node under full load: idle, ramp, steady, cool-down; judged, stored, compared with its baseline.

    Exit 0 accepted, 1 a finding failed (or the load did not run), 2 bad usage, 3 could not run.
    `--load command -- CMD ARGS...` runs CMD (gpu-burn, dcgmproftester, an NCCL test) as the load.
    """
    from agent.apps.accept.run import AcceptRequest, run_accept
    from agent.apps.cli.support import stdout_is_tty
    from agent.report import render

    if load == "command" and not command:
        raise click.UsageError("--load command needs the command after -- (e.g. -- gpu_burn 600)")
    if load != "command" and command:
        raise click.UsageError(f"a command after -- needs --load command (not --load {load})")
    config = load_cli_config(config_path)
    request = AcceptRequest(
        config=config, profile=profile, load=load, argv=command, duration_s=seconds(duration, "--duration"),
        interval_s=seconds(interval, "--interval"), idle_s=seconds(idle, "--idle"), ramp_s=seconds(ramp, "--ramp"),
        cooldown_s=seconds(cooldown, "--cooldown"), grace_s=seconds(grace, "--grace"), state_dir=state_dir,
        new_baseline=new_baseline, bmc=bmc_options(config, bmc))
    outcome = run_accept(request)
    if html is not None:
        from agent.apps.accept.html import render_html
        from agent.io.fsutil import write_output

        write_output(html, render_html(outcome.recording, outcome.report))
    tty = output is None and stdout_is_tty()
    fmt = fmt or ("table" if tty else "json")
    color = fmt == "table" and use_color(tty)
    text = render(outcome.report, fmt, verbose=state.verbose > 0, color=color)
    if output is not None:
        from agent.io.fsutil import write_output

        write_output(output, text)
    else:
        click.echo(text, nl=False, color=color)
    sys.exit(outcome.report.exit_code)


# The shared SOURCE OPTIONS less the replays: accept loads and reads this machine's GPUs.
accept.params = [p for p in accept.params if p.name not in ("simulate", "snapshot")]
