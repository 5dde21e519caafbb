"""`nodewarden health-check`: the scheduler's gate (agent.scheduler) as a click command."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import click

from agent.cli_options import PATH, bmc_options, load_cli_config, source_options


def default_node() -> str:
    """Slurm's name for this host: slurmd says it in SLURMD_NODENAME, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


@click.command("health-check")
@source_options
@click.option("--slurm", "slurm", is_flag=True, help="Act through scontrol: drain, update our reason, resume.")
@click.option("--npd", "npd", is_flag=True,
              help="node-problem-detector custom plugin: one line (<= 80 bytes), exit 0 OK, 1 NonOK, 2 Unknown.")
@click.option("--dry-run", is_flag=True, help="With --slurm: print the scontrol command it would run; change nothing.")
@click.option("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME, else the short host name).")
@click.option("--state-dir", type=PATH, metavar="DIR",
              help="Where the daemon's state file and the decisions are (default: the config's state_dir). "
                   "With --simulate/--snapshot, only a daemon's folder named here answers for the recording.")
@click.option("--max-age", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Oldest state file answered from (default: the config's, else 3 daemon poll intervals).")
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Total time of the run: the one-shot audit and every Slurm call (default 50).")
@click.option("--fail-on", type=click.Choice(["DRAIN", "DEGRADED"]),
              help="The verdict that drains / is NonOK (default: the config's health_check.drain_on, DRAIN).")
def health_check(simulate: str | None, snapshot: Path | None, config_path: Path | None, slurm: bool, npd: bool,
                 dry_run: bool, node: str | None, state_dir: Path | None, max_age: float | None,
                 deadline: float | None, fail_on: str | None, **bmc: Any) -> None:
    """The scheduler's gate: the verdict from the daemon's state file, or a bounded one-shot audit.

    Plain and --slurm: exit 0 OK, 1 the verdict drains, 3 cannot decide (nothing done).
    --npd: exit 0 OK, 1 NonOK, 2 Unknown. Bad usage or config: 2.
    """
    import dataclasses

    from agent.engine import AuditRequest
    from agent.scheduler import HealthRequest, run_health_check, valid_node_name
    from agent.scheduler.settings import settings_from

    if slurm and npd:
        raise click.UsageError("--slurm and --npd are two different gates: choose one")
    if dry_run and not slurm:
        raise click.UsageError("--dry-run goes with --slurm")
    name = node or default_node()
    if not valid_node_name(name):
        raise click.BadParameter(f"{name[:80]!r}: a Slurm node name is 1-64 of A-Z a-z 0-9 . _ -, "
                                 "starting with a letter or digit", param_hint="--node")
    config = load_cli_config(config_path)
    settings = settings_from(config, state_dir=state_dir, deadline_s=deadline, max_age_s=max_age,
                             recording=bool(simulate or snapshot))
    if fail_on:
        settings = dataclasses.replace(settings, drain_on=fail_on)
    audit = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, bmc=bmc_options(config, bmc))
    outcome = run_health_check(HealthRequest(audit, settings, name, "slurm" if slurm else "npd" if npd else "plain",
                                             dry_run))
    for line in outcome.lines:
        click.echo(line)
    sys.exit(outcome.exit_code)
