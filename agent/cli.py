"""Command line (contract in DESIGN.md). Heavy modules load inside commands,
so `nodewarden --version` and simple commands start fast."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from agent import __version__
from agent.cli_options import bmc_options, load_cli_config, source_options
from agent.cli_support import (
    COLOR_CHOICES,
    COLOR_HELP,
    DEBUG_HTTP_HELP,
    LOG_FORMAT_HELP,
    VERBOSE_HELP,
    State,
    add_global_options,
    argv_wants_json,
    click_error,
    complete_checks,
    complete_profiles,
    error,
    say,
    use_color,
    wants_json,
    warn,
)
from agent.errors import EXIT_CANNOT_RUN, EXIT_USAGE, NodewardenError

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["State", "cli", "main"]


class NodewardenGroup(click.Group):
    """Turns our errors into one-line messages (or JSON lines) and DESIGN.md's exit codes."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        argv = list(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:  # the root's own options: before any State exists
            if not argv_wants_json(argv):
                raise
            click_error(exc, True)
            raise click.exceptions.Exit(exc.exit_code) from None
        ctx.meta["nodewarden.argv"] = argv
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except click.ClickException as exc:  # a subcommand's usage error
            if not wants_json(ctx):
                raise
            click_error(exc, True)
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except NodewardenError as exc:
            error(str(exc), **getattr(exc, "fields", {}), **_traceback(ctx))
            ctx.exit(exc.exit_code)
        except Exception as exc:  # noqa: BLE001 - the last resort: exit 3, never a bare traceback
            say("internal error", f"{type(exc).__name__}: {exc}" + ("" if _verbose(ctx) else
                " (run with -vv for the traceback)"), **_traceback(ctx))
            ctx.exit(EXIT_CANNOT_RUN)


def _traceback(ctx: click.Context) -> dict[str, Any]:
    """-vv: the traceback, printed (text) or as the JSON line's `exc` field."""
    if not _verbose(ctx):
        return {}
    import traceback  # only on an error under -vv (`--version` and clean runs never need it)

    if wants_json(ctx):
        return {"exc": traceback.format_exc()}
    traceback.print_exc()
    return {}


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (`nodewarden audit | head -c1`): exit quietly, no traceback.

    stdout is pointed at /dev/null first, so the interpreter's final flush cannot complain either.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real descriptor (tests capture stdout in memory)
    sys.exit(EXIT_BROKEN_PIPE)


def _verbose(ctx: click.Context) -> bool:
    """-vv: tracebacks on errors (-v only lists passes and reasons)."""
    state = ctx.find_object(State)
    return bool(state and state.verbose >= 2)


@click.group(name="nodewarden", cls=NodewardenGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="nodewarden")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
@click.option("--log-format", type=click.Choice(["text", "json"]), help=LOG_FORMAT_HELP)
@click.option("--debug-http", is_flag=True, help=DEBUG_HTTP_HELP)
@click.option("--color", type=click.Choice(COLOR_CHOICES), default="auto", metavar="auto|always|never",
              help=COLOR_HELP)
@click.pass_context
def cli(ctx: click.Context, verbose: int, log_format: str | None, debug_http: bool, color: str) -> None:
    """Keep GPU servers tuned and healthy: audit, remediate, watch.

    The global options (-v, --log-format, --debug-http, --color) may also follow the command:
    `nodewarden audit -v` is `nodewarden -v audit`.
    """
    from agent.cli_support import apply_logging

    state = ctx.ensure_object(State)
    state.verbose, state.log_format, state.log_format_given = verbose, log_format or "text", log_format is not None
    state.debug_http, state.color = debug_http, color
    apply_logging(state)


_config = load_cli_config  # the shared helpers, under the short names this module's commands use
_bmc_options = bmc_options


@cli.command()
@source_options
@click.option("--profile", metavar="NAME|auto", shell_complete=complete_profiles,
              help="Profile to judge by (default: match automatically).")
@click.option("--only", multiple=True, metavar="GLOB", shell_complete=complete_checks,
              help="Run only checks whose id matches (repeatable; the profile is chosen as without it).")
@click.option("--skip", multiple=True, metavar="GLOB", shell_complete=complete_checks,
              help="Skip checks whose id matches (repeatable). A glob matching no check is exit 2.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "junit", "prom"]),
              help="Output format (default: table on a terminal, json otherwise).")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write the report to FILE (atomically; a device or FIFO in place; - is stdout).")
@click.pass_obj
def audit(state: State, /, simulate: str | None, snapshot: Path | None, config_path: Path | None,
          profile: str | None, only: tuple[str, ...], skip: tuple[str, ...], fmt: str | None,
          output: Path | None, **bmc: Any) -> None:
    """Audit a node against its profile. Exit 0 no fail, 1 fail, 2 bad input, 3 could not run."""
    from agent.cli_support import check_selection, stdout_is_tty
    from agent.engine import AuditRequest, run_audit
    from agent.report import render

    check_selection(only, skip)
    config = _config(config_path)
    request = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, profile=profile, only=only,
                           skip=skip, bmc=_bmc_options(config, bmc))
    report = run_audit(request)
    tty = output is None and stdout_is_tty()
    fmt = fmt or ("table" if tty else "json")
    color = fmt == "table" and use_color(tty)
    text = render(report, fmt, verbose=state.verbose > 0, color=color)
    if output is not None:
        from agent.fsutil import write_output  # its socket and secrets imports only when writing a file

        write_output(output, text)
    else:
        click.echo(text, nl=False, color=color)
    sys.exit(report.exit_code)


@cli.group()
def profiles() -> None:
    """List, show, validate and match tuning profiles."""


@profiles.command("list")
@click.option("--config", "config_path", type=click.Path(path_type=Path), metavar="FILE")
def profiles_list(config_path: Path | None) -> None:
    """Profiles on the search path (site folders first)."""
    from agent.profiles import ProfileStore, available

    config = _config(config_path)
    store = ProfileStore(config.profile_dirs)
    paths = available(store.dirs)
    for name in store.names():
        data = store.file(name).data
        kind = "abstract" if data.get("abstract") else "fallback" if name == "generic-nvidia" else "model"
        click.echo(f"{name:<18} {kind:<9} {data['description']}  [{paths[name]}]")


@profiles.command("show")
@click.argument("name")
@click.option("--config", "config_path", type=click.Path(path_type=Path), metavar="FILE")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def profiles_show(name: str, config_path: Path | None, fmt: str) -> None:
    """The merged profile NAME, with the files it comes from."""
    import json

    import yaml

    from agent.profiles import ProfileStore

    config = _config(config_path)
    profile = ProfileStore(config.profile_dirs, config.overrides_file).profile(name)
    doc = {"name": profile.name, "description": profile.description, "files": list(profile.chain),
           "match": profile.match.to_json() if profile.match else None, "expect": profile.expect}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False), nl=False)


@profiles.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def profiles_validate(files: tuple[Path, ...]) -> None:
    """Validate profile FILEs (schema, extends chain, comparators)."""
    from agent.profiles import ProfileStore

    failed = 0
    for path in files:
        try:
            ProfileStore([path.parent]).validate_file(path)
            click.echo(f"{path}: ok")
        except NodewardenError as exc:
            failed += 1
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
    from agent.engine import AuditRequest
    from agent.matching import select
    from agent.node import node_identity, open_node
    from agent.profiles import ProfileStore

    config = _config(config_path)
    node = open_node(AuditRequest(config=config, simulate=simulate, snapshot=snapshot))
    identity = node_identity(node)
    selection = select(identity, ProfileStore(config.profile_dirs, config.overrides_file))
    click.echo(f"hardware: {identity.describe()}")
    click.echo(f"profile:  {selection.profile.name} ({selection.how})")
    if selection.matched_on:
        click.echo(f"matched:  {', '.join(selection.matched_on)}")
    if selection.also_matched:
        click.echo(f"also:     {', '.join(selection.also_matched)}")


@cli.group()
def snapshot() -> None:
    """Record a node for offline audits and bug reports."""


@snapshot.command("capture")
@source_options
@click.option("--out", required=True, type=click.Path(path_type=Path), metavar="DIR|FILE.tar.gz",
              help="New directory to write (must not exist or be empty), or one new .tar.gz archive.")
@click.option("--redact", metavar="KINDS", default=None,
              help="With --out FILE.tar.gz: replace serials,uuids,hostnames,macs,ips,guids by consistent tokens.")
def snapshot_capture(simulate: str | None, snapshot: Path | None, config_path: Path | None,
                     out: Path, redact: str | None, **bmc: Any) -> None:
    """Capture this node (or copy a simulated/recorded one) into DIR or FILE.tar.gz."""
    from agent.engine import AuditRequest
    from agent.importers.archive import capture_archive, is_archive, parse_redact
    from agent.node import open_node
    from agent.profiles import ProfileStore
    from agent.snapshot import capture_live, copy_snapshot

    kinds = parse_redact(redact)
    if kinds and not is_archive(out):
        raise click.UsageError("--redact needs --out FILE.tar.gz (a redacted archive to send)")
    config = _config(config_path)
    node = open_node(AuditRequest(config=config, simulate=simulate, snapshot=snapshot))

    def capture(target: Path) -> list[str]:
        if node.snapshot is not None:
            return copy_snapshot(node.snapshot, target)
        store = ProfileStore(config.profile_dirs, config.overrides_file)
        keys = sorted({k for name in store.names() for k in store.profile(name).sysctl_keys})
        return capture_live(target, keys, bmc=_bmc_options(config, bmc))

    captured = capture_archive(out, capture, kinds) if is_archive(out) else capture(out)
    click.echo(f"captured {', '.join(captured)} into {out}")


@snapshot.command("import")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="New snapshot directory to write (must not exist or be empty).")
@click.option("--as", "forced", multiple=True, metavar="KIND=FILE",
              help="Read FILE (an input, or a file inside one) as KIND instead of detecting it (repeatable).")
def snapshot_import(inputs: tuple[Path, ...], out: Path, forced: tuple[str, ...]) -> None:
    """Build one snapshot from captures: files, folders or archives (.gz .tar .tar.gz .tar.xz .zip).

    Kinds are detected by content: nvidia-smi -q / -q -x, nvlink -s, topo -m, --query-gpu CSV, kernel
    logs (kmsg, dmesg, journalctl -k), lspci, dmidecode, ibstat, ipmitool, ip link, ethtool, lsmod,
    nvidia-bug-report.log(.gz), a Redfish mockup, a sosreport. meta.yaml records every input.
    """
    from agent.errors import ConfigError
    from agent.importers.bundle import import_inputs

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
    summary = import_inputs(paths, out, kinds)
    for entry in summary.entries:
        if entry.error:
            click.echo(f"error: {entry.name}: {entry.error}", err=True)
        elif entry.contributed:
            click.echo(f"{entry.name} ({entry.kind}): {'; '.join(entry.contributed)}")
        elif entry.kind == "unknown":
            click.echo(f"skipped: {entry.name}: {'; '.join(entry.skipped)}", err=True)
    click.echo(f"imported {', '.join(summary.captured)} into {out}")


@snapshot.command("import-nvidia-smi")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--out", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="New snapshot directory to write (must not exist or be empty).")
def snapshot_import_nvidia_smi(file: Path, out: Path) -> None:
    """Build a snapshot's NVML part from `nvidia-smi -q` text or `-q -x` XML (e.g. from nvidia-bug-report)."""
    from agent.importers.nvidia_smi import import_nvidia_smi

    result = import_nvidia_smi(file, out)
    click.echo(f"imported {result.gpu_count} GPU(s), driver {result.driver_version or 'unknown'}, "
               f"from {result.format} dump {file} into {out}")
    for warning in result.warnings:
        warn(warning)


def _state_dir_option(func: F) -> F:
    return click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
                        default="/var/lib/nodewarden", show_default=True,
                        help="Where the remediation journal lives: root's or yours, writable by nobody "
                        "else (exit 2 otherwise). The lock is the node's, not this folder's.")(func)


@cli.command()
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
    from agent.engine import AuditRequest
    from agent.remediate import RemediationRequest
    from agent.remediate import remediate as run_remediation
    from agent.report.remediation import render_remediation
    from remediations import ActionClass

    config = _config(config_path)
    request = RemediationRequest(
        audit=AuditRequest(config=config, simulate=simulate, snapshot=snapshot, profile=profile,
                           bmc=_bmc_options(config, bmc)),
        apply=do_apply, allow=frozenset({ActionClass.SAFE, *(ActionClass(a) for a in allow)}),
        only=only, state_dir=state_dir)
    result = run_remediation(request)
    fmt = fmt or ("table" if sys.stdout.isatty() else "json")
    click.echo(render_remediation(result, fmt), nl=False)
    sys.exit(result.exit_code)


@cli.command()
@source_options
@click.argument("run_id", required=False)
@click.option("--last", is_flag=True, help="Roll back the newest run that changed this node.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_state_dir_option
def rollback(simulate: str | None, snapshot: Path | None, config_path: Path | None, run_id: str | None,
             last: bool, fmt: str, state_dir: Path, **bmc: Any) -> None:
    """Restore exactly what a remediation run changed (RUN_ID or --last)."""
    import json

    from agent.engine import AuditRequest
    from agent.remediate import rollback as run_rollback

    if last == (run_id is not None):
        raise click.UsageError("give either RUN_ID or --last")
    config = _config(config_path)
    result = run_rollback(AuditRequest(config=config, simulate=simulate, snapshot=snapshot,
                                       bmc=_bmc_options(config, bmc)), state_dir, run_id)
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


@cli.command()
@source_options
@click.option("--listen", metavar="HOST:PORT", help="Serve /metrics here (default: daemon.listen in the config, "
              "else 127.0.0.1:9847).")
@click.option("--profile", metavar="NAME|auto", help="Profile to judge by (default: match automatically).")
@click.pass_obj
def daemon(state: State, /, simulate: str | None, snapshot: Path | None, config_path: Path | None,
           listen: str | None, profile: str | None, **bmc: Any) -> None:
    """Watch the node: poll sources, judge, log changes, serve Prometheus metrics (SIGHUP reloads)."""
    from agent.daemon import Daemon, daemon_settings
    from agent.engine import AuditRequest
    from agent.log import setup_logging

    if not state.log_format_given:
        setup_logging(max(state.verbose, 1), "json", stream=sys.stdout,  # JSON lines to journald
                      debug_http=state.debug_http)
    else:
        setup_logging(max(state.verbose, 1), state.log_format, stream=sys.stdout, debug_http=state.debug_http)
    config = _config(config_path)
    settings = daemon_settings(config, listen)
    request = AuditRequest(config=config, simulate=simulate, snapshot=snapshot, profile=profile,
                           bmc=_bmc_options(config, bmc))
    runner = Daemon(request, settings, config_path, listen, lambda cfg: _bmc_options(cfg, bmc))
    sys.exit(runner.run())


def _duration(text: str) -> Any:
    import datetime as dt
    import re

    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text.strip())
    if not match:
        raise click.BadParameter(f"{text!r}: use a number and s, m, h or d (e.g. 24h, 7d)")
    seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return dt.timedelta(seconds=seconds)


@cli.group()
def fleet() -> None:
    """Fleet compliance reports over many nodes' audits."""


@fleet.command("report")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--prometheus", metavar="URL", help="Also read nodes' findings from this Prometheus (HTTP API).")
@click.option("--format", "fmt", type=click.Choice(["html", "md", "csv", "json"]), required=True)
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write here atomically (default: stdout).")
@click.option("--stale-after", default="24h", show_default=True, metavar="DURATION",
              help="A report older than this is stale (s, m, h, d).")
@click.option("--expiring-within", default="14d", show_default=True, metavar="DURATION",
              help="Waivers expiring within this are flagged.")
@click.option("--thermal-delta", default=5.0, show_default=True, type=float, metavar="CELSIUS",
              help="A GPU this much hotter than its slot's fleet median is an outlier.")
@click.option("--expect-nodes", type=click.Path(path_type=Path, dir_okay=False, exists=True), metavar="FILE",
              help="Node names that must have reported, one per line (e.g. from the Ansible inventory).")
@click.option("--now", "now_text", hidden=True, help="Judge ages as of this ISO time (tests).")
def fleet_report(inputs: tuple[Path, ...], prometheus: str | None, fmt: str, output: Path | None, stale_after: str,
                 expiring_within: str, thermal_delta: float, expect_nodes: Path | None, now_text: str | None) -> None:
    """Summarise audit JSON files or folders of them (as fleet-audit.yml collects them). Exit 2: no input."""
    import datetime as dt

    from agent.fleet import FleetInputError, FleetOptions, build_report, input_files, progress_bar, read_reports
    from agent.fleet.render import iter_csv, iter_html, iter_json, iter_md
    from agent.fsutil import write_output_stream

    options = FleetOptions(stale_after=_duration(stale_after), expiring_within=_duration(expiring_within),
                           thermal_delta_c=thermal_delta)
    if now_text:
        options.now = dt.datetime.fromisoformat(now_text.replace("Z", "+00:00"))
    if expect_nodes is not None:
        options.expected_nodes = [line.split()[0] for line in expect_nodes.read_text().splitlines()
                                  if line.strip() and not line.lstrip().startswith("#")]
    if not inputs and not prometheus:
        raise FleetInputError("no input: give audit JSON files or folders, or --prometheus URL")
    files, missing_inputs = input_files(inputs)
    reader = read_reports(files, keep_rows=fmt == "csv", progress=progress_bar())
    try:
        skipped = missing_inputs + reader.skipped
        if prometheus:
            from agent.fleet.prometheus import read_prometheus

            for summary in read_prometheus(prometheus, keep_rows=fmt == "csv"):
                reader.add_summary(summary)
        for item in skipped:
            warn(f"skipped {item.path}: {item.reason}")
        if not reader.by_name:
            raise FleetInputError(f"no usable audit report among {len(files)} file(s)"
                                  + (f" ({len(skipped)} skipped)" if skipped else ""))
        nodes = reader.records()
        data = build_report(nodes, skipped, reader.duplicates(), options)
        chunks = {"json": lambda: iter_json(data), "md": lambda: iter_md(data), "html": lambda: iter_html(data),
                  "csv": lambda: iter_csv(reader, nodes)}[fmt]()
        if output is not None:
            write_output_stream(output, chunks)
        else:
            for chunk in chunks:
                click.echo(chunk, nl=False)
    finally:
        reader.close()


def _register_baseline() -> None:
    from agent.baseline import baseline as baseline_group  # imports agent.cli only inside its functions

    cli.add_command(baseline_group)


_register_baseline()


@cli.command("install")
@click.option("--prefix", type=click.Path(path_type=Path, file_okay=False), default=Path("/"), show_default=True,
              help="Root to install under (a staging folder or an image).")
@click.option("--bin", "binary", metavar="PATH",
              help="The nodewarden the units run (default: this installation's; layout: /opt/nodewarden/bin).")
def install_command(prefix: Path, binary: str | None) -> None:
    """Install the systemd units, an example config, the credential file and the state folder."""
    from agent.commands.install import install, summary

    click.echo(summary(install(prefix, binary)))


@cli.command("apply-boot")
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Apply under DIR instead of / (tests, chroots).")
def apply_boot_command(root: str) -> None:
    """Replay the tunables remediate persisted in /etc/nodewarden/boot.conf (run at boot)."""
    from agent.bootapply import apply_boot

    result = apply_boot(root)
    for line in result.applied:
        click.echo(f"applied {line}")
    for problem in result.problems:
        warn(problem)
    sys.exit(result.exit_code)


add_global_options(cli)  # after every command is registered: `nodewarden audit -v` as `nodewarden -v audit`


def main() -> None:
    cli(prog_name="nodewarden")
