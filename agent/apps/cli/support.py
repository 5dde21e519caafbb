"""What every command shares: global options (before or after the command), colour, messages, completion.

- `-v`/`-vv`, `--log-format`, `--debug-http` and `--color` are the root group's options and are
  accepted after any subcommand too (`nodewarden audit -v`): `add_global_options` gives every
  command of the tree the same options, whose callbacks add to the one `State`.
- Colour: `--color auto` (the default) colours a terminal unless `NO_COLOR` is set (and not empty,
  https://no-color.org) or `TERM=dumb`; `always` and `never` win over both.
- `warn` / `error`: `nodewarden: warning: ...` lines on stderr, or JSON lines (the log's own
  fields: ts, level, logger, msg) under `--log-format json`; click's usage errors follow too.
- Completion for `--simulate`, `--profile`, `--only`, `--skip` (click's `_NODEWARDEN_COMPLETE`).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agent.core.errors import ConfigError

if TYPE_CHECKING:  # `nodewarden --version` loads neither logging nor completion
    from click.shell_completion import CompletionItem

F = TypeVar("F", bound=Callable[..., Any])
COLOR_CHOICES = ("auto", "always", "never")
GLOBAL_MARK = "nodewarden_global"  # attribute set on the per-command copies of the global options


class State:
    verbose: int = 0
    debug_http: bool = False
    log_format: str = "text"
    log_format_given: bool = False
    color: str = "auto"


def _state(ctx: click.Context | None = None) -> State | None:
    ctx = ctx or click.get_current_context(silent=True)
    return ctx.find_object(State) if ctx is not None else None


def apply_logging(state: State) -> None:
    from agent.io.log import setup_logging

    setup_logging(state.verbose, state.log_format, debug_http=state.debug_http)


def _more_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    state = _state(ctx)
    if state is not None and value:
        state.verbose += value
        apply_logging(state)


def _log_format(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    state = _state(ctx)
    if state is not None and value is not None:
        state.log_format, state.log_format_given = value, True
        apply_logging(state)


def _debug_http(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    state = _state(ctx)
    if state is not None and value:
        state.debug_http = True
        apply_logging(state)


def _color(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    state = _state(ctx)
    if state is not None and value is not None:
        state.color = value


VERBOSE_HELP = "More output: -v lists passes and the reason of every finding, -vv adds tracebacks and debug logs."
LOG_FORMAT_HELP = "Log lines, warnings and errors as text or JSON lines (default: text; JSON for the daemon)."
DEBUG_HTTP_HELP = "Log the BMC libraries' HTTP requests and responses too (secrets redacted)."
COLOR_HELP = "Colour the table: auto (a terminal, unless NO_COLOR is set), always or never."


# The global options are accepted by every command (`nodewarden install -v` works), but a command's
# --help describes them as they act there: --color only where a findings table is coloured,
# --debug-http only where a BMC is read; elsewhere they are accepted and hidden.
FINDINGS_COMMANDS = frozenset({"audit", "accept"})  # they print findings: -v lists passes, --color colours
PLAIN_VERBOSE_HELP = "More log output: -v informational messages, -vv debug logs and tracebacks on errors."
VERBOSE_HELPS = {"import": "-v lists every file and what it gave (default: a line per kind); -vv adds debug logs."}


def _reads_bmc(command: click.Command) -> bool:
    return any(param.name == "bmc_url" for param in command.params) or command.name == "daemon"


def _global_params(command: click.Command | None = None) -> list[click.Option]:
    findings = command is None or command.name in FINDINGS_COMMANDS
    bmc = command is None or _reads_bmc(command)
    params = [
        click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_more_verbose,
                     help=VERBOSE_HELP if findings or command is None
                     else VERBOSE_HELPS.get(str(command.name), PLAIN_VERBOSE_HELP)),
        click.Option(["--log-format"], type=click.Choice(["text", "json"]), expose_value=False,
                     callback=_log_format, help=LOG_FORMAT_HELP),
        click.Option(["--debug-http"], is_flag=True, expose_value=False, callback=_debug_http,
                     help=DEBUG_HTTP_HELP, hidden=not bmc),
        click.Option(["--color"], type=click.Choice(COLOR_CHOICES), expose_value=False, callback=_color,
                     metavar="auto|always|never", help=COLOR_HELP, hidden=not findings),
    ]
    for param in params:
        setattr(param, GLOBAL_MARK, True)
    return params


def add_global_options(command: click.Command) -> None:
    """`command` and every command under it accept the global options (once: again is a no-op)."""
    names = {opt for p in command.params for opt in getattr(p, "opts", ())}
    if "--log-format" not in names:
        command.params.extend(_global_params(command))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)


# Commands defined in their own modules and imported when first named: name -> (module, attribute).
LAZY_COMMANDS = {
    "baseline": ("agent.apps.cli.baseline", "baseline"),  # it imports agent.apps.cli.main only inside its functions
    "accept": ("agent.apps.cli.accept", "accept"),
    "health-check": ("agent.apps.cli.health_check", "health_check"),
    "ledger": ("agent.apps.cli.ledger", "ledger"),
    **{name: ("agent.apps.cli.commands", attribute) for name, attribute in (
        ("profiles", "profiles"), ("snapshot", "snapshot"), ("remediate", "remediate"), ("rollback", "rollback"),
        ("daemon", "daemon"), ("fleet", "fleet"), ("install", "install_command"),
        ("apply-boot", "apply_boot_command"))},
}


class LazyCommands(dict[str, click.Command]):
    """A group's `commands`, where a command of `lazy` is imported when it is first looked up by name."""

    def __init__(self, loaded: Mapping[str, click.Command], lazy: dict[str, tuple[str, str]]) -> None:
        super().__init__(loaded)
        self.lazy = lazy

    def names(self) -> list[str]:
        return sorted({*self, *self.lazy})

    def __contains__(self, name: object) -> bool:  # a command not imported yet is still one of the group's
        return dict.__contains__(self, name) or name in self.lazy

    def __missing__(self, name: str) -> click.Command:
        if name not in self.lazy:
            raise KeyError(name)
        import importlib

        module, attribute = self.lazy[name]
        command: click.Command = getattr(importlib.import_module(module), attribute)
        self[name] = command
        return command


def use_color(tty: bool) -> bool:
    state = _state()
    choice = state.color if state is not None else "auto"
    if choice != "auto":
        return choice == "always"
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


# --- messages on stderr ----------------------------------------------------------------------------


def wants_json(ctx: click.Context | None = None) -> bool:
    """`--log-format json` was given, wherever on the line (an error may come before its callback ran)."""
    ctx = ctx or click.get_current_context(silent=True)
    state = _state(ctx)
    if state is not None and state.log_format_given:
        return state.log_format == "json"
    argv: Sequence[str] = ctx.find_root().meta.get("nodewarden.argv", ()) if ctx is not None else ()
    return argv_wants_json(argv)


def argv_wants_json(argv: Sequence[str]) -> bool:
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--log-format=json" or (arg == "--log-format" and args[i + 1: i + 2] == ["json"]):
            return True
    return False


def json_line(level: str, message: str, **fields: Any) -> str:
    import logging

    from agent.io.log import JsonFormatter, redact

    record = logging.LogRecord("nodewarden", getattr(logging, level.upper(), logging.ERROR), __file__, 0,
                               redact(message), None, None)
    record.fields = fields
    return JsonFormatter().format(record)


def say(level: str, message: str, *, as_json: bool | None = None, **fields: Any) -> None:
    """`nodewarden: LEVEL: message` on stderr, or one JSON line under --log-format json."""
    if as_json if as_json is not None else wants_json():
        import logging

        known = isinstance(logging.getLevelName(level.upper()), int)  # "internal error" is no log level
        click.echo(json_line(level if known else "error", message if known else f"{level}: {message}", **fields),
                   err=True)
    else:
        from agent.core.sanitise import clean
        from agent.io.log import redact

        click.echo(f"nodewarden: {level}: {clean(redact(message), newlines=True)}", err=True)


def warn(message: str) -> None:
    say("warning", message)


def error(message: str, **fields: Any) -> None:
    say("error", message, **fields)


def click_error(exc: click.ClickException, as_json: bool) -> None:
    """A usage error as JSON (`--log-format json`); as text, click's own rendering with the usage line."""
    if as_json:
        click.echo(json_line("error", exc.format_message(), exit_code=exc.exit_code), err=True)
    else:
        exc.show()


# --- --only / --skip --------------------------------------------------------------------------------


class SelectionError(ConfigError):
    """`--only`/`--skip` named no check (exit 2); JSON lines carry the ids as `known_checks`."""

    def __init__(self, message: str, known: list[str]) -> None:
        super().__init__(message)
        self.fields = {"known_checks": known}


def check_selection(only: Sequence[str], skip: Sequence[str]) -> None:
    """A glob that matches no check is a typo that would silently select nothing: exit 2, with the ids."""
    from checks import all_checks

    ids = [c.id for c in all_checks()]
    unmatched = [f"{flag} {glob!r}" for flag, globs in (("--only", only), ("--skip", skip)) for glob in globs
                 if not any(fnmatch.fnmatchcase(i, glob) for i in ids)]
    if not unmatched:
        return
    import textwrap

    areas: dict[str, list[str]] = {}
    for check_id in ids:
        areas.setdefault(check_id.split(".", 1)[0], []).append(check_id)
    listing = "\n".join(textwrap.fill(" ".join(found), 100, initial_indent=f"  {area + ':':<11} ",
                                      subsequent_indent=" " * 14, break_on_hyphens=False)
                        for area, found in areas.items())
    verb = "matches" if len(unmatched) == 1 else "match"
    raise SelectionError(f"{', '.join(unmatched)} {verb} no check; the check ids are:\n{listing}", ids)


# --- shell completion -------------------------------------------------------------------------------


def complete_simulated(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    from agent.sources.snapshot import list_simulated

    try:
        names = sorted(list_simulated())
    except Exception:  # noqa: BLE001 - completion never fails the shell
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_checks(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    from checks import all_checks

    ids = [c.id for c in all_checks()]
    globs = sorted({f"{i.split('.', 1)[0]}.*" for i in ids})
    return [CompletionItem(v) for v in (*globs, *ids) if v.startswith(incomplete)]


def complete_profiles(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    try:
        from agent.policy.profiles import ProfileStore

        store = ProfileStore([])
        names = [n for n in store.names() if not store.file(n).data.get("abstract")]
    except Exception:  # noqa: BLE001 - completion never fails the shell
        return []
    return [CompletionItem(n) for n in ("auto", *names) if n.startswith(incomplete)]


def fewer_collections(func: F) -> F:
    """`func` run with a young generation of 50,000 objects for the cyclic collector (default 700).

    A one-shot audit allocates a few hundred thousand objects that live until it ends (modules,
    facts, findings); at 700 the collector walks them ~50 times (~3 ms). Few of them form cycles,
    so the larger threshold costs little memory; the caller's threshold is restored afterwards.
    """
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import gc

        before = gc.get_threshold()
        gc.set_threshold(50_000, *before[1:])
        try:
            return func(*args, **kwargs)
        finally:
            gc.set_threshold(*before)

    return wrapper  # type: ignore[return-value]


def exit_without_teardown(code: int) -> None:
    """Leave as the interpreter would (atexit handlers, then the standard streams flushed), but without
    freeing every object and module one by one: that teardown costs a one-shot audit ~8 ms, a tenth of
    its own work. Returns (and the caller exits normally) while a non-daemon thread runs, which the
    interpreter would wait for, or when a stream cannot be flushed, so that the usual error shows.
    """
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(not t.daemon for t in threading.enumerate() if t is not main_thread):
        return
    atexit._run_exitfuncs()  # logging's flush, multiprocessing's and tempfile's clean-up
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return  # e.g. a closed pipe: the normal exit reports it as it always did
    os._exit(code)


def stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


# The machine's fault, not the input's: a full disk or quota, an I/O error, a read-only file system.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM,
                                 errno.EMFILE, errno.ENFILE})


@contextlib.contextmanager
def os_errors_as_exits(what: str) -> Iterator[None]:
    """An OSError escaping `what` (snapshot capture, import) is one clear line, never "internal error" (3):
    exit 1 (EnvironmentFault) for the machine's fault, exit 2 (SnapshotError) for anything else, which
    the input or the operator's paths caused (a name too long, a folder not allowed)."""
    from agent.core.errors import EnvironmentFault, NodewardenError, SnapshotError

    try:
        yield
    except NodewardenError:
        raise
    except OSError as exc:
        where = exc.filename if isinstance(exc.filename, str) else None
        reason = exc.strerror or str(exc)
        if exc.errno in _ENVIRONMENT_ERRNOS:
            raise EnvironmentFault(f"{what} failed: {reason} (nothing was published)", path=where) from None
        raise SnapshotError(f"{what} failed: {reason}", path=where) from None
