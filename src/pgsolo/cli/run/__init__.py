"""``pgsolo run``: a command under a session lock (DESIGN §5)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING

from ...drivers.conninfo import (
    redact_dsn,
)
from ...errors import (
    UsageError,
)
from ...keys import Key
from ...locking.core import MAX_WAIT_SECONDS
from ..exit_codes import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from ...reasons import RunReason
from ..common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    database,
    seconds_between,
)


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
        type=seconds_between(0.001, MAX_WAIT_SECONDS),
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
        type=seconds_between(0.01, 3600),
        default=1.0,
        metavar="S",
        help="check that the lock is still held every S seconds (default: 1)",
    )
    parser.add_argument(
        "--check-timeout",
        type=seconds_between(0.1, 3600),
        default=10.0,
        metavar="S",
        help="a check (any exchange with the database once the lock is held) that gets no"
        " answer within S seconds drops the connection and counts as a lost lock; TCP"
        " keepalives and tcp_user_timeout are sized from it too (default: 10)",
    )
    parser.add_argument(
        "--grace",
        type=seconds_between(0, 3600),
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
    from ...jobs.definition import Job  # noqa: PLC0415
    from .attempt import supervise  # noqa: PLC0415
    from .report import RunReport  # noqa: PLC0415
    from .signals import RunSignals  # noqa: PLC0415

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
