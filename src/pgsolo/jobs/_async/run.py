"""``run_job_async``: a function run as one attempt at a job, on an async connection the
caller gives or one pgsolo opens from a connection string."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from ..._acompat import AIS_ASYNC
from ...drivers import adapt_async
from ...drivers._async.connect import aopen_connection
from ...keys import KeyLike
from ...locking import AsyncKeeper, Watch, adrive
from ..definition import (
    Job,
    JobOptions,
    JobResult,
    refuse_cancel_without_tasks,
    refuse_unknown_options,
)
from ..plan import attempt_plan, conclude, core_for
from ..report import report
from .record import arecord_result

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["run_job_async"]

T = TypeVar("T")


async def run_job_async(
    target: AsyncConnectionLike | str,
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

    Keyword arguments are pgsolo's options only (:class:`JobOptions`: ``lifetime``,
    ``wait``, ``period``, ``record``, ``keep``, ...); any other raises :class:`UsageError`
    before anything connects. To give ``fn`` keyword arguments of its own, bind them
    first: ``run_job_async(dsn, key, functools.partial(fn, name="bob"))``. A failure
    re-raises the callable's exception after it is logged and recorded, unless
    ``raise_errors=False``.
    """
    refuse_unknown_options("run_job_async", options)
    job = Job.define(key, **options)
    refuse_cancel_without_tasks(job, tasks=AIS_ASYNC)
    if isinstance(target, str):
        async with aopen_connection(
            target, application_name=job.application_name_for(target)
        ) as conn:
            return await _run_async(job, conn, target, fn, args)
    return await _run_async(job, target, None, fn, args)


async def _run_async(
    job: Job,
    conn: AsyncConnectionLike,
    dsn: str | None,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
) -> JobResult[T]:
    driver = adapt_async(conn)
    info = driver.server_info()
    core = core_for(job, driver)

    async def work() -> T:
        keeper = AsyncKeeper(Watch(core, job.keep), driver) if job.keep is not None else None
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

    result: JobResult[T] = await adrive(attempt_plan(job, core), driver, work)
    report(job, result, driver, info)
    if job.record:
        await arecord_result(job, result, driver, dsn)
    return conclude(job, result)
