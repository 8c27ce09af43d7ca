"""Singleton jobs (``pgsolo.jobs``) against a real PostgreSQL: outcomes, periods, ledger.

Every attempt must end as exactly one of completed / skipped / failed / lost, and each is
checked here by what an operator or caller can observe: ``pg_locks`` and
``pg_stat_activity`` through the ``observer`` session, committed rows, the ledger
tables, Prometheus samples, log records, and the values and errors the caller gets.
Faults are real (``pg_terminate_backend``); concurrency uses real threads and sessions.
The async twins live in ``test_jobs_async.py``.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import (
    WORK,
    app_name_of,
    eventually,
    hold,
    key_of,
    period_rows,
    terminate,
    unhold,
    work_rows,
)
from pgsolo import ConnectionStateError, InvalidKeyError, LockLostError, UsageError
from pgsolo._types import Lifetime
from pgsolo.jobs import JobResult, run_job, singleton
from pgsolo.jobs.record import skip_warning
from pgsolo.schema import LATEST_VERSION, MIGRATIONS, schema_version

Connect = Callable[..., psycopg.Connection]
T = TypeVar("T")

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim
CLOSED_PORT_DSN = "postgresql://u:p@127.0.0.1:1/db"  # nothing listens: connecting fails


class Boom(Exception):
    """The callable's own failure."""


# -- helpers ------------------------------------------------------------------------------


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def server_now(observer: Any) -> datetime:
    row = observer.conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


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


def insert_work(conn: psycopg.Connection, job: str, note: str) -> None:
    conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


# -- 1. completed -------------------------------------------------------------------------


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


# -- 2. skipped: busy ---------------------------------------------------------------------


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


# -- 3. failed ----------------------------------------------------------------------------


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


# -- 4. once per period -------------------------------------------------------------------


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


# -- 5. the unique constraint, not the lock, has the last word -----------------------------


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


# -- 6. lost ------------------------------------------------------------------------------


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


# -- 7. the ledger ------------------------------------------------------------------------


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


def test_migrate_is_idempotent_and_reports_the_schema_version(db: str, observer: Any) -> None:
    assert pgsolo.migrate(observer.conn) == []
    latest = MIGRATIONS[-1][0]
    assert schema_version(observer.conn) == latest == LATEST_VERSION


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


# -- 8. application_name ------------------------------------------------------------------


def test_a_job_shows_its_name_in_pg_stat_activity(db: str, observer: Any) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert run_job(db, job, fn).value == f"pgsolo:{job}"
    assert run_job(db, job, fn, lifetime="session").value == f"pgsolo:{job}"
    named = run_job(db, (7_100_001, 5), fn, name="nightly-settlement")
    assert named.job == "nightly-settlement"
    assert named.value == "pgsolo:nightly-settlement"


def test_connections_a_job_opens_use_tcp_keepalives_unless_the_dsn_says_otherwise(
    db: str,
) -> None:
    """A half-open connection under a held lock must be noticed by the client too."""

    def fn(conn: psycopg.Connection) -> dict[str, str]:
        return conn.info.get_parameters()

    params = run_job(db, new_job(), fn).value
    assert params is not None
    assert params["keepalives"] == "1"
    assert int(params["keepalives_idle"]) >= 1
    assert int(params["tcp_user_timeout"]) >= 1000
    own = run_job(make_conninfo(db, keepalives_idle="77"), new_job(), fn).value
    assert own is not None
    assert own["keepalives_idle"] == "77"


def test_a_long_job_name_is_cut_to_what_postgres_keeps(db: str, observer: Any) -> None:
    job = new_job() + ":" + "x" * 80

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert run_job(db, job, fn).value == f"pgsolo:{job}"[:63]


def test_application_name_given_by_caller_dsn_or_environment_wins(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert run_job(named_dsn, job, fn).value == "from-dsn"
    assert run_job(db, job, fn, application_name="billing-worker").value == "billing-worker"
    assert run_job(named_dsn, job, fn, application_name="billing-worker").value == "billing-worker"
    monkeypatch.setenv("PGAPPNAME", "from-env")
    assert run_job(db, job, fn).value == "from-env"
    assert run_job(named_dsn, job, fn).value == "from-dsn"


# -- 9. metrics ---------------------------------------------------------------------------


def test_metrics_count_skips_apart_from_successes(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()
    attempts = "pgsolo_job_attempts_total"

    for _ in range(2):
        run_job(db, job, lambda c: None)
    completed_before_skips = sample(attempts, job=job, outcome="completed", reason="")
    holder = hold(connect, job)
    for _ in range(3):
        run_job(db, job, lambda c: None)
    unhold(holder, job)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    run_job(db, job, fn, raise_errors=False)

    assert completed_before_skips == 2
    assert sample(attempts, job=job, outcome="completed", reason="") == 2  # skips add nothing
    assert sample(attempts, job=job, outcome="skipped", reason="busy") == 3
    assert sample(attempts, job=job, outcome="failed", reason="") == 1
    assert sample("pgsolo_job_lock_wait_seconds_count", job=job) == 6
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="completed") == 2
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="failed") == 1
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="skipped") == 0
    assert sample("pgsolo_job_duration_seconds_sum", job=job, outcome="completed") >= 0


def test_metric_labels_stay_bounded_when_locks_are_lost(db: str, observer: Any) -> None:
    """A reason is a code of pgsolo.reasons, never a message: labels stay bounded."""
    job = new_job()

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    assert run_job(db, job, kill, lifetime="session", raise_errors=False).outcome == "lost"
    assert run_job(db, job, kill, raise_errors=False).outcome == "lost"
    run_job(db, job, lambda c: None, period="day")
    run_job(db, job, lambda c: None, period="day")

    reasons = {
        s.labels["reason"]
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == "pgsolo_job_attempts_total" and s.labels.get("job") == job
    }
    assert reasons <= {"", *pgsolo.reasons.REASONS}
    lost = "connection-lost"
    assert sample("pgsolo_job_attempts_total", job=job, outcome="lost", reason=lost) == 2
    assert (
        sample(
            "pgsolo_job_attempts_total",
            job=job,
            outcome="skipped",
            reason="already-done-this-period",
        )
        == 1
    )


# -- 10. logging --------------------------------------------------------------------------


def test_one_log_record_per_attempt_with_the_incident_fields(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    database = observer.conn.info.dbname

    completed = run_job(db, job, lambda c: None)
    holder = hold(connect, job)
    skipped = run_job(db, job, lambda c: None)
    unhold(holder, job)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    failed = run_job(db, job, fn, raise_errors=False)

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    lost = run_job(db, job, kill, lifetime="session", raise_errors=False)
    results = [completed, skipped, failed, lost]
    server = f"{observer.conn.info.host}:{observer.conn.info.port}"

    records = job_log_records(caplog, job)
    assert [r.pgsolo["outcome"] for r in records] == [r.outcome for r in results]  # type: ignore[attr-defined]
    assert [r.levelno for r in records] == [logging.INFO] * 2 + [logging.ERROR] * 2
    for record, result in zip(records, results, strict=True):
        fields = record.pgsolo  # type: ignore[attr-defined]
        message = record.getMessage()
        assert message.startswith(f"job {result.outcome}: ")
        assert fields["job"] == job
        assert fields["key"] == key_of(job).text
        assert fields["name"] == job
        # Even for the lost run, whose connection no longer knows where it was.
        assert fields["database"] == database
        assert fields["server"] == server
        assert fields["application_name"] == f"pgsolo:{job}"
        assert fields["backend_pid"] == result.backend_pid
        assert fields["lock_wait_ms"] >= 0
        assert fields["duration_ms"] >= 0
        for name in ("job", "key", "database", "server", "backend_pid", "lock_wait_ms"):
            assert f"{name}={fields[name]}" in message
        assert "duration_ms=" in message
    assert records[1].pgsolo["reason"] == "busy"  # type: ignore[attr-defined]
    assert "reason=busy" in records[1].getMessage()
    assert "Boom" in records[2].pgsolo["error"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_a_lost_run_is_logged_with_its_server_at_production_log_levels(
    db: str, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    """With INFO off, nothing else asked the connection where it was before it died."""
    job = new_job()
    caplog.set_level(logging.WARNING, logger="pgsolo")

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    result = run_job(db, job, kill, lifetime=lifetime, raise_errors=False)

    assert result.outcome == "lost"
    (record,) = job_log_records(caplog, job)
    assert record.levelno == logging.ERROR
    fields = record.pgsolo  # type: ignore[attr-defined]
    assert fields["database"] == observer.conn.info.dbname
    assert fields["server"] == f"{observer.conn.info.host}:{observer.conn.info.port}"
    assert fields["application_name"] == f"pgsolo:{job}"
    assert fields["backend_pid"] == result.backend_pid


@pytest.fixture
def password_dsn(dsn: str, observer: Any) -> Iterator[tuple[str, str]]:
    role = f"pgsolo_pw_{uuid.uuid4().hex[:10]}"
    password = f"Secret-{uuid.uuid4().hex}"
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    try:
        yield make_conninfo(dsn, user=role, password=password), password
    finally:
        observer.conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
            (role,),
        )
        observer.conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def test_a_password_in_the_dsn_never_reaches_the_logs(
    password_dsn: tuple[str, str],
    connect: Connect,
    observer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn, password = password_dsn
    job = new_job()
    caplog.set_level(logging.DEBUG, logger="pgsolo")

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    assert run_job(dsn, job, lambda c: None).outcome == "completed"
    holder = hold(connect, job)
    assert run_job(dsn, job, lambda c: None, wait=0.1).outcome == "skipped"
    unhold(holder, job)
    assert run_job(dsn, job, fn, raise_errors=False).outcome == "failed"
    assert run_job(dsn, job, kill, raise_errors=False).outcome == "lost"
    with pytest.raises(LockLostError) as raised:
        run_job(dsn, job, kill, lifetime="session")

    assert len(job_log_records(caplog, job)) == 5
    assert password not in str(raised.value)
    assert password not in caplog.text
    for record in caplog.records:
        assert password not in record.getMessage()
        assert password not in repr(getattr(record, "pgsolo", None))


# -- 11. validation before any SQL --------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"key": 2**63}, InvalidKeyError, "int64"),
        ({"key": (1, 2**31)}, InvalidKeyError, "pair key"),
        ({"key": ""}, InvalidKeyError, "empty"),
        ({"key": 1.5}, InvalidKeyError, "float"),
        ({"lifetime": "forever"}, UsageError, "lifetime"),
        ({"wait": -1}, UsageError, "wait"),
        ({"wait": 0}, UsageError, "wait"),
        ({"wait": "5"}, UsageError, "wait"),
        ({"period": "fortnight"}, UsageError, "period"),
        ({"period": "0 seconds"}, UsageError, "period"),
        ({"record": "yes"}, UsageError, "record"),
    ],
)
def test_bad_arguments_fail_before_connecting(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    key = options.pop("key", "jobs-test:valid")
    calls: list[int] = []

    with pytest.raises(error, match=match) as raised:
        run_job(CLOSED_PORT_DSN, key, lambda c: calls.append(1), **options)

    assert not isinstance(raised.value, psycopg.Error)
    assert calls == []


@pytest.mark.parametrize(
    ("key", "options", "error"),
    [
        (-(2**63) - 1, {}, InvalidKeyError),
        ("jobs-test:valid", {"lifetime": "forever"}, UsageError),
        ("jobs-test:valid", {"wait": -1}, UsageError),
        ("jobs-test:valid", {"period": "fortnight"}, UsageError),
        ("jobs-test:valid", {"lifetim": "session"}, UsageError),  # a typo is not a kwarg
    ],
)
def test_singleton_validates_when_it_decorates(
    key: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        singleton(key, dsn=CLOSED_PORT_DSN, **options)


# -- 12. the decorator --------------------------------------------------------------------


def test_singleton_decorates_a_sync_function(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()

    @singleton(job, dsn=db, period="day")
    def settle(conn: psycopg.Connection, region: str, *, dry_run: bool) -> tuple[Any, ...]:
        """Settle one region."""
        return (
            conn.info.transaction_status,
            region,
            dry_run,
            app_name_of(observer, conn.info.backend_pid),
        )

    assert settle.__name__ == "settle"
    assert settle.__doc__ == "Settle one region."
    first = settle("eu", dry_run=False)
    second = settle("eu", dry_run=False)

    assert isinstance(first, JobResult)
    assert first.outcome == "completed"
    assert first.value == (INTRANS, "eu", False, f"pgsolo:{job}")
    assert (second.outcome, second.reason) == ("skipped", "already-done-this-period")


def test_singleton_options_reach_the_run(db: str, connect: Connect) -> None:
    job = new_job()

    @singleton(job, dsn=db, lifetime="session", raise_errors=False, wait=0.2)
    def flaky(conn: psycopg.Connection) -> None:
        assert conn.info.transaction_status == IDLE
        raise Boom("x")

    result = flaky()
    assert result.outcome == "failed"
    assert isinstance(result.error, Boom)
    holder = hold(connect, job)
    assert (flaky().outcome, flaky().reason) == ("skipped", "busy")
    unhold(holder, job)


def test_singleton_uses_pgsolo_dsn_when_no_dsn_is_given(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()
    monkeypatch.delenv("PGSOLO_DSN", raising=False)

    @singleton(job)
    def report(conn: psycopg.Connection, n: int) -> tuple[str, int]:
        return conn.info.dbname, n

    monkeypatch.setenv("PGSOLO_DSN", db)  # read when the job runs, not when it is defined
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_DSN)  # PGSOLO_DSN comes first
    result = report(3)

    assert result.outcome == "completed"
    assert result.value == (observer.conn.info.dbname, 3)


# -- text reaches the database as written, whatever the session's settings ---------------


def test_hostile_error_text_is_recorded_verbatim_under_any_client_encoding(
    db: str, connect: Connect, observer: Any
) -> None:
    """In SJIS, 0x5C can end a two-byte character; text quoted for UTF-8 would let a
    backslash escape the closing quote. pgsolo writes text as hex digits instead."""
    job = new_job()
    payload = "\u00c1\\'); CREATE TABLE pgsolo_pwned(); --"
    conn = connect()
    conn.execute("SET client_encoding TO 'SJIS'")
    conn.execute("SET backslash_quote = on")
    conn.execute("SET standard_conforming_strings = off")

    def bad(c: psycopg.Connection) -> None:
        raise ValueError(payload)

    result = run_job(conn, job, bad, record=True, raise_errors=False)
    assert result.outcome == "failed"
    assert observer.conn.execute("SELECT to_regclass('pgsolo_pwned')").fetchone() == (None,)
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["error"] == f"ValueError: {payload}"


def test_a_period_is_one_period_whatever_the_client_encoding(
    db: str, connect: Connect, observer: Any
) -> None:
    job = f"Grüße-{uuid.uuid4().hex[:8]}"
    utf8, latin1 = connect(), connect()
    latin1.execute("SET client_encoding TO 'LATIN1'")
    assert run_job(utf8, job, lambda c: 1, period="day").completed
    again = run_job(latin1, job, lambda c: 1, period="day")
    assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")
    rows = observer.conn.execute(
        "SELECT job FROM pgsolo.job_periods WHERE job LIKE 'Gr%%' AND job = %s", (job,)
    ).fetchall()
    assert rows == [(job,)]


def test_an_error_message_that_is_not_valid_unicode_is_still_recorded(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    undecodable = b"/tmp/\xff".decode("utf-8", "surrogateescape")

    def missing(c: psycopg.Connection) -> None:
        raise FileNotFoundError(2, "No such file", undecodable)

    result = run_job(connect(), job, missing, record=True, raise_errors=False)
    assert result.outcome == "failed"
    assert isinstance(result.error, FileNotFoundError)
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["outcome"] == "failed"
    assert "No such file" in row["error"]
    assert "\\udcff" in row["error"]  # the undecodable byte, escaped rather than lost


@pytest.mark.parametrize("name", ["", "a\0b", "\ud800"])
def test_job_names_must_be_text_the_database_can_store(name: str) -> None:
    with pytest.raises(pgsolo.UsageError):
        run_job(CLOSED_PORT_DSN, 1, lambda c: None, name=name)


# -- regressions: work that ends its own transaction; ledger reads on implicit transactions --


@pytest.mark.parametrize("autocommit", [True, False])
def test_xact_work_that_commits_and_carries_on_in_a_new_transaction_is_rolled_back(
    db: str, connect: Connect, observer: Any, autocommit: bool
) -> None:
    """After a COMMIT and a new transaction the connection looks busy again, but the
    lock is gone: pgsolo commits only if the lock is still held, in the same round trip
    as the COMMIT, so the unprotected rest of the work is rolled back."""
    job = new_job()
    conn = connect(autocommit=autocommit)

    def fn(c: psycopg.Connection) -> str:
        insert_work(c, job, "before")
        if autocommit:
            c.execute("COMMIT")
            c.execute("BEGIN")
        else:
            c.commit()  # psycopg begins the next transaction by itself
        insert_work(c, job, "after")  # runs without the lock
        return "went on"

    result = run_job(conn, job, fn, raise_errors=False)
    assert result.outcome == "lost"
    assert isinstance(result.error, LockLostError)
    assert "no longer held" in str(result.error)
    assert work_rows(observer, job) == ["before"]  # "after" was not committed
    assert observer.holders(key_of(job)) == set()
    assert conn.info.transaction_status == IDLE
    # The connection and the key are usable again.
    assert run_job(conn, job, lambda c: "again").completed


@pytest.mark.parametrize("ending", ["COMMIT", "ROLLBACK"])
def test_xact_work_that_ends_its_own_transaction_is_lost(
    db: str, observer: Any, ending: str
) -> None:
    """The lock of an xact job lives in its transaction: work that commits (or rolls
    back) mid-way goes on unprotected, which is a lost lock, not a completed run."""
    job = new_job()
    seen: dict[str, object] = {}

    def fn(conn: psycopg.Connection) -> str:
        insert_work(conn, job, "before")
        conn.execute(ending)
        seen["holders"] = observer.holders(key_of(job))
        insert_work(conn, job, "after")  # runs without the lock
        return "went on"

    result = run_job(db, job, fn, record=True, raise_errors=False)
    assert result.outcome == "lost"
    assert result.reason == "work-ended-transaction"
    assert isinstance(result.error, LockLostError)
    assert result.error.key == key_of(job)
    assert result.value == "went on"
    assert seen["holders"] == set()  # the server really let go of the lock mid-way
    assert observer.holders(key_of(job)) == set()
    assert work_rows(observer, job) == (["after", "before"] if ending == "COMMIT" else ["after"])
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["outcome"] == "lost"
    assert row["reason"] == "work-ended-transaction"

    with pytest.raises(LockLostError) as raised:
        run_job(db, job, fn)
    assert raised.value.key == key_of(job)
    assert job in str(raised.value)
    assert observer.holders(key_of(job)) == set()


def test_xact_work_that_commits_on_a_callers_connection_leaves_it_reusable(
    db: str, connect: Connect, observer: Any
) -> None:
    """After such a lost run, the caller's connection must not keep pgsolo's claim on the
    key (later runs would be skipped as busy) nor on the transaction (another thread
    would be refused)."""
    job = new_job()
    conn = connect()

    def commits(c: psycopg.Connection) -> None:
        c.execute("COMMIT")

    result = run_job(conn, job, commits, raise_errors=False)
    assert result.outcome == "lost"
    assert conn.info.transaction_status == IDLE
    assert observer.holders(key_of(job)) == set()

    again = run_job(conn, job, lambda c: observer.holders(key_of(job)), raise_errors=False)
    assert again.outcome == "completed", again
    assert again.value == {conn.info.backend_pid}

    # Another thread may now use the connection for a transaction of its own.
    seen: list[object] = []

    def other_thread() -> None:
        try:
            with conn.transaction():
                seen.append(pgsolo.xact_lock(conn, key_of(job)).acquire())
                seen.append(observer.holders(key_of(job)))
        except BaseException as exc:
            seen.append(exc)

    thread = threading.Thread(target=other_thread, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert seen == [True, {conn.info.backend_pid}]
    assert observer.holders(key_of(job)) == set()


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


def test_schema_version_of_an_unmigrated_database_leaves_the_connection_idle(
    fresh_db: str,
) -> None:
    with psycopg.connect(fresh_db, autocommit=False) as conn:
        assert schema_version(conn) == 0
        assert conn.info.transaction_status == IDLE
