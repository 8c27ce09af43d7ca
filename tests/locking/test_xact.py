"""xact_lock: a lock that lasts as long as its transaction.

The article's two-session scenario, literally (sync sessions one after the other, async
sessions interleaved on one event loop), raw SQL and pgsolo side by side, a rollback that
releases, refusals on an autocommit connection. Everything runs on real sessions; what is
asserted is what ``pg_locks`` says through the ``observer`` session. The tests that read
the same in both flavours (exceptions in the block, autocommit off, nested blocks) are
written once, async, in ``_async/test_xact.py``; scripts/unasync.py generates
``_sync/test_xact.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import DEADLINE, AConnect, Connect, assert_clean, backend_state, pid_of
from pgsolo import (
    ConnectionStateError,
    Key,
    UsageError,
)

# -- sync connections ----------------------------------------------------------------------

ARTICLE_KEY = (42, 1001)


def test_article_two_sessions_with_pgsolo(connect: Connect, observer: Any) -> None:
    a, b = connect(), connect()
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # Session A: BEGIN; try the xact lock -> true. Leave the transaction open.
    a.execute("BEGIN")
    assert pgsolo.xact_lock(a, ARTICLE_KEY).acquire() is True
    assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(a)}

    # Session B: BEGIN; try -> false; ROLLBACK.
    b.execute("BEGIN")
    assert pgsolo.xact_lock(b, ARTICLE_KEY).acquire() is False
    b.execute("ROLLBACK")
    # The same through the context manager (BEGIN + try, then ROLLBACK at block end).
    with pgsolo.xact_lock(b, ARTICLE_KEY) as busy:
        assert busy.acquired is False
    assert b.info.transaction_status is psycopg.pq.TransactionStatus.IDLE

    # Finish session A: COMMIT releases the lock.
    a.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # Session B again: now true.
    b.execute("BEGIN")
    assert pgsolo.xact_lock(b, ARTICLE_KEY).acquire() is True
    assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(b)}
    b.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()


def test_article_raw_sql_and_pgsolo_interleaved(connect: Connect, observer: Any) -> None:
    raw, solo = connect(), connect()
    try_sql = "SELECT pg_try_advisory_xact_lock(42, 1001)"

    # A raw holder makes pgsolo report busy.
    raw.execute("BEGIN")
    assert raw.execute(try_sql).fetchone() == (True,)
    with pgsolo.xact_lock(solo, ARTICLE_KEY) as lock:
        assert lock.acquired is False
    assert pgsolo.session_lock(solo, ARTICLE_KEY).acquire() is False
    raw.execute("COMMIT")

    # Once the raw holder committed, pgsolo gets it; and a pgsolo holder makes raw SQL busy.
    with pgsolo.xact_lock(solo, ARTICLE_KEY) as lock:
        assert lock.acquired is True
        assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(solo)}
        raw.execute("BEGIN")
        assert raw.execute(try_sql).fetchone() == (False,)
        raw.execute("ROLLBACK")
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # pgsolo committed at block end: raw SQL gets it again.
    raw.execute("BEGIN")
    assert raw.execute(try_sql).fetchone() == (True,)
    raw.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()


def test_rollback_releases_xact_lock(connect: Connect, observer: Any, key: Key) -> None:
    conn, other = connect(autocommit=False), connect()
    assert pgsolo.xact_lock(conn, key).acquire() is True
    assert observer.holders(key) == {pid_of(conn)}
    conn.rollback()
    assert observer.holders(key) == set()
    with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


def test_xact_acquire_on_autocommit_idle_connection_is_refused(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    marker = f"SELECT 'pgsolo-marker-{uuid.uuid4().hex}'"
    conn.execute(marker)
    with pytest.raises(ConnectionStateError, match="autocommit"):
        pgsolo.xact_lock(conn, key).acquire()
    with pytest.raises(ConnectionStateError, match="autocommit"):
        pgsolo.xact_lock(conn, key, wait=5).acquire()
    assert backend_state(observer, pid_of(conn)) == ("idle", marker)
    assert observer.holders(key) == set()


def test_xact_lock_has_no_release(connect: Connect, key: Key) -> None:
    conn = connect()
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        with pytest.raises(UsageError, match="COMMIT or ROLLBACK"):
            lock.release()


# -- async connections ---------------------------------------------------------------------


async def test_article_scenario_interleaving_two_async_connections(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    a, b = await aconnect(), await aconnect()
    a_holds, b_checked, a_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    async def session_a() -> None:
        async with pgsolo.xact_lock(a, key) as lock:
            seen["a_acquired"] = lock.acquired
            seen["a_status"] = a.info.transaction_status
            a_holds.set()
            await asyncio.wait_for(b_checked.wait(), DEADLINE)
            seen["holders_while_a"] = observer.holders(key)
        seen["holders_after_a"] = observer.holders(key)
        a_done.set()

    async def session_b() -> None:
        await asyncio.wait_for(a_holds.wait(), DEADLINE)
        async with b.transaction():  # BEGIN; try; ROLLBACK, as in the article
            seen["b_first"] = await pgsolo.xact_lock(b, key).acquire()
            raise psycopg.Rollback()
        b_checked.set()
        await asyncio.wait_for(a_done.wait(), DEADLINE)
        async with pgsolo.xact_lock(b, key) as lock:
            seen["b_second"] = lock.acquired
            seen["holders_while_b"] = observer.holders(key)

    await asyncio.wait_for(asyncio.gather(session_a(), session_b()), DEADLINE)

    assert seen["a_acquired"] is True
    assert seen["a_status"] is pq.TransactionStatus.INTRANS
    assert seen["b_first"] is False
    assert seen["holders_while_a"] == {pid_of(a)}
    assert seen["holders_after_a"] == set()
    assert seen["b_second"] is True
    assert seen["holders_while_b"] == {pid_of(b)}
    await assert_clean(a, observer)
    await assert_clean(b, observer)
