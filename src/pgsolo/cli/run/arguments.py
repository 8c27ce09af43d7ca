"""The arguments of ``pgsolo run`` (DESIGN §5): its options, and COMMAND after ``--``."""

from __future__ import annotations

import argparse
import math
import shlex

from ..._types import MAX_WAIT_SECONDS
from ...keys import MAX_SEMAPHORE_LIMIT
from ..common import (
    add_dsn_argument,
    add_key_is_name_argument,
    seconds_between,
    without_secrets,
)
from ..exit_codes import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_SKIPPED,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_USAGE,
)
from ..output import add_json_destination_arguments

__all__ = ["ON_LOST", "add_run_arguments", "command_of", "skip_exit_code", "with_separator"]

ON_LOST = ("terminate", "warn")  # what a lost lock does to COMMAND; the first is the default

# Exit codes that already mean something else (DESIGN §5): a skip that exits with one of
# them could not be told apart from that ending. 126 and up are the shell's (not found,
# not executable, killed by a signal).
_TAKEN_EXIT_CODES = (EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_LOST, EXIT_UNSAFE)
_MAX_SKIP_EXIT_CODE = 125


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of ``pgsolo run``, then ``-- COMMAND [ARG...]``."""
    _add_lock_options(parser)
    _add_watch_options(parser)
    _add_exit_options(parser)
    add_dsn_argument(parser)
    _add_metrics_options(parser)
    add_json_destination_arguments(parser)
    # Not dest="command": main() reads the subcommand's name from there.
    parser.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]", help="what to run"
    )


def _add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """Where the run's metrics go (``pgsolo[prometheus]``; published by publish.py)."""
    group = parser.add_argument_group("metrics (needs pgsolo[prometheus])")
    group.add_argument(
        "--metrics-textfile",
        metavar="PATH",
        help="when the run ends, write its metrics to PATH (*.prom, for node_exporter's"
        " textfile collector), atomically; a job's last success already in the file is kept"
        " until a run completes it again",
    )
    group.add_argument(
        "--pushgateway",
        metavar="URL",
        help="when the run ends, push its metrics to the Prometheus Pushgateway at URL,"
        " grouped by job=<the job's name> (POST: a run that did not complete keeps the last"
        " success an earlier push set)",
    )


def _add_lock_options(parser: argparse.ArgumentParser) -> None:
    """What to lock, how long to wait for it, and the job around it."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", metavar="KEY", help="a name, an int64 or N:R")
    what.add_argument(
        "--leader",
        metavar="NAME",
        help="instead of --key: run COMMAND as the leader NAME, a standby on every replica"
        " that runs the same line: one runs COMMAND, the others wait (forever, unless"
        " --wait) without holding back VACUUM, and one of them starts COMMAND once the"
        " leader's session ends; the key is the name pgsolo:leader:NAME",
    )
    add_key_is_name_argument(parser)
    parser.add_argument(
        "--namespace",
        type=int,
        metavar="N",
        help="derive the pair (N, int32 of the name) instead of an int64 (names only)",
    )
    parser.add_argument(
        "--wait",
        type=wait_seconds,
        metavar="SECONDS",
        help="wait up to SECONDS for the lock, or `forever` (a standby that takes over when"
        " the holder ends); the wait holds back no VACUUM (it runs in short slices);"
        " default: try once",
    )
    parser.add_argument(
        "--limit",
        type=slot_count,
        metavar="N",
        help="let up to N runs of the job run at once (across every host): each holds one of"
        " N slots, the keys of the semaphore named KEY (pgsolo:semaphore:KEY:0 to"
        " KEY:N-1, as pgsolo.semaphore() takes them); busy means every slot is held. KEY"
        " must be a name; not with --leader, --namespace or --once-per. Default: KEY's"
        " own lock",
    )
    parser.add_argument(
        "--once-per",
        metavar="PERIOD",
        help="run at most once per PERIOD by the database's clock: minute, hour, day, week,"
        " month, year (or hourly, daily, ...: calendar periods, in UTC unless --timezone),"
        " or a number of seconds from 1 to 3153600000 (100 years) counted from the Unix"
        " epoch: 900, '900 seconds', 15m, 24h, 1d, 2w; needs `pgsolo migrate`",
    )
    parser.add_argument(
        "--timezone",
        metavar="ZONE",
        help="where a --once-per day, week, month or year starts at midnight: an IANA name"
        " with its region (Europe/Paris, not CET); a day is then 23 or 25 hours long when"
        " the clocks change; default: UTC",
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
        help="application_name of pgsolo's connection (default: pgsolo:<job name>; with"
        " --limit N, pgsolo:semaphore:KEY/N)",
    )


def _add_watch_options(parser: argparse.ArgumentParser) -> None:
    """How the lock is watched while COMMAND runs, and how COMMAND is stopped on a loss."""
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
        " keepalives and tcp_user_timeout are sized from it too, and the server gives the"
        " connection up after more than --check-interval plus S of silence (default: 10)",
    )
    parser.add_argument(
        "--grace",
        type=seconds_between(0, 3600),
        default=10.0,
        metavar="S",
        help="after a lost lock (or with --kill-on-exit), seconds between SIGTERM and"
        " SIGKILL (default: 10); the server gives a silent host up only after them",
    )
    parser.add_argument(
        "--kill-on-exit",
        action="store_true",
        help="once COMMAND exits, SIGTERM what it started and left running (a background"
        " job, a daemon), SIGKILL after --grace, then let the lock go; default: hold the"
        " lock until every process COMMAND started has exited",
    )
    parser.add_argument(
        "--on-lost",
        choices=ON_LOST,
        default=ON_LOST[0],
        help="a lock lost while COMMAND runs: terminate stops COMMAND (SIGTERM, then SIGKILL"
        " after --grace); warn prints one warning and lets it finish, then exits 70 unless"
        " COMMAND failed (default: terminate)",
    )


def _add_exit_options(parser: argparse.ArgumentParser) -> None:
    """The exit codes of a skip (flock's -E), for schedulers that take any non-zero as a
    failure (a Kubernetes Job with backoffLimit: 0)."""
    parser.add_argument(
        "--conflict-exit-code",
        type=skip_exit_code,
        default=EXIT_SKIPPED,
        metavar="N",
        help=f"exit N when skipped because KEY is busy or --wait timed out (default:"
        f" {EXIT_SKIPPED}; 0 for Kubernetes)",
    )
    parser.add_argument(
        "--already-done-exit-code",
        type=skip_exit_code,
        default=EXIT_SKIPPED,
        metavar="N",
        help=f"exit N when skipped because --once-per's period is already done (default:"
        f" {EXIT_SKIPPED})",
    )


def skip_exit_code(text: str) -> int:
    """An argparse type for the exit code of a skip: 0, or 3 to 125 but for the codes that
    already mean another ending (1, 2, 69, 70, 78), so that the exit code alone still
    tells every ending apart (COMMAND's own codes aside)."""
    try:
        code = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an exit code: {text!r}") from None
    if not 0 <= code <= _MAX_SKIP_EXIT_CODE or code in _TAKEN_EXIT_CODES:
        taken = ", ".join(str(c) for c in _TAKEN_EXIT_CODES)
        raise argparse.ArgumentTypeError(
            f"{code} cannot be a skip's exit code: use 0 to {_MAX_SKIP_EXIT_CODE}, except"
            f" {taken} (pgsolo's other endings)"
        )
    return code


def command_of(args: argparse.Namespace) -> tuple[list[str], bool]:
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


def with_separator(args: argparse.Namespace, command: list[str]) -> str:
    """The command line as it should have been given, to show in the error: pgsolo's own
    options with any password blanked out, ``--``, then COMMAND's name only (its arguments
    are never shown: they may carry secrets)."""
    # Here, not at the top: the driver layer loads libpq, which `pgsolo run --help` skips.
    from ...drivers.conninfo import redact_dsn  # noqa: PLC0415

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
    # COMMAND's name may be the rest of an unquoted DSN (--dsn host=h password=pw ...).
    line = shlex.join(["pgsolo", *shown, "--", command[0]]) + arguments
    return without_secrets(line, given)


def slot_count(text: str) -> int:
    """``--limit``: how many runs at once, 1 to :data:`~pgsolo.keys.MAX_SEMAPHORE_LIMIT`."""
    try:
        count = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= count <= MAX_SEMAPHORE_LIMIT:
        raise argparse.ArgumentTypeError(f"{count} is not from 1 to {MAX_SEMAPHORE_LIMIT}")
    return count


def wait_seconds(text: str) -> float:
    """``--wait``: a number of seconds, or ``forever`` (``wait=math.inf``)."""
    if text.strip().lower() == "forever":
        return math.inf
    try:
        return seconds_between(0.001, MAX_WAIT_SECONDS)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}; or `forever`, which waits as long as it takes"
        ) from None
