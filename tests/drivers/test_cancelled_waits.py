"""A cancelled task leaves nothing behind on every async kind of connection: the wait on
the server is cancelled, nothing is held afterwards (not even a grant that raced the
cancellation), and the connection is usable (its transaction too, when the lock was
waiting in the caller's). Sync kinds: a KeyboardInterrupt is in test_psycopg2.py and
tests/locking/test_interruptions.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import psycopg
import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AKind
from _support import DEADLINE, Connect, aeventually
from pgsolo import Key


async def wait_until_waiting(observer: Any, key: Key, task: asyncio.Task[Any]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not observer.waiters(key):
        assert not task.done(), "the task finished before it waited"
        assert loop.time() < deadline, "the task never started waiting"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("in_callers_transaction", [False, True], ids=["own", "callers"])
@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_cancelled_wait_leaves_nothing_behind(
    kind: AKind,
    in_callers_transaction: bool,
    db: str,
    observer: Any,
    key: Key,
    sync_connect: Connect,
) -> None:
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire()
    async with kind.open(db) as conn:
        if in_callers_transaction:
            await conn.begin()
        lock = (
            pgsolo.xact_lock(conn.conn, key, wait=30)
            if in_callers_transaction or not kind.session_locks
            else pgsolo.session_lock(conn.conn, key, wait=30)
        )
        task = asyncio.create_task(lock.__aenter__())
        await wait_until_waiting(observer, key, task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, DEADLINE)
        assert observer.waiters(key) == set()  # the server's wait was cancelled
        if in_callers_transaction:
            assert await conn.in_transaction()
            await conn.execute("SELECT 1")  # the caller's transaction is still usable
            await conn.rollback()
        assert not await conn.in_transaction()
        holder.release()
        assert observer.holders(key) == set()  # and the abandoned wait was not granted
        async with pgsolo.xact_lock(conn.conn, key, wait=5) as again:
            assert again.acquired
    assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_task_cancelled_again_while_it_cleans_up_leaves_nothing_behind(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """Regression: a task cancelled a second (or third) time while pgsolo cleaned up after
    the first cancellation (releasing, or asking whether a racing grant had landed) cut the
    clean-up short, and the lock stayed held on a connection nobody knew held it: asyncpg
    left it in about one such attempt in ten, psycopg in one in five hundred (the chaos
    suite found it as a worker cancelled twice in one attempt). And regression: a second
    cancellation cut short pgsolo's wait for its cancel request to reach the server, so a
    request still on its way when the statement ended anyway cancelled the next statement
    on the connection (asyncpg, about one attempt in three hundred: a later lock, or the
    caller's own statement, failed with QueryCanceledError). The attempts are seeded and
    the cancellations land at random moments, as they do in an application."""
    rng = random.Random(23)
    async with kind.open(db) as conn:
        for attempt in range(400):
            wait = rng.choice([None, 0.2])
            lock = (
                pgsolo.session_lock(conn.conn, key, wait=wait)
                if kind.session_locks
                else pgsolo.xact_lock(conn.conn, key, wait=wait)
            )

            async def hold(lock: Any = lock) -> None:
                async with lock:
                    await asyncio.sleep(rng.random() * 0.003)

            task = asyncio.create_task(hold())
            for _ in range(rng.choice([2, 2, 3])):
                await asyncio.sleep(rng.random() * 0.004)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, DEADLINE)
            assert observer.holders(key) == set(), f"held after attempt {attempt}"
            assert not await conn.in_transaction(), f"a transaction left by attempt {attempt}"
            await conn.execute("SELECT 1")  # no cancel request of the attempt lands here
            if await conn.in_transaction():  # SQLAlchemy began one for the statement
                await conn.rollback()


NOT_ANSWERING_BOUND = 45.0  # pgsolo's bounds on a silent connection (5 s, 15 s), with room
# The async drivers' own connections (SQLAlchemy's over them wait on the silent network
# for their own statements, as they would without pgsolo).
DRIVER_KINDS = [kind for kind in ASYNC_KINDS if not kind.name.startswith("sqlalchemy")]


@pytest.mark.parametrize("kind", DRIVER_KINDS, ids=str)
async def test_a_wait_cancelled_while_the_server_answers_nothing_ends_and_closes_it(
    kind: AKind, pgsolo_relay: Any, observer: Any, key: Key, sync_connect: Connect
) -> None:
    """Regression: a wait cancelled while the network swallowed everything (the cancel
    request included) never ended on asyncpg: pgsolo's clean-up after the cancellation
    waited for an answer without a bound. And once the interrupted statement was given up
    on, asyncpg still waited for the server to acknowledge its own cancellation, so the
    caller's next statement failed with "another operation is in progress". Now the task
    ends in bounded time, and a connection whose state is unknown is closed: it holds
    nothing, and says so."""
    if kind.name.startswith("psycopg") and psycopg.pq.version() < 170000:
        pytest.skip("libpq < 17: psycopg's cancel request blocks the process (docs/locks.md)")
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire()
    async with kind.open(pgsolo_relay.dsn) as conn:
        lock = (
            pgsolo.session_lock(conn.conn, key, wait=60)
            if kind.session_locks
            else pgsolo.xact_lock(conn.conn, key, wait=60)
        )
        task = asyncio.create_task(lock.__aenter__())
        await wait_until_waiting(observer, key, task)
        with pgsolo_relay.blackholed():
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=NOT_ANSWERING_BOUND)
            assert done, "the cancelled task never ended"
            assert task.cancelled()
            with pytest.raises(Exception, match=r"closed|released") as closed:
                await asyncio.wait_for(conn.execute("SELECT 1"), DEADLINE)
            assert "in progress" not in str(closed.value)
        holder.release()
        await aeventually(
            lambda: not observer.holders(key) and not observer.waiters(key),
            "the abandoned wait gone from the server",
        )
