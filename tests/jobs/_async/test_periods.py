"""Once per period (``period=``) for an async job: a completed run uses up its period, a
failed one does not, a period already recorded skips, and a run that sneaks in without the
lock wins while the job's xact work rolls back. Written once, under ``_async/``:
scripts/unasync.py writes the twin under ``_sync/``. Tests of one flavour only (the
database clock, concurrent runs, the session run that loses the race):
``tests/jobs/test_periods.py``.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg
import pytest

from _support import (
    Boom,
    SyncConnect,
    asleep,
    insert_work,
    key_of,
    new_job,
    period_rows,
    record_period,
    work_rows,
)
from pgsolo._types import Lifetime
from pgsolo.jobs import run_job_async


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_failed_run_does_not_use_up_the_period(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    calls: list[bool] = []

    async def fn(conn: psycopg.AsyncConnection[Any], fail: bool) -> str:
        calls.append(fail)
        if fail:
            raise Boom("first try fails")
        return "done"

    first = await run_job_async(
        db, job, fn, True, period="day", lifetime=lifetime, raise_errors=False
    )
    assert first.outcome == "failed"
    assert period_rows(observer, job) == []

    second = await run_job_async(db, job, fn, False, period="day", lifetime=lifetime)
    third = await run_job_async(db, job, fn, False, period="day", lifetime=lifetime)

    assert (second.outcome, second.value) == ("completed", "done")
    assert (third.outcome, third.reason) == ("skipped", "already-done-this-period")
    assert calls == [True, False]
    assert len(period_rows(observer, job)) == 1


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_once_per_day_completes_then_skips(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        calls.append(conn.info.backend_pid)
        return "settled"

    first = await run_job_async(db, job, fn, period="day", lifetime=lifetime)
    assert observer.holders(key_of(job)) == set()  # the first run is over: no overlap
    second = await run_job_async(db, job, fn, period="day", lifetime=lifetime)

    assert (first.outcome, first.value) == ("completed", "settled")
    assert (second.outcome, second.reason, second.value) == (
        "skipped",
        "already-done-this-period",
        None,
    )
    assert len(calls) == 1
    assert period_rows(observer, job) == [("day", socket.gethostname(), os.getpid(), True)]
    assert observer.holders(key_of(job)) == set()
    # Another period of the same job is tracked on its own.
    hourly = await run_job_async(db, job, fn, period="hour", lifetime=lifetime)
    assert hourly.outcome == "completed"


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_period_already_recorded_skips_without_running(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    record_period(observer.conn, job)
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    result = await run_job_async(db, job, fn, period="day", lifetime=lifetime)

    assert (result.outcome, result.reason) == ("skipped", "already-done-this-period")
    assert calls == []
    assert observer.holders(key_of(job)) == set()


async def test_a_run_that_sneaks_in_without_the_lock_wins_and_the_xact_work_rolls_back(
    db: str, sync_connect: SyncConnect, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    sneak = sync_connect()  # a run that did not take the lock records the period meanwhile

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await insert_work(conn, job, "would be the second time")
        record_period(sneak, job)
        return "ran"

    result = await run_job_async(db, job, fn, period="day")

    assert (result.outcome, result.reason, result.value) == (
        "skipped",
        "already-done-this-period",
        None,
    )
    assert work_rows(observer, job) == []  # the job's transaction was rolled back
    assert period_rows(observer, job) == [("day", None, None, True)]  # the sneak's row
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_run_that_crosses_a_boundary_marks_the_period_it_checked(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    """Guards the next period's run: a session job marked the period its work ended in
    (each statement its own transaction, now() read again), so the run of that next
    period, which no work had started in, was skipped as already done."""
    job = new_job("jobs-async-test")
    period = "2 seconds"

    async def cross(conn: psycopg.AsyncConnection[Any]) -> None:
        # Until the database's clock is past the end of the period this run began in.
        (left,) = observer.conn.execute(
            "SELECT extract(epoch FROM date_bin('2 seconds', clock_timestamp(),"
            " '1970-01-01 00:00:00+00') + interval '2 seconds' - clock_timestamp())"
        ).fetchone()
        await asleep(float(left) + 0.2)

    first = await run_job_async(db, job, cross, period=period, lifetime=lifetime)
    assert first.outcome == "completed"
    second = await run_job_async(db, job, lambda conn: _done(), period=period, lifetime=lifetime)
    # The second may land later still, in a third period: either way it ran.
    assert second.outcome == "completed", second
    starts = observer.conn.execute(
        "SELECT period_start FROM pgsolo.job_periods WHERE job = %s", (job,)
    ).fetchall()
    assert len(set(starts)) == 2


async def _done() -> str:
    return "done"
