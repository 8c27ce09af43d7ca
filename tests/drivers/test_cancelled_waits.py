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

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AKind
from _support import DEADLINE, Connect
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
    suite found it as a worker cancelled twice in one attempt). The attempts are seeded
    and the cancellations land at random moments, as they do in an application."""
    rng = random.Random(23)
    async with kind.open(db) as conn:
        for attempt in range(200):
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
