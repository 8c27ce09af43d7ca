"""The one definition of a job attempt, as a plan both shells drive: take the lock, check
the period, run the work, verify the commit, record the period, end."""

from __future__ import annotations

import os
import socket
import time
from typing import (
    TYPE_CHECKING,
    Any,
    ParamSpec,
    TypeVar,
)

from .. import sql
from .._logging import logger
from .._types import Outcome
from ..drivers import DriverBase, TxStatus
from ..errors import (
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    NotMigratedError,
    TransactionFailedError,
)
from ..locking.core import LockCore, require_no_transaction, wait_ms_of
from ..locking.plans import WORK, Plan, outside_transaction
from ..reasons import LostReason
from .definition import Job, JobResult

if TYPE_CHECKING:
    pass

__all__ = ["attempt_plan", "conclude", "core_for"]

T = TypeVar("T")
P = ParamSpec("P")


def attempt_plan(job: Job, core: LockCore) -> Plan[JobResult[Any]]:  # noqa: PLR0911, PLR0915
    """The one definition of a job attempt, for both shells."""
    driver = core.driver
    require_no_transaction(
        driver, f"job {job.name!r}", "pgsolo must own the transaction or the session lock"
    )
    host, pid = socket.gethostname(), os.getpid()
    backend_pid = driver.backend_pid()

    def outside(statements: list[str]) -> list[str]:
        return statements if job.lifetime == "xact" else outside_transaction(driver, statements)

    def result(outcome: Outcome, **kwargs: Any) -> JobResult[Any]:
        return JobResult(
            outcome, job.name, job.key, lock_wait=lock_wait, backend_pid=backend_pid, **kwargs
        )

    if job.record:
        # Checked before the work runs: finding out afterwards would fail a run whose
        # work is done, and the caller's retry would do it twice.
        ready = yield outside_transaction(driver, [sql.LEDGER_READY])
        if ready is not True:
            raise NotMigratedError("record=True needs pgsolo's tables: run `pgsolo migrate` first")

    started = time.perf_counter()
    try:
        acquired = yield from core.acquire(context=True)
    except LockTimeoutError:
        acquired = False
    lock_wait = time.perf_counter() - started
    if not acquired:
        yield from core.exit(failed=False)
        return result("skipped", reason="busy")

    work_started = time.perf_counter()
    in_work = False
    try:
        if job.period is not None:
            done = yield outside([sql.period_done(job.name, job.period)])
            if done is True:
                yield from core.exit(failed=False)
                return result("skipped", reason="already-done-this-period")
        in_work = True
        value = yield WORK
        in_work = False
        duration = time.perf_counter() - work_started
        if core.lost is not None:  # the keeper saw the lock go: not all of it ran locked
            yield from core.exit(failed=True)
            loss = core.lost
            return result("lost", value=value, duration=duration, reason=loss.reason, error=loss)
        if job.lifetime == "xact" and driver.transaction_status() is TxStatus.IDLE:
            # The work committed or rolled back the locked transaction itself: the lock
            # went with it, and whatever ran after that ran unprotected. Leaving sends
            # nothing (the transaction is over) but drops pgsolo's claim on the key.
            yield from core.exit(failed=False)
            return result(
                "lost",
                value=value,
                duration=duration,
                reason="work-ended-transaction",
                error=LockLostError(
                    f"job {job.name!r}: the work ended the transaction that held {job.key}"
                    " itself (commit or rollback); the lock was released before the work"
                    " finished",
                    key=job.key,
                    reason="work-ended-transaction",
                ),
            )
        if job.period is not None:
            marked = yield outside([sql.period_record(job.name, job.period, host=host, pid=pid)])
            if marked is not True and job.lifetime == "xact":
                # Another run recorded this period first: the constraint wins, and this
                # run's transaction, work included, is rolled back.
                yield from core.exit(failed=True)
                return result("skipped", reason="already-done-this-period", duration=duration)
            if marked is not True:
                logger.error(
                    "pgsolo: job %s completed but period %s was already recorded by another"
                    " run: the work ran twice in this period",
                    job.name,
                    job.period,
                )
    except BaseException as exc:
        duration = time.perf_counter() - work_started
        yield from core.exit(failed=True)
        undefined_table = sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NOT_MIGRATED
        if undefined_table and job.period is not None and not in_work:
            raise NotMigratedError(
                "once-per-period runs need pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        if isinstance(exc, LockLostError):  # the keeper saw the lock go while the work ran
            return result("lost", error=exc, duration=duration, reason=exc.reason)
        if isinstance(exc, Exception):
            if driver.is_closed():  # the connection, and the lock with it, went under the work
                return result("lost", error=exc, duration=duration, reason="connection-lost")
            return result("failed", error=exc, duration=duration)
        raise  # KeyboardInterrupt, SystemExit, cancellation: not the work's outcome
    try:
        yield from core.exit(failed=False)
    except (LockLostError, LockNotHeldError) as exc:
        return result("lost", error=exc, duration=duration, reason=_lost_reason(exc), value=value)
    except TransactionFailedError as exc:
        return result("failed", error=exc, duration=duration)
    except Exception as exc:
        if not driver.is_closed():
            return result("failed", error=exc, duration=duration)
        # The work returned, but the transaction holding the lock died with its
        # connection before it could commit: a lost lock, not a failure of the work.
        lost = LockLostError(
            f"{job.lifetime} lock {job.key} was lost with its connection before the run"
            f" could end, so the work's transaction was not confirmed committed: {exc}",
            key=job.key,
            reason="connection-lost",
        )
        lost.__cause__ = exc
        return result("lost", error=lost, duration=duration, reason="connection-lost")
    return result("completed", value=value, duration=duration)


def _lost_reason(error: BaseException | None) -> LostReason:
    """The reason code of a loss found at the end of the run: the error's own, or
    ``lock-released`` when the server said the lock was no longer held at release."""
    return error.reason if isinstance(error, LockLostError) else "lock-released"


def conclude(job: Job, result: JobResult[T], raise_errors: bool) -> JobResult[T]:
    if raise_errors and result.error is not None:
        if result.outcome == "lost" and isinstance(result.error, LockLostError | LockNotHeldError):
            raise LockLostError(
                f"job {job.name!r} lost its lock {job.key} while the work ran: {result.error}",
                key=job.key,
                reason=_lost_reason(result.error),
            ) from result.error
        raise result.error
    return result


def core_for(job: Job, driver: DriverBase) -> LockCore:
    return LockCore(
        driver,
        job.key,
        job.lifetime,
        wait_ms=wait_ms_of(job.wait),
        shared=False,
        reentrant=False,
        verify_commit=True,
    )
