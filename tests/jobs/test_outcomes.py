"""``run_job`` and ``run_job_async``: what each outcome means on a real server.

Completed (the value, the work committed with the lock), skipped (busy, or a bounded wait
that ran out), failed (the same exception, the lock released), cancelled (async), and lost
(the lock or the connection went while the work ran).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    WORK,
    eventually,
    hold,
    key_of,
    period_rows,
    terminate,
    unhold,
    work_rows,
)
from pgsolo import ConnectionStateError, LockLostError
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


class Boom(Exception):
    """The callable's own failure."""


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def insert_work(conn: psycopg.Connection, job: str, note: str) -> None:
    conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


def test_completed_returns_the_value_and_commits_the_transaction(db: str, observer: Any) -> None:
    job = new_job()
    seen: dict[str, Any] = {}

    def fn(conn: psycopg.Connection, a: int, *, b: int) -> int:
        seen["status"] = conn.info.transaction_status
        seen["pid"] = conn.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        insert_work(conn, job, "xact")
        seen["visible_before_commit"] = work_rows(observer, job)
        return a + b

    # fn's own keyword arguments are bound first: run_job's keywords are options.
    result = run_job(db, job, functools.partial(fn, b=2), 40)

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
def test_completed_on_a_callers_connection_leaves_it_idle(
    db: str, connect: Connect, observer: Any, autocommit: bool
) -> None:
    job = new_job()
    conn = connect(autocommit=autocommit)
    seen: dict[str, Any] = {}

    def fn(c: psycopg.Connection) -> str:
        assert c is conn
        seen["status"] = c.info.transaction_status
        seen["holders"] = observer.holders(key_of(job))
        insert_work(c, job, "caller")
        return "ok"

    result = run_job(conn, job, fn)

    assert (result.outcome, result.value) == ("completed", "ok")
    assert seen["status"] == INTRANS
    assert seen["holders"] == {conn.info.backend_pid}
    assert conn.info.transaction_status == IDLE
    assert conn.autocommit is autocommit
    assert work_rows(observer, job) == ["caller"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("target", ["dsn", "autocommit", "transactional"])
def test_session_lifetime_runs_outside_a_transaction_holding_a_session_lock(
    db: str, connect: Connect, observer: Any, target: str
) -> None:
    job = new_job()
    conn = None if target == "dsn" else connect(autocommit=target == "autocommit")
    seen: dict[str, Any] = {}

    def fn(c: psycopg.Connection) -> int:
        seen["status"] = c.info.transaction_status
        seen["pid"] = c.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        seen["session_locks"] = pgsolo.held_session_locks(c)
        return 7

    result = run_job(db if conn is None else conn, job, fn, lifetime="session")

    assert (result.outcome, result.value) == ("completed", 7)
    assert seen["status"] == IDLE  # no transaction held open around the work
    assert seen["holders"] == {seen["pid"]} == {result.backend_pid}
    assert seen["session_locks"] == [key_of(job)]
    assert observer.holders(key_of(job)) == set()  # released afterwards
    if conn is not None:
        assert pgsolo.held_session_locks(conn) == []
        assert conn.info.transaction_status == IDLE


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
def test_skipped_busy_when_another_session_holds_the_key(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    holder = hold(connect, job)
    conn = connect(autocommit=False)
    calls: list[int] = []

    result = run_job(conn, job, lambda c: calls.append(1), lifetime=lifetime)

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
def test_bounded_wait_runs_out_as_a_busy_skip(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    holder = hold(connect, job)
    conn = connect()
    calls: list[int] = []

    started = time.monotonic()
    result = run_job(conn, job, lambda c: calls.append(1), lifetime=lifetime, wait=0.3)
    elapsed = time.monotonic() - started

    assert (result.outcome, result.reason) == ("skipped", "busy")
    assert calls == []
    assert elapsed < DEADLINE
    assert result.lock_wait >= 0.25  # it did wait for the lock before giving up
    assert observer.holders(key_of(job)) == {holder.info.backend_pid}
    row = conn.execute("SHOW lock_timeout").fetchone()
    assert row == ("0",)  # the wait's lock_timeout did not leak into the session
    assert conn.info.transaction_status == IDLE


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


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_failure_reraises_the_same_exception_and_releases_the_lock(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    boom = Boom("disk on fire")
    seen: dict[str, Any] = {}

    def fn(conn: psycopg.Connection) -> None:
        insert_work(conn, job, "partial")
        seen["holders"] = observer.holders(key_of(job))
        raise boom

    with pytest.raises(Boom) as raised:
        run_job(db, job, fn, lifetime=lifetime)

    assert raised.value is boom
    assert seen["holders"] != set()
    assert observer.holders(key_of(job)) == set()
    # xact: the work was in the lock's transaction and is rolled back; session: the
    # autocommit work was already committed, and pgsolo does not pretend otherwise.
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["partial"])


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


@pytest.mark.parametrize("period", [None, "day"])
def test_a_database_error_of_the_callable_is_reraised_unchanged(
    db: str, connect: Connect, observer: Any, period: str | None
) -> None:
    """Even an "undefined table" error: it is the work's, not a sign that pgsolo's own
    tables are missing."""
    job = new_job()
    conn = connect()
    seen: dict[str, BaseException] = {}

    def fn(c: psycopg.Connection) -> None:
        try:
            c.execute("SELECT * FROM pgsolo_test_no_such_table")
        except psycopg.Error as exc:
            seen["error"] = exc
            raise

    with pytest.raises(psycopg.errors.UndefinedTable) as raised:
        run_job(conn, job, fn, period=period)

    assert raised.value is seen["error"]
    assert conn.info.transaction_status == IDLE  # the aborted transaction was rolled back
    assert observer.holders(key_of(job)) == set()
    assert run_job(conn, job, lambda c: "again", period=period).outcome == "completed"


def test_session_lock_lost_raises_lock_lost_error(db: str, observer: Any) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str:
        terminate(observer, conn.info.backend_pid)
        return "finished, but without the lock"

    with pytest.raises(LockLostError) as raised:
        run_job(db, job, fn, lifetime="session")

    assert raised.value.key == key_of(job)
    assert job in str(raised.value)
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


def test_xact_connection_killed_under_the_work_is_lost_not_failed(db: str, observer: Any) -> None:
    job = new_job()
    seen: dict[str, BaseException] = {}

    def fn(conn: psycopg.Connection) -> None:
        insert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        try:
            conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            seen["error"] = exc
            raise

    result = run_job(db, job, fn, raise_errors=False)

    assert result.outcome == "lost"
    assert result.error is seen["error"]
    assert result.reason == "connection-lost"
    assert work_rows(observer, job) == []

    # With raise_errors, the callable's own exception is what the caller gets.
    with pytest.raises(psycopg.OperationalError) as raised:
        run_job(db, job, fn)
    assert raised.value is seen["error"]


def test_xact_connection_killed_before_commit_raises_lock_lost(db: str, observer: Any) -> None:
    """The callable returned, but its transaction (and lock) died before the commit."""
    job = new_job()

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        return "looked fine"

    result = run_job(db, job, fn, raise_errors=False)
    assert result.outcome == "lost"
    assert result.reason == "connection-lost"

    with pytest.raises(LockLostError) as raised:
        run_job(db, job, fn)
    assert raised.value.key == key_of(job)
    assert isinstance(raised.value.__cause__, LockLostError | psycopg.OperationalError)
    assert work_rows(observer, job) == []


# -- async jobs ----------------------------------------------------------------------------

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]
BOUND = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


def new_async_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def aeventually(predicate: Callable[[], Any], what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not (value := predicate()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def ainsert_work(conn: psycopg.AsyncConnection[Any], job: str, note: str) -> None:
    await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


def job_log_records(caplog: pytest.LogCaptureFixture, job: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "pgsolo"
        and r.getMessage().startswith("job ")
        and getattr(r, "pgsolo", {}).get("job") == job
    ]


async def test_completed_returns_the_value_and_commits_the_transaction_async(
    db: str, observer: Any
) -> None:
    job = new_async_job()
    seen: dict[str, Any] = {}

    async def fn(conn: psycopg.AsyncConnection[Any], a: int, *, b: int) -> int:
        seen["status"] = conn.info.transaction_status
        seen["pid"] = conn.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        await ainsert_work(conn, job, "xact")
        seen["visible_before_commit"] = work_rows(observer, job)
        return a + b

    # fn's own keyword arguments are bound first: run_job's keywords are options.
    result = await run_job_async(db, job, functools.partial(fn, b=2), 40)

    assert isinstance(result, JobResult)
    assert (result.outcome, result.value, result.error) == ("completed", 42, None)
    assert result.backend_pid == seen["pid"]
    assert seen["status"] == INTRANS
    assert seen["holders"] == {seen["pid"]}
    assert seen["visible_before_commit"] == []
    assert work_rows(observer, job) == ["xact"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("autocommit", [True, False])
async def test_completed_on_a_callers_connection_leaves_it_idle_async(
    db: str, aconnect: AConnect, observer: Any, autocommit: bool
) -> None:
    job = new_async_job()
    conn = await aconnect(autocommit=autocommit)

    async def fn(c: psycopg.AsyncConnection[Any]) -> Any:
        assert c is conn
        await ainsert_work(c, job, "caller")
        return c.info.transaction_status

    result = await run_job_async(conn, job, fn)

    assert (result.outcome, result.value) == ("completed", INTRANS)
    assert conn.info.transaction_status == IDLE
    assert work_rows(observer, job) == ["caller"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("target", ["dsn", "autocommit", "transactional"])
async def test_session_lifetime_runs_outside_a_transaction_holding_a_session_lock_async(
    db: str, aconnect: AConnect, observer: Any, target: str
) -> None:
    job = new_async_job()
    conn = None if target == "dsn" else await aconnect(autocommit=target == "autocommit")
    seen: dict[str, Any] = {}

    async def fn(c: psycopg.AsyncConnection[Any]) -> int:
        seen["status"] = c.info.transaction_status
        seen["holders"] = observer.holders(key_of(job))
        seen["session_locks"] = pgsolo.held_session_locks(c)
        return 7

    result = await run_job_async(db if conn is None else conn, job, fn, lifetime="session")

    assert (result.outcome, result.value) == ("completed", 7)
    assert seen["status"] == IDLE
    assert seen["holders"] == {result.backend_pid}
    assert seen["session_locks"] == [key_of(job)]
    assert observer.holders(key_of(job)) == set()
    if conn is not None:
        assert pgsolo.held_session_locks(conn) == []
        assert conn.info.transaction_status == IDLE


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_skipped_busy_when_another_session_holds_the_key_async(
    db: str, aconnect: AConnect, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    holder = hold(connect, job)
    conn = await aconnect(autocommit=False)
    calls: list[int] = []

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    result = await run_job_async(conn, job, fn, lifetime=lifetime)

    assert (result.outcome, result.reason, result.value) == ("skipped", "busy", None)
    assert calls == []
    assert observer.holders(key_of(job)) == {holder.info.backend_pid}
    assert conn.info.transaction_status == IDLE


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_bounded_wait_runs_out_as_a_busy_skip_async(
    db: str, aconnect: AConnect, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    holder = hold(connect, job)
    conn = await aconnect()
    calls: list[int] = []

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    result = await asyncio.wait_for(
        run_job_async(conn, job, fn, lifetime=lifetime, wait=0.3), BOUND
    )

    assert (result.outcome, result.reason) == ("skipped", "busy")
    assert calls == []
    assert result.lock_wait >= 0.25
    assert observer.holders(key_of(job)) == {holder.info.backend_pid}
    cursor = await conn.execute("SHOW lock_timeout")
    assert await cursor.fetchone() == ("0",)


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_wait_gets_the_lock_when_the_holder_releases_async(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    holder = hold(connect, job)

    async def fn(conn: psycopg.AsyncConnection[Any]) -> int:
        return conn.info.backend_pid

    task = asyncio.create_task(run_job_async(db, job, fn, lifetime=lifetime, wait=10))
    waiting = await aeventually(lambda: observer.waiters(key_of(job)), "the job to wait")
    unhold(holder, job)
    result = await asyncio.wait_for(task, BOUND)

    assert result.outcome == "completed"
    assert {result.value} == waiting
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_failure_reraises_the_same_exception_and_releases_the_lock_async(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_async_job()
    boom = Boom("disk on fire")

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        await ainsert_work(conn, job, "partial")
        raise boom

    with pytest.raises(Boom) as raised:
        await run_job_async(db, job, fn, lifetime=lifetime)

    assert raised.value is boom
    assert observer.holders(key_of(job)) == set()
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["partial"])

    result = await run_job_async(db, job, fn, lifetime=lifetime, raise_errors=False)
    assert (result.outcome, result.value) == ("failed", None)
    assert result.error is boom


async def test_a_database_error_of_the_callable_is_reraised_unchanged_async(
    db: str, aconnect: AConnect, observer: Any
) -> None:
    job = new_async_job()
    conn = await aconnect()
    seen: dict[str, BaseException] = {}

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        try:
            await c.execute("SELECT * FROM pgsolo_test_no_such_table")
        except psycopg.Error as exc:
            seen["error"] = exc
            raise

    with pytest.raises(psycopg.errors.UndefinedTable) as raised:
        await run_job_async(conn, job, fn, period="day")

    assert raised.value is seen["error"]
    assert conn.info.transaction_status == IDLE
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_cancelled_run_releases_the_lock_and_rolls_back(
    db: str, aconnect: AConnect, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    job = new_async_job()
    conn = await aconnect()
    started = asyncio.Event()
    caplog.set_level(logging.INFO, logger="pgsolo")

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        await ainsert_work(c, job, "interrupted")
        started.set()
        await asyncio.sleep(BOUND * 3)

    task = asyncio.create_task(run_job_async(conn, job, fn, lifetime=lifetime, period="day"))
    await asyncio.wait_for(started.wait(), BOUND)
    assert observer.holders(key_of(job)) == {conn.info.backend_pid}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, BOUND)

    assert observer.holders(key_of(job)) == set()
    assert conn.info.transaction_status == IDLE
    assert pgsolo.held_session_locks(conn) == []
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["interrupted"])
    assert period_rows(observer, job) == []  # an interrupted run does not use up the day
    assert job_log_records(caplog, job) == []  # not an outcome of the work


async def test_session_lock_lost_async(db: str, observer: Any) -> None:
    job = new_async_job()

    async def kill(conn: psycopg.AsyncConnection[Any]) -> str:
        terminate(observer, conn.info.backend_pid)
        return "finished, but without the lock"

    with pytest.raises(LockLostError) as raised:
        await run_job_async(db, job, kill, lifetime="session")
    assert raised.value.key == key_of(job)

    result = await run_job_async(db, job, kill, lifetime="session", raise_errors=False)
    assert result.outcome == "lost"
    assert isinstance(result.error, LockLostError)
    assert observer.holders(key_of(job)) == set()


async def test_xact_connection_killed_under_the_work_is_lost_not_failed_async(
    db: str, observer: Any
) -> None:
    job = new_async_job()
    seen: dict[str, BaseException] = {}

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        await ainsert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        try:
            await conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            seen["error"] = exc
            raise

    result = await run_job_async(db, job, fn, raise_errors=False)

    assert result.outcome == "lost"
    assert result.error is seen["error"]
    assert work_rows(observer, job) == []


async def test_xact_connection_killed_before_commit_raises_lock_lost_async(
    db: str, observer: Any
) -> None:
    job = new_async_job()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await ainsert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        return "looked fine"

    with pytest.raises(LockLostError) as raised:
        await run_job_async(db, job, fn)
    assert raised.value.key == key_of(job)
    assert work_rows(observer, job) == []
