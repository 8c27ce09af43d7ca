"""The ledger (``record=True``): one row per attempt, lost attempts recorded through a fresh
connection, the warning for jobs that mostly skip, the ledger before ``migrate``, and
ledger reads that leave the caller's connection idle.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    hold,
    key_of,
    terminate,
    unhold,
)
from pgsolo import LockLostError, UsageError
from pgsolo.jobs import run_job, run_job_async
from pgsolo.jobs.record import skip_warning
from pgsolo.schema import LATEST_VERSION, MIGRATIONS, schema_version

# -- sync jobs -----------------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]

IDLE = psycopg.pq.TransactionStatus.IDLE


class Boom(Exception):
    """The callable's own failure."""


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def server_now(observer: Any) -> datetime:
    row = observer.conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_the_ledger_records_every_attempt(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()
    before = server_now(observer)

    completed = run_job(db, job, lambda c: "ok", record=True)
    holder = hold(connect, job)
    skipped = run_job(db, job, lambda c: "ok", record=True)
    unhold(holder, job)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("disk on fire")

    with pytest.raises(Boom):
        run_job(db, job, fn, record=True)  # recorded before it is re-raised
    after = server_now(observer)

    rows = pgsolo.history(observer.conn, job=job)
    assert [r["outcome"] for r in rows] == ["failed", "skipped", "completed"]  # newest first
    assert [r["reason"] for r in rows] == [None, "busy", None]
    assert rows[0]["error"] == "Boom: disk on fire"
    assert rows[1]["error"] is None
    assert rows[2]["error"] is None
    assert rows[1]["backend_pid"] == skipped.backend_pid
    assert rows[2]["backend_pid"] == completed.backend_pid
    for row in rows:
        assert row["job"] == job
        assert row["lock_key"] == key_of(job).text
        started = datetime.fromisoformat(row["started_at"])
        finished = datetime.fromisoformat(row["finished_at"])
        assert before <= started <= finished <= after  # the database's clock
        assert row["duration_ms"] >= 0
        assert row["lock_wait_ms"] >= 0
        assert row["host"] == socket.gethostname()
        assert row["pid"] == os.getpid()
        assert isinstance(row["backend_pid"], int)
        assert row["application_name"] == f"pgsolo:{job}"
        assert row["exit_code"] is None
    assert pgsolo.history(observer.conn, job=job, limit=1) == rows[:1]


def test_a_lost_attempt_is_recorded_through_a_fresh_connection(db: str, observer: Any) -> None:
    job = new_job()
    pids: list[int] = []

    def fn(conn: psycopg.Connection) -> None:
        pids.append(conn.info.backend_pid)
        terminate(observer, conn.info.backend_pid)

    with pytest.raises(LockLostError):
        run_job(db, job, fn, lifetime="session", record=True)

    rows = pgsolo.history(observer.conn, job=job)
    assert len(rows) == 1
    assert rows[0]["outcome"] == "lost"
    assert rows[0]["backend_pid"] == pids[0]  # the attempt's backend, not the recorder's
    assert rows[0]["application_name"] == f"pgsolo:{job}"
    assert "LockLostError" in rows[0]["error"]


def test_a_lost_attempt_on_a_callers_connection_is_logged_as_unrecorded(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    conn = connect()

    def fn(c: psycopg.Connection) -> None:
        terminate(observer, c.info.backend_pid)

    with caplog.at_level(logging.INFO, logger="pgsolo"):
        result = run_job(conn, job, fn, lifetime="session", record=True, raise_errors=False)

    assert result.outcome == "lost"
    assert pgsolo.history(observer.conn, job=job) == []
    assert any(
        "not recorded" in r.getMessage() and job in r.getMessage() and r.levelno == logging.ERROR
        for r in caplog.records
    )


def test_skip_warning_flags_jobs_that_are_mostly_busy(
    db: str, connect: Connect, observer: Any
) -> None:
    slow, healthy, periodic = new_job(), new_job(), new_job()
    assert run_job(db, slow, lambda c: None, record=True).completed
    holder = hold(connect, slow)
    for _ in range(4):
        assert run_job(db, slow, lambda c: None, record=True).reason == "busy"
    unhold(holder, slow)
    for _ in range(3):
        assert run_job(db, healthy, lambda c: None, record=True).completed
    for _ in range(4):  # once a day, tried often: skips, but not because it is slow
        run_job(db, periodic, lambda c: None, record=True, period="day")

    rows = [*pgsolo.history(observer.conn, job=slow), *pgsolo.history(observer.conn, job=healthy)]
    warnings = skip_warning(rows)
    assert len(warnings) == 1
    assert slow in warnings[0]
    assert "4 of its last 5" in warnings[0]
    assert skip_warning(pgsolo.history(observer.conn, job=healthy)) == []
    periodic_rows = pgsolo.history(observer.conn, job=periodic)
    assert [r["reason"] for r in periodic_rows].count("already-done-this-period") == 3
    assert skip_warning(periodic_rows) == []


def test_a_recorded_busy_skip_warns_when_the_job_mostly_skips(
    db: str, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    slow = new_job()
    assert run_job(db, slow, lambda c: None, record=True).completed
    holder = hold(connect, slow)
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        for _ in range(3):
            assert run_job(db, slow, lambda c: None, record=True).reason == "busy"
    unhold(holder, slow)
    warnings = [
        r.getMessage() for r in caplog.records if "slower than its schedule" in r.getMessage()
    ]
    # 1 of 2 attempts skipped is not "mostly"; 2 of 3 and 3 of 4 are.
    assert len(warnings) == 2
    assert all(slow in w for w in warnings)
    assert "3 of its last 4" in warnings[-1]


def test_record_or_period_before_migrate_is_a_usage_error_before_the_work(
    fresh_db: str, connect: Connect
) -> None:
    job = new_job()
    calls: list[int] = []
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert schema_version(conn) == 0
        # Without record/period, pgsolo needs no tables at all.
        assert run_job(conn, job, lambda c: calls.append(1)).outcome == "completed"
        calls.clear()

        for options in ({"record": True}, {"period": "day"}):
            with pytest.raises(UsageError, match="pgsolo migrate"):
                run_job(conn, job, lambda c: calls.append(1), **options)
            assert calls == []  # the work did not run: a retry will not run it twice
            assert conn.info.transaction_status == IDLE
        with pytest.raises(UsageError, match="pgsolo migrate"):
            run_job(fresh_db, job, lambda c: calls.append(1), record=True, lifetime="session")
        assert calls == []

        applied = pgsolo.migrate(conn)
        assert applied == [version for version, _ in MIGRATIONS]
        assert pgsolo.migrate(conn) == []
        assert schema_version(conn) == LATEST_VERSION
        result = run_job(fresh_db, job, lambda c: calls.append(1), record=True, period="day")
        assert result.outcome == "completed"
        assert calls == [1]
        assert [r["outcome"] for r in pgsolo.history(conn, job=job)] == ["completed"]


def test_ledger_reads_leave_a_non_autocommit_connection_idle(
    db: str, connect: Connect, observer: Any
) -> None:
    """schema_version() and history() must not leave the caller "idle in transaction"."""
    job = new_job()
    assert run_job(db, job, lambda c: "ok", record=True).completed
    conn = connect(autocommit=False)
    pid = conn.info.backend_pid

    assert schema_version(conn) == LATEST_VERSION
    assert conn.info.transaction_status == IDLE
    rows = pgsolo.history(conn, job=job)
    assert [r["outcome"] for r in rows] == ["completed"]
    assert conn.info.transaction_status == IDLE
    row = observer.conn.execute(
        "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    assert row == ("idle",)


# -- async jobs ----------------------------------------------------------------------------

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


def new_async_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


async def test_the_ledger_records_every_attempt_async(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_async_job()

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


async def test_a_lost_attempt_is_recorded_through_a_fresh_connection_async(
    db: str, observer: Any
) -> None:
    job = new_async_job()
    pids: list[int] = []

    async def kill(conn: psycopg.AsyncConnection[Any]) -> None:
        pids.append(conn.info.backend_pid)
        terminate(observer, conn.info.backend_pid)

    result = await run_job_async(db, job, kill, lifetime="session", record=True, raise_errors=False)

    assert result.outcome == "lost"
    rows = pgsolo.history(observer.conn, job=job)
    assert [(r["outcome"], r["backend_pid"]) for r in rows] == [("lost", pids[0])]
    assert rows[0]["application_name"] == f"pgsolo:{job}"


async def test_record_or_period_before_migrate_is_a_usage_error_before_the_work_async(
    fresh_db: str, aconnect: AConnect
) -> None:
    job = new_async_job()
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
