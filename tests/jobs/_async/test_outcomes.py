"""What each outcome of an async job means on a real server.

Completed (the value, the work committed with the lock), skipped (busy, or a bounded wait
that ran out), failed (the same exception, the lock released) and lost (the lock or the
connection went while the work ran). Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. Tests of one flavour only: ``tests/jobs/test_outcomes.py``.
"""

from __future__ import annotations

import functools
import time
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
    SyncConnect,
    hold,
    insert_work,
    key_of,
    new_job,
    terminate,
    work_rows,
)
from pgsolo import LockLostError
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job_async

# -- completed --------------------------------------------------------------------------


async def test_completed_returns_the_value_and_commits_the_transaction(
    db: str, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    seen: dict[str, Any] = {}

    async def fn(conn: psycopg.AsyncConnection[Any], a: int, *, b: int) -> int:
        seen["status"] = conn.info.transaction_status
        seen["pid"] = conn.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        await insert_work(conn, job, "xact")
        seen["visible_before_commit"] = work_rows(observer, job)
        return a + b

    # fn's own keyword arguments are bound first: run_job_async's keywords are options.
    result = await run_job_async(db, job, functools.partial(fn, b=2), 40)

    assert isinstance(result, JobResult)
    assert result.outcome == "completed"
    assert result.completed
    assert not result.skipped
    assert result.value == 42
    assert (result.job, result.key, result.reason, result.error) == (job, key_of(job), None, None)
    assert result.backend_pid == seen["pid"]
    assert result.lock_wait >= 0
    assert result.duration >= 0
    assert seen["status"] == INTRANS  # the callable runs inside the locked transaction
    assert seen["holders"] == {seen["pid"]}
    assert seen["visible_before_commit"] == []
    assert work_rows(observer, job) == ["xact"]  # committed with the lock's transaction
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("autocommit", [True, False])
async def test_completed_on_a_callers_connection_leaves_it_idle(
    db: str, aconnect: AConnect, observer: Any, autocommit: bool
) -> None:
    job = new_job("jobs-async-test")
    conn = await aconnect(autocommit=autocommit)
    seen: dict[str, Any] = {}

    async def fn(c: psycopg.AsyncConnection[Any]) -> str:
        assert c is conn
        seen["status"] = c.info.transaction_status
        seen["holders"] = observer.holders(key_of(job))
        await insert_work(c, job, "caller")
        return "ok"

    result = await run_job_async(conn, job, fn)

    assert (result.outcome, result.value) == ("completed", "ok")
    assert seen["status"] == INTRANS
    assert seen["holders"] == {conn.info.backend_pid}
    assert conn.info.transaction_status == IDLE
    assert conn.autocommit is autocommit
    assert work_rows(observer, job) == ["caller"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("target", ["dsn", "autocommit", "transactional"])
async def test_session_lifetime_runs_outside_a_transaction_holding_a_session_lock(
    db: str, aconnect: AConnect, observer: Any, target: str
) -> None:
    job = new_job("jobs-async-test")
    conn = None if target == "dsn" else await aconnect(autocommit=target == "autocommit")
    seen: dict[str, Any] = {}

    async def fn(c: psycopg.AsyncConnection[Any]) -> int:
        seen["status"] = c.info.transaction_status
        seen["pid"] = c.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        seen["session_locks"] = pgsolo.held_session_locks(c)
        return 7

    result = await run_job_async(db if conn is None else conn, job, fn, lifetime="session")

    assert (result.outcome, result.value) == ("completed", 7)
    assert seen["status"] == IDLE  # no transaction held open around the work
    assert seen["holders"] == {seen["pid"]} == {result.backend_pid}
    assert seen["session_locks"] == [key_of(job)]
    assert observer.holders(key_of(job)) == set()  # released afterwards
    if conn is not None:
        assert pgsolo.held_session_locks(conn) == []
        assert conn.info.transaction_status == IDLE


# -- skipped: busy ----------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_skipped_busy_when_another_session_holds_the_key(
    db: str, aconnect: AConnect, sync_connect: SyncConnect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    holder = hold(sync_connect, job)
    conn = await aconnect(autocommit=False)
    calls: list[int] = []

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    result = await run_job_async(conn, job, fn, lifetime=lifetime)

    assert result.outcome == "skipped"
    assert result.skipped
    assert not result.completed
    assert result.reason == "busy"
    assert result.value is None
    assert result.error is None
    assert result.duration == 0
    assert calls == []
    assert observer.holders(key_of(job)) == {holder.info.backend_pid}
    assert conn.info.transaction_status == IDLE  # nothing left open by the failed try
    assert pgsolo.held_session_locks(conn) == []


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_bounded_wait_runs_out_as_a_busy_skip(
    db: str, aconnect: AConnect, sync_connect: SyncConnect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    holder = hold(sync_connect, job)
    conn = await aconnect()
    calls: list[int] = []

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    started = time.monotonic()
    result = await run_job_async(conn, job, fn, lifetime=lifetime, wait=0.3)
    elapsed = time.monotonic() - started

    assert (result.outcome, result.reason) == ("skipped", "busy")
    assert calls == []
    assert elapsed < DEADLINE
    assert result.lock_wait >= 0.25  # it did wait for the lock before giving up
    assert observer.holders(key_of(job)) == {holder.info.backend_pid}
    cursor = await conn.execute("SHOW lock_timeout")
    row = await cursor.fetchone()
    assert row == ("0",)  # the wait's lock_timeout did not leak into the session
    assert conn.info.transaction_status == IDLE


# -- failed -----------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_failure_reraises_the_same_exception_and_releases_the_lock(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job("jobs-async-test")
    boom = Boom("disk on fire")
    seen: dict[str, Any] = {}

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        await insert_work(conn, job, "partial")
        seen["holders"] = observer.holders(key_of(job))
        raise boom

    with pytest.raises(Boom) as raised:
        await run_job_async(db, job, fn, lifetime=lifetime)

    assert raised.value is boom
    assert seen["holders"] != set()
    assert observer.holders(key_of(job)) == set()
    # xact: the work was in the lock's transaction and is rolled back; session: the
    # autocommit work was already committed, and pgsolo does not pretend otherwise.
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["partial"])

    result = await run_job_async(db, job, fn, lifetime=lifetime, raise_errors=False)
    assert (result.outcome, result.value) == ("failed", None)
    assert result.error is boom


@pytest.mark.parametrize("period", [None, "day"])
async def test_a_database_error_of_the_callable_is_reraised_unchanged(
    db: str, aconnect: AConnect, observer: Any, period: str | None
) -> None:
    """Even an "undefined table" error: it is the work's, not a sign that pgsolo's own
    tables are missing."""
    job = new_job("jobs-async-test")
    conn = await aconnect()
    seen: dict[str, BaseException] = {}

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        try:
            await c.execute("SELECT * FROM pgsolo_test_no_such_table")
        except psycopg.Error as exc:
            seen["error"] = exc
            raise

    async def again(c: psycopg.AsyncConnection[Any]) -> str:
        return "again"

    with pytest.raises(psycopg.errors.UndefinedTable) as raised:
        await run_job_async(conn, job, fn, period=period)

    assert raised.value is seen["error"]
    assert conn.info.transaction_status == IDLE  # the aborted transaction was rolled back
    assert observer.holders(key_of(job)) == set()
    assert (await run_job_async(conn, job, again, period=period)).outcome == "completed"


# -- lost -------------------------------------------------------------------------------


async def test_session_lock_lost_raises_lock_lost_error(db: str, observer: Any) -> None:
    job = new_job("jobs-async-test")

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        terminate(observer, conn.info.backend_pid)
        return "finished, but without the lock"

    with pytest.raises(LockLostError) as raised:
        await run_job_async(db, job, fn, lifetime="session")

    assert raised.value.key == key_of(job)
    assert job in str(raised.value)
    assert observer.holders(key_of(job)) == set()

    result = await run_job_async(db, job, fn, lifetime="session", raise_errors=False)
    assert result.outcome == "lost"
    assert isinstance(result.error, LockLostError)
    assert observer.holders(key_of(job)) == set()


async def test_xact_connection_killed_under_the_work_is_lost_not_failed(
    db: str, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    seen: dict[str, BaseException] = {}

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        await insert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        try:
            await conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            seen["error"] = exc
            raise

    result = await run_job_async(db, job, fn, raise_errors=False)

    assert result.outcome == "lost"
    assert result.error is seen["error"]
    assert result.reason == "connection-lost"
    assert work_rows(observer, job) == []

    # With raise_errors, the callable's own exception is what the caller gets.
    with pytest.raises(psycopg.OperationalError) as raised:
        await run_job_async(db, job, fn)
    assert raised.value is seen["error"]


async def test_xact_connection_killed_before_commit_raises_lock_lost(
    db: str, observer: Any
) -> None:
    """The callable returned, but its transaction (and lock) died before the commit."""
    job = new_job("jobs-async-test")

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await insert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        return "looked fine"

    result = await run_job_async(db, job, fn, raise_errors=False)
    assert result.outcome == "lost"
    assert result.reason == "connection-lost"

    with pytest.raises(LockLostError) as raised:
        await run_job_async(db, job, fn)
    assert raised.value.key == key_of(job)
    assert isinstance(raised.value.__cause__, LockLostError | psycopg.OperationalError)
    assert work_rows(observer, job) == []
