"""The xact job's commit check: pgsolo commits the work only if the lock is still held, in
the same round trip. Work that commits and carries on, ends its own transaction, or
resets the session's settings is judged by what the server holds.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    IDLE,
    WORK,
    Connect,
    insert_work,
    key_of,
    new_job,
    work_rows,
)
from pgsolo import LockLostError
from pgsolo.jobs import run_job

# -- sync jobs -----------------------------------------------------------------------------


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


@pytest.mark.parametrize("prepare_threshold", [5, 0])
def test_a_waiting_jobs_work_that_commits_and_carries_on_is_rolled_back(
    db: str, connect: Connect, observer: Any, prepare_threshold: int
) -> None:
    """The same where the job waits, and its wait marks the transaction itself: as
    written, and run by name (psycopg's ``prepare_threshold=0``: from the first)."""
    job = new_job()
    conn = connect()
    conn.prepare_threshold = prepare_threshold

    def fn(c: psycopg.Connection) -> str:
        insert_work(c, job, "before")
        c.execute("COMMIT")
        c.execute("BEGIN")
        insert_work(c, job, "after")  # runs without the lock
        return "went on"

    result = run_job(conn, job, fn, raise_errors=False, wait=5)
    assert result.outcome == "lost"
    assert result.reason == "work-ended-transaction"
    assert work_rows(observer, job) == ["before"]  # "after" was not committed
    assert observer.holders(key_of(job)) == set()
    assert conn.info.transaction_status == IDLE
    assert run_job(conn, job, lambda c: "again", wait=5).completed


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


def test_reset_all_inside_an_xact_jobs_transaction_is_not_a_lost_lock(
    db: str, connect: Any, observer: Any
) -> None:
    """RESET ALL is allowed inside a transaction and ends neither it nor its xact lock;
    it also resets pgsolo.xact_lock_marker, so the commit check reports a loss and
    rolls back work that ran entirely under the lock (the pg_locks check committed it)."""
    job = f"commit-check-{uuid.uuid4().hex[:12]}"
    conn = connect()

    def work(c: psycopg.Connection[Any]) -> str:
        c.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'written')", (job,))
        c.execute("RESET ALL")  # e.g. a library restoring defaults; the lock is still held
        held = c.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid()"
        ).fetchone()
        assert held == (1,)  # still held, in the same transaction
        return "ok"

    result = run_job(conn, job, work, raise_errors=False)
    assert (result.outcome, result.reason) == ("completed", None), result
    assert work_rows(observer, job) == ["written"]
