"""Command line (contract in DESIGN.md). Heavy modules load inside commands, and every command but
`audit` is defined in agent.apps.cli.commands and imported when named, so `nodewarden --version` and a
one-shot audit start fast."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import click

from agent import __version__
from agent.apps.cli.options import FILE_PATH, bmc_options, load_cli_config, source_options
from agent.apps.cli.support import (
    COLOR_CHOICES,
    COLOR_HELP,
    DEBUG_HTTP_HELP,
    LAZY_COMMANDS,
    LOG_FORMAT_HELP,
    VERBOSE_HELP,
    LazyCommands,
    State,
    add_global_options,
    argv_wants_json,
    click_error,
    complete_checks,
    complete_profiles,
    error,
    exit_without_teardown,
    fewer_collections,
    say,
    use_color,
    wants_json,
)
from agent.core.errors import EXIT_CANNOT_RUN, NodewardenError

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

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        # A command gets the global options (`nodewarden audit -v`) when it is looked up, and a lazy
        # one is imported then: one command run builds neither the other commands' options nor modules.
        try:
            command = self.commands[cmd_name]
        except KeyError:
            return None
        add_global_options(command)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self.commands.names() if isinstance(self.commands, LazyCommands) else sorted(self.commands)

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
    from agent.apps.cli.support import apply_logging

    state = ctx.ensure_object(State)
    state.verbose, state.log_format, state.log_format_given = verbose, log_format or "text", log_format is not None
    state.debug_http, state.color = debug_http, color
    apply_logging(state)


cli.commands = LazyCommands(cli.commands, LAZY_COMMANDS)  # the commands besides audit: agent.apps.cli.commands

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
@click.option("--output", type=FILE_PATH, metavar="FILE",
              help="Write the report to FILE (atomically; a device or FIFO in place; - is stdout).")
@click.pass_obj
@fewer_collections
def audit(state: State, /, simulate: str | None, snapshot: Path | None, config_path: Path | None,
          profile: str | None, only: tuple[str, ...], skip: tuple[str, ...], fmt: str | None,
          output: Path | None, **bmc: Any) -> None:
    """Audit a node against its profile. Exit 0 no fail, 1 fail, 2 bad input, 3 could not run."""
    from agent.apps.cli.support import check_selection, stdout_is_tty
    from agent.engine.audit import AuditRequest, run_audit
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
        from agent.io.fsutil import write_output  # its socket and secrets imports only when writing a file

        write_output(output, text)
    else:
        click.echo(text, nl=False, color=color)
    sys.exit(report.exit_code)


def main() -> None:
    """The console script: the command, then an exit that skips the interpreter's teardown where it can."""
    try:
        cli(prog_name="nodewarden")
    except SystemExit as exc:
        if isinstance(exc.code, int | None):
            exit_without_teardown(exc.code or 0)
        raise
