"""What each ending of ``pgsolo run`` means on the command line: its exit code (DESIGN
§5, normative) and the one line of its error (never a password: every driver message
goes through the caller's ``scrub``).

:func:`verdict` reads the job plan's result once the attempt reached the lock; the
other functions word the endings that come before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._logging import cli_logger as logger
from ...errors import (
    DatabaseUnavailableError,
    LockLostError,
    LockNotHeldError,
    NotMigratedError,
    PeriodUnconfirmedError,
)
from ...jobs.definition import Job, JobResult, replace_result
from ...locking import unresponsive
from ...schema import LATEST_VERSION
from ..exit_codes import EXIT_FAILED, EXIT_LOST, EXIT_OK, EXIT_SKIPPED, EXIT_UNSAFE
from .child import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND
from .signals import signal_name
from .watch import Command, Ran

if TYPE_CHECKING:
    from ...monitor import AdvisoryLock

__all__ = ["SkipCodes", "Verdict", "busy", "not_migrated", "not_started", "unavailable", "verdict"]

Scrub = Callable[[BaseException], str]

# Lost while COMMAND ran, in a way that says the connection is unsafe for session locks.
_UNSAFE_LOSSES = ("connection-moved", "server-in-recovery")


@dataclass(frozen=True, slots=True)
class SkipCodes:
    """The exit codes of a skip (``--conflict-exit-code``, ``--already-done-exit-code``):
    DESIGN §5's 75 unless the user chose another. The outcome and reason stay ``skipped``
    whatever the code: a skip that exits 0 is still reported as a skip."""

    conflict: int = EXIT_SKIPPED  # busy, or --wait timed out
    already_done: int = EXIT_SKIPPED  # --once-per's period already done

    def of(self, result: JobResult[Any]) -> int:
        return self.already_done if result.reason == "already-done-this-period" else self.conflict


@dataclass(frozen=True, slots=True)
class Verdict:
    """An attempt that reached the lock, as the command line says it."""

    result: JobResult[Any]  # what is logged and recorded
    exit_code: int
    error: str | None = None  # the report's one line
    command_exit_code: int | None = None


def verdict(
    result: JobResult[Any], command: Command, scrub: Scrub, skip_codes: SkipCodes | None = None
) -> Verdict:
    """The exit code and error of the job plan's ``result`` with COMMAND as the work."""
    status = command.status
    if result.outcome == "skipped":
        return Verdict(result, (skip_codes or SkipCodes()).of(result))
    if result.outcome == "completed":
        return Verdict(result, EXIT_OK, command_exit_code=status)
    if result.outcome == "lost":
        return _lost(result, command, scrub)
    return _failed(result, command, scrub)


def _failed(result: JobResult[Any], command: Command, scrub: Scrub) -> Verdict:
    status = command.status
    error = scrub(result.error) if result.error is not None else ""
    if result.reason == "period-not-recorded":
        text = f"the period could not be recorded: {error}"
        return Verdict(result, EXIT_FAILED, text, status)
    if result.reason in ("command-not-found", "cannot-execute"):
        code = EXIT_NOT_FOUND if result.reason == "command-not-found" else EXIT_CANNOT_EXECUTE
        return Verdict(result, code, f"cannot run {command.argv[0]!r}: {error}", code)
    if status is None or status == 0:
        # COMMAND succeeded, but the lock could not be let go cleanly: the session ends
        # when pgsolo closes the connection right after this, and the lock with it.
        logger.warning("pgsolo: releasing %s failed: %s", command.job.key, error)
        completed = replace_result(result, outcome="completed", error=None)
        return Verdict(completed, EXIT_OK, command_exit_code=status)
    return Verdict(result, status, command_exit_code=status)  # COMMAND's own answer


def _lost(result: JobResult[Any], command: Command, scrub: Scrub) -> Verdict:
    code = EXIT_UNSAFE if result.reason in _UNSAFE_LOSSES else EXIT_LOST
    job, ran = command.job, command.ran
    if ran is not None and ran.lost is not None:  # the keeper saw it while COMMAND ran
        text = _lost_while_running(job, ran)
        error = LockLostError(text, key=job.key, reason=ran.lost.reason)
        if ran.lost.warned and ran.status != 0:
            # --on-lost=warn: COMMAND ran to its end and failed; its own code says more
            # than the loss (which the outcome, ``lost``, still says).
            code = ran.status
        return Verdict(dataclasses.replace(result, error=error), code, text, command.status)
    detail = scrub(result.error) if result.error is not None else ""
    lock_lost = isinstance(result.error, LockLostError | LockNotHeldError)
    if not lock_lost or isinstance(result.error, PeriodUnconfirmedError):
        # Marking the period done failed with the connection, after COMMAND succeeded: the
        # server may have written it all the same (a frozen backend that resumed, a commit
        # whose answer was lost), so say what is known, not more.
        if unresponsive(result.error):
            detail = f"no answer within {command.keep.timeout:g}s (--check-timeout)"
        text = (
            f"the period may not have been recorded: {detail} (the next run in this period"
            " skips it if it was, and runs the command again if not)"
        )
        return Verdict(result, code, text, command.status)
    # The lock was gone by the time COMMAND ended: at most once is not guaranteed for
    # this run, whatever COMMAND said.
    logger.error(
        "pgsolo: lock %s was no longer held when job %s ended: %s", job.key, job.name, detail
    )
    text = f"lock {job.key} was lost while the command ran: {detail}"
    return Verdict(result, code, text, command.status)


def _lost_while_running(job: Job, ran: Ran) -> str:
    # Said once, plainly: the keeper's own log line carries the driver's words.
    assert ran.lost is not None  # noqa: S101 - the caller checked
    lost = f"lock {job.key} was lost while the command ran: {ran.lost.detail}"
    if ran.lost.warned:
        return f"{lost}; --on-lost=warn let the command finish (exit status {ran.status})"
    if not ran.lost.stopped:
        left = (
            f", and the {ran.lost.others} processes it left running got SIGTERM"
            if ran.lost.others
            else ""
        )
        return (
            f"lock {job.key} was lost: {ran.lost.detail}; the command had already"
            f" finished by then (exit status {ran.status}){left}"
        )
    if ran.returncode < 0:
        how = f"was stopped by {signal_name(-ran.returncode)} (exit status {ran.status})"
    else:
        how = f"exited with status {ran.status} after SIGTERM"
    return f"{lost}; the command {how}"


def busy(job: Job, holders: list[AdvisoryLock] | None) -> str:
    """A skip because the key is busy, and who holds it: what a person looking at a cron
    log needs to go and find it (``holders`` None: they could not be read)."""
    if job.semaphore is not None:
        line = f"skipped: all {job.limit} slots of {job.semaphore!r} are busy"
    else:
        line = f"skipped: {job.key} is busy"
    if holders is None:
        return line
    if not holders:
        return f"{line} (its holder let go before pgsolo could see who it was)"
    return f"{line}, held by {'; '.join(_holder(lock) for lock in holders)}"


def _holder(lock: AdvisoryLock) -> str:
    from ...monitor import format_seconds  # noqa: PLC0415 - with the holders, on a busy skip

    if lock.pid is None:
        return "a prepared transaction"
    facts = [
        f"application_name {lock.application_name!r}" if lock.application_name else None,
        f"host {lock.client_addr}" if lock.client_addr else None,
        f"for {format_seconds(lock.age_seconds)}" if lock.since is not None else None,
    ]
    shown = ", ".join(fact for fact in facts if fact)
    return f"pid {lock.pid}" + (f" ({shown})" if shown else "")


def not_started(signum: int) -> str:
    """A signal ended the attempt before COMMAND started (exit 128+N)."""
    return f"interrupted by {signal_name(signum)} before the command started; it was not run"


def unavailable(exc: BaseException | None, label: str, check_timeout: float, scrub: Scrub) -> str:
    """The database refused, failed or did not answer before COMMAND started (exit 69)."""
    where = f" ({label})"
    detail = scrub(exc) if exc is not None else "no answer"
    if unresponsive(exc):
        detail = f"no answer within {check_timeout:g}s (--check-timeout)"
    elif isinstance(exc, DatabaseUnavailableError):
        where = ""  # it says where itself
    return f"database unavailable{where}: {detail}"


def not_migrated(exc: NotMigratedError, job: Job, label: str) -> str:
    """``--record`` or ``--once-per`` without pgsolo's tables (exit 2)."""
    if exc.version is None:
        return f"pgsolo's tables are missing in {label}: run pgsolo migrate first"
    needs = "--record" if job.record else "--once-per"
    return (
        f"{needs} needs pgsolo's tables, and {label} has schema version {exc.version}"
        f" (this pgsolo needs {LATEST_VERSION}): run pgsolo migrate first"
    )
