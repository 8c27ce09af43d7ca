"""A cancelled ``run_once_async``: cancelled while the operation runs, it stays started
and releases its lock; cancelled while starting the attempt, it leaves nothing behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pgsolo
from _support import DEADLINE, IDLE, WORK, locks_of, new_op, row_of, work_rows
from pgsolo import run_once_async


async def test_a_cancelled_async_operation_stays_started_and_releases_its_lock(
    db: str, aconnect: Any, observer: Any
) -> None:
    conn = await aconnect()
    op = new_op()
    running = asyncio.Event()

    async def slow(ctx: Any) -> None:
        await ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        running.set()
        await asyncio.sleep(DEADLINE * 10)

    task = asyncio.create_task(pgsolo.run_once_async(conn, op, slow))
    await asyncio.wait_for(running.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "started"
    assert work_rows(observer, op) == []
    assert locks_of(observer, conn) == set()
    assert conn.info.transaction_status == IDLE


# -- found in review -----------------------------------------------------------------------


async def test_cancelled_while_starting_the_attempt_leaves_nothing_behind(
    db: str, aconnect: Any, observer: Any
) -> None:
    """Cancel the task while once_start waits on the operation's row (held FOR UPDATE by
    another session): the connection must be idle, its lock released, the row as before."""

    op_key = new_op("review2")
    conn = await aconnect()

    async def failing(ctx: Any) -> None:
        raise ValueError("first attempt fails")

    with pytest.raises(ValueError, match="first attempt fails"):
        await run_once_async(conn, op_key, failing)
    observer.conn.execute("BEGIN")
    observer.conn.execute("SELECT 1 FROM pgsolo.operations WHERE op_key = %s FOR UPDATE", (op_key,))
    ran: list[int] = []

    async def operation(ctx: Any) -> int:
        ran.append(1)
        return 1

    task = asyncio.create_task(run_once_async(conn, op_key, operation))
    try:
        for _ in range(200):
            blocked = observer.conn.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                (conn.info.backend_pid,),
            ).fetchone()
            if blocked and blocked[0]:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)
    finally:
        observer.conn.execute("ROLLBACK")
    assert not ran
    assert conn.info.transaction_status == IDLE, conn.info.transaction_status.name
    assert observer.advisory(pid=conn.info.backend_pid) == set()
    row = observer.conn.execute(
        "SELECT state, attempts FROM pgsolo.operations WHERE op_key = %s", (op_key,)
    ).fetchone()
    assert row == ("failed", 1)
