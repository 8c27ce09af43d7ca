"""``run_job`` and ``run_job_async``: the outcomes that only one flavour has a test for.

A connection with a transaction open is refused, a wait gets the lock when the holder lets
go (a thread, or a task, runs the job meanwhile), a failure without raise_errors, a lost
session lock behind the job's back, and a cancelled async run. The outcomes tested alike
in both flavours are written once, async, in ``_async/test_outcomes.py``;
``_sync/test_outcomes.py`` is generated from it by scripts/unasync.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    DEADLINE,
    IDLE,
    INTRANS,
    AConnect,
    Boom,
    Connect,
    aeventually,
    eventually,
    hold,
    insert_work,
    job_log_records,
    key_of,
    new_job,
    period_rows,
    terminate,
    unhold,
    work_rows,
)
from pgsolo import ConnectionStateError, LockLostError
from pgsolo._types import Lifetime
from pgsolo.jobs import run_job, run_job_async
from pgsolo.jobs.definition import replace_result

# -- sync jobs -----------------------------------------------------------------------------


def test_a_connection_with_a_transaction_open_is_refused(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    conn = connect(autocommit=False)
    conn.execute("SELECT 1")  # the caller's own transaction is open
    calls: list[int] = []

    with pytest.raises(ConnectionStateError, match="no transaction open"):
        run_job(conn, job, lambda c: calls.append(1))

    assert calls == []
    assert conn.info.transaction_status == INTRANS  # the caller's transaction is untouched
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_wait_gets_the_lock_when_the_holder_releases(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    holder = hold(connect, job)
    box: dict[str, Any] = {}

    def fn(conn: psycopg.Connection) -> int:
        return conn.info.backend_pid

    def runner() -> None:
        try:
            box["result"] = run_job(db, job, fn, lifetime=lifetime, wait=10)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    waiting = eventually(lambda: observer.waiters(key_of(job)), "the job to wait for the lock")
    unhold(holder, job)
    thread.join(DEADLINE)

    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.outcome == "completed"
    assert {result.value} == waiting == {result.backend_pid}
    assert result.lock_wait > 0
    assert observer.holders(key_of(job)) == set()


def test_failure_without_raise_errors_returns_a_failed_result(db: str, observer: Any) -> None:
    job = new_job()
    boom = Boom("nope")

    def fn(conn: psycopg.Connection) -> None:
        raise boom

    result = run_job(db, job, fn, raise_errors=False)

    assert result.outcome == "failed"
    assert result.error is boom
    assert result.value is None
    assert not result.completed
    assert not result.skipped
    assert result.reason is None
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("target", ["dsn", "conn"])
def test_session_lock_lost_without_raise_errors(
    db: str, connect: Connect, observer: Any, target: str
) -> None:
    job = new_job()
    conn = connect() if target == "conn" else None
    pids: list[int] = []

    def fn(c: psycopg.Connection) -> None:
        pids.append(c.info.backend_pid)
        terminate(observer, c.info.backend_pid)

    result = run_job(db if conn is None else conn, job, fn, lifetime="session", raise_errors=False)

    assert result.outcome == "lost"
    assert not result.completed
    assert isinstance(result.error, LockLostError)
    assert result.reason
    assert result.backend_pid == pids[0]
    if conn is not None:
        assert conn.closed
        assert pgsolo.held_session_locks(conn) == []


def test_session_lock_released_behind_pgsolos_back_is_lost(db: str, observer: Any) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> None:
        conn.execute("SELECT pg_advisory_unlock_all()")

    result = run_job(db, job, fn, lifetime="session", raise_errors=False)

    assert result.outcome == "lost"
    assert isinstance(result.error, pgsolo.LockNotHeldError)
    with pytest.raises(LockLostError):
        run_job(db, job, fn, lifetime="session")


# -- async jobs ----------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_wait_gets_the_lock_when_the_holder_releases_async(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    holder = hold(connect, job)

    async def fn(conn: psycopg.AsyncConnection[Any]) -> int:
        return conn.info.backend_pid

    task = asyncio.create_task(run_job_async(db, job, fn, lifetime=lifetime, wait=10))
    waiting = await aeventually(lambda: observer.waiters(key_of(job)), "the job to wait")
    unhold(holder, job)
    result = await asyncio.wait_for(task, DEADLINE)

    assert result.outcome == "completed"
    assert {result.value} == waiting
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_cancelled_run_releases_the_lock_and_rolls_back(
    db: str, aconnect: AConnect, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    conn = await aconnect()
    started = asyncio.Event()
    caplog.set_level(logging.INFO, logger="pgsolo")

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        await insert_work(c, job, "interrupted")
        started.set()
        await asyncio.sleep(DEADLINE * 3)

    task = asyncio.create_task(run_job_async(conn, job, fn, lifetime=lifetime, period="day"))
    await asyncio.wait_for(started.wait(), DEADLINE)
    assert observer.holders(key_of(job)) == {conn.info.backend_pid}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)

    assert observer.holders(key_of(job)) == set()
    assert conn.info.transaction_status == IDLE
    assert pgsolo.held_session_locks(conn) == []
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["interrupted"])
    assert period_rows(observer, job) == []  # an interrupted run does not use up the day
    assert job_log_records(caplog, job) == []  # not an outcome of the work


def test_each_outcome_has_its_class_and_every_one_is_a_job_result(
    db: str, connect: Connect
) -> None:
    """The classes type checkers narrow by (``if result.completed:`` makes ``value`` a
    ``T``) are what run time hands back, and ``isinstance(r, JobResult)`` still holds."""
    job = new_job()
    done = pgsolo.run_job(db, job, lambda conn: 7)
    assert type(done) is pgsolo.JobCompleted
    assert (done.completed, done.value, done.outcome) == (True, 7, "completed")
    holder = hold(connect, job)
    skipped = pgsolo.run_job(db, job, lambda conn: 7)
    unhold(holder, job)
    assert type(skipped) is pgsolo.JobSkipped
    assert (skipped.skipped, skipped.reason, skipped.value) == (True, "busy", None)

    def boom(conn: object) -> int:
        raise Boom

    failed = pgsolo.run_job(db, job, boom, raise_errors=False)
    assert type(failed) is pgsolo.JobFailed
    for result in (done, skipped, failed):
        assert isinstance(result, pgsolo.JobResult)
    assert pgsolo.JobResult[int] is not None  # still subscriptable at run time
    # A changed outcome changes the class with it (pgsolo run's "released badly" ending).
    assert type(replace_result(failed, outcome="completed", error=None)) is pgsolo.JobCompleted
