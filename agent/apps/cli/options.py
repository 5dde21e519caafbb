"""Command-line options shared by several modules' commands (agent.apps.cli.main, agent.apps.cli.baseline)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# Shared by every option of its kind: each click.Path() looks up the translation of its name
# (gettext searches the disk every time), ~50 us apiece over ~40 options.
PATH = click.Path(path_type=Path)
FILE_PATH = click.Path(path_type=Path, dir_okay=False)
DIR_PATH = click.Path(path_type=Path, file_okay=False)


def _complete_simulated(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from agent.apps.cli.support import complete_simulated

    return complete_simulated(ctx, param, incomplete)


def source_options(func: F) -> F:
    """--simulate / --snapshot / --config, shared by every command that reads a node."""
    options = [
        click.option("--simulate", metavar="NAME", shell_complete=_complete_simulated,
                     help="Replay a simulated node shipped with nodewarden."),
        click.option("--snapshot", type=PATH, metavar="DIR",
                     help="Replay a recorded snapshot directory."),
        click.option("--config", "config_path", type=PATH, metavar="FILE",
                     help="Config file (default /etc/nodewarden/config.yaml if present)."),
        click.option("--bmc", "bmc_url", metavar="URL", help="Redfish service of the node's BMC (https://host)."),
        click.option("--ipmi", "ipmi_host", metavar="HOST[:PORT]",
                     help="IPMI-over-LAN BMC (where Redfish is missing or unusable)."),
        click.option("--bmc-user", metavar="USER", help="BMC user name."),
        click.option("--bmc-password-file", type=FILE_PATH, metavar="FILE",
                     help="File holding the BMC password; must be readable by its owner only."),
        click.option("--bmc-ca-file", type=FILE_PATH, metavar="FILE",
                     help="CA bundle to verify the BMC's TLS certificate."),
        click.option("--bmc-insecure", is_flag=True, help="Do not verify the BMC's TLS certificate (reported)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_cli_config(config_path: Path | None) -> Any:
    """The config a command runs with: `--config FILE`, else the default file if present."""
    from agent.policy.config import load_config

    return load_config(config_path)


def bmc_options(config: Any, kw: dict[str, Any]) -> Any:
    """BmcOptions from the SOURCE OPTIONS a command got (`kw`), over the config's bmc/ipmi sections."""
    from agent.io.credentials import resolve_bmc_options

    return resolve_bmc_options(config.bmc, config.ipmi, url=kw.get("bmc_url"), ipmi=kw.get("ipmi_host"),
                               user=kw.get("bmc_user"), password_file=kw.get("bmc_password_file"),
                               ca_file=kw.get("bmc_ca_file"), insecure=bool(kw.get("bmc_insecure")))

