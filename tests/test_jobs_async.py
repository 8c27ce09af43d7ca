"""The async twins of tests/test_jobs.py: ``run_job_async`` and ``@singleton`` on
``async def`` functions, against a real PostgreSQL.

What is asserted is what can be observed: ``pg_locks`` / ``pg_stat_activity`` through the
``observer`` session, committed rows, pgsolo's tables, metrics, log records, and the
values and errors the caller gets. Concurrency is real (one connection per task on one
event loop); faults are real (``pg_terminate_backend``, ``task.cancel()``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import (
    WORK,
    app_name_of,
    hold,
    key_of,
    period_rows,
    terminate,
    unhold,
    work_rows,
)
from pgsolo import InvalidKeyError, LockLostError, UsageError
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job_async, singleton
from pgsolo.schema import schema_version

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]
Connect = Callable[..., psycopg.Connection]

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
BOUND = 10.0  # generous bound for anything that must happen "soon"; never a speed claim
CLOSED_PORT_DSN = "postgresql://u:p@127.0.0.1:1/db"


class Boom(Exception):
    """The callable's own failure."""


# -- helpers ------------------------------------------------------------------------------


def new_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def eventually(predicate: Callable[[], Any], what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not (value := predicate()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def insert_work(conn: psycopg.AsyncConnection[Any], job: str, note: str) -> None:
    await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def job_log_records(caplog: pytest.LogCaptureFixture, job: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "pgsolo"
        and r.getMessage().startswith("job ")
        and getattr(r, "pgsolo", {}).get("job") == job
    ]


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


# -- completed ----------------------------------------------------------------------------


async def test_completed_returns_the_value_and_commits_the_transaction(
    db: str, observer: Any
) -> None:
    job = new_job()
    seen: dict[str, Any] = {}

    async def fn(conn: psycopg.AsyncConnection[Any], a: int, *, b: int) -> int:
        seen["status"] = conn.info.transaction_status
        seen["pid"] = conn.info.backend_pid
        seen["holders"] = observer.holders(key_of(job))
        await insert_work(conn, job, "xact")
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
async def test_completed_on_a_callers_connection_leaves_it_idle(
    db: str, aconnect: AConnect, observer: Any, autocommit: bool
) -> None:
    job = new_job()
    conn = await aconnect(autocommit=autocommit)

    async def fn(c: psycopg.AsyncConnection[Any]) -> Any:
        assert c is conn
        await insert_work(c, job, "caller")
        return c.info.transaction_status

    result = await run_job_async(conn, job, fn)

    assert (result.outcome, result.value) == ("completed", INTRANS)
    assert conn.info.transaction_status == IDLE
    assert work_rows(observer, job) == ["caller"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("target", ["dsn", "autocommit", "transactional"])
async def test_session_lifetime_runs_outside_a_transaction_holding_a_session_lock(
    db: str, aconnect: AConnect, observer: Any, target: str
) -> None:
    job = new_job()
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


# -- skipped: busy ------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_skipped_busy_when_another_session_holds_the_key(
    db: str, aconnect: AConnect, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
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
async def test_bounded_wait_runs_out_as_a_busy_skip(
    db: str, aconnect: AConnect, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
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
async def test_wait_gets_the_lock_when_the_holder_releases(
    db: str, connect: Connect, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    holder = hold(connect, job)

    async def fn(conn: psycopg.AsyncConnection[Any]) -> int:
        return conn.info.backend_pid

    task = asyncio.create_task(run_job_async(db, job, fn, lifetime=lifetime, wait=10))
    waiting = await eventually(lambda: observer.waiters(key_of(job)), "the job to wait")
    unhold(holder, job)
    result = await asyncio.wait_for(task, BOUND)

    assert result.outcome == "completed"
    assert {result.value} == waiting
    assert observer.holders(key_of(job)) == set()


# -- failed -------------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_failure_reraises_the_same_exception_and_releases_the_lock(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
    boom = Boom("disk on fire")

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        await insert_work(conn, job, "partial")
        raise boom

    with pytest.raises(Boom) as raised:
        await run_job_async(db, job, fn, lifetime=lifetime)

    assert raised.value is boom
    assert observer.holders(key_of(job)) == set()
    assert work_rows(observer, job) == ([] if lifetime == "xact" else ["partial"])

    result = await run_job_async(db, job, fn, lifetime=lifetime, raise_errors=False)
    assert (result.outcome, result.value) == ("failed", None)
    assert result.error is boom


async def test_a_database_error_of_the_callable_is_reraised_unchanged(
    db: str, aconnect: AConnect, observer: Any
) -> None:
    job = new_job()
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


async def test_a_failed_run_does_not_use_up_the_period(db: str, observer: Any) -> None:
    job = new_job()
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
async def test_cancelled_run_releases_the_lock_and_rolls_back(
    db: str, aconnect: AConnect, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    job = new_job()
    conn = await aconnect()
    started = asyncio.Event()
    caplog.set_level(logging.INFO, logger="pgsolo")

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        await insert_work(c, job, "interrupted")
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


# -- once per period ----------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_once_per_day_completes_then_skips(
    db: str, observer: Any, lifetime: Lifetime
) -> None:
    job = new_job()
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
    job = new_job()
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
        BOUND * 3,
    )

    outcomes = collections.Counter(r.outcome for r in results)
    assert outcomes == {"completed": 1, "skipped": workers - 1}
    assert {r.reason for r in results if r.skipped} <= {"busy", "already-done-this-period"}
    (winner,) = [r for r in results if r.completed]
    assert work_rows(observer, job) == [str(winner.value)]
    assert len(period_rows(observer, job)) == 1


async def test_a_period_already_recorded_skips_without_running(db: str, observer: Any) -> None:
    job = new_job()
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


async def test_a_run_that_sneaks_in_without_the_lock_wins_and_the_xact_work_rolls_back(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    sneak = connect()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await insert_work(conn, job, "would be the second time")
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


# -- lost ---------------------------------------------------------------------------------


async def test_session_lock_lost(db: str, observer: Any) -> None:
    job = new_job()

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


async def test_xact_connection_killed_under_the_work_is_lost_not_failed(
    db: str, observer: Any
) -> None:
    job = new_job()
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
    assert work_rows(observer, job) == []


async def test_xact_connection_killed_before_commit_raises_lock_lost(
    db: str, observer: Any
) -> None:
    job = new_job()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str:
        await insert_work(conn, job, "never committed")
        terminate(observer, conn.info.backend_pid)
        return "looked fine"

    with pytest.raises(LockLostError) as raised:
        await run_job_async(db, job, fn)
    assert raised.value.key == key_of(job)
    assert work_rows(observer, job) == []


# -- ledger -------------------------------------------------------------------------------


async def test_the_ledger_records_every_attempt(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()

    async def fail(conn: psycopg.AsyncConnection[Any]) -> None:
        raise Boom("disk on fire")

    completed = await run_job_async(db, job, returns, "ok", record=True)
    holder = hold(connect, job)
    skipped = await run_job_async(db, job, returns, "ok", record=True)
    unhold(holder, job)
    with pytest.raises(Boom):
        await run_job_async(db, job, fail, record=True)

    rows = pgsolo.history(observer.conn, job=job)
    assert [r["outcome"] for r in rows] == ["failed", "skipped", "completed"]
    assert [r["reason"] for r in rows] == [None, "busy", None]
    assert rows[0]["error"] == "Boom: disk on fire"
    assert [r["backend_pid"] for r in rows[1:]] == [skipped.backend_pid, completed.backend_pid]
    for row in rows:
        assert row["lock_key"] == key_of(job).text
        assert row["started_at"] <= row["finished_at"]  # same zone: ISO text orders by time
        assert row["host"] == socket.gethostname()
        assert row["pid"] == os.getpid()
        assert row["application_name"] == f"pgsolo:{job}"


async def test_a_lost_attempt_is_recorded_through_a_fresh_connection(
    db: str, observer: Any
) -> None:
    job = new_job()
    pids: list[int] = []

    async def kill(conn: psycopg.AsyncConnection[Any]) -> None:
        pids.append(conn.info.backend_pid)
        terminate(observer, conn.info.backend_pid)

    result = await run_job_async(db, job, kill, lifetime="session", record=True, raise_errors=False)

    assert result.outcome == "lost"
    rows = pgsolo.history(observer.conn, job=job)
    assert [(r["outcome"], r["backend_pid"]) for r in rows] == [("lost", pids[0])]
    assert rows[0]["application_name"] == f"pgsolo:{job}"


async def test_record_or_period_before_migrate_is_a_usage_error_before_the_work(
    fresh_db: str, aconnect: AConnect
) -> None:
    job = new_job()
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    for options in ({"record": True}, {"period": "day"}):
        with pytest.raises(UsageError, match="pgsolo migrate"):
            await run_job_async(fresh_db, job, fn, **options)
        assert calls == []
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert schema_version(conn) == 0
        pgsolo.migrate(conn)
    result = await run_job_async(fresh_db, job, fn, record=True, period="day")
    assert result.outcome == "completed"
    assert calls == [1]


# -- application_name, metrics, logging ---------------------------------------------------


async def test_application_name(db: str, observer: Any) -> None:
    job = new_job()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert (await run_job_async(db, job, fn)).value == f"pgsolo:{job}"
    assert (await run_job_async(db, job, fn, application_name="worker-7")).value == "worker-7"
    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert (await run_job_async(named_dsn, job, fn)).value == "from-dsn"


async def test_metrics_count_skips_apart_from_successes(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    attempts = "pgsolo_job_attempts_total"

    await run_job_async(db, job, returns, None)
    holder = hold(connect, job)
    await run_job_async(db, job, returns, None)
    await run_job_async(db, job, returns, None)
    unhold(holder, job)

    assert sample(attempts, job=job, outcome="completed", reason="") == 1
    assert sample(attempts, job=job, outcome="skipped", reason="busy") == 2
    assert sample("pgsolo_job_lock_wait_seconds_count", job=job) == 3
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="completed") == 1


async def test_one_log_record_per_attempt_even_when_lost(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    caplog.set_level(logging.WARNING, logger="pgsolo")  # INFO off, as in many deployments

    async def kill(conn: psycopg.AsyncConnection[Any]) -> None:
        terminate(observer, conn.info.backend_pid)

    await run_job_async(db, job, returns, None)
    lost = await run_job_async(db, job, kill, lifetime="session", raise_errors=False)

    (record,) = job_log_records(caplog, job)  # the completed run logs at INFO: filtered
    assert record.getMessage().startswith("job lost: ")
    fields = record.pgsolo  # type: ignore[attr-defined]
    assert fields["database"] == observer.conn.info.dbname
    assert fields["server"] == f"{observer.conn.info.host}:{observer.conn.info.port}"
    assert fields["application_name"] == f"pgsolo:{job}"
    assert fields["backend_pid"] == lost.backend_pid

    caplog.clear()
    caplog.set_level(logging.INFO, logger="pgsolo")
    await run_job_async(db, job, returns, None)
    holder = hold(connect, job)
    await run_job_async(db, job, returns, None)
    unhold(holder, job)
    records = job_log_records(caplog, job)
    assert [r.pgsolo["outcome"] for r in records] == ["completed", "skipped"]  # type: ignore[attr-defined]
    assert all(r.pgsolo["lock_wait_ms"] >= 0 for r in records)  # type: ignore[attr-defined]


# -- validation and the decorator ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"key": 2**63}, InvalidKeyError),
        ({"key": ""}, InvalidKeyError),
        ({"lifetime": "forever"}, UsageError),
        ({"wait": -1}, UsageError),
        ({"period": "fortnight"}, UsageError),
    ],
)
async def test_bad_arguments_fail_before_connecting(
    options: dict[str, Any], error: type[Exception]
) -> None:
    key = options.pop("key", "jobs-async-test:valid")
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    with pytest.raises(error) as raised:
        await run_job_async(CLOSED_PORT_DSN, key, fn, **options)

    assert not isinstance(raised.value, psycopg.Error)
    assert calls == []


async def test_singleton_decorates_an_async_function(db: str, observer: Any) -> None:
    job = new_job()

    @singleton(job, dsn=db, period="day")
    async def settle(
        conn: psycopg.AsyncConnection[Any], region: str, *, dry_run: bool
    ) -> tuple[Any, ...]:
        """Settle one region."""
        return conn.info.transaction_status, region, dry_run

    assert settle.__name__ == "settle"
    assert settle.__doc__ == "Settle one region."
    first = await settle("eu", dry_run=True)
    second = await settle("eu", dry_run=True)

    assert isinstance(first, JobResult)
    assert (first.outcome, first.value) == ("completed", (INTRANS, "eu", True))
    assert (second.outcome, second.reason) == ("skipped", "already-done-this-period")


async def test_singleton_uses_pgsolo_dsn_when_no_dsn_is_given(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()
    monkeypatch.delenv("PGSOLO_DSN", raising=False)

    @singleton(job, lifetime="session")
    async def report(conn: psycopg.AsyncConnection[Any], n: int) -> tuple[str, int, Any]:
        return conn.info.dbname, n, conn.info.transaction_status

    monkeypatch.setenv("PGSOLO_DSN", db)
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_DSN)
    result = await report(3)

    assert result.outcome == "completed"
    assert result.value == (observer.conn.info.dbname, 3, IDLE)


def test_singleton_validates_an_async_definition_when_it_decorates() -> None:
    with pytest.raises(UsageError):
        singleton("jobs-async-test:valid", dsn=CLOSED_PORT_DSN, lifetime="forever")
