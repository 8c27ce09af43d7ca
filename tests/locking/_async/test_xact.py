"""xact_lock on an async connection, the tests that read the same in both flavours.

Exceptions and database errors in the block roll the work back and release the lock, a
connection with autocommit off (psycopg's implicit transaction) is left idle, a plain
acquire needs a transaction, and nested blocks join the outer transaction. What is
asserted is what ``pg_locks`` says through the ``observer`` session. Written once, under
``_async/``: scripts/unasync.py writes the twin under ``_sync/``. The tests of one flavour
only (the article's scenario, raw SQL alongside) are in ``tests/locking/test_xact.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    IDLE,
    INTRANS,
    AConnect,
    JobFailedError,
    assert_clean,
    insert_note,
    notes,
    other_key,
    pid_of,
)
from pgsolo import ConnectionStateError, Key, TransactionFailedError

# -- rollback and exceptions ------------------------------------------------------------


async def test_exception_in_xact_block_rolls_back_and_releases(
    aconnect: AConnect, observer: Any, key: Key, table: str
) -> None:
    conn, other = await aconnect(), await aconnect()

    # The happy path commits, so the row check below can tell a rollback from a no-op.
    async with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        await insert_note(conn, table, "committed")
    assert notes(observer, table) == ["committed"]

    failure = JobFailedError("the job broke")

    async def job() -> None:
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            await insert_note(conn, table, "rolled back")
            assert observer.holders(key) == {pid_of(conn)}
            raise failure

    with pytest.raises(JobFailedError) as raised:
        await job()
    assert raised.value is failure
    assert notes(observer, table) == ["committed"]
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    await assert_clean(conn, observer)
    async with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


async def test_caught_database_error_in_xact_block_commits_nothing(
    aconnect: AConnect, observer: Any, key: Key, table: str
) -> None:
    conn = await aconnect()

    async def job() -> None:
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            await insert_note(conn, table, "must not commit")
            with pytest.raises(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1/0")  # caught here, and not re-raised

    with pytest.raises(TransactionFailedError, match="rolled back"):
        await job()
    assert notes(observer, table) == []
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    await assert_clean(conn, observer)


# -- autocommit=False connections -------------------------------------------------------


async def test_xact_context_on_non_autocommit_connection_joins_the_callers_transaction(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """With autocommit off, psycopg's implicit transaction is the caller's: the block joins
    it, and pgsolo never commits what the caller meant to roll back. (It once committed
    at the end of the block, and the caller's rollback left the rows in the table.)"""
    conn = await aconnect(autocommit=False)
    await conn.execute("CREATE TEMP TABLE written (n int) ON COMMIT PRESERVE ROWS")
    await conn.commit()
    assert conn.info.transaction_status is IDLE
    async with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert conn.info.transaction_status is INTRANS
        await conn.execute("INSERT INTO written VALUES (1)")
    assert conn.info.transaction_status is INTRANS  # still the caller's, still open
    assert observer.holders(key) == {pid_of(conn)}  # held until the caller ends it
    await conn.rollback()
    assert observer.holders(key) == set()
    cur = await conn.execute("SELECT count(*) FROM written")
    assert await cur.fetchone() == (0,)  # the caller's rollback undid the block's rows
    await conn.rollback()
    # A busy try leaves the caller's transaction open and usable too.
    other = await aconnect()
    async with pgsolo.session_lock(other, key):
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired is False
        assert conn.info.transaction_status is INTRANS
        await conn.rollback()
    await assert_clean(conn, observer)


async def test_xact_plain_acquire_on_non_autocommit_connection(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    # Without a transaction (autocommit, idle) a plain acquire is refused...
    autocommit = await aconnect()
    with pytest.raises(ConnectionStateError):
        await pgsolo.xact_lock(autocommit, key).acquire()
    await assert_clean(autocommit, observer)

    # ...with autocommit off it takes the lock in psycopg's implicit transaction.
    conn = await aconnect(autocommit=False)
    lock = pgsolo.xact_lock(conn, key)
    assert await lock.acquire() is True
    assert conn.info.transaction_status is INTRANS
    assert observer.holders(key) == {pid_of(conn)}
    await conn.commit()
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is IDLE


# -- nested blocks ----------------------------------------------------------------------


async def test_nested_xact_blocks_join_the_outer_transaction(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """The other side of refusing another thread's or task's xact block on a shared
    connection: nested blocks in one thread or task are not refused; the inner one joins
    the outer transaction and its lock lasts until that ends."""
    conn = await aconnect()
    pid = pid_of(conn)
    inner_key = other_key(key)
    async with pgsolo.xact_lock(conn, key) as outer:
        assert outer.acquired
        async with pgsolo.xact_lock(conn, inner_key) as inner:
            assert inner.acquired
            assert observer.holders(key) == {pid}
            assert observer.holders(inner_key) == {pid}
        # The inner block joined the outer transaction: its lock lasts until that ends.
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(inner_key) == {pid}
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == set()
    assert observer.holders(inner_key) == set()
    await assert_clean(conn, observer)
