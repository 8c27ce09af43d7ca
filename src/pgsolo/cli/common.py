"""What every command shares: its common options, where it connects (and how a failure
to connect becomes exit 69), output, and argument types."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from .._logging import LOG_FORMATS
from .._types import check_seconds
from ..dsn import DEFAULT_CONNECT_TIMEOUT, DsnChoice, choose_dsn, resolved_dsn
from ..errors import (
    DatabaseUnavailableError,
    InvalidArgumentError,
    InvalidDsnError,
)
from . import COMMANDS
from .exit_codes import (
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    import psycopg

    from ..drivers.kinds import SyncConnectionLike

# The driver (psycopg, and libpq under it) is imported by the functions that connect, not
# with this module: `pgsolo --help`, `pgsolo key` and `pgsolo --version` never load it, and
# a host without libpq gets a hint rather than an ImportError (cli.main).


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Parser(argparse.ArgumentParser):
    """argparse's parser for pgsolo's commands: ``given``, the command line, is what its
    usage errors blank every password of, since argparse echoes what it refused
    (``unrecognized arguments: password=...``, an unquoted key=value DSN); and no option
    is taken by an abbreviation of its name (``--ds`` for ``--dsn``), whose value the
    messages that blank ``--dsn``'s would not know for a DSN."""

    def __init__(self, *args: Any, given: Sequence[str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given = tuple(given)

    def error(self, message: str) -> NoReturn:
        hint = _dashed_key_hint(self.given, positional=self.prog.endswith(" key"))
        super().error(without_secrets(message + hint, self.given))


# A pair key with a negative part, as `pgsolo locks` shows one: argparse takes a word that
# starts with "-" for an option unless it is a plain negative number.
_DASHED_PAIR = re.compile(r"-\d+:-?\d+")


def _dashed_key_hint(given: Sequence[str], *, positional: bool) -> str:
    """How to write a key of the command line ``given`` that argparse took for an option
    (``positional``: `pgsolo key KEY`'s, else an option's, ``--key KEY``)."""
    words = given[: given.index("--")] if "--" in given else given
    for word in words:
        if _DASHED_PAIR.fullmatch(word):
            written = f"after --: pgsolo key -- {word}" if positional else f"--key={word}"
            return f" ({word} starts with '-': write it {written})"
    return ""


def without_secrets(text: str, words: Iterable[str]) -> str:
    """``text`` with every password that a word of ``words`` (a command line) holds
    blanked out: a connection string's, whole (``--dsn=postgresql://u:pw@h``) or in
    pieces (``password=pw``, the words of an unquoted key=value string)."""
    from ..drivers.conninfo import scrub_secrets  # noqa: PLC0415 - see the top of this module

    for word in words:
        value = word.partition("=")[2] if word.startswith("-") else word
        if "://" in value or "password" in value.lower():
            text = scrub_secrets(text, value)
    return text


Handler: TypeAlias = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """Ends the command with ``message`` on stderr and exit code ``code``; ``reason`` is
    the ``error.code`` of its ``--json`` document (default: one per exit code)."""

    def __init__(self, message: str, code: int = EXIT_FAILED, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


# Options every command takes, before or after its name: pgsolo -v demo, pgsolo demo -v.
COMMON = argparse.ArgumentParser(add_help=False)
# Their argparse actions, as add_argument() returns them (argparse lists a parser's options
# nowhere public): what tells which of them take a value.
COMMON_OPTIONS = (
    COMMON.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log job outcomes (-vv: every lock event, debug)",
    ),
    COMMON.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="log lines as text (default) or one JSON object per line",
    ),
)


def add_command(
    subparsers: Subparsers,
    name: str,
    *,
    description: str,
) -> argparse.ArgumentParser:
    """Declare subcommand ``name`` with the options every command takes, and its help
    line from :data:`pgsolo.cli.COMMANDS`, where ``pgsolo --help`` reads it too."""
    _, line = COMMANDS[name]
    return subparsers.add_parser(name, help=line, description=description, parents=[COMMON])


def add_dsn_argument(parser: argparse.ArgumentParser, *, help: str | None = None) -> None:
    """``--dsn`` and ``--connect-timeout``: every command that connects takes both."""
    parser.add_argument(
        "--dsn",
        metavar="DSN",
        help=help
        or "connection string (URI or key=value, several hosts allowed: host=a,b"
        " target_session_attrs=read-write), or 'embedded'; default: $PGSOLO_DSN, then"
        " $DATABASE_URL, then libpq defaults (PGHOST, ...)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=seconds_between(1, 3600),
        metavar="S",
        help=f"give up connecting after S seconds, for each host of the DSN (libpq's"
        f" minimum is 2); default: the DSN's connect_timeout, then $PGCONNECT_TIMEOUT,"
        f" then {DEFAULT_CONNECT_TIMEOUT}",
    )


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass(frozen=True, slots=True)
class Database:
    """Where a command connects: ``dsn`` for psycopg, ``label`` for people, and the
    ``--connect-timeout`` given (None: the DSN's, the environment's, or pgsolo's)."""

    dsn: str
    label: str
    connect_timeout: float | None = None


@contextmanager
def database(
    flag: str | None, *, default: str | None = None, connect_timeout: float | None = None
) -> Iterator[Database]:
    """Resolve the connection (``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq
    defaults, or ``default`` instead of the last three), start the embedded server for
    ``embedded``, and turn connection failures inside the block into exit code 69.
    """
    from ..drivers import driver_errors, is_unavailable  # noqa: PLC0415
    from ..drivers.conninfo import redact_dsn, scrub_secrets  # noqa: PLC0415

    choice = choose_dsn(flag, default=default)
    if choice.dsn and not choice.embedded:
        validate_dsn(choice.dsn, choice.source)
    with ExitStack() as stack:
        if choice.embedded:
            import subprocess  # noqa: PLC0415  (only the embedded server's start needs it)

            note_first_embedded_start()
            try:
                dsn = stack.enter_context(resolved_dsn(choice))
            except (OSError, subprocess.SubprocessError) as exc:
                raise CliError(
                    f"could not start the embedded server: {exc}", EXIT_UNAVAILABLE
                ) from exc
            label = f"the embedded server ({redact_dsn(dsn)})"
        else:
            dsn, label = choice.dsn, display(choice)
        try:
            yield Database(dsn, label, connect_timeout)
        except DatabaseUnavailableError as exc:  # it says where
            raise CliError(f"database unavailable: {exc}", EXIT_UNAVAILABLE) from exc
        except driver_errors() as exc:
            message = scrub_secrets(str(exc).strip(), dsn)
            if is_unavailable(exc):
                raise CliError(
                    f"database unavailable ({label}): {message}", EXIT_UNAVAILABLE
                ) from exc
            raise CliError(
                f"database error ({label}): {message}", EXIT_FAILED, "database-error"
            ) from exc


def display(choice: DsnChoice) -> str:
    """Where ``choice`` connects, safe to print."""
    from ..drivers.conninfo import redact_dsn  # noqa: PLC0415

    if choice.embedded:
        return "the embedded server"
    if not choice.dsn:
        return "libpq defaults (PGHOST, PGPORT, PGDATABASE, ...)"
    return redact_dsn(choice.dsn)


def validate_dsn(dsn: str, source: str) -> None:
    """A connection string libpq would refuse, as a usage error (exit 2) before anything
    connects; never quoted (what libpq could not read may be a password)."""
    from ..drivers.conninfo import parse_dsn  # noqa: PLC0415

    try:
        parse_dsn(dsn)
    except InvalidDsnError as exc:
        # Never quoted: what libpq could not read may be a password in any spelling of
        # the string (postgresql+psycopg2://, POSTGRESQL://, a quote missing...).
        raise CliError(f"invalid connection string in {source}: {exc}", EXIT_USAGE) from None


def note_first_embedded_start() -> None:
    from ..embedded import default_data_dir  # noqa: PLC0415

    data_dir = default_data_dir()
    if not (data_dir / "PG_VERSION").exists():
        print(
            f"pgsolo: creating the embedded PostgreSQL in {data_dir} (first run only)",
            file=sys.stderr,
            flush=True,
        )


@contextmanager
def connection(db: Database, default_name: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of pgsolo's own to ``db``, named ``default_name`` in
    ``pg_stat_activity`` unless the DSN or ``PGAPPNAME`` names it."""
    from ..drivers.connect import open_connection  # noqa: PLC0415
    from ..drivers.conninfo import application_name_for, connection_settings  # noqa: PLC0415

    name = application_name_for(db.dsn, default_name)
    settings = connection_settings(connect_timeout=db.connect_timeout)
    with open_connection(db.dsn, application_name=name, defaults=settings) as conn:
        yield conn


def where(conn: SyncConnectionLike) -> tuple[str, str]:
    """The database's name and the server's address (``host:port``; a unix socket's
    directory as the host), as every ``--json`` document and pgsolo's log lines give
    them: never a connection string, so never a password."""
    from ..drivers import adapt_sync  # noqa: PLC0415

    info = adapt_sync(conn).server_info()
    return info.database, info.address


def print_table(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type for a number of seconds: pgsolo's one duration check."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        try:
            return check_seconds("the value", value, low, high)
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_key_is_name_argument(parser: argparse.ArgumentParser) -> None:
    """``--key-is-name``: the escape from :meth:`~pgsolo.Key.parse`'s refusals."""
    parser.add_argument(
        "--key-is-name",
        action="store_true",
        help="take KEY as a name exactly as given, never as an int64 or a pair: for a name"
        " such as '42:abc' or one with blanks around it, which are refused without it",
    )
