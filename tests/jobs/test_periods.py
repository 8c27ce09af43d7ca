"""Once per period (``period=``), the tests that only one flavour has: the period comes from
the database clock in UTC; concurrent runs (threads, or tasks) in one period run the work
once, and the unique constraint, not the lock, has the last word. The period tests alike
in both flavours are written once, async, in ``_async/test_periods.py``; scripts/unasync.py
generates ``_sync/test_periods.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import (
    DEADLINE,
    AConnect,
    Connect,
    insert_work,
    new_job,
    period_rows,
    record_period,
    server_now,
    work_rows,
)
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "isolation", [psycopg.IsolationLevel.REPEATABLE_READ, psycopg.IsolationLevel.SERIALIZABLE]
)
def test_an_xact_period_job_whose_snapshot_may_predate_its_lock_is_refused_before_the_work(
    db: str, connect: Connect, observer: Any, isolation: psycopg.IsolationLevel
) -> None:
    """At REPEATABLE READ, an xact job's transaction takes its snapshot as the lock's
    statement begins: a run that waited for the lock while another completed the period
    read the period as undone, ran the work again (its side effects twice), then failed
    on the period's INSERT. Now a check whose snapshot may be older than the lock refuses
    the run before its work; a session job's check, a transaction of its own, runs."""
    job = new_job()
    conn = connect()
    conn.isolation_level = isolation
    ran: list[str] = []

    def fn(conn: psycopg.Connection, name: str) -> str:
        ran.append(name)
        insert_work(conn, job, name)
        return name

    with pytest.raises(pgsolo.UsageError, match="READ COMMITTED"):
        run_job(conn, job, fn, "xact", period="day", wait=5)
    assert ran == []
    assert period_rows(observer, job) == []
    assert observer.advisory(pid=conn.info.backend_pid) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE

    assert run_job(conn, job, fn, "session", period="day", lifetime="session").completed
    assert run_job(conn, job, fn, "again", period="day", lifetime="session").skipped
    assert ran == ["session"]
    assert work_rows(observer, job) == ["session"]
    assert len(period_rows(observer, job)) == 1


def test_a_session_job_whose_work_left_its_transaction_failed_is_failed_not_done(
    db: str, connect: Connect, observer: Any
) -> None:
    """Work on a connection with autocommit off that catches a database error leaves its
    transaction failed; letting the key go rolls it back, work included. Before: the run
    was failed with ``period-not-recorded``, whose meaning is that the work is done, and
    the log said it completed."""
    job = new_job()
    conn = connect(autocommit=False)

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "rolled back")
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        return "done"

    result = run_job(conn, job, fn, period="day", lifetime="session", raise_errors=False)
    assert (result.outcome, result.reason) == ("failed", None)
    assert isinstance(result.error, pgsolo.TransactionFailedError)
    assert "rolled back" in str(result.error)
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert work_rows(observer, job) == []
    assert period_rows(observer, job) == []
    assert observer.advisory(pid=conn.info.backend_pid) == set()
    # Not done, so the next run in this period does it.
    assert run_job(conn, job, lambda c: "again", period="day", lifetime="session").completed


def test_a_session_run_that_loses_the_period_race_says_the_work_ran_twice(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    sneak = connect()

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "done")  # autocommit: already committed, cannot be undone
        record_period(sneak, job)
        return "ran"

    with caplog.at_level(logging.INFO, logger="pgsolo"):
        result = run_job(db, job, fn, period="day", lifetime="session")

    assert (result.outcome, result.value) == ("completed", "ran")
    assert work_rows(observer, job) == ["done"]
    twice = [r for r in caplog.records if "ran twice" in r.getMessage()]
    assert len(twice) == 1
    assert twice[0].levelno == logging.ERROR
    assert job in twice[0].getMessage()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_session_job_whose_work_left_its_transaction_open_holds_its_key_until_it_ends(
    db: str, connect: Connect, observer: Any, ending: str
) -> None:
    """Regression: on a connection with autocommit off (psycopg's default), a session
    job's work runs in the driver's transaction, for the caller to end, and its period's
    record went into it; the lock was let go at once, so a second run started before
    either was committed, ran the work again, and then waited for the first's record.
    The key stays held until the caller ends that transaction: a commit makes the next
    run skip the period, a rollback (the work and its record undone) lets it run."""
    job = new_job()
    caller = connect(autocommit=False)
    first = run_job(caller, job, lambda c: insert_work(c, job, "first"), period="day",
                    lifetime="session")  # fmt: skip
    assert first.completed
    assert caller.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    second = run_job(db, job, lambda c: insert_work(c, job, "second"), period="day",
                     lifetime="session")  # fmt: skip
    assert (second.outcome, second.reason) == ("skipped", "busy")
    getattr(caller, ending)()
    third = run_job(db, job, lambda c: insert_work(c, job, "third"), period="day",
                    lifetime="session")  # fmt: skip
    if ending == "commit":
        assert (third.outcome, third.reason) == ("skipped", "already-done-this-period")
        assert work_rows(observer, job) == ["first"]
    else:
        assert third.completed
        assert work_rows(observer, job) == ["third"]
    assert len(period_rows(observer, job)) == 1


# -- async jobs ----------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_concurrent_tasks_in_one_period_run_the_work_once(
    db: str, aconnect: AConnect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    workers = 8
    conns = [await aconnect() for _ in range(workers)]

    async def fn(conn: psycopg.AsyncConnection[Any], i: int) -> int:
        await insert_work(conn, job, str(i))
        await asyncio.sleep(0.2)  # widen the window in which the others try
        return i

    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                run_job_async(conns[i], job, fn, i, period="day", lifetime=lifetime)
                for i in range(workers)
            )
        ),
        DEADLINE * 3,
    )

    outcomes = collections.Counter(r.outcome for r in results)
    assert outcomes == {"completed": 1, "skipped": workers - 1}
    assert {r.reason for r in results if r.skipped} <= {"busy", "already-done-this-period"}
    (winner,) = [r for r in results if r.completed]
    assert work_rows(observer, job) == [str(winner.value)]
    assert len(period_rows(observer, job)) == 1
