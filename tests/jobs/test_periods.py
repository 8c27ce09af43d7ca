"""Once per period (``period=``): a completed run uses up its period, a failed one does not;
the period comes from the database clock in UTC; concurrent runs in one period run the
work once, and the unique constraint, not the lock, has the last word.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from _support import (
    WORK,
    key_of,
    period_rows,
    work_rows,
)
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]
DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


class Boom(Exception):
    """The callable's own failure."""


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def server_now(observer: Any) -> datetime:
    row = observer.conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def insert_work(conn: psycopg.Connection, job: str, note: str) -> None:
    conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_a_failed_run_does_not_use_up_the_period(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    calls: list[bool] = []

    def fn(conn: psycopg.Connection, fail: bool) -> str:
        calls.append(fail)
        if fail:
            raise Boom("first try fails")
        return "done"

    first = run_job(db, job, fn, True, period="day", lifetime=lifetime, raise_errors=False)
    assert first.outcome == "failed"
    assert period_rows(observer, job) == []

    second = run_job(db, job, fn, False, period="day", lifetime=lifetime)
    third = run_job(db, job, fn, False, period="day", lifetime=lifetime)

    assert (second.outcome, second.value) == ("completed", "done")
    assert (third.outcome, third.reason) == ("skipped", "already-done-this-period")
    assert calls == [True, False]
    assert len(period_rows(observer, job)) == 1


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_once_per_day_completes_then_skips(db: str, observer: Any, lifetime: Lifetime) -> None:
    job = new_job()
    calls: list[int] = []

    def fn(conn: psycopg.Connection) -> str:
        calls.append(conn.info.backend_pid)
        return "settled"

    first = run_job(db, job, fn, period="day", lifetime=lifetime)
    assert observer.holders(key_of(job)) == set()  # the first run is over: no overlap
    second = run_job(db, job, fn, period="day", lifetime=lifetime)

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
    assert run_job(db, job, fn, period="hour", lifetime=lifetime).outcome == "completed"


@pytest.mark.parametrize(
    ("period", "expected"),
    [
        ("day", "date_trunc('day', completed_at, 'UTC')"),
        ("week", "date_trunc('week', completed_at, 'UTC')"),
        ("month", "date_trunc('month', completed_at, 'UTC')"),
        ("3600 seconds", "date_bin('1 hour', completed_at, timestamptz '1970-01-01 00:00+00')"),
    ],
)
def test_the_period_comes_from_the_database_clock_in_utc(
    db: str, observer: Any, period: str, expected: str
) -> None:
    """The session's time zone is +14h: a period truncated in local time would differ."""
    job = new_job()
    far_east = make_conninfo(db, options="-c TimeZone=Pacific/Kiritimati")
    before = server_now(observer)

    result = run_job(far_east, job, lambda c: None, period=period)

    after = server_now(observer)
    assert result.outcome == "completed"
    rows = observer.conn.execute(
        f"SELECT period_start = {expected}, completed_at, period_start"
        " FROM pgsolo.job_periods WHERE job = %s AND period = %s",
        (job, period),
    ).fetchall()
    assert len(rows) == 1
    matches, completed_at, start = rows[0]
    assert matches, (start, completed_at)
    assert before <= completed_at <= after  # stamped by the server, during the run
    assert start <= completed_at


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_concurrent_runs_in_one_period_run_the_work_once(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    workers = 8
    conns = [connect() for _ in range(workers)]
    barrier = threading.Barrier(workers)
    results: list[JobResult[int] | None] = [None] * workers
    errors: list[BaseException] = []

    def fn(conn: psycopg.Connection, i: int) -> int:
        insert_work(conn, job, str(i))
        time.sleep(0.2)  # widen the window in which the others try; not synchronisation
        return i

    def runner(i: int) -> None:
        try:
            barrier.wait(DEADLINE)
            results[i] = run_job(conns[i], job, fn, i, period="day", lifetime=lifetime)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE * 3)

    assert not any(t.is_alive() for t in threads)
    assert errors == []
    done = [r for r in results if r is not None]
    assert len(done) == workers
    outcomes = collections.Counter(r.outcome for r in done)
    assert outcomes == {"completed": 1, "skipped": workers - 1}
    assert {r.reason for r in done if r.skipped} <= {"busy", "already-done-this-period"}
    (winner,) = [r for r in done if r.completed]
    assert work_rows(observer, job) == [str(winner.value)]  # the work ran exactly once
    assert len(period_rows(observer, job)) == 1


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_a_period_already_recorded_skips_without_running(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    observer.conn.execute(
        "INSERT INTO pgsolo.job_periods (job, period, period_start)"
        " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
        (job,),
    )
    calls: list[int] = []

    result = run_job(db, job, lambda c: calls.append(1), period="day", lifetime=lifetime)

    assert (result.outcome, result.reason) == ("skipped", "already-done-this-period")
    assert calls == []
    assert observer.holders(key_of(job)) == set()


def test_a_run_that_sneaks_in_without_the_lock_wins_and_the_xact_work_rolls_back(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    sneak = connect()  # a run that did not take the lock records the period meanwhile

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "would be the second time")
        sneak.execute(
            "INSERT INTO pgsolo.job_periods (job, period, period_start)"
            " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
            (job,),
        )
        return "ran"

    result = run_job(db, job, fn, period="day")

    assert (result.outcome, result.reason, result.value) == (
        "skipped",
        "already-done-this-period",
        None,
    )
    assert work_rows(observer, job) == []  # the job's transaction was rolled back
    assert period_rows(observer, job) == [("day", None, None, True)]  # the sneak's row
    assert observer.holders(key_of(job)) == set()


def test_a_session_run_that_loses_the_period_race_says_the_work_ran_twice(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    sneak = connect()

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "done")  # autocommit: already committed, cannot be undone
        sneak.execute(
            "INSERT INTO pgsolo.job_periods (job, period, period_start)"
            " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
            (job,),
        )
        return "ran"

    with caplog.at_level(logging.INFO, logger="pgsolo"):
        result = run_job(db, job, fn, period="day", lifetime="session")

    assert (result.outcome, result.value) == ("completed", "ran")
    assert work_rows(observer, job) == ["done"]
    twice = [r for r in caplog.records if "ran twice" in r.getMessage()]
    assert len(twice) == 1
    assert twice[0].levelno == logging.ERROR
    assert job in twice[0].getMessage()


# -- async jobs ----------------------------------------------------------------------------

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]
BOUND = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


def new_async_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def ainsert_work(conn: psycopg.AsyncConnection[Any], job: str, note: str) -> None:
    await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


async def test_a_failed_run_does_not_use_up_the_period_async(db: str, observer: Any) -> None:
    job = new_async_job()
    calls: list[bool] = []

    async def fn(conn: psycopg.AsyncConnection[Any], fail: bool) -> str:
        calls.append(fail)
        if fail:
            raise Boom("first try fails")
        return "done"

    first = await run_job_async(db, job, fn, True, period="day", raise_errors=False)
    second = await run_job_async(db, job, fn, False, period="day")
    third = await run_job_async(db, job, fn, False, period="day")

    assert first.outcome == "failed"
    assert (second.outcome, second.value) == ("completed", "done")
    assert (third.outcome, third.reason) == ("skipped", "already-done-this-period")
    assert calls == [True, False]
    assert len(period_rows(observer, job)) == 1


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_once_per_day_completes_then_skips_async(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        calls.append(conn.info.backend_pid)
        return "settled"

    first = await run_job_async(db, job, fn, period="day", lifetime=lifetime)
    assert observer.holders(key_of(job)) == set()
    second = await run_job_async(db, job, fn, period="day", lifetime=lifetime)

    assert (first.outcome, first.value) == ("completed", "settled")
    assert (second.outcome, second.reason) == ("skipped", "already-done-this-period")
    assert len(calls) == 1
    assert period_rows(observer, job) == [("day", socket.gethostname(), os.getpid(), True)]


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_concurrent_tasks_in_one_period_run_the_work_once(
    db: str, aconnect: AConnect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    workers = 8
    conns = [await aconnect() for _ in range(workers)]

    async def fn(conn: psycopg.AsyncConnection[Any], i: int) -> int:
        await ainsert_work(conn, job, str(i))
        await asyncio.sleep(0.2)  # widen the window in which the others try
        return i

    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                run_job_async(conns[i], job, fn, i, period="day", lifetime=lifetime)
                for i in range(workers)
            )
        ),
        BOUND * 3,
    )

    outcomes = collections.Counter(r.outcome for r in results)
    assert outcomes == {"completed": 1, "skipped": workers - 1}
    assert {r.reason for r in results if r.skipped} <= {"busy", "already-done-this-period"}
    (winner,) = [r for r in results if r.completed]
    assert work_rows(observer, job) == [str(winner.value)]
    assert len(period_rows(observer, job)) == 1


async def test_a_period_already_recorded_skips_without_running_async(
    db: str, observer: Any
) -> None:
    job = new_async_job()
    observer.conn.execute(
        "INSERT INTO pgsolo.job_periods (job, period, period_start)"
        " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
        (job,),
    )
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    result = await run_job_async(db, job, fn, period="day")

    assert (result.outcome, result.reason) == ("skipped", "already-done-this-period")
    assert calls == []


async def test_a_run_that_sneaks_in_without_the_lock_wins_and_the_xact_work_rolls_back_async(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_async_job()
    sneak = connect()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await ainsert_work(conn, job, "would be the second time")
        sneak.execute(
            "INSERT INTO pgsolo.job_periods (job, period, period_start)"
            " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
            (job,),
        )
        return "ran"

    result = await run_job_async(db, job, fn, period="day")

    assert (result.outcome, result.reason, result.value) == (
        "skipped",
        "already-done-this-period",
        None,
    )
    assert work_rows(observer, job) == []
    assert period_rows(observer, job) == [("day", None, None, True)]
    assert observer.holders(key_of(job)) == set()
