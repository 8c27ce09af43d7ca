"""Edge cases of session jobs watched by the keeper: no cancellation left pending on the
caller's task, and the value of work that completed after a loss is kept."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg

from _support import eventually, terminate
from pgsolo import Keep, LockLostError, run_job, run_job_async

INTERVAL = 0.05
BOUND = 20.0


def new_job() -> str:
    return f"keep-edge-{uuid.uuid4().hex[:12]}"


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
            new_job(),
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
    result = run_job(db, new_job(), work, lifetime="session", keep=keep, raise_errors=False)
    assert result.outcome == "lost"
    assert isinstance(result.error, LockLostError)
    assert result.value == "the work's value"
