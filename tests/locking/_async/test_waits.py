"""Bounded waits (``wait=``) on an async connection, the tests that read the same in both
flavours: a wait that times out inside the caller's transaction leaves it usable, with the
connection's own ``lock_timeout``. Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. The other wait tests are in ``tests/locking/test_waits.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg import sql as pgsql

import pgsolo
from pgsolo import Key, LockTimeoutError

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


def pid_of(conn: psycopg.AsyncConnection[Any]) -> int:
    return conn.info.backend_pid


async def show_lock_timeout(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute("SHOW lock_timeout")
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def table(observer: Any) -> Iterator[str]:
    """A real (not temporary) table, so the observer session can see what was committed."""
    name = f"pgsolo_work_{uuid.uuid4().hex[:12]}"
    observer.conn.execute(
        pgsql.SQL("CREATE TABLE {} (note text NOT NULL)").format(pgsql.Identifier(name))
    )
    yield name
    observer.conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(name)))


async def insert_note(conn: psycopg.AsyncConnection[Any], table: str, note: str) -> None:
    await conn.execute(
        pgsql.SQL("INSERT INTO {} VALUES (%s)").format(pgsql.Identifier(table)), (note,)
    )


def notes(observer: Any, table: str) -> list[str]:
    rows = observer.conn.execute(
        pgsql.SQL("SELECT note FROM {} ORDER BY note").format(pgsql.Identifier(table))
    ).fetchall()
    return [r[0] for r in rows]


def lock_factory(lifetime: str) -> Callable[..., pgsolo.AsyncLock]:
    return pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock  # type: ignore[return-value]


async def assert_clean(conn: psycopg.AsyncConnection[Any], observer: Any) -> None:
    """The connection holds and waits for nothing, is IDLE (not ACTIVE, not idle in
    transaction), and still answers queries."""
    pid = pid_of(conn)
    assert not conn.closed
    assert not conn.broken
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    assert observer.advisory(pid=pid) == set()
    assert observer.advisory(pid=pid, granted=False) == set()
    assert pgsolo.held_session_locks(conn) == []
    cur = await conn.execute("SELECT 42")
    assert await cur.fetchone() == (42,)
    if not conn.autocommit:
        await conn.rollback()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_timeout_inside_callers_transaction_leaves_it_usable(
    aconnect: AConnect, observer: Any, key: Key, table: str, lifetime: str
) -> None:
    holder_conn, waiter = await aconnect(), await aconnect()
    holder = pgsolo.session_lock(holder_conn, key)
    assert await holder.acquire() is True
    await waiter.execute("SET lock_timeout = '7s'")
    async with waiter.transaction():
        await insert_note(waiter, table, "before the wait")
        lock = lock_factory(lifetime)(waiter, key, wait=0.3)
        with pytest.raises(LockTimeoutError):
            await lock.acquire()
        assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        cur = await waiter.execute("SELECT 41 + 1")
        assert await cur.fetchone() == (42,)
        assert await show_lock_timeout(waiter) == "7s"
        await insert_note(waiter, table, "after the wait")
    assert notes(observer, table) == ["after the wait", "before the wait"]
    assert await show_lock_timeout(waiter) == "7s"
    assert observer.advisory(pid=pid_of(waiter)) == set()
    await holder.release()
    await assert_clean(waiter, observer)
