"""Errors that the CLI turns into exit codes and one-line messages.

Exit codes are a contract (DESIGN.md): 2 = bad usage, config, profile or
input; 3 = the audit could not run at all.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_CANNOT_RUN = 3


class NodewardenError(Exception):
    """An error with a message meant for the operator, not a traceback."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        return where + self.message


class ConfigError(NodewardenError):
    """Bad config file, waiver file or command-line combination."""


class ProfileError(NodewardenError):
    """A profile that cannot be located, parsed, validated or merged."""


class SnapshotError(NodewardenError):
    """A snapshot directory that is missing, unreadable or partial."""


class AuditError(NodewardenError):
    """The audit could not run at all."""

    exit_code = EXIT_CANNOT_RUN


class EnvironmentFault(NodewardenError):
    """The machine failed the command (a full disk, an I/O error), not its input: exit 1, never 3."""

    exit_code = EXIT_FAIL
