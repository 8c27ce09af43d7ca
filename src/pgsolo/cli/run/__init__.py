"""``pgsolo run``: a command under a session lock (DESIGN §5).

Where each part lives:

- :mod:`.arguments`: its options, and COMMAND after ``--``;
- :mod:`.attempt`: one attempt, start to end: connect, drive the job plan
  (:mod:`pgsolo.jobs.plan`) with COMMAND as its work, log, count and record the ending;
- :mod:`.watch`: COMMAND as that work: started, watched with the keeper while it runs,
  stopped when the lock is lost;
- :mod:`.child`: COMMAND's process, its process group and every process it started;
- :mod:`.signals`: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2, ending a wait
  before COMMAND, forwarded while it runs;
- :mod:`.outcome`: what each ending means: the exit code and the error line;
- :mod:`.report`: the ``--json`` object.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import TYPE_CHECKING

from ...errors import (
    DatabaseUnavailableError,
    InsufficientPrivilegeError,
    PgsoloError,
    UsageError,
)
from ...keys import LEADER_PREFIX, Key, leader_key
from ..common import CliError, Subparsers, add_command, database
from ..exit_codes import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE
from ..output import JsonDestination
from .arguments import add_run_arguments, command_of, with_separator
from .report import RunReport
from .signals import RunSignals

if TYPE_CHECKING:
    from ...jobs.definition import Job
    from ...reasons import RunReason

__all__ = ["add_run_command", "cmd_run"]


def add_run_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "run",
        description="Run COMMAND while this process holds a session-level advisory lock on KEY, on "
        "one pinned connection watched for the whole run. COMMAND comes after -- "
        "(everything after it is COMMAND's, options included). KEY is a name "
        "(daily-settlement), an int64 (123) or a pair (42:1001). Busy means skip, unless "
        "--wait is given. With --leader NAME instead of --key, every replica runs the "
        "same line as a standby: one runs COMMAND, the others wait for as long as it "
        "lives, and one of them runs COMMAND once it is gone. Exit codes: COMMAND's own "
        "(128+N if killed by signal N; 127 not found, 126 not executable); 75 skipped "
        "(busy, wait timed out, or already done this period; --conflict-exit-code and "
        "--already-done-exit-code change it); 70 lock lost, or no answer within "
        "--check-timeout, while COMMAND ran (COMMAND gets SIGTERM, then SIGKILL after "
        "--grace; with --on-lost=warn it finishes, and a COMMAND that failed exits with "
        "its own code); 78 unsafe connection, nothing taken and COMMAND not started (a "
        "standby, or a transaction-pooling proxy in the way), or, while COMMAND ran, the "
        "connection moved to another backend; 69 database unavailable; 2 usage error, "
        "including --record or "
        "--once-per on a database where `pgsolo migrate` has not run; 1 COMMAND succeeded"
        " but its period could not be recorded, or, COMMAND not started, a privilege"
        " --record or --once-per needs is missing or the database refused a statement."
        " SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1"
        " and SIGUSR2 are forwarded to "
        "COMMAND; one that comes before COMMAND started ends the run without starting it "
        "(128+N, lock released). When stdin is not a terminal, COMMAND leads its own "
        "process group and every signal reaches the whole group (what COMMAND started "
        "too); with a terminal on stdin, only COMMAND's own process. The lock is held "
        "until every process COMMAND started has exited (a background job, a daemon: on "
        "Linux pgsolo is their subreaper and reaps them), unless --kill-on-exit stops "
        "them once COMMAND exits; after a lost lock they are all stopped. If pgsolo "
        "itself is killed, COMMAND's own process is killed with it (Linux).",
    )
    add_run_arguments(parser)
    parser.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    # The signals of .signals are handled from here on: one that comes while the driver
    # loads (a fifth of a second) is remembered, and ends the run before it connects,
    # with its outcome written, instead of killing pgsolo with the document unwritten.
    with RunSignals().installed() as signals:
        try:
            destination = JsonDestination.of(args)
        except UsageError as exc:  # nowhere to write the document: said as text only
            print(f"pgsolo run: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        # cli.main writes the document of a failure it catches itself (no libpq to load,
        # from the imports below on) where this one goes.
        args.write_json = destination.write if destination is not None else None
        return _run(args, signals, destination)


def _run(args: argparse.Namespace, signals: RunSignals, destination: JsonDestination | None) -> int:
    """The run, with its signals handled and its document's destination open."""
    from .attempt import supervise  # noqa: PLC0415
    from .outcome import SkipCodes  # noqa: PLC0415
    from .publish import Publisher  # noqa: PLC0415

    command, separated = command_of(args)
    key: Key | None = None
    job: Job | None = None
    publisher = Publisher(args)
    # From here on every ending prints its error and, with --json, one JSON object (where
    # JsonDestination says).
    try:
        # Everything is validated before anything connects (UsageError: exit 2).
        key = _key_of(args, command, separated=separated)
        job = _job_of(args, key)
        publisher.start()
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
                on_lost=args.on_lost,
                kill_on_exit=args.kill_on_exit,
                skip_codes=SkipCodes(args.conflict_exit_code, args.already_done_exit_code),
            )
    except (CliError, PgsoloError) as exc:  # before any attempt: outcome null
        outcome = _report_before_attempt(exc, args, key, job)
    publisher.finish(outcome.job)  # before the error line and the JSON, which end stderr
    _tell(outcome, destination)
    return outcome.exit_code


def _key_of(args: argparse.Namespace, command: list[str], *, separated: bool) -> Key:
    """The key of a run whose COMMAND is given, after ``--``: a :class:`CliError` or
    :class:`UsageError` (exit 2) otherwise."""
    if not command:
        raise CliError(
            "no command to run: pgsolo run --key KEY [OPTIONS] -- COMMAND [ARG...]", EXIT_USAGE
        )
    if not separated:
        raise CliError(
            "COMMAND must come after `--` (pgsolo run --key KEY [OPTIONS] -- COMMAND"
            " [ARG...]), so that no option is ever taken for the wrong program;"
            f" run: {with_separator(args, command)}",
            EXIT_USAGE,
        )
    if args.leader is None:
        return Key.parse(args.key, namespace=args.namespace, name=args.key_is_name)
    if args.namespace is not None or args.key_is_name:
        raise UsageError("--namespace and --key-is-name apply to --key, not to --leader")
    return leader_key(args.leader)


def _job_of(args: argparse.Namespace, key: Key) -> Job:
    """The job of a run: a session lock on ``key`` with the command line's options."""
    from ...jobs.definition import Job  # noqa: PLC0415 - after --json's destination

    leading = args.leader is not None
    given: Key | str = key
    if args.limit is not None:
        if leading:
            raise UsageError("--limit and --leader do not go together: a leader is one")
        if args.namespace is not None:  # the slots' keys are the name's own (DESIGN §2)
            raise UsageError("--limit and --namespace do not go together")
        if key.name is None:
            raise UsageError(
                f"--limit needs a --key that is a name (its slots are derived from it), got"
                f" {key.text} (--key-is-name makes a name of it)"
            )
        given = key.name
    try:
        return Job.define(
            given,
            name=args.name,
            limit=args.limit,
            lifetime="session",
            # A standby leader waits for as long as the leader lives; its sessions carry
            # the key's name, which is how `pgsolo locks` names a leader and its candidates.
            wait=math.inf if leading and args.wait is None else args.wait,
            period=args.once_per,
            timezone=args.timezone,
            record=args.record,
            application_name=args.application_name or (key.name if leading else None),
        )
    except UsageError as exc:  # said in the command line's words, not the Python API's
        exc.args = (_PYTHON_OPTION.sub(lambda m: _CLI_OPTIONS[m[1]], str(exc)),)
        raise


# Job.define's parameters, as its errors spell them (``period=``), and their options.
_CLI_OPTIONS = {
    "period": "--once-per",
    "timezone": "--timezone",
    "limit": "--limit",
    "wait": "--wait",
    "record": "--record",
    "application_name": "--application-name",
    "name": "--name",
}
_PYTHON_OPTION = re.compile(r"(?<![\w-])(" + "|".join(_CLI_OPTIONS) + r")=(?!\w)")


def _report_before_attempt(
    exc: CliError | PgsoloError, args: argparse.Namespace, key: Key | None, job: Job | None
) -> RunReport:
    """What a run that ended before any attempt reports: ``outcome`` null, and as much of
    the job and key as was validated."""
    code, reason = _ending_of(exc)
    return RunReport(
        exit_code=code,
        outcome=None,
        reason=reason,
        job=job.name if job is not None else (args.name or _given_key(args)),
        key=key.text if key is not None else _given_key(args),
        key_name=key.name if key is not None else None,
        error=str(exc),
    )


def _given_key(args: argparse.Namespace) -> str:
    """The key as the command line gave it: ``--key``'s text, or the name the key of
    ``--leader NAME`` would have."""
    return str(args.key) if args.key is not None else f"{LEADER_PREFIX}{args.leader}"


def _tell(outcome: RunReport, destination: JsonDestination | None) -> None:
    """The ending on stderr (its error line, a notice), then the ``--json`` document."""
    if outcome.error_line is not None:
        print(f"pgsolo run: error: {outcome.error_line}", file=sys.stderr, flush=True)
    if outcome.notice is not None:
        print(f"pgsolo run: {outcome.notice}", file=sys.stderr, flush=True)
    if destination is not None:
        destination.write(outcome.as_dict())


def _ending_of(exc: CliError | PgsoloError) -> tuple[int, RunReason]:
    """The exit code and ``--json`` reason of a run that ended before any attempt."""
    if isinstance(exc, CliError):
        reasons: dict[int, RunReason] = {
            EXIT_USAGE: "usage-error",
            EXIT_UNAVAILABLE: "database-unavailable",
        }
        return exc.code, reasons.get(exc.code, "database-error")
    if isinstance(exc, UsageError):
        return EXIT_USAGE, "usage-error"
    if isinstance(exc, InsufficientPrivilegeError):
        return EXIT_FAILED, "insufficient-privilege"
    if isinstance(exc, DatabaseUnavailableError):
        return EXIT_UNAVAILABLE, "database-unavailable"
    return EXIT_FAILED, "database-error"
