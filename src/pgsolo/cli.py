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
import json
import logging
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg

from . import __version__
from .connect import DEFAULT_CONNECT_TIMEOUT
from .dsn import EMBEDDED, choose_dsn, parse_dsn, redact_dsn, resolved_dsn, scrub_secrets
from .durations import check_seconds
from .errors import (
    DatabaseUnavailableError,
    InvalidArgumentError,
    InvalidDsnError,
    LockTimeoutError,
    PgsoloError,
    UnsafeConnectionError,
    UsageError,
)
from .keys import Key, name_to_sql
from .locks import MAX_WAIT_SECONDS
from .monitor import MAX_OLDER_THAN

if TYPE_CHECKING:
    from .keys import Registry
    from .monitor import AdvisoryLock
    from .reasons import RunReason

__all__ = [
    "COMMANDS",
    "EXIT_FAILED",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_SKIPPED",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "EXIT_USAGE",
    "CliError",
    "Database",
    "add_command",
    "add_dsn_argument",
    "add_json_argument",
    "build_parser",
    "database",
    "main",
    "redact_dsn",
]

# Exit codes (DESIGN §5, normative).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # database unavailable
EXIT_LOST = 70  # lock lost while the command ran
EXIT_SKIPPED = 75  # busy, wait timed out, or already done
EXIT_UNSAFE = 78  # unsafe configuration (session lock behind a transaction pooler)

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler: TypeAlias = Callable[[argparse.Namespace], int]

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


class CliError(Exception):
    """Ends the command with ``message`` on stderr and exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- shared pieces -----------------------------------------------------------------------


# Options every command takes, before or after its name: pgsolo -v demo, pgsolo demo -v.
_COMMON = argparse.ArgumentParser(add_help=False)
_COMMON.add_argument(
    "-v",
    "--verbose",
    action="count",
    default=argparse.SUPPRESS,
    help="log each lock attempt (-vv: debug)",
)


def add_command(
    subparsers: Subparsers,
    name: str,
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """Declare subcommand ``name`` with the options every command takes."""
    return subparsers.add_parser(name, help=help, description=description, parents=[_COMMON])


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
        type=_seconds(1, 3600),
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
    choice = choose_dsn(flag, default=default)
    if choice.dsn and not choice.embedded:
        _validate_dsn(choice.dsn, choice.source)
    with ExitStack() as stack:
        if choice.embedded:
            _note_first_embedded_start()
            try:
                dsn = stack.enter_context(resolved_dsn(choice))
            except (OSError, subprocess.SubprocessError) as exc:
                raise CliError(
                    f"could not start the embedded server: {exc}", EXIT_UNAVAILABLE
                ) from exc
            label = f"the embedded server ({redact_dsn(dsn)})"
        else:
            dsn, label = choice.dsn, choice.display()
        try:
            yield Database(dsn, label, connect_timeout)
        except DatabaseUnavailableError as exc:  # it says where
            raise CliError(f"database unavailable: {exc}", EXIT_UNAVAILABLE) from exc
        except psycopg.OperationalError as exc:
            message = scrub_secrets(str(exc).strip(), dsn)
            raise CliError(f"database unavailable ({label}): {message}", EXIT_UNAVAILABLE) from exc
        except psycopg.Error as exc:
            message = scrub_secrets(str(exc).strip(), dsn)
            raise CliError(f"database error ({label}): {message}", EXIT_FAILED) from exc


def _validate_dsn(dsn: str, source: str) -> None:
    try:
        parse_dsn(dsn)
    except InvalidDsnError as exc:
        # Never quoted: what libpq could not read may be a password in any spelling of
        # the string (postgresql+psycopg2://, POSTGRESQL://, a quote missing...).
        raise CliError(f"invalid connection string in {source}: {exc}", EXIT_USAGE) from None


def _note_first_embedded_start() -> None:
    from .embedded import default_data_dir  # noqa: PLC0415

    data_dir = default_data_dir()
    if not (data_dir / "PG_VERSION").exists():
        print(
            f"pgsolo: creating the embedded PostgreSQL in {data_dir} (first run only)",
            file=sys.stderr,
            flush=True,
        )


def _emit_json(obj: object) -> None:
    print(json.dumps(obj), flush=True)


# -- pgsolo key --------------------------------------------------------------------------


def add_key_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "key",
        help="show the lock key of a name and the SQL to take it from psql",
        description="Show the advisory-lock key of KEY (key spec v1) and the SQL that takes"
        " the same lock from psql. KEY is a name (daily-settlement), an int64 (123) or a"
        " pair (42:1001).",
    )
    parser.add_argument("key", metavar="KEY", help="a name, an int64 or a pair N:R")
    parser.add_argument(
        "--namespace",
        type=int,
        metavar="N",
        help="derive the pair (N, int32 of the name) instead of an int64 (names only)",
    )
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_key)


def describe_key(key: Key) -> dict[str, Any]:
    """What ``pgsolo key`` reports. ``key`` is the command-line form, a string: an int64
    does not survive a trip through a JSON parser that reads numbers as doubles."""
    namespace, resource = key.value if isinstance(key.value, tuple) else (None, None)
    numeric = f"SELECT pg_try_advisory_lock({key.sql_args});"
    derived = (
        f"SELECT pg_try_advisory_lock({name_to_sql(key.name, namespace=namespace)});"
        if key.name is not None
        else numeric
    )
    return {
        "name": key.name,
        "key": key.text,
        "namespace": namespace,
        "resource": resource,
        "sql": derived,
        "sql_numeric": numeric,
    }


def cmd_key(args: argparse.Namespace) -> int:
    key = Key.parse(args.key, namespace=args.namespace)  # InvalidKeyError: exit 2
    info = describe_key(key)
    if args.json:
        _emit_json(info)
        return EXIT_OK
    kind = (
        f"pair: namespace {info['namespace']}, resource {info['resource']}"
        if key.is_pair
        else "int64"
    )
    source = f"{key.name!r} -> " if key.name is not None else ""
    print(f"{source}key {key.text} ({kind})")
    print("-- take it from psql (a session lock; pg_advisory_unlock releases it):")
    if key.name is not None:
        print(info["sql"])
    print(info["sql_numeric"])
    return EXIT_OK


# -- pgsolo demo -------------------------------------------------------------------------


def add_demo_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "demo",
        help="race worker processes for the daily settlement: exactly one runs it",
        description="The article's opening scenario: N worker processes wake up at the same"
        " instant and race for the daily settlement; pgsolo.xact_lock lets one run it and"
        " the others skip. Exits 0 when exactly one worker did the work and no row was"
        " processed twice.",
    )
    parser.add_argument(
        "--workers", type=_int_between(1, 64), default=4, metavar="N", help="default: 4"
    )
    parser.add_argument(
        "--work-seconds",
        type=_seconds(0, 3600),
        default=1.5,
        metavar="S",
        help="how long the winner keeps working with the lock held (default: 1.5)",
    )
    parser.add_argument(
        "--rows", type=_int_between(1, 1_000_000), default=20, metavar="N", help="default: 20"
    )
    add_dsn_argument(
        parser,
        help="run on this server instead of the embedded one (the demo drops and creates"
        " the table pgsolo_demo_settlements there; it never reads $PGSOLO_DSN or"
        " $DATABASE_URL)",
    )
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import JOB_KEY, TABLE, format_report, run_demo  # noqa: PLC0415

    with database(args.dsn, default=EMBEDDED) as db:
        if not args.json:
            print(
                f"pgsolo demo: {args.workers} worker processes race for {JOB_KEY!r} on"
                f" {db.label}; table {TABLE} has {args.rows} pending settlements",
                flush=True,
            )
        try:
            result = run_demo(
                db.dsn,
                workers=args.workers,
                work_seconds=args.work_seconds,
                rows=args.rows,
                log_level=args.log_level,
            )
        except LockTimeoutError as exc:
            raise CliError(
                f"another pgsolo demo kept {db.label} busy for {exc.timeout:g}s", EXIT_SKIPPED
            ) from exc
    if args.json:
        _emit_json(result.as_dict())
    else:
        format_report(result)
    return EXIT_OK if result.ok else EXIT_FAILED


# -- pgsolo run -------------------------------------------------------------------------


def add_run_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "run",
        help="run a command while holding a lock: at most one at a time, anywhere",
        description="Run COMMAND while this process holds a session-level advisory lock on"
        " KEY, on one pinned connection watched for the whole run. COMMAND comes after --"
        " (everything after it is COMMAND's, options included). KEY is a name"
        " (daily-settlement), an int64 (123) or a pair (42:1001). Busy means skip, unless"
        " --wait is given. Exit codes: COMMAND's own (128+N if killed by signal N; 127 not"
        " found, 126 not executable); 75 skipped (busy, wait timed out, or already done"
        " this period); 70 lock lost, or no answer within --check-timeout, while COMMAND"
        " ran (COMMAND gets SIGTERM, then SIGKILL after --grace); 69 database unavailable;"
        " 2 usage error, including --record or --once-per on a database where"
        " `pgsolo migrate` has not run; 1 COMMAND succeeded"
        " but its period could not be recorded. SIGTERM and SIGINT are forwarded to"
        " COMMAND; one that comes before COMMAND started ends the run without starting it"
        " (128+N, lock released). When stdin is not a terminal, COMMAND leads its own"
        " process group and every signal reaches the whole group (what COMMAND started"
        " too); with a terminal on stdin, only COMMAND's own process. If pgsolo itself is"
        " killed, COMMAND's own process is killed with it (Linux).",
    )
    parser.add_argument("--key", required=True, metavar="KEY", help="a name, an int64 or N:R")
    parser.add_argument(
        "--namespace",
        type=int,
        metavar="N",
        help="derive the pair (N, int32 of the name) instead of an int64 (names only)",
    )
    parser.add_argument(
        "--wait",
        type=_seconds(0.001, MAX_WAIT_SECONDS),
        metavar="SECONDS",
        help="wait up to SECONDS for the lock (server-side lock_timeout); default: try once",
    )
    parser.add_argument(
        "--once-per",
        metavar="PERIOD",
        help="run at most once per PERIOD by the database's clock: minute, hour, day, week,"
        " month, year (UTC) or 'N seconds' (N from 1 to 3153600000, 100 years); needs"
        " `pgsolo migrate`",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write every attempt to the ledger (pgsolo.job_runs; needs `pgsolo migrate`)",
    )
    parser.add_argument(
        "--name", metavar="NAME", help="the job's name (default: the key's name or text)"
    )
    parser.add_argument(
        "--application-name",
        metavar="NAME",
        help="application_name of pgsolo's connection (default: pgsolo:<job name>)",
    )
    parser.add_argument(
        "--check-interval",
        type=_seconds(0.01, 3600),
        default=1.0,
        metavar="S",
        help="check that the lock is still held every S seconds (default: 1)",
    )
    parser.add_argument(
        "--check-timeout",
        type=_seconds(0.1, 3600),
        default=10.0,
        metavar="S",
        help="a check (any exchange with the database once the lock is held) that gets no"
        " answer within S seconds drops the connection and counts as a lost lock; TCP"
        " keepalives and tcp_user_timeout are sized from it too (default: 10)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds(0, 3600),
        default=10.0,
        metavar="S",
        help="after a lost lock, seconds between SIGTERM and SIGKILL (default: 10)",
    )
    add_dsn_argument(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with the outcome on stderr (its last line), however the"
        " run ends once its arguments parse",
    )
    # Not dest="command": main() reads the subcommand's name from there.
    parser.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]", help="what to run"
    )
    parser.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .jobs import Job  # noqa: PLC0415
    from .supervise import RunReport, RunSignals, supervise  # noqa: PLC0415

    command, separated = _command_of(args)
    key: Key | None = None
    job: Job | None = None
    # From here on every ending prints its error and, with --json, one JSON object (the
    # last line on stderr); SIGTERM and SIGINT are handled before anything connects.
    with RunSignals().installed() as signals:
        try:
            if not command:
                raise CliError(  # noqa: TRY301 - reported below like every other ending
                    "no command to run: pgsolo run --key KEY [OPTIONS] -- COMMAND [ARG...]",
                    EXIT_USAGE,
                )
            if not separated:
                raise CliError(  # noqa: TRY301
                    "COMMAND must come after `--` (pgsolo run --key KEY [OPTIONS] -- COMMAND"
                    " [ARG...]), so that no option is ever taken for the wrong program;"
                    f" run: {_with_separator(args, command)}",
                    EXIT_USAGE,
                )
            # Everything is validated before anything connects (UsageError: exit 2).
            key = Key.parse(args.key, namespace=args.namespace)
            job = Job.define(
                key,
                name=args.name,
                lifetime="session",
                wait=args.wait,
                period=args.once_per,
                record=args.record,
                application_name=args.application_name,
            )
            with database(args.dsn, connect_timeout=args.connect_timeout) as db:
                outcome = supervise(
                    job,
                    command,
                    dsn=db.dsn,
                    label=db.label,
                    check_interval=args.check_interval,
                    check_timeout=args.check_timeout,
                    connect_timeout=db.connect_timeout,
                    grace=args.grace,
                    signals=signals,
                )
        except (CliError, UsageError) as exc:  # before any attempt: outcome null
            code = exc.code if isinstance(exc, CliError) else EXIT_USAGE
            reasons: dict[int, RunReason] = {
                EXIT_USAGE: "usage-error",
                EXIT_UNAVAILABLE: "database-unavailable",
            }
            outcome = RunReport(
                exit_code=code,
                outcome=None,
                reason=reasons.get(code, "database-error"),
                job=job.name if job is not None else (args.name or args.key),
                key=key.text if key is not None else args.key,
                key_name=key.name if key is not None else None,
                error=str(exc),
            )
        if outcome.error is not None:
            print(f"pgsolo run: error: {outcome.error}", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps(outcome.as_dict()), file=sys.stderr, flush=True)
    return outcome.exit_code


def _command_of(args: argparse.Namespace) -> tuple[list[str], bool]:
    """COMMAND [ARG...] of ``pgsolo run``, and whether ``--`` came before it (DESIGN §5).

    argparse keeps everything from COMMAND on, options included; whether it keeps the
    ``--`` itself depends on the Python version, so the command line as given decides.
    """
    command = list(args.argv)
    if command[:1] == ["--"]:
        return command[1:], True
    given: list[str] = getattr(args, "given_argv", [])
    start = len(given) - len(command)
    separated = start > 0 and given[start:] == command and given[start - 1] == "--"
    return command, separated


def _with_separator(args: argparse.Namespace, command: list[str]) -> str:
    """The command line as it should have been given, to show in the error: pgsolo's own
    options with any password blanked out, ``--``, then COMMAND's name only (its arguments
    are never shown: they may carry secrets)."""
    given: list[str] = getattr(args, "given_argv", [])
    options = given[: len(given) - len(command)] if given[-len(command) :] == command else []
    shown: list[str] = []
    for index, word in enumerate(options):
        if index > 0 and options[index - 1] == "--dsn":
            shown.append(redact_dsn(word))
        elif word.startswith("--dsn="):
            shown.append("--dsn=" + redact_dsn(word.removeprefix("--dsn=")))
        else:
            shown.append(word)
    if not options:
        shown = ["run", "--key", "KEY", "[OPTIONS]"]
    arguments = " ARG..." if len(command) > 1 else ""
    return shlex.join(["pgsolo", *shown, "--", command[0]]) + arguments


# -- pgsolo migrate ----------------------------------------------------------------------


def add_migrate_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "migrate",
        help="create or upgrade pgsolo's tables (the ledger, once-per-period records)",
        description="Create or upgrade the tables in the pgsolo schema that --record,"
        " --once-per and `pgsolo history` use. Idempotent, and safe to run from many hosts"
        " at once: versions are applied in order under an advisory lock of their own.",
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from . import ledger  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        _connection(db, "pgsolo:migrate") as conn,
    ):
        try:
            applied = ledger.migrate(conn)
        except LockTimeoutError as exc:
            raise CliError(
                f"another pgsolo migrate kept {db.label} busy for {exc.timeout:g}s", EXIT_SKIPPED
            ) from exc
        version = ledger.schema_version(conn)
    if args.json:
        _emit_json({"applied": applied, "schema_version": version, "database": db.label})
    elif applied:
        versions = ", ".join(str(v) for v in applied)
        print(f"applied migration {versions}: pgsolo schema version {version} on {db.label}")
    else:
        print(f"up to date: pgsolo schema version {version} on {db.label}")
    return EXIT_OK


# -- pgsolo history ----------------------------------------------------------------------


def add_history_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "history",
        help="show the latest recorded attempts (pgsolo run --record), newest first",
        description="Show the ledger: the latest attempts recorded by `pgsolo run --record`"
        " (or record=True), newest first, and warn about jobs whose recent attempts were"
        " mostly skipped because the previous run was still going.",
    )
    parser.add_argument("--job", metavar="NAME", help="only this job")
    parser.add_argument(
        "--limit", type=_int_between(1, 10_000), default=20, metavar="N", help="default: 20"
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_history)


HISTORY_COLUMNS = ("started_at", "job", "outcome", "reason", "duration", "host", "exit/error")


def cmd_history(args: argparse.Namespace) -> int:
    from . import ledger  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        _connection(db, "pgsolo:history") as conn,
    ):
        try:
            rows = ledger.history(conn, job=args.job, limit=args.limit)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
            raise CliError(
                f"no ledger in {db.label}: run pgsolo migrate first", EXIT_USAGE
            ) from exc
    if args.json:
        _emit_json(rows)
    elif not rows:
        print("no attempts recorded" + (f" for job {args.job}" if args.job else ""))
    else:
        _print_table([HISTORY_COLUMNS, *(_history_line(row) for row in rows)])
    for warning in ledger.skip_warning(rows):
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def _history_line(row: dict[str, Any]) -> tuple[str, ...]:
    started = str(row.get("started_at") or "")
    with suppress(ValueError):
        started = datetime.fromisoformat(started).isoformat(sep=" ", timespec="seconds")
    duration = row.get("duration_ms")
    exit_code, error = row.get("exit_code"), row.get("error")
    detail = " ".join(str(x) for x in (exit_code, error) if x is not None)
    return (
        started,
        str(row.get("job") or ""),
        str(row.get("outcome") or ""),
        str(row.get("reason") or ""),
        f"{float(duration) / 1000:.3f}s" if duration is not None else "",
        str(row.get("host") or ""),
        detail,
    )


@contextmanager
def _connection(db: Database, default_name: str) -> Iterator[psycopg.Connection[Any]]:
    from .connect import (  # noqa: PLC0415
        application_name_for,
        connection_settings,
        open_connection,
    )

    name = application_name_for(db.dsn, default_name)
    settings = connection_settings(connect_timeout=db.connect_timeout)
    with open_connection(db.dsn, application_name=name, defaults=settings) as conn:
        yield conn


# -- pgsolo locks, doctor, terminate ---------------------------------------------------


def add_locks_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "locks",
        help="who holds which advisory lock, since when, and who waits behind whom",
        description="List every advisory lock of the database, held and waiting: the key"
        " (int64 or N:R), its name (from --registry, or a --name whose key spec v1 key"
        " matches), exclusive or shared, lifetime where the server proves it, the backend"
        " (pid, application_name, client, state), how long it has been held or waited"
        " for, its current query, and the wait chains (pg_blocking_pids). One query;"
        " exit code 0.",
    )
    parser.add_argument(
        "--registry", metavar="FILE", help="a TOML registry of names ([locks], [namespaces])"
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="NAME",
        help="label the key NAME derives to (an int64, or N:<its int32> in any namespace);"
        " repeatable",
    )
    parser.add_argument("--key", metavar="KEY", help="only this key: a name, an int64 or N:R")
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_locks)


LOCKS_COLUMNS = (
    "KEY",
    "NAME",
    "MODE",
    "LIFETIME",
    "STATUS",
    "PID",
    "APPLICATION",
    "CLIENT",
    "STATE",
    "FOR",
    "BLOCKED BY",
    "QUERY",
)
QUERY_WIDTH = 60  # characters of the current query in the table (--json has more)


def cmd_locks(args: argparse.Namespace) -> int:
    from .monitor import advisory_locks, wait_chains  # noqa: PLC0415

    registry = _load_registry(args.registry) if args.registry else None
    key = Key.parse(args.key) if args.key is not None else None
    names = list(args.name)
    if key is not None and key.name is not None:
        names.append(key.name)  # the rows --key NAME selects are labelled with it
    if registry is not None and key is not None and key.name is not None:
        key = registry.resolve(key.name)
    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        _connection(db, "pgsolo:locks") as conn,
    ):
        locks = advisory_locks(conn, registry=registry, names=names, key=key)
    chains = wait_chains(locks)
    if args.json:
        _emit_json(
            {
                "database": db.label,
                "locks": [lock.as_dict() for lock in locks],
                "wait_chains": [list(chain) for chain in chains],
            }
        )
        return EXIT_OK
    held = sum(1 for lock in locks if lock.granted)
    print(f"{held} held, {len(locks) - held} waiting: advisory locks in {db.label}")
    if locks:
        _print_table([LOCKS_COLUMNS, *(_lock_line(lock) for lock in locks)])
    if chains:
        print("wait chains (each pid waits for the next; the last one holds the lock):")
        for chain in chains:
            print("  " + " -> ".join(str(pid) for pid in chain))
    return EXIT_OK


def _load_registry(path: str) -> Registry:
    from .keys import Registry  # noqa: PLC0415

    try:
        return Registry.from_toml(path)
    except OSError as exc:
        raise CliError(f"cannot read the registry {path}: {exc.strerror}", EXIT_USAGE) from exc


def _lock_line(lock: AdvisoryLock) -> tuple[str, ...]:
    from .monitor import format_seconds  # noqa: PLC0415

    age = lock.age_seconds
    since = f"{format_seconds(age)} ({lock.since_source})" if age is not None else ""
    query = lock.query or ""
    return (
        lock.key.text,
        lock.name or "",
        "shared" if lock.shared else "exclusive",
        lock.lifetime or "?",
        "held" if lock.granted else "waiting",
        str(lock.pid) if lock.pid is not None else "(prepared)",
        lock.application_name or "",
        lock.client_addr or ("local" if lock.state is not None else ""),
        lock.state or "",
        since,
        ",".join(str(pid) for pid in lock.blocked_by),
        query if len(query) <= QUERY_WIDTH else query[: QUERY_WIDTH - 3] + "...",
    )


def _print_table(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def add_doctor_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "doctor",
        help="check the production checklist against a live database",
        description="Check the database against the advisory-lock production checklist and"
        " print each check as ok, warn or fail with one line of advice: idle sessions"
        " holding session locks, idle or long transactions holding locks, the shared lock"
        " table's capacity, connections without an application_name, idle timeouts that"
        " end lock holders, lock_timeout, a pooling proxy, and PUBLIC's EXECUTE on the"
        " advisory-lock functions. Exit codes: 0 no check failed (warnings allowed);"
        " 1 at least one check failed; 69 database unavailable; 2 usage error.",
    )
    parser.add_argument(
        "--older-than",
        type=_seconds(0, MAX_OLDER_THAN),
        default=300.0,
        metavar="SECONDS",
        help="an idle session or open transaction holding a lock, or a wait, older than this"
        " is suspect (default: 300)",
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_doctor)


DOCTOR_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def cmd_doctor(args: argparse.Namespace) -> int:
    from .monitor import doctor  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        _connection(db, "pgsolo:doctor") as conn,
    ):
        checks = doctor(conn, older_than=args.older_than)
    code = EXIT_FAILED if any(check.status == "fail" for check in checks) else EXIT_OK
    if args.json:
        _emit_json(
            {"database": db.label, "exit_code": code, "checks": [c.as_dict() for c in checks]}
        )
        return code
    print(f"pgsolo doctor: {db.label}")
    for check in checks:
        print(f"[{DOCTOR_MARKS[check.status]}] {check.name}: {check.detail}")
        if check.advice:
            print(f"       advice: {check.advice}")
    return code


def add_terminate_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "terminate",
        help="end the backend that holds advisory locks (after showing what it holds)",
        description="Show what backend PID holds and waits for, ask for confirmation on the"
        " terminal, then end it with pg_terminate_backend: its session ends, its"
        " transaction rolls back and every lock it holds is released. Refuses a PID that"
        " holds no advisory lock in this database unless --force. Without a terminal on"
        " stdin, --yes is required. Exit codes: 0 terminated and its locks are gone;"
        " 1 declined, or the backend did not end; 2 usage error (including no terminal"
        " and no --yes, or nothing held without --force); 69 database unavailable.",
    )
    parser.add_argument("pid", type=_int_between(1, 2**31 - 1), metavar="PID")
    parser.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    parser.add_argument(
        "--force", action="store_true", help="terminate PID even if it holds no advisory lock"
    )
    add_dsn_argument(parser)
    parser.set_defaults(handler=cmd_terminate)


TERMINATE_WAIT_MS = 5000  # how long pg_terminate_backend waits for the backend to be gone


def cmd_terminate(args: argparse.Namespace) -> int:
    from .monitor import advisory_locks, terminate_backend  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        _connection(db, "pgsolo:terminate") as conn,
    ):
        if args.pid == conn.info.backend_pid:
            raise CliError(f"pid {args.pid} is this command's own session", EXIT_USAGE)
        locks = advisory_locks(conn, pid=args.pid)
        held = [lock for lock in locks if lock.granted]
        if not held and not args.force:
            waits = " (it only waits for one)" if locks else ""
            raise CliError(
                f"pid {args.pid} holds no advisory lock in {db.label}{waits}; nothing to"
                " release (--force terminates it anyway)",
                EXIT_USAGE,
            )
        if locks:
            first = locks[0]
            app = repr(first.application_name) if first.application_name else "no application_name"
            print(
                f"pid {args.pid} ({app}, client {first.client_addr or 'local'}, state"
                f" {first.state or 'unknown'}) in {db.label}:"
            )
            _print_table([LOCKS_COLUMNS, *(_lock_line(lock) for lock in locks)])
        else:
            print(f"pid {args.pid} holds no advisory lock in {db.label} (--force)")
        if not args.yes and not _confirmed(args.pid):
            print(f"not terminated: pid {args.pid}")
            return EXIT_FAILED
        ended = terminate_backend(conn, args.pid, wait_ms=TERMINATE_WAIT_MS)
        left = advisory_locks(conn, pid=args.pid) if ended else locks
    if not ended:
        print(
            f"pgsolo terminate: pid {args.pid} did not end within"
            f" {TERMINATE_WAIT_MS / 1000:g}s (or is not a backend of this server)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if left:
        print(
            f"pgsolo terminate: pid {args.pid} ended but {len(left)} locks still show",
            file=sys.stderr,
        )
        return EXIT_FAILED
    waited = len(locks) - len(held)
    ended_waits = f", {waited} wait(s) ended" if waited else ""
    print(f"terminated pid {args.pid}: {len(held)} advisory lock(s) released{ended_waits}")
    return EXIT_OK


def _confirmed(pid: int) -> bool:
    if not sys.stdin.isatty():
        raise CliError(
            "stdin is not a terminal, so pgsolo cannot ask for confirmation; pass --yes to"
            f" terminate pid {pid} without asking",
            EXIT_USAGE,
        )
    print(
        f"terminate pid {pid}? Its session ends, its transaction rolls back and its locks"
        " are released. [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# -- argument types ----------------------------------------------------------------------


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


def _seconds(low: float, high: float) -> Callable[[str], float]:
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


# -- the command -------------------------------------------------------------------------

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
        parents=[_COMMON],
    )
    parser.add_argument("--version", action="version", version=f"pgsolo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def _configure_logging(verbosity: int) -> int | None:
    """Warnings and errors on stderr; pgsolo's own INFO lines with -v, DEBUG with -vv.

    pgserver logs every step of starting a server at INFO: that is for its developers.
    """
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    if verbosity <= 0:
        return None
    level = logging.INFO if verbosity == 1 else logging.DEBUG
    logging.getLogger("pgsolo").setLevel(level)
    return level


def main(argv: list[str] | None = None) -> int:
    """Run ``pgsolo`` with ``argv`` (default: the process arguments); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.log_level = _configure_logging(getattr(args, "verbose", 0))
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


if __name__ == "__main__":
    sys.exit(main())
