"""`nodewarden health-check`: the scheduler's gate (agent.apps.scheduler) as a click command."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import click

from agent.apps.cli.options import PATH, bmc_options, load_cli_config, source_options


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
@click.option("--event", is_flag=True,
              help="With --slurm: the event-driven gate (what nodewarden-gate.service runs when the daemon's "
                   "verdict changes): the daemon's state file only, and it only drains.")
@click.option("--follow", is_flag=True,
              help="With --slurm, where systemd is not PID 1: run the event gate each time the daemon's verdict "
                   "changes, until SIGTERM (what nodewarden-gate.path does under systemd).")
def health_check(simulate: str | None, snapshot: Path | None, config_path: Path | None, slurm: bool, npd: bool,
                 dry_run: bool, node: str | None, state_dir: Path | None, max_age: float | None,
                 deadline: float | None, fail_on: str | None, event: bool, follow: bool, **bmc: Any) -> None:
    """The scheduler's gate: the verdict from the daemon's state file, or a bounded one-shot audit.

    Plain and --slurm: exit 0 OK, 1 the verdict drains, 3 cannot decide (nothing done).
    --npd: exit 0 OK, 1 NonOK, 2 Unknown. Bad usage or config: 2.
    """
    import dataclasses

    from agent.apps.scheduler import HealthRequest, run_health_check, valid_node_name
    from agent.apps.scheduler.settings import settings_from
    from agent.engine.audit import AuditRequest

    if slurm and npd:
        raise click.UsageError("--slurm and --npd are two different gates: choose one")
    if dry_run and not slurm:
        raise click.UsageError("--dry-run goes with --slurm")
    if (event or follow) and not slurm:
        raise click.UsageError("--event and --follow go with --slurm")
    if event and follow:
        raise click.UsageError("--follow runs --event gates itself: choose one")
    name = node or default_node()
    if not valid_node_name(name):
        raise click.BadParameter(f"{name[:80]!r}: a Slurm node name is 1-64 of A-Z a-z 0-9 . _ -, "
                                 "starting with a letter or digit", param_hint="--node")
    config = load_cli_config(config_path)
    settings = settings_from(config, state_dir=state_dir, deadline_s=deadline, max_age_s=max_age,
                             recording=bool(simulate or snapshot))
    if fail_on:
        settings = dataclasses.replace(settings, drain_on=fail_on)
    if follow:
        _follow(settings, name, config_path, simulate, snapshot, dry_run, max_age, fail_on)
    audit = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, bmc=bmc_options(config, bmc))
    outcome = run_health_check(HealthRequest(audit, settings, name, "slurm" if slurm else "npd" if npd else "plain",
                                             dry_run, event))
    for line in outcome.lines:
        click.echo(line)
    sys.exit(outcome.exit_code)


def _follow(settings: Any, node: str, config_path: Path | None, simulate: str | None, snapshot: Path | None,
            dry_run: bool, max_age: float | None, fail_on: str | None) -> None:
    """The event gate's trigger without systemd (agent.apps.scheduler.trigger), until SIGTERM or SIGINT."""
    import signal
    import threading

    from agent.apps.scheduler.trigger import follow

    # The same command nodewarden-gate.service runs, as its own process: its own deadline, counted
    # from its own start, and nothing of this long-lived process's state in it.
    argv = [sys.executable, "-P", "-m", "agent", "health-check", "--slurm", "--event", "--node", node,
            "--state-dir", str(settings.state_dir), "--deadline", f"{settings.deadline_s:g}",
            *(["--config", str(config_path)] if config_path else []),
            *(["--simulate", simulate] if simulate else []), *(["--snapshot", str(snapshot)] if snapshot else []),
            *(["--dry-run"] if dry_run else []), *(["--max-age", f"{max_age:g}"] if max_age else []),
            *(["--fail-on", fail_on] if fail_on else [])]
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    click.echo(f"following {settings.state_dir}: an event gate for {node} at each verdict change", err=True)
    follow(settings.state_dir, argv, stop, timeout_s=settings.deadline_s + 10.0,
           on_run=lambda code, said: click.echo(f"event gate exit {code}: {said}", err=False))
    sys.exit(0)
