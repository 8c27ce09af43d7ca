"""``run_job_async``: a function run as one attempt at a job, on an async connection the
caller gives or one pgsolo opens from a connection string."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from ..._acompat import AIS_ASYNC, AMutex, apause, ato_its_end
from ...drivers import AsyncDriver, adapt_async
from ...drivers._async.connect import aopen_connection
from ...errors import ConnectionStateError, DatabaseUnavailableError
from ...keys import KeyLike
from ...locking import (
    AsyncKeeper,
    AsyncLocker,
    Watch,
    adrive,
    alend_session,
    keepalive_basis,
    poll_pauses,
)
from ..definition import (
    Job,
    JobOptions,
    JobResult,
    awork_value,
    refuse_cancel_without_tasks,
    refuse_unknown_options,
    refuse_unrunnable_work,
    through_locker,
)
from ..plan import attempt_plan, conclude, core_for
from ..report import report
from .record import arecord_result

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["run_job_async"]

T = TypeVar("T")


# How long a job's work, once over, may wait for its Locker connection back while it is
# being cancelled: the connection's other locks each hold it for one round trip.
RETURN_BOUND = 60.0


async def run_job_async(
    target: AsyncConnectionLike | AsyncLocker | str,
    key: KeyLike,
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    **options: Unpack[JobOptions],
) -> JobResult[T]:
    """Run ``fn(conn, *args)`` at most once at a time across every process.

    ``target`` is a connection of any supported library (docs/connections.md), which
    stays the caller's, or a connection string from which pgsolo opens (and closes) a
    connection named ``pgsolo:<job name>`` in ``pg_stat_activity``. Busy means skip,
    unless ``wait=`` seconds are given.

    ``target`` may be an :class:`~pgsolo.AsyncLocker`: the job's session lock is taken
    through it (``lifetime`` is ``"session"``), a wait tries as a Locker's waits do, and
    ``fn(*args)`` is called without a connection, since the Locker's are shared by its
    locks.

    Keyword arguments are pgsolo's options only (:class:`JobOptions`: ``lifetime``,
    ``wait``, ``period``, ``record``, ``keep``, ...); any other raises :class:`UsageError`
    before anything connects. To give ``fn`` keyword arguments of its own, bind them
    first: ``run_job_async(dsn, key, functools.partial(fn, name="bob"))``. A failure
    re-raises the callable's exception after it is logged and recorded, unless
    ``raise_errors=False``.
    """
    refuse_unknown_options("run_job_async", options)
    refuse_unrunnable_work(fn, awaits=AIS_ASYNC)
    if isinstance(target, AsyncLocker):
        through_locker(options)  # type: ignore[arg-type]
    job = Job.define(key, **options)
    refuse_cancel_without_tasks(job, tasks=AIS_ASYNC)
    if isinstance(target, AsyncLocker):
        return await _run_through(job, target, fn, args)
    if isinstance(target, str):
        async with aopen_connection(
            target,
            application_name=job.application_name_for(target),
            check_timeout=keepalive_basis(job.keep),
        ) as conn:
            return await _run_async(job, adapt_async(conn), target, fn, (conn, *args))
    return await _run_async(job, adapt_async(target), None, fn, (target, *args))


async def _run_async(
    job: Job,
    driver: AsyncDriver,
    dsn: str | None,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    *,
    again_if_busy: bool = False,
) -> JobResult[T]:
    """One attempt at ``job`` on ``driver``, ``fn(*args)`` being its work: reported,
    recorded and concluded, unless ``again_if_busy`` and it found the key busy (the
    caller tries again, and reports the last try)."""
    info = driver.server_info()  # read now: a report of a loss comes after the connection
    core = core_for(job, driver)

    async def work() -> T:
        keeper = AsyncKeeper(Watch(core, job.keep), driver) if job.keep is not None else None
        if keeper is not None:
            keeper.start()
        ended_with: BaseException | None = None
        try:
            return await awork_value(fn(*args))
        except BaseException as exc:
            ended_with = exc
            raise
        finally:
            if keeper is not None:
                keeper.stop()
                if (instead := keeper.undo_cancel(ended_with)) is not None:
                    raise instead from ended_with  # Keep(cancel=True) stopped the work

    result: JobResult[T] = await adrive(attempt_plan(job, core), driver, work)
    if again_if_busy and _busy(result):
        return result
    report(job, result, driver, info)
    if job.record:
        await arecord_result(job, result, driver, dsn)
    return conclude(job, result)


async def _run_through(
    job: Job, locker: AsyncLocker, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]
) -> JobResult[T]:
    """An attempt at ``job`` through ``locker``: the plan's round trips on one of its
    connections, each with that connection to itself, and ``fn(*args)`` without it; a
    wait is tries until ``job.wait`` runs out, and one more, which is reported."""
    deadline = None if job.wait is None else time.monotonic() + job.wait
    one_try = dataclasses.replace(job, wait=None)
    pauses = poll_pauses()
    dead = 0  # connections found closed by their server before the work began
    while True:
        last = deadline is None or time.monotonic() >= deadline
        began: list[bool] = []
        async with alend_session(locker, job.key) as (driver, mutex):
            try:
                result = await _run_async(
                    one_try,
                    driver,
                    None,
                    _without,
                    (mutex, began, fn, args),
                    again_if_busy=not last,
                )
            except (DatabaseUnavailableError, ConnectionStateError):
                # Ended by its server before the work began (refused before any SQL, or
                # failed under the lock's statement, nothing held): the attempt goes to
                # another connection, as a Locker's lock does.
                dead += 1
                if began or not driver.is_closed() or dead > locker.max_connections:
                    raise
                continue
        if last or not _busy(result):
            return result
        await apause(min(next(pauses), max(0.0, (deadline or 0) - time.monotonic())), None)


def _busy(result: JobResult[Any]) -> bool:
    return result.outcome == "skipped" and result.reason == "busy"


async def _without(
    mutex: AMutex, began: list[bool], fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]
) -> T:
    """``fn(*args)``, the Locker's connection left to its other locks meanwhile; ``began``
    says it was called."""
    began.append(True)
    mutex.release()
    try:
        return await awork_value(fn(*args))
    finally:
        await ato_its_end(mutex.acquire(), RETURN_BOUND)
