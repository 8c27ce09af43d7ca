"""pgsolo with APScheduler 3: replicas that each run the same scheduler, the same jobs and
the same triggers, and run each scheduled occurrence of a job once between them
(docs/schedulers.md).

:class:`OnceExecutor` wraps the executor that runs the jobs and runs each occurrence
through :func:`pgsolo.run_once`, keyed by the job's id and the occurrence's *scheduled* time
(:func:`occurrence_key`): every replica computes the same key from its trigger, whatever its
clock or time zone says, and the database decides which one runs it. A replica that finds
the occurrence run, or running, elsewhere does not call the job; its APScheduler reports
:data:`EVENT_OCCURRENCE_SKIPPED` instead of ``EVENT_JOB_EXECUTED``.

Importing this module imports APScheduler (a scheduler recognises an executor by its
class); ``import pgsolo`` never does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent  # type: ignore[import-untyped]
from apscheduler.executors.base import BaseExecutor  # type: ignore[import-untyped]
from apscheduler.executors.pool import ThreadPoolExecutor  # type: ignore[import-untyped]
from apscheduler.job import Job  # type: ignore[import-untyped]
from apscheduler.util import iscoroutinefunction_partial  # type: ignore[import-untyped]

from ._types import OnceOutcome
from .drivers.conninfo import parse_dsn
from .errors import InvalidArgumentError, UsageError
from .locking import wait_ms_of
from .once import OperationContext, run_once, run_once_async

__all__ = ["EVENT_OCCURRENCE_SKIPPED", "OnceExecutor", "Skipped", "occurrence", "occurrence_key"]

EVENT_OCCURRENCE_SKIPPED = 2**24
"""The event of an occurrence this replica did not run: another ran it, or runs it now.

A bit above APScheduler 3's own codes, so ``EVENT_ALL`` leaves it out and a listener that
counts ``EVENT_JOB_EXECUTED`` counts only the runs of its own replica; add a listener with
this mask to see the skips (``event.retval`` is a :class:`Skipped`)."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """Why a replica did not run an occurrence: the ``retval`` of its
    :data:`EVENT_OCCURRENCE_SKIPPED` event."""

    op_key: str
    """The occurrence's operation key (:func:`occurrence_key`), its row in
    ``pgsolo.operations``."""
    outcome: OnceOutcome
    """``already-succeeded``: another replica ran it to success. ``skipped-busy``: another
    replica is running it (and did not end within ``wait``)."""


def occurrence_key(job_id: str, run_time: datetime) -> str:
    """The operation key of the occurrence of ``job_id`` scheduled at ``run_time``:
    ``apscheduler:<job id>@<run time in UTC, ISO 8601>``.

    In UTC, so that replicas whose schedulers have different time zones agree on it.
    """
    return f"apscheduler:{job_id}@{run_time.astimezone(UTC).isoformat()}"


_current: ContextVar[OperationContext] = ContextVar("pgsolo_apscheduler_occurrence")


def occurrence() -> OperationContext:
    """The occurrence the calling job runs, from inside a job that a :class:`OnceExecutor`
    runs: its ``op_key`` (:func:`occurrence_key`), the ``idempotency_key`` to hand to an
    external service, the ``attempt`` number (more than 1 when an earlier attempt failed or
    died), and ``conn``, a psycopg connection whose statements commit with the record of
    the occurrence's success, or not at all. :class:`~pgsolo.UsageError` anywhere else."""
    try:
        return _current.get()
    except LookupError:
        raise UsageError(
            "pgsolo.apscheduler.occurrence() is called from inside a job run by OnceExecutor"
        ) from None


class OnceExecutor(BaseExecutor):  # type: ignore[misc]
    """An APScheduler 3 executor that runs each scheduled occurrence of a job at most once
    across every scheduler that uses one on the same database.

    ``dsn`` is the connection string of the database (``pgsolo migrate`` must have run);
    each occurrence opens a connection of its own, named ``pgsolo:once:<key>``, for as long
    as it runs. ``executor`` runs the jobs (a ``ThreadPoolExecutor()`` by default; a
    process pool, ``AsyncIOExecutor`` for coroutine jobs...). ``wait`` is
    :func:`pgsolo.run_once`'s: ``None`` skips an occurrence another replica is running; a
    number of seconds waits up to that long for it to end, and runs the occurrence again
    here if that run failed or died.

    Checked here, before anything connects: :class:`~pgsolo.InvalidArgumentError` for a
    ``dsn`` that is not text or an ``executor`` that is not an APScheduler executor,
    :class:`~pgsolo.InvalidDsnError` for a ``dsn`` libpq would refuse.
    """

    def __init__(self, dsn: str, executor: object = None, *, wait: float | None = None) -> None:
        super().__init__()
        if not isinstance(dsn, str):
            raise InvalidArgumentError(
                f"OnceExecutor() takes a connection string (each occurrence opens its own"
                f" connection), got {type(dsn).__name__}"
            )
        parse_dsn(dsn)
        if executor is None:
            executor = ThreadPoolExecutor()
        if not isinstance(executor, BaseExecutor) or isinstance(executor, OnceExecutor):
            raise InvalidArgumentError(
                "OnceExecutor(executor=...) takes the APScheduler executor that runs the jobs"
                f" (ThreadPoolExecutor(), ProcessPoolExecutor()...), got {executor!r}"
            )
        wait_ms_of(wait)
        self._dsn = dsn
        self._executor = executor
        self._wait = wait

    def start(self, scheduler: Any, alias: str) -> None:
        super().start(scheduler, alias)
        self._executor.start(_Relay(scheduler), alias)

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait)

    def submit_job(self, job: Any, run_times: Sequence[datetime]) -> None:
        # The wrapped executor counts the running instances (max_instances) and is the one
        # told when they end; counting them here too would count each twice.
        self._do_submit_job(job, run_times)

    def _do_submit_job(self, job: Any, run_times: Sequence[datetime]) -> None:
        # One submission per occurrence, each with its own key. Several run times come
        # only with coalesce=False; APScheduler counts them as one instance, so each after
        # the first gets one more allowed instance, and only the first can be refused.
        for extra, run_time in enumerate(run_times):
            self._executor.submit_job(self._occurrence(job, run_time, extra), [run_time])

    def _occurrence(self, job: Any, run_time: datetime, extra: int) -> Any:
        """``job`` as it runs at ``run_time``: through ``run_once``, under the job's own id,
        name and options, so APScheduler's logs, events and misfire checks are the job's."""
        run = _run_async if iscoroutinefunction_partial(job.func) else _run
        occurrence = Job(
            job._scheduler,
            id=job.id,
            func=run,
            args=(self._dsn, occurrence_key(job.id, run_time), self._wait, job.func),
            kwargs={"args": tuple(job.args), "kwargs": dict(job.kwargs)},
            name=job.name,
            trigger=job.trigger,
            executor=job.executor,
            misfire_grace_time=job.misfire_grace_time,
            coalesce=job.coalesce,
            max_instances=job.max_instances + extra,
            next_run_time=job.next_run_time,
        )
        occurrence._jobstore_alias = job._jobstore_alias
        return occurrence


class _Relay:
    """The scheduler as the wrapped executor sees it: the events of its runs pass through
    here, where a skipped occurrence's ``EVENT_JOB_EXECUTED`` becomes
    :data:`EVENT_OCCURRENCE_SKIPPED`, so that no listener counts it as a run of its own."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def _dispatch_event(self, event: Any) -> None:
        if event.code == EVENT_JOB_EXECUTED and isinstance(event.retval, Skipped):
            event = JobExecutionEvent(
                EVENT_OCCURRENCE_SKIPPED,
                event.job_id,
                event.jobstore,
                event.scheduled_run_time,
                retval=event.retval,
            )
        self._scheduler._dispatch_event(event)


def _run(
    dsn: str,
    op_key: str,
    wait: float | None,
    func: Callable[..., object],
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    returned: list[object] = []

    def operation(ctx: OperationContext) -> None:
        # The job's return value is this replica's (its EXECUTED event's retval), not
        # stored: it need not be JSON.
        token = _current.set(ctx)
        try:
            returned.append(func(*args, **kwargs))
        finally:
            _current.reset(token)

    # run_once logs every outcome at INFO on pgsolo.once, a skip as much as a run.
    result = run_once(dsn, op_key, operation, wait=wait)
    return returned[0] if result.outcome == "ran" else Skipped(op_key, result.outcome)


async def _run_async(
    dsn: str,
    op_key: str,
    wait: float | None,
    func: Callable[..., Awaitable[object]],
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    returned: list[object] = []

    async def operation(ctx: OperationContext) -> None:
        token = _current.set(ctx)
        try:
            returned.append(await func(*args, **kwargs))
        finally:
            _current.reset(token)

    result = await run_once_async(dsn, op_key, operation, wait=wait)
    return returned[0] if result.outcome == "ran" else Skipped(op_key, result.outcome)
