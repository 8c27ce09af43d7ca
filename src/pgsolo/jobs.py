"""Singleton jobs: run a callable under a lock and say what happened.

Every attempt ends as exactly one outcome: ``completed`` (with the callable's return
value), ``skipped`` (``busy``, or ``already-done-this-period``), ``failed`` (the
callable raised) or ``lost`` (the lock vanished while the work ran). A skip is never a
success: it is logged, counted and recorded as a skip.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    Never,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from . import metrics, sql
from ._plans import WORK, Plan, adrive, drive, outside_transaction
from .connect import DEFAULT_APP_PREFIX, aopen_connection, application_name_for, open_connection
from .drivers import DriverBase, ServerInfo, TxStatus, adapt_async, adapt_sync
from .dsn import choose_dsn
from .errors import (
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    TransactionFailedError,
    UsageError,
)
from .keeper import AsyncKeeper, Keep, Keeper, as_keep
from .keys import Key, KeyLike, Registry, as_key
from .ledger import SKIP_WARNING_WINDOW, history_rows, skip_warning
from .locks import _LockCore, _require_no_transaction, _validate_wait
from .reasons import LostReason, Reason

if TYPE_CHECKING:
    import psycopg

__all__ = ["Job", "JobResult", "Outcome", "run_job", "run_job_async", "singleton"]

logger = logging.getLogger("pgsolo")

T = TypeVar("T")
P = ParamSpec("P")

Outcome = Literal["completed", "skipped", "failed", "lost"]
SQLSTATE_UNDEFINED_TABLE = "42P01"


@dataclass(frozen=True, slots=True)
class JobResult(Generic[T]):
    """What one attempt at a job ended as."""

    outcome: Outcome
    job: str
    key: Key
    reason: Reason | None = None
    """A short code of :mod:`pgsolo.reasons`, never a message: ``busy`` or
    ``already-done-this-period`` for a skip, how the lock went for ``lost``
    (``connection-lost``, ``lock-released``, ``work-ended-transaction``, ...); None for
    ``completed`` and for a ``failed`` run (its exception is :attr:`error`)."""
    value: T | None = None
    """The callable's return value, for ``completed``."""
    error: BaseException | None = field(default=None, compare=False)
    lock_wait: float = 0.0
    """Seconds spent getting (or failing to get) the lock."""
    duration: float = 0.0
    """Seconds the work ran."""
    backend_pid: int | None = None

    @property
    def completed(self) -> bool:
        return self.outcome == "completed"

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"


@dataclass(frozen=True, slots=True)
class Job:
    """A validated job definition. Built by :func:`run_job` and :func:`singleton`."""

    name: str
    key: Key
    lifetime: sql.Lifetime = "xact"
    wait: float | None = None
    period: str | None = None
    record: bool = False
    application_name: str | None = None
    keep: Keep | None = None
    """Session jobs: the keeper watches the lock while the work runs (``keep=``)."""

    @classmethod
    def define(
        cls,
        key: KeyLike,
        *,
        name: str | None = None,
        lifetime: sql.Lifetime = "xact",
        wait: float | None = None,
        period: str | None = None,
        record: bool = False,
        application_name: str | None = None,
        namespace: int | None = None,
        registry: Registry | None = None,
        keep: bool | Keep = False,
    ) -> Job:
        resolved = as_key(key, namespace=namespace, registry=registry)
        if lifetime not in ("xact", "session"):
            raise UsageError(f"lifetime must be 'xact' or 'session', got {lifetime!r}")
        _validate_wait(wait)
        if period is not None:
            sql.period_start(period)  # InvalidArgumentError for a period it cannot be
        job_name = name if name is not None else (resolved.name or resolved.text)
        if not isinstance(job_name, str) or not job_name or "\0" in job_name:
            raise UsageError(f"a job name must be non-empty text without NUL, got {job_name!r}")
        try:
            job_name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"a job name must be valid Unicode text, got {job_name!r}") from None
        if not isinstance(record, bool):
            raise UsageError(f"record must be True or False, got {record!r}")
        keeping = as_keep(keep)
        if keeping is not None and lifetime != "session":
            raise UsageError(
                "keep= watches a session lock; a transaction-level job's lock lives and dies"
                " with its transaction, and its COMMIT already checks it"
            )
        return cls(job_name, resolved, lifetime, wait, period, record, application_name, keeping)

    def application_name_for(self, dsn: str) -> str:
        """``pgsolo:<job name>`` unless the caller, the DSN or ``PGAPPNAME`` names it."""
        return application_name_for(dsn, f"{DEFAULT_APP_PREFIX}{self.name}", self.application_name)


def _plan(job: Job, core: _LockCore) -> Plan[JobResult[Any]]:  # noqa: PLR0911, PLR0915
    """The one definition of a job attempt, for both shells."""
    driver = core.driver
    _require_no_transaction(
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
            raise UsageError("record=True needs pgsolo's tables: run `pgsolo migrate` first")

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
        undefined_table = driver.sqlstate(exc) == SQLSTATE_UNDEFINED_TABLE
        if undefined_table and job.period is not None and not in_work:
            raise UsageError(
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


def report(
    job: Job, result: JobResult[Any], driver: DriverBase, info: ServerInfo | None = None
) -> None:
    """Log the outcome (one line per attempt, with everything an incident needs) and
    count it in the metrics. ``info`` is the server as seen before the run: a lost
    connection no longer knows its database, server or application_name."""
    metrics.observe(result)
    level = logging.ERROR if result.outcome in ("failed", "lost") else logging.INFO
    if not logger.isEnabledFor(level):
        return
    if info is None:
        info = driver.server_info()
    fields: dict[str, object] = {
        "job": job.name,
        "outcome": result.outcome,
        "reason": result.reason,
        "key": job.key.text,
        "name": job.key.name,
        "database": info.database,
        "server": info.address,
        "application_name": info.application_name,
        "backend_pid": result.backend_pid,
        "lock_wait_ms": round(result.lock_wait * 1000, 3),
        "duration_ms": round(result.duration * 1000, 3),
        "error": repr(result.error) if result.error is not None else None,
    }
    logger.log(
        level,
        "job %s: %s",
        result.outcome,
        " ".join(f"{k}={v}" for k, v in fields.items() if k != "outcome" and v is not None),
        extra={"pgsolo": fields},
    )


def ledger_statements(
    job: Job, result: JobResult[Any], driver: DriverBase, *, exit_code: int | None = None
) -> list[str]:
    """The statements that write ``result`` to the ledger (``pgsolo.job_runs``)."""
    error = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
    return outside_transaction(
        driver,
        [
            sql.record_attempt(
                job=job.name,
                lock_key=job.key.text,
                outcome=result.outcome,
                reason=result.reason,
                duration_s=result.duration,
                lock_wait_s=result.lock_wait,
                host=socket.gethostname(),
                pid=os.getpid(),
                backend_pid=result.backend_pid,
                application_name=driver.server_info().application_name,
                exit_code=exit_code,
                error=error,
            )
        ],
    )


def _conclude(job: Job, result: JobResult[T], raise_errors: bool) -> JobResult[T]:
    if raise_errors and result.error is not None:
        if result.outcome == "lost" and isinstance(result.error, LockLostError | LockNotHeldError):
            raise LockLostError(
                f"job {job.name!r} lost its lock {job.key} while the work ran: {result.error}",
                key=job.key,
                reason=_lost_reason(result.error),
            ) from result.error
        raise result.error
    return result


def _core_for(job: Job, driver: DriverBase) -> _LockCore:
    return _LockCore(
        driver,
        job.key,
        job.lifetime,
        wait_ms=_validate_wait(job.wait),
        shared=False,
        reentrant=False,
        verify_commit=True,
    )


def _refuse_unknown_options(call: Callable[..., object], unknown: Mapping[str, object]) -> None:
    """Keyword arguments of :func:`run_job` and :func:`singleton` are pgsolo's options,
    never the function's: one that is not an option is a :class:`UsageError`, before
    anything connects, with the way to pass it to the function instead."""
    if not unknown:
        return
    names = sorted(unknown)
    parameters = inspect.signature(call).parameters.values()
    options = ", ".join(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)
    if call is singleton:
        hint = (
            "the decorated function's own arguments are given when it is called"
            f" ({', '.join(f'{n}=...' for n in names)} there)"
        )
    else:
        hint = (
            "bind the function's own keyword arguments first, with functools.partial(fn,"
            f" {', '.join(f'{n}=...' for n in names)}); positional arguments after fn still"
            " go to fn"
        )
    raise UsageError(
        f"{call.__name__}() got keyword argument(s) {', '.join(names)} that are not pgsolo"
        f" options ({options}): keyword arguments here are pgsolo's, never the job"
        f" function's; {hint}"
    )


def run_job(
    target: psycopg.Connection[Any] | str,
    key: KeyLike,
    fn: Callable[..., T],
    *args: Any,
    name: str | None = None,
    lifetime: sql.Lifetime = "xact",
    wait: float | None = None,
    period: str | None = None,
    record: bool = False,
    raise_errors: bool = True,
    application_name: str | None = None,
    namespace: int | None = None,
    registry: Registry | None = None,
    keep: bool | Keep = False,
    **not_options: Never,
) -> JobResult[T]:
    """Run ``fn(conn, *args)`` at most once at a time across every process.

    Keyword arguments are pgsolo's options only; any other raises :class:`UsageError`
    before anything connects. To give ``fn`` keyword arguments of its own, bind them
    first: ``run_job(dsn, key, functools.partial(fn, name="bob"))``.

    ``target`` is a psycopg connection, or a connection string from which pgsolo opens
    (and closes) a connection named ``pgsolo:<job name>`` in ``pg_stat_activity``.
    ``lifetime="xact"`` (default) runs ``fn`` inside the locked transaction and commits
    with it; ``"session"`` holds a session lock on the pinned connection, for work that
    spans commits or external calls. Busy means skip, unless ``wait=`` seconds are
    given. ``period="day"`` (or ``hour``, ``"900 seconds"``...) records each completed
    run durably, so a second run in the same period, by the database's clock, is
    skipped. ``record=True`` writes every attempt to the ledger (``pgsolo migrate``).
    ``keep=True`` (or a :class:`~pgsolo.Keep`), for a session job, watches the lock
    while ``fn`` runs: a loss makes the outcome ``lost`` (its reason from the keeper).
    A failure re-raises the callable's exception after it is logged and recorded,
    unless ``raise_errors=False``.
    """
    _refuse_unknown_options(run_job, not_options)
    job = Job.define(
        key,
        name=name,
        lifetime=lifetime,
        wait=wait,
        period=period,
        record=record,
        application_name=application_name,
        namespace=namespace,
        registry=registry,
        keep=keep,
    )
    if job.keep is not None and job.keep.cancel:
        raise UsageError("Keep(cancel=True) cancels an asyncio task: use run_job_async")
    if isinstance(target, str):
        with open_connection(target, application_name=job.application_name_for(target)) as conn:
            return _run_sync(job, conn, target, fn, args, raise_errors)
    return _run_sync(job, target, None, fn, args, raise_errors)


def _run_sync(
    job: Job,
    conn: psycopg.Connection[Any],
    dsn: str | None,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    raise_errors: bool,
) -> JobResult[T]:
    driver = adapt_sync(conn)
    info = driver.server_info()
    core = _core_for(job, driver)

    def work() -> T:
        keeper = Keeper(core, driver, job.keep) if job.keep is not None else None
        if keeper is not None:
            keeper.start()
        try:
            return fn(conn, *args)
        finally:
            if keeper is not None:
                keeper.stop()

    result: JobResult[T] = drive(_plan(job, core), driver, work)
    report(job, result, driver, info)
    if job.record:
        if not driver.is_closed():
            drive(_record_plan(job, result, driver), driver)
        elif dsn is not None:
            with open_connection(dsn, application_name=job.application_name_for(dsn)) as spare:
                spare_driver = adapt_sync(spare)
                drive(_record_plan(job, result, spare_driver), spare_driver)
        else:
            _log_unrecorded(job, result)
    return _conclude(job, result, raise_errors)


def _log_unrecorded(job: Job, result: JobResult[Any]) -> None:
    logger.error(
        "pgsolo: job %s %s, but its connection is gone and there is no DSN to reconnect"
        " with: the attempt is not recorded in the ledger",
        job.name,
        result.outcome,
    )


def _record_plan(job: Job, result: JobResult[Any], driver: DriverBase) -> Plan[None]:
    try:
        yield ledger_statements(job, result, driver)
    except Exception as exc:
        if driver.sqlstate(exc) == SQLSTATE_UNDEFINED_TABLE:
            raise UsageError(
                "record=True needs pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        raise
    if result.outcome == "skipped" and result.reason == "busy":
        # Only a skip pays for this look back: repeated skips mean the work is slower
        # than its schedule, which the article says to watch for.
        recent = yield outside_transaction(
            driver, [sql.history(job=job.name, limit=SKIP_WARNING_WINDOW)]
        )
        for warning in skip_warning(history_rows(recent)):
            logger.warning("pgsolo: %s", warning)


async def run_job_async(
    target: psycopg.AsyncConnection[Any] | str,
    key: KeyLike,
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    name: str | None = None,
    lifetime: sql.Lifetime = "xact",
    wait: float | None = None,
    period: str | None = None,
    record: bool = False,
    raise_errors: bool = True,
    application_name: str | None = None,
    namespace: int | None = None,
    registry: Registry | None = None,
    keep: bool | Keep = False,
    **not_options: Never,
) -> JobResult[T]:
    """The async twin of :func:`run_job`: ``await fn(conn, *args)``; keyword arguments
    are pgsolo's options only (bind ``fn``'s own with ``functools.partial``)."""
    _refuse_unknown_options(run_job_async, not_options)
    job = Job.define(
        key,
        name=name,
        lifetime=lifetime,
        wait=wait,
        period=period,
        record=record,
        application_name=application_name,
        namespace=namespace,
        registry=registry,
        keep=keep,
    )
    if isinstance(target, str):
        async with aopen_connection(
            target, application_name=job.application_name_for(target)
        ) as conn:
            return await _run_async(job, conn, target, fn, args, raise_errors)
    return await _run_async(job, target, None, fn, args, raise_errors)


async def _run_async(
    job: Job,
    conn: psycopg.AsyncConnection[Any],
    dsn: str | None,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    raise_errors: bool,
) -> JobResult[T]:
    driver = adapt_async(conn)
    core = _core_for(job, driver)

    async def work() -> object:
        keeper = AsyncKeeper(core, driver, job.keep) if job.keep is not None else None
        if keeper is not None:
            keeper.start()
        ended_with: BaseException | None = None
        try:
            return await fn(conn, *args)
        except BaseException as exc:
            ended_with = exc
            raise
        finally:
            if keeper is not None:
                keeper.stop()
                if (instead := keeper.undo_cancel(ended_with)) is not None:
                    raise instead from ended_with  # Keep(cancel=True) stopped the work

    info = driver.server_info()
    result: JobResult[T] = await adrive(_plan(job, core), driver, work)
    report(job, result, driver, info)
    if job.record:
        if not driver.is_closed():
            await adrive(_record_plan(job, result, driver), driver)
        elif dsn is not None:
            async with aopen_connection(
                dsn, application_name=job.application_name_for(dsn)
            ) as spare:
                spare_driver = adapt_async(spare)
                await adrive(_record_plan(job, result, spare_driver), spare_driver)
        else:
            _log_unrecorded(job, result)
    return _conclude(job, result, raise_errors)


class _SingletonDecorator(Protocol):
    # The connection types tell the overloads apart: with ``Any`` there, a function
    # taking ``AsyncConnection[Any]`` matched both and mypy made the result ``Any``.
    @overload
    def __call__(
        self, fn: Callable[Concatenate[psycopg.AsyncConnection[Any], P], Awaitable[T]]
    ) -> Callable[P, Awaitable[JobResult[T]]]: ...
    @overload
    def __call__(
        self, fn: Callable[Concatenate[psycopg.Connection[Any], P], T]
    ) -> Callable[P, JobResult[T]]: ...


def singleton(
    key: KeyLike,
    *,
    dsn: str | None = None,
    name: str | None = None,
    lifetime: sql.Lifetime = "xact",
    wait: float | None = None,
    period: str | None = None,
    record: bool = False,
    raise_errors: bool = True,
    application_name: str | None = None,
    namespace: int | None = None,
    registry: Registry | None = None,
    keep: bool | Keep = False,
    **not_options: Never,
) -> _SingletonDecorator:
    """Decorate ``fn(conn, ...)`` so that each call runs it as a singleton job.

    pgsolo's options are given here, once, and only here: ``dsn=`` (or ``PGSOLO_DSN`` /
    ``DATABASE_URL``) says where to connect, every other one is :func:`run_job`'s, and
    they are checked now. The decorated function keeps its own signature: every argument
    of a call, keyword ones included (``greet(name="bob")``), goes to ``fn`` and none is
    read as an option. It returns a :class:`JobResult`; an ``async def`` function gives
    an async one.
    """
    _refuse_unknown_options(singleton, not_options)
    Job.define(
        key,
        name=name,
        lifetime=lifetime,
        wait=wait,
        period=period,
        record=record,
        application_name=application_name,
        namespace=namespace,
        registry=registry,
        keep=keep,
    )
    options: dict[str, Any] = {
        "name": name,
        "lifetime": lifetime,
        "wait": wait,
        "period": period,
        "record": record,
        "raise_errors": raise_errors,
        "application_name": application_name,
        "namespace": namespace,
        "registry": registry,
        "keep": keep,
    }

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
                # The call's keywords are bound to fn here, so none reaches run_job_async.
                work = functools.partial(fn, **kwargs)
                return await run_job_async(choose_dsn(dsn).dsn, key, work, *args, **options)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
            work = functools.partial(fn, **kwargs)
            return run_job(choose_dsn(dsn).dsn, key, work, *args, **options)

        return wrapper

    return decorate
