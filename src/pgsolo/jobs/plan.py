"""The one definition of a job attempt, as a plan every shell drives (``run_job``,
``run_job_async``, and ``pgsolo run`` with COMMAND as the work).

Its steps, in order: check that pgsolo's tables are ready (``record``, ``period``); take
the lock; check the period; run the work and judge whether the lock lasted through it;
record the period; let the lock go. Each step after the lock either ends the attempt,
having let the lock go, or lets it go on.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, TypeVar

from .. import sql
from .._logging import jobs_logger as logger
from .._types import Outcome
from ..drivers import DriverBase, TxStatus
from ..errors import (
    InsufficientPrivilegeError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    NotMigratedError,
    PeriodUnconfirmedError,
    TransactionFailedError,
    UsageError,
)
from ..locking import (
    LockCore,
    LockSpec,
    is_claimed,
    lock_core,
    outside_transaction,
    refuse_keeper,
    require_no_transaction,
    slot_attempts,
    unavailable,
    unresponsive,
    wait_ms_of,
)
from ..locking.plans import WORK, Plan
from ..reasons import LostReason
from ..schema import LATEST_VERSION, version_plan
from .definition import Failure, Job, JobResult, job_result, untranslatable_name

__all__ = [
    "attempt_plan",
    "conclude",
    "core_for",
    "ledger_ready",
    "lost_reason",
    "unresponsive",
]

T = TypeVar("T")


def attempt_plan(job: Job, core: LockCore) -> Plan[JobResult[Any]]:
    """The one definition of a job attempt, for every shell (see the module docstring).

    What goes wrong before the lock is held is raised (:class:`NotMigratedError`,
    :class:`~pgsolo.UnsafeConnectionError`, the driver's errors); from then on every
    ending is a :class:`JobResult`, except an interruption (``KeyboardInterrupt``,
    cancellation), raised once the lock is let go.
    """
    if core.driver.transaction_status() is not TxStatus.IDLE:  # the message only if refused
        require_no_transaction(
            core.driver, f"job {job.name!r}", "pgsolo must own the transaction or the session lock"
        )
    period = job.period
    if job.record or period is not None:
        yield from ledger_ready(job, core.driver)
    attempt = _Attempt(job, core)
    try:
        if not (yield from attempt.take_lock()):
            return attempt.result("skipped", reason="busy")
        # The steps of a period only with one: each is a generator made and run to its
        # end, under the lock, by every job.
        if period is not None and (ended := (yield from attempt.check_period(period))) is not None:
            return ended
        if (ended := (yield from attempt.run_work())) is not None:
            return ended
        if period is not None and (ended := (yield from attempt.record_period(period))) is not None:
            return ended
        return (yield from attempt.end())
    except BaseException:
        yield from core.let_go()  # a Ctrl-C between the steps: nothing stays held
        raise


def ledger_ready(job: Job, driver: DriverBase) -> Plan[None]:
    """Before the lock: pgsolo's tables are there, at the version this pgsolo needs.

    Checked before the work runs, with whether the database's encoding can hold the job's
    name: finding out afterwards would fail a run whose work is done, and the caller's
    retry would do it twice.
    """
    try:
        features = _table_features(job)
        version = yield from version_plan(
            driver, first=[sql.name_fits(job.name), sql.require_privileges(features)]
        )
    except Exception as exc:
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.UNTRANSLATABLE:
            raise untranslatable_name(job.name) from exc
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NO_PRIVILEGE:
            raise _no_privilege(job, driver) from exc
        if failed := unavailable(driver, exc, f"checking the tables of job {job.name!r}"):
            raise failed from exc
        raise
    if version >= LATEST_VERSION:
        return
    raise NotMigratedError(
        f"a job with {_table_options(job)} needs pgsolo's tables, and this database has"
        f" schema version {version} (this pgsolo needs {LATEST_VERSION}): run `pgsolo"
        " migrate` first",
        version=version,
    )


def _no_privilege(job: Job, driver: DriverBase) -> InsufficientPrivilegeError:
    """A job that needs pgsolo's tables, refused by them before its work ran."""
    return sql.privilege_error(
        f"job {job.name!r} with {_table_options(job)}",
        driver.server_info().user,
        features=_table_features(job),
    )


def _table_uses(job: Job) -> tuple[tuple[str, bool], ...]:
    return (("record", job.record), ("period", job.period is not None))


def _table_features(job: Job) -> tuple[str, ...]:
    return tuple(feature for feature, used in _table_uses(job) if used)


def _table_options(job: Job) -> str:
    """The options of ``job`` that use pgsolo's tables, as the caller wrote them."""
    options = {"record": "record=True", "period": "period="}
    return " and ".join(options[feature] for feature, used in _table_uses(job) if used)


class _Attempt:
    """One attempt as it goes: what it knows, and its steps once the lock is held."""

    def __init__(self, job: Job, core: LockCore) -> None:
        self.job = job
        self.core = core
        self.driver = core.driver
        self.backend_pid = self.driver.backend_pid()
        self.lock_wait = 0.0
        self.duration = 0.0  # seconds the work ran
        self.value: Any = None  # what the work returned
        self.failure: Failure | None = None  # the work ran to its end and failed
        self.period_start = 0  # with a period: the start of the one checked (epoch seconds)

    def result(self, outcome: Outcome, **kwargs: Any) -> JobResult[Any]:
        return job_result(
            outcome,
            self.job.name,
            self.job.key,
            lock_wait=self.lock_wait,
            backend_pid=self.backend_pid,
            **kwargs,
        )

    def _outside(self, statements: list[str]) -> list[str]:
        if self.job.lifetime == "xact":
            return statements
        return outside_transaction(self.driver, statements)

    def take_lock(self) -> Plan[bool]:
        """Try, or wait up to ``wait``; busy or timed out is False, with nothing held."""
        started = time.perf_counter()
        try:
            if self.job.slots:
                acquired = yield from self._take_slot()
            else:
                acquired = yield from self.core.acquire(context=True)
        except LockTimeoutError:
            acquired = False
        self.lock_wait = time.perf_counter() - started
        if not acquired:
            yield from self.core.exit(failed=False)
        return acquired

    def _take_slot(self) -> Plan[bool]:
        """``limit=``: a slot of the job's that is free, or frees while it waits, in the order
        of :func:`~pgsolo.locking.slot_attempts`. The one core is aimed at each slot in turn,
        let go of after each busy one, and the job is the run holding the slot it got."""
        core, job = self.core, self.job
        conn, pid = self.driver.connection, self.driver.backend_pid()
        tried = False
        for slot, wait in slot_attempts(job.limit, job.wait):
            if wait is not None and is_claimed(conn, pid, job.slots[slot]):
                continue  # held on this connection (a semaphore's): it would never free for it
            if tried:
                yield from core.exit(failed=False)
            tried = True
            core.aim(core.spec._replace(key=job.slots[slot], wait_ms=wait_ms_of(wait)))
            try:
                if (yield from core.acquire(context=True)):
                    self.job = job.holding(job.slots[slot])
                    return True
            except LockTimeoutError:
                pass  # its turn ran out with nothing held: the next attempt
        return False

    def check_period(self, period: str) -> Plan[JobResult[Any] | None]:
        """With a period: skip if it is already done, by the database's clock and with
        the lock held."""
        job = self.job
        try:
            start = yield self._outside([sql.period_done(job.name, period)])
        except BaseException as exc:
            return (yield from self._failed(exc, in_work=False))
        if start is not None and int(str(start)) == sql.PERIOD_UNSEEN:
            yield from self.core.exit(failed=True)
            raise UsageError(
                f"job {job.name!r} checks its period in a transaction at REPEATABLE READ or"
                " SERIALIZABLE that began before the check, whose snapshot may be older than"
                " the lock: a period another run recorded while this one waited would look"
                " undone, and the work would run twice. Run it at READ COMMITTED (the"
                " connection's isolation level), or with lifetime='session' on an"
                " autocommit connection."
            )
        if start is not None:  # not done: the period this run marks, if its work succeeds
            self.period_start = int(str(start))
            return None
        try:
            yield from self.core.exit(failed=False)
        except Exception as exc:  # nothing ran: whatever became of the lock, this is a skip
            logger.warning(
                "pgsolo: letting %s go after a skip failed: %s", job.key, self._scrub(exc)
            )
        return self.result("skipped", reason="already-done-this-period")

    def run_work(self) -> Plan[JobResult[Any] | None]:
        """The work, then whether the lock lasted through it."""
        started = time.perf_counter()
        try:
            value = yield WORK
        except BaseException as exc:
            self.duration = time.perf_counter() - started
            return (yield from self._failed(exc, in_work=True))
        self.duration = time.perf_counter() - started
        if isinstance(value, Failure):
            self.failure = value
        else:
            self.value = value
        if (loss := self.core.lost) is not None:  # the keeper saw the lock go meanwhile
            yield from self.core.exit(failed=True)
            return self._ended("lost", reason=loss.reason, error=loss, value=self.value)
        if self.job.lifetime == "xact" and self.driver.transaction_status() is TxStatus.IDLE:
            # The work committed or rolled back the locked transaction itself: the lock
            # went with it, and whatever ran after that ran unprotected. Leaving sends
            # nothing (the transaction is over) but drops pgsolo's claim on the key.
            yield from self.core.exit(failed=False)
            lost = self._ended_transaction()
            return self._ended("lost", reason=lost.reason, error=lost, value=self.value)
        return None

    def _ended_transaction(self) -> LockLostError:
        job = self.job
        return LockLostError(
            f"job {job.name!r}: the work ended the transaction that held {job.key} itself"
            " (commit or rollback); the lock was released before the work finished",
            key=job.key,
            reason="work-ended-transaction",
        )

    def record_period(self, period: str) -> Plan[JobResult[Any] | None]:
        """With a period, after work that succeeded: mark the period done, with the lock
        still held."""
        job = self.job
        if self.failure is not None:
            return None
        # The period checked before the work, not the one the work ended in: a run that
        # crossed a boundary must not use the next period up.
        statement = sql.period_record(
            job.name, period, self.period_start, host=socket.gethostname(), pid=os.getpid()
        )
        try:
            marked = yield self._outside([statement])
        except BaseException as exc:
            return (yield from self._period_not_recorded(exc))
        if marked is True:
            return None
        if job.lifetime == "xact":
            # Another run recorded this period first: the constraint wins, and this
            # run's transaction, work included, is rolled back.
            yield from self.core.exit(failed=True)
            return self._ended("skipped", reason="already-done-this-period")
        logger.error(
            "pgsolo: job %s completed but period %s was already recorded by another run:"
            " the work ran twice in this period (do all its runs use the same key?)",
            job.name,
            period,
        )
        return None

    def _period_not_recorded(self, exc: BaseException) -> Plan[JobResult[Any]]:
        yield from self.core.exit(failed=True)
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit, cancellation
        gone = _gone(self.driver, exc, self.backend_pid)
        if self.job.lifetime == "xact":  # rolled back, work included
            if gone is not None:
                return self._ended("lost", reason=gone, error=self._lost(exc, gone))
            return self._ended("failed", error=exc)
        if sql.meaning(self.driver.sqlstate(exc)) is sql.Meaning.TRANSACTION_FAILED:
            # The work left its transaction failed (it caught a database error and went
            # on): letting the key go rolled it back, work included. Not done, then.
            failed = TransactionFailedError(
                f"job {self.job.name!r}: its work left its transaction failed (a database"
                " error it caught), so none of it could commit: it was rolled back as the"
                " lock was let go, and the period is not marked"
            )
            failed.__cause__ = exc
            return self._ended("failed", error=failed)
        # The work is done but its period is not marked: the next run in this period
        # will do it again. Say so with a failure rather than a silent success; when the
        # connection failed, the server may have written it all the same (a frozen backend
        # that resumed), so say only that.
        # WARNING: the failure that follows goes back to the caller as an error.
        logger.warning(
            "pgsolo: job %s completed but its period %s: %s",
            self.job.name,
            "may not have been recorded" if gone is not None else "could not be recorded",
            self._scrub(exc),
        )
        if gone is not None:
            unconfirmed = PeriodUnconfirmedError(
                f"{self.job.lifetime} lock {self.job.key} was lost with its connection as the"
                f" period was recorded, after the work ran; the period may not have been"
                f" recorded: {exc}",
                key=self.job.key,
                reason=gone,
            )
            unconfirmed.__cause__ = exc
            return self._ended("lost", reason=gone, error=unconfirmed)
        return self._ended("failed", reason="period-not-recorded", error=exc)

    def end(self) -> Plan[JobResult[Any]]:
        """Let the lock go after work that ran to its end: a lock found gone by then makes
        the attempt lost, whatever the work said."""
        rollback = self.failure is not None and self.job.lifetime == "xact"
        if self.job.lifetime == "session":  # a call less for every xact job
            yield from self._hand_over_to_open_transaction()
        try:
            yield from self.core.exit(failed=rollback)
        except (LockLostError, LockNotHeldError) as exc:
            return self._ended("lost", reason=lost_reason(exc), error=exc, value=self.value)
        except TransactionFailedError as exc:
            return self._ended("failed", error=exc)
        except Exception as exc:
            if (gone := _gone(self.driver, exc, self.backend_pid)) is None:
                return self._ended("failed", error=exc)
            # The work returned, but the transaction holding the lock died with its
            # connection before it could commit: a lost lock, not a failure of the work.
            return self._ended("lost", reason=gone, error=self._lost(exc, gone))
        except BaseException:
            yield from self.core.let_go()  # a Ctrl-C as it let go: let go all the same
            raise
        if (failure := self.failure) is not None:
            return self._ended("failed", reason=failure.reason, error=failure.error)
        return self._ended("completed", value=self.value)

    def _hand_over_to_open_transaction(self) -> Plan[None]:
        """A session job whose work left a transaction open (a connection with autocommit
        off opens one by itself), for its caller to end: the key stays held, at the
        transaction's level, until the caller commits or rolls back. Let go at once, a
        second run would start before the first's work, and its period's record, were
        committed, and would run it again."""
        if self.driver.transaction_status() is not TxStatus.INTRANS:
            return
        try:
            # The session holding the key is granted it again at once: the try never waits.
            yield [sql.acquire(self.core.spec.key, "xact", wait=False, shared=False)]
        except Exception as exc:  # the release that follows says what the connection is
            logger.warning(
                "pgsolo: job %s could not keep its key until its work's transaction ends"
                " (%r): it is let go now",
                self.job.name,
                exc,
            )

    def _failed(self, exc: BaseException, *, in_work: bool) -> Plan[JobResult[Any]]:
        """The period check or the work raised ``exc``: let the lock go (never masking
        ``exc``), and say what that makes the attempt."""
        if isinstance(exc, Exception) and self.job.lifetime == "session":
            yield from self._hand_over_to_open_transaction()  # an interruption lets go at once
        yield from self.core.exit(failed=True)
        meaning = sql.meaning(self.driver.sqlstate(exc))
        if meaning is sql.Meaning.NOT_MIGRATED and self.job.period is not None and not in_work:
            raise NotMigratedError(
                "once-per-period runs need pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        if meaning is sql.Meaning.NO_PRIVILEGE and self.job.period is not None and not in_work:
            raise _no_privilege(self.job, self.driver) from exc
        if meaning is sql.Meaning.UNTRANSLATABLE and not in_work:  # the period's job name
            raise untranslatable_name(self.job.name) from exc
        if isinstance(exc, LockLostError):  # the keeper saw the lock go while the work ran
            return self._ended("lost", reason=exc.reason, error=exc)
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit, cancellation: not the work's outcome
        if (gone := _gone(self.driver, exc, self.backend_pid)) is None:
            return self._ended("failed", error=exc)
        if in_work:  # the work's own error, as it raised it
            # The connection, and the lock with it, went under the work.
            return self._ended("lost", reason=gone, error=exc)
        # pgsolo's period check: before the work ran.
        doing = f"checking the period of job {self.job.name!r}"
        failed = unavailable(self.driver, exc, doing, dead=True)  # Django may have reconnected
        if failed is None:  # pgsolo's already (a deadline's)
            return self._ended("lost", reason=gone, error=exc)
        failed.__cause__ = exc  # returned, not raised: chained by hand
        return self._ended("lost", reason=gone, error=failed)

    def _lost(self, exc: Exception, gone: LostReason) -> LockLostError:
        """pgsolo's error for its own statement (``exc``) that failed with the
        connection after the work ran: its outcome (the commit, the period) was not
        confirmed recorded."""
        lost = LockLostError(
            f"{self.job.lifetime} lock {self.job.key} was lost with its connection"
            " before the run could end, so the work's transaction (or its period) was not"
            f" confirmed committed: {exc}",
            key=self.job.key,
            reason=gone,
        )
        lost.__cause__ = exc
        return lost

    def _ended(self, outcome: Outcome, **kwargs: Any) -> JobResult[Any]:
        return self.result(outcome, duration=self.duration, **kwargs)

    def _scrub(self, exc: BaseException) -> str:
        return self.driver.scrub(str(exc).strip())


def _gone(driver: DriverBase, error: BaseException, backend_pid: int) -> LostReason | None:
    """How the connection went, if ``error`` came with its end; None while it lives. Its
    session (``backend_pid``) may be gone behind a connection that is open again: a
    framework reconnects as it closes its books on the failure (Django does)."""
    if unresponsive(error):
        return "connection-unresponsive"
    if driver.is_closed() or driver.backend_pid() != backend_pid:
        return "connection-lost"
    return None


def lost_reason(error: BaseException | None) -> LostReason:
    """The reason code of a loss found at the end of the run: ``connection-unresponsive``
    when a deadline shut the connection down, else the error's own, or ``lock-released``
    when the server said the lock was no longer held at release."""
    if unresponsive(error):
        return "connection-unresponsive"
    if isinstance(error, LockLostError) and error.reason is not None:
        return error.reason
    return "lock-released"


def conclude(job: Job, result: JobResult[T]) -> JobResult[T]:
    if job.raise_errors and result.error is not None:
        if result.outcome == "lost" and isinstance(result.error, LockLostError | LockNotHeldError):
            raise LockLostError(
                f"job {job.name!r} lost its lock {result.key} while the work ran: {result.error}",
                key=result.key,
                reason=lost_reason(result.error),
            ) from result.error
        raise result.error
    return result


def core_for(job: Job, driver: DriverBase) -> LockCore:
    if job.keep is not None:
        refuse_keeper(driver)
    return lock_core(
        driver, LockSpec(job.key, job.lifetime, wait_ms_of(job.wait), verify_commit=True)
    )
