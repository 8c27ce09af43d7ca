"""Session jobs watched by the keeper (``run_job(..., lifetime="session", keep=...)``):
a lock lost while the work runs makes the outcome ``lost``, never ``completed``.

Also (found in review): ``Keep(cancel=True)`` leaves no cancellation pending on the
caller's task, and a lost session job keeps the value its work returned.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import INTERVAL, eventually, new_job, terminate
from pgsolo import Keep, LockLostError, UsageError, run_job, run_job_async

BOUND = 20.0


def test_a_lost_lock_while_the_work_runs_is_outcome_lost(db: str, observer: Any) -> None:
    backend: list[int] = []
    finished = threading.Event()

    def work(conn: psycopg.Connection[Any]) -> str:
        backend.append(conn.info.backend_pid)
        terminate(observer, conn.info.backend_pid)  # someone ends the session mid-work
        eventually(lambda: observer.holders(pgsolo.as_key(job)) == set(), "the lock to go")
        finished.set()
        return "done, but not under the lock to the end"

    job = new_job("keep-test")
    result = run_job(
        db, job, work, lifetime="session", keep=Keep(interval=INTERVAL), raise_errors=False
    )
    assert finished.is_set()
    assert result.outcome == "lost"
    assert result.reason == "connection-lost"
    assert isinstance(result.error, LockLostError)


def test_lock_released_behind_the_jobs_back_is_lost_with_the_keepers_reason(
    db: str,
) -> None:
    def work(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_unlock_all()")  # gone, the session alive
        eventually(lost.is_set, "the keeper to notice")

    lost = threading.Event()
    keep = Keep(interval=INTERVAL, on_lost=lambda _error: lost.set())
    result = run_job(
        db, new_job("keep-test"), work, lifetime="session", keep=keep, raise_errors=False
    )
    assert result.outcome == "lost"
    assert result.reason == "lock-released"


def test_a_watched_job_that_keeps_its_lock_completes(db: str, observer: Any) -> None:
    def work(conn: psycopg.Connection[Any]) -> int:
        for _ in range(5):  # several beats, and the work's own statements between them
            assert conn.execute("SELECT 1").fetchone() == (1,)
            threading.Event().wait(INTERVAL)
        return 42

    job = new_job("keep-test")
    result = run_job(db, job, work, lifetime="session", keep=Keep(interval=INTERVAL))
    assert (result.outcome, result.value) == ("completed", 42)
    assert observer.holders(pgsolo.as_key(job)) == set()
    assert not [t for t in threading.enumerate() if t.name.startswith("pgsolo-keeper")]


async def test_async_cancel_true_stops_the_work_and_reports_lost(db: str, observer: Any) -> None:
    reached_end = False

    async def work(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal reached_end
        terminate(observer, conn.info.backend_pid)
        await asyncio.sleep(BOUND)  # cancelled by the keeper long before
        reached_end = True

    result = await asyncio.wait_for(
        run_job_async(
            db,
            new_job("keep-test"),
            work,
            lifetime="session",
            keep=Keep(interval=INTERVAL, cancel=True),
            raise_errors=False,
        ),
        BOUND * 2,
    )
    assert not reached_end
    assert result.outcome == "lost"
    assert result.reason == "connection-lost"


async def test_an_outside_cancellation_of_a_watched_job_stays_a_cancellation(db: str) -> None:
    started = asyncio.Event()

    async def work(conn: psycopg.AsyncConnection[Any]) -> None:
        started.set()
        await asyncio.sleep(BOUND)

    task = asyncio.create_task(
        run_job_async(
            db,
            new_job("keep-test"),
            work,
            lifetime="session",
            keep=Keep(interval=INTERVAL, cancel=True),
        )
    )
    await asyncio.wait_for(started.wait(), BOUND)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, BOUND)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lifetime": "xact", "keep": True}, "watches a session lock"),
        ({"lifetime": "session", "keep": "yes"}, "keep must be"),
        ({"lifetime": "session", "keep": Keep(cancel=True)}, "run_job_async"),
    ],
)
def test_bad_keep_options_are_refused_before_any_sql(
    connect: Any, options: dict[str, Any], message: str
) -> None:
    conn = connect()
    conn.close()  # any SQL would fail with a driver error, not a UsageError
    ran: list[object] = []
    with pytest.raises(UsageError, match=message):
        run_job(conn, new_job("keep-test"), ran.append, **options)
    assert ran == []


async def test_cancel_true_leaves_no_pending_cancellation_when_the_work_converts_it(
    db: str, observer: Any
) -> None:
    """Keep(cancel=True) cancels the caller's task. Work whose clean-up fails on the dead
    connection raises that error instead of the CancelledError (very common: a finally
    block that talks to the database). pgsolo issued the cancellation, but only the
    CancelledError branch of the work wrapper takes it back (uncancel), so the caller's
    task is left with cancelling() == 1 after run_job_async returned: asyncio's own
    structures (TaskGroup, timeout, Runner) then read a cancellation nobody asked for."""

    async def work(conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            terminate(observer, conn.info.backend_pid)
            await asyncio.sleep(BOUND)  # cancelled by the keeper long before
        finally:
            await conn.execute("SELECT 1")  # clean-up on the dead connection: raises

    async def caller() -> tuple[Any, int]:
        result = await run_job_async(
            db,
            new_job("keep-edge"),
            work,
            lifetime="session",
            keep=Keep(interval=INTERVAL, cancel=True),
            raise_errors=False,
        )
        me = asyncio.current_task()
        assert me is not None
        return result, me.cancelling()

    result, cancelling = await asyncio.wait_for(caller(), BOUND * 2)
    assert result.outcome == "lost"
    assert cancelling == 0, "the keeper's cancellation is still pending on the caller"


def test_a_lost_session_job_keeps_the_value_its_work_returned(db: str) -> None:
    """The xact path returns the value with a 'lost' outcome (value=value); a keeper-found
    loss drops it, though the work ran to its end and returned it."""

    def work(conn: psycopg.Connection[Any]) -> str:
        conn.execute("SELECT pg_advisory_unlock_all()")
        eventually(lost.is_set, "the keeper to notice")
        return "the work's value"

    lost = threading.Event()
    keep = Keep(interval=INTERVAL, on_lost=lambda _error: lost.set())
    result = run_job(
        db, new_job("keep-edge"), work, lifetime="session", keep=keep, raise_errors=False
    )
    assert result.outcome == "lost"
    assert isinstance(result.error, LockLostError)
    assert result.value == "the work's value"
