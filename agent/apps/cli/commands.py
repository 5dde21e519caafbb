"""The commands besides `audit`, imported when one of them is named (agent.apps.cli.main's `LAZY_COMMANDS`).

Building a command's click options costs ~25 us each; `nodewarden audit` and `--version` need
none of these ~70.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from agent.apps.cli.options import DIR_PATH, FILE_PATH, PATH, bmc_options, load_cli_config, source_options
from agent.apps.cli.support import State, error, os_errors_as_exits, wants_json, warn
from agent.core.errors import EXIT_USAGE
from agent.sources.importers.summary import IMPORT_KINDS

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def profiles() -> None:
    """List, show, validate and match tuning profiles."""


@profiles.command("list")
@click.option("--config", "config_path", type=PATH, metavar="FILE")
def profiles_list(config_path: Path | None) -> None:
    """Profiles on the search path (site folders first)."""
    from agent.policy.profiles import ProfileStore, available

    config = load_cli_config(config_path)
    store = ProfileStore(config.profile_dirs)
    paths = available(store.dirs)
    names = store.names()
    width = max((len(name) for name in names), default=0)  # a site profile's long name keeps its columns
    for name in names:
        data = store.file(name).data
        kind = "abstract" if data.get("abstract") else "fallback" if name == "generic-nvidia" else "model"
        click.echo(f"{name:<{width}}  {kind:<9} {data['description']}  [{paths[name]}]")


@profiles.command("show")
@click.argument("name")
@click.option("--config", "config_path", type=PATH, metavar="FILE")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def profiles_show(name: str, config_path: Path | None, fmt: str) -> None:
    """The merged profile NAME, with the files it comes from."""
    import json

    import yaml

    from agent.policy.profiles import ProfileStore

    config = load_cli_config(config_path)
    profile = ProfileStore(config.profile_dirs, config.overrides_file).profile(name)
    doc = {"name": profile.name, "description": profile.description, "files": list(profile.chain),
           "match": profile.match.to_json() if profile.match else None, "expect": profile.expect}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False), nl=False)


@profiles.command("validate")
@click.argument("files", nargs=-1, required=True, type=PATH)
def profiles_validate(files: tuple[Path, ...]) -> None:
    """Validate profile FILEs (schema, extends chain, comparators): every error of each file."""
    from agent.policy.profiles import ProfileStore

    failed = 0
    for path in files:
        problems = ProfileStore([path.parent]).validate_file_errors(path)
        if not problems:
            click.echo(f"{path}: ok")
        failed += bool(problems)
        for exc in problems:
            if wants_json():
                error(str(exc), file=str(path))
            else:
                click.echo(f"{exc}", err=True)
    if failed:
        sys.exit(EXIT_USAGE)


@profiles.command("match")
@source_options
def profiles_match(simulate: str | None, snapshot: Path | None, config_path: Path | None, **_bmc: Any) -> None:
    """Show which profile a node matches, and on what."""
    from agent.engine.audit import AuditRequest
    from agent.policy.matching import select
    from agent.policy.profiles import ProfileStore
    from agent.sources.node import node_identity, open_node

    config = load_cli_config(config_path)
    node = open_node(AuditRequest(config=config, simulate=simulate, snapshot=snapshot))
    identity = node_identity(node)
    selection = select(identity, ProfileStore(config.profile_dirs, config.overrides_file))
    click.echo(f"hardware: {identity.describe()}")
    click.echo(f"profile:  {selection.profile.name} ({selection.how})")
    if selection.matched_on:
        click.echo(f"matched:  {', '.join(selection.matched_on)}")
    if selection.also_matched:
        click.echo(f"also:     {', '.join(selection.also_matched)}")


@click.group()
def snapshot() -> None:
    """Record a node for offline audits and bug reports."""


@snapshot.command("capture")
@source_options
@click.option("--out", required=True, type=PATH, metavar="DIR|FILE.tar.gz",
              help="New directory to write (must not exist or be empty), or one new .tar.gz archive.")
@click.option("--redact", metavar="KINDS", default=None,
              help="With --out FILE.tar.gz: replace serials,uuids,hostnames,macs,ips,guids by consistent tokens.")
def snapshot_capture(simulate: str | None, snapshot: Path | None, config_path: Path | None,
                     out: Path, redact: str | None, **bmc: Any) -> None:
    """Capture this node (or copy a simulated/recorded one) into DIR or FILE.tar.gz."""
    from agent.engine.audit import AuditRequest
    from agent.policy.profiles import ProfileStore
    from agent.sources.importers.archive import capture_archive, is_archive, parse_redact
    from agent.sources.node import open_node
    from agent.sources.snapshot import capture_live, copy_snapshot

    kinds = parse_redact(redact)
    if kinds and not is_archive(out):
        raise click.UsageError("--redact needs --out FILE.tar.gz (a redacted archive to send)")
    config = load_cli_config(config_path)
    node = open_node(AuditRequest(config=config, simulate=simulate, snapshot=snapshot))

    def capture(target: Path) -> list[str]:
        if node.snapshot is not None:
            return copy_snapshot(node.snapshot, target)
        store = ProfileStore(config.profile_dirs, config.overrides_file)
        keys = sorted({k for name in store.names() for k in store.profile(name).sysctl_keys})
        done = capture_live(target, keys, bmc=bmc_options(config, bmc))
        history.append(_capture_ledger(config.state_dir, target, redacted=bool(kinds)))
        return done

    history: list[str] = []
    with os_errors_as_exits("capture"):  # ENOSPC, EIO: exit 1; never "internal error"
        captured = capture_archive(out, capture, kinds) if is_archive(out) else capture(out)
    click.echo(f"captured {', '.join(captured)} into {out}")
    for why in history:
        click.echo(f"ledger: {why}")


def _capture_ledger(state_dir: Path, target: Path, *, redacted: bool) -> str:
    """The node's ledger into a live capture (`audit --snapshot` then judges its history); said either way."""
    if redacted:  # a database file cannot be redacted line by line: a redacted archive goes without it
        return "left out of a redacted archive (send `nodewarden ledger export` output, redacted, instead)"
    from agent.engine.history import copy_ledger
    from agent.state.layout import LEDGER_FILE

    return copy_ledger(state_dir, target / LEDGER_FILE) or f"copied as {LEDGER_FILE}"


@snapshot.command("import")
@click.argument("inputs", nargs=-1, type=PATH)
@click.option("--out", required=True, type=PATH, metavar="DIR",
              help="New snapshot directory to write (must not exist or be empty).")
@click.option("--as", "forced", multiple=True, metavar="KIND=FILE",
              help="Read FILE (an input, or a file inside one) as KIND instead of detecting it (repeatable). "
                   "KIND is one of: " + ", ".join(IMPORT_KINDS) + ".")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors (the exit status tells the rest).")
def snapshot_import(inputs: tuple[Path, ...], out: Path, forced: tuple[str, ...], quiet: bool) -> None:
    """Build one snapshot from captures: files, folders or archives (.gz .tar .tar.gz .tar.xz .zip).

    Kinds are detected by content: nvidia-smi -q / -q -x, nvlink -s, topo -m, --query-gpu CSV, kernel
    logs (kmsg, dmesg, journalctl -k), lspci, dmidecode, ibstat, ipmitool, ip link, ethtool, lsmod,
    nvidia-bug-report.log(.gz), a Redfish mockup, a sosreport. meta.yaml records every input. It prints
    one line per kind with counts and names the files that failed; -v prints every file.
    """
    from agent.core.errors import ConfigError
    from agent.sources.importers.bundle import import_inputs

    kinds: dict[str, str] = {}
    paths = list(inputs)
    for item in forced:
        kind, sep, name = item.partition("=")
        if not sep or not kind or not name:
            raise ConfigError(f"--as {item!r}: expected KIND=FILE")
        kinds[name] = kind
        if Path(name).exists() and Path(name) not in paths:
            paths.append(Path(name))
    if not paths:
        raise ConfigError("name at least one input (a file, folder or archive)")
    with os_errors_as_exits("import"):
        summary = import_inputs(paths, out, kinds)
    from agent.sources.importers.summary import EVERY_FILE, QUIET, SUMMARY, printout

    state = click.get_current_context().find_object(State)
    verbosity = QUIET if quiet else EVERY_FILE if state is not None and state.verbose > 0 else SUMMARY
    shown = printout(summary.entries, summary.captured, str(out), IMPORT_KINDS, verbosity)
    for line in shown.err:
        click.echo(line, err=True)
    for line in shown.out:
        click.echo(line)


@snapshot.command("import-nvidia-smi")
@click.argument("file", type=FILE_PATH)
@click.option("--out", required=True, type=PATH, metavar="DIR",
              help="New snapshot directory to write (must not exist or be empty).")
def snapshot_import_nvidia_smi(file: Path, out: Path) -> None:
    """Build a snapshot's NVML part from `nvidia-smi -q` text or `-q -x` XML (e.g. from nvidia-bug-report)."""
    from agent.sources.importers.nvidia_smi import import_nvidia_smi

    with os_errors_as_exits("import"):
        result = import_nvidia_smi(file, out)
    click.echo(f"imported {result.gpu_count} GPU(s), driver {result.driver_version or 'unknown'}, "
               f"from {result.format} dump {file} into {out}")
    for warning in result.warnings:
        warn(warning)


def _state_dir_option(func: F) -> F:
    return click.option("--state-dir", type=DIR_PATH, metavar="DIR",
                        default="/var/lib/nodewarden", show_default=True,
                        help="Where the remediation journal lives: root's or yours, writable by nobody "
                        "else (exit 2 otherwise). The lock is the node's, not this folder's.")(func)


@click.command()
@source_options
@click.option("--apply", "do_apply", is_flag=True, help="Apply the plan (default: only print it).")
@click.option("--allow", multiple=True, type=click.Choice(["safe", "disruptive", "reboot"]),
              help="Also allow this class of action (repeatable; safe is always allowed).")
@click.option("--only", multiple=True, metavar="GLOB", help="Only actions whose id or check id matches.")
@click.option("--profile", metavar="NAME|auto", help="Profile to remediate towards (default: match).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]),
              help="Output format (default: table on a terminal, json otherwise).")
@_state_dir_option
def remediate(simulate: str | None, snapshot: Path | None, config_path: Path | None, do_apply: bool,
              allow: tuple[str, ...], only: tuple[str, ...], profile: str | None, fmt: str | None,
              state_dir: Path, **bmc: Any) -> None:
    """Plan (default) or apply fixes for drift. Exit 0 ok, 1 refused/failed, 2 bad input, 3 could not run."""
    from agent.engine.audit import AuditRequest
    from agent.engine.remediate import RemediationRequest
    from agent.engine.remediate import remediate as run_remediation
    from agent.engine.remediation_report import render_remediation
    from remediations import ActionClass

    config = load_cli_config(config_path)
    request = RemediationRequest(
        audit=AuditRequest(config=config, simulate=simulate, snapshot=snapshot, profile=profile,
                           bmc=bmc_options(config, bmc)),
        apply=do_apply, allow=frozenset({ActionClass.SAFE, *(ActionClass(a) for a in allow)}),
        only=only, state_dir=state_dir)
    result = run_remediation(request)
    fmt = fmt or ("table" if sys.stdout.isatty() else "json")
    click.echo(render_remediation(result, fmt), nl=False)
    sys.exit(result.exit_code)


@click.command()
@source_options
@click.argument("run_id", required=False)
@click.option("--last", is_flag=True, help="Roll back the newest run that changed this node.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_state_dir_option
def rollback(simulate: str | None, snapshot: Path | None, config_path: Path | None, run_id: str | None,
             last: bool, fmt: str, state_dir: Path, **bmc: Any) -> None:
    """Restore exactly what a remediation run changed (RUN_ID or --last)."""
    import json

    from agent.engine.audit import AuditRequest
    from agent.engine.remediate import rollback as run_rollback

    if last == (run_id is not None):
        raise click.UsageError("give either RUN_ID or --last")
    config = load_cli_config(config_path)
    result = run_rollback(AuditRequest(config=config, simulate=simulate, snapshot=snapshot,
                                       bmc=bmc_options(config, bmc)), state_dir, run_id)
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    elif result.already:
        click.echo(f"run {result.run_id} was already rolled back; nothing changed")
    else:
        paths = list(dict.fromkeys(result.restored))
        click.echo(f"rolled back run {result.run_id} on {result.target}: restored {len(paths)} path(s)")
        for path in paths[:10]:
            click.echo(f"  {path}")
        if len(paths) > 10:
            click.echo(f"  ... and {len(paths) - 10} more (--format json lists all)")
    for warning in result.warnings:
        warn(warning)


@click.command()
@source_options
@click.option("--listen", metavar="HOST:PORT", help="Serve /metrics here (default: daemon.listen in the config, "
              "else 127.0.0.1:9847).")
@click.option("--profile", metavar="NAME|auto", help="Profile to judge by (default: match automatically).")
@click.option("--state-dir", type=DIR_PATH, metavar="DIR",
              help="Where health-check's state file is written (default: state_dir in the config; with "
              "--simulate or --snapshot, a private temporary folder instead of the system's "
              "/var/lib/nodewarden).")
@click.pass_obj
def daemon(state: State, /, simulate: str | None, snapshot: Path | None, config_path: Path | None,
           listen: str | None, profile: str | None, state_dir: Path | None, **bmc: Any) -> None:
    """Watch the node: poll sources, judge, log changes, serve Prometheus metrics (SIGHUP reloads)."""
    from agent.apps.daemon.service import Daemon, daemon_settings, is_system_state_dir, replay_state_dir
    from agent.engine.audit import AuditRequest
    from agent.io.log import setup_logging

    if not state.log_format_given:
        setup_logging(max(state.verbose, 1), "json", stream=sys.stdout,  # JSON lines to journald
                      debug_http=state.debug_http)
    else:
        setup_logging(max(state.verbose, 1), state.log_format, stream=sys.stdout, debug_http=state.debug_http)
    config = load_cli_config(config_path)
    if state_dir is None and (simulate is not None or snapshot is not None) and is_system_state_dir(config.state_dir):
        state_dir = replay_state_dir()  # a recorded node's verdict is not this host's: never in its folder
    if state_dir is not None:
        config = dataclasses.replace(config, state_dir=state_dir.absolute())
    settings = daemon_settings(config, listen)
    request = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, profile=profile,
                           bmc=bmc_options(config, bmc))
    from agent.apps.scheduler.metrics import DaemonGate  # the CLI wires the gate in: one app never imports another

    runner = Daemon(request, settings, config_path, listen, lambda cfg: bmc_options(cfg, bmc),
                    state_dir=config.state_dir if state_dir is not None else None, gate=DaemonGate)
    sys.exit(runner.run())


def _duration(text: str) -> Any:
    import datetime as dt
    import re

    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text.strip())
    if not match:
        raise click.BadParameter(f"{text!r}: use a number and s, m, h or d (e.g. 24h, 7d)")
    seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return dt.timedelta(seconds=seconds)


@click.group()
def fleet() -> None:
    """Fleet compliance reports over many nodes' audits."""


@fleet.command("report")
@click.argument("inputs", nargs=-1, type=PATH)
@click.option("--prometheus", metavar="URL", help="Also read nodes' findings from this Prometheus (HTTP API).")
@click.option("--prometheus-timeout", default=300.0, show_default=True, type=click.FloatRange(min=1), metavar="SECONDS",
              help="Total time for all Prometheus queries.")
@click.option("--prometheus-max-mb", default=128, show_default=True, type=click.IntRange(min=1), metavar="MB",
              help="Largest answer read for one Prometheus query.")
@click.option("--format", "fmt", type=click.Choice(["html", "md", "csv", "json"]), required=True)
@click.option("--output", type=FILE_PATH, metavar="FILE",
              help="Write here atomically (default: stdout).")
@click.option("--stale-after", default="24h", show_default=True, metavar="DURATION",
              help="A report older than this is stale (s, m, h, d).")
@click.option("--expiring-within", default="14d", show_default=True, metavar="DURATION",
              help="Waivers expiring within this are flagged.")
@click.option("--thermal-delta", default=5.0, show_default=True, type=float, metavar="CELSIUS",
              help="A GPU this much hotter than its slot's fleet median is an outlier.")
@click.option("--acceptance-stale-after", default="180d", show_default=True, metavar="DURATION",
              help="A node's acceptance run older than this is stale: re-accept it (s, m, h, d).")
@click.option("--expect-nodes", type=click.Path(path_type=Path, dir_okay=False, exists=True), metavar="FILE",
              help="Node names that must have reported, one per line (e.g. from the Ansible inventory).")
@click.option("--now", "now_text", hidden=True, help="Judge ages as of this ISO time (tests).")
def fleet_report(inputs: tuple[Path, ...], prometheus: str | None, prometheus_timeout: float, prometheus_max_mb: int,
                 fmt: str, output: Path | None, stale_after: str, expiring_within: str, thermal_delta: float,
                 acceptance_stale_after: str, expect_nodes: Path | None, now_text: str | None) -> None:
    """Summarise audit JSON files or folders of them (as fleet-audit.yml collects them), with each node's
    newest `nodewarden accept` JSON report among them. Exit 2: no input."""
    import datetime as dt

    from agent.apps.fleet import FleetInputError, FleetOptions, build_report, input_files, progress_bar, read_reports
    from agent.apps.fleet.render import iter_csv, iter_html, iter_json, iter_md
    from agent.io.fsutil import write_output_stream

    options = FleetOptions(stale_after=_duration(stale_after), expiring_within=_duration(expiring_within),
                           thermal_delta_c=thermal_delta, acceptance_stale_after=_duration(acceptance_stale_after))
    if now_text:
        options.now = dt.datetime.fromisoformat(now_text.replace("Z", "+00:00"))
    if expect_nodes is not None:
        options.expected_nodes = [line.split()[0] for line in expect_nodes.read_text().splitlines()
                                  if line.strip() and not line.lstrip().startswith("#")]
    if not inputs and not prometheus:
        raise FleetInputError("no input: give audit JSON files or folders, or --prometheus URL")
    files, missing_inputs = input_files(inputs)
    reader = read_reports(files, keep_rows=fmt == "csv", progress=progress_bar(), today=options.now.date())
    try:
        skipped = missing_inputs + reader.skipped
        if prometheus:
            from agent.apps.fleet.prometheus import read_prometheus

            for summary in read_prometheus(prometheus, keep_rows=fmt == "csv", timeout_s=prometheus_timeout,
                                           max_bytes=prometheus_max_mb << 20):
                reader.add_summary(summary)
        for item in skipped:
            warn(f"skipped {item.path}: {item.reason}")
        if not reader.by_name:
            raise FleetInputError(f"no usable audit report among {len(files)} file(s)"
                                  + (f" ({len(skipped)} skipped)" if skipped else ""))
        nodes = reader.records()
        data = build_report(nodes, skipped, reader.duplicates(), options, reader.accepts, reader.accept_reports)
        chunks = {"json": lambda: iter_json(data), "md": lambda: iter_md(data), "html": lambda: iter_html(data),
                  "csv": lambda: iter_csv(reader, nodes, data["nodes"])}[fmt]()
        if output is not None:
            write_output_stream(output, chunks)
        else:
            for chunk in chunks:
                click.echo(chunk, nl=False)
    finally:
        reader.close()


@click.command("install")
@click.option("--prefix", type=DIR_PATH, default=Path("/"), show_default=True,
              help="Root to install under (a staging folder or an image).")
@click.option("--bin", "binary", metavar="PATH",
              help="The nodewarden the units run (default: this installation's; layout: /opt/nodewarden/bin).")
def install_command(prefix: Path, binary: str | None) -> None:
    """Install the systemd units, an example config, the credential file and the state folder."""
    from agent.apps.cli.install import install, summary

    click.echo(summary(install(prefix, binary), prefix))


@click.command("apply-boot")
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Apply under DIR instead of / (tests, chroots).")
def apply_boot_command(root: str) -> None:
    """Replay the tunables remediate persisted in /etc/nodewarden/boot.conf (run at boot)."""
    from agent.engine.bootapply import apply_boot

    result = apply_boot(root)
    for line in result.applied:
        click.echo(f"applied {line}")
    for problem in result.problems:
        warn(problem)
    sys.exit(result.exit_code)
