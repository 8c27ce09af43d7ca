"""xact_lock: a lock that lasts as long as its transaction.

The article's two-session scenario, literally (sync and interleaved async sessions), raw SQL
and pgsolo side by side, rollback and exceptions in the block, nested blocks, and
connections with autocommit off (psycopg's implicit transaction). Everything runs on real
sessions; what is asserted is what ``pg_locks`` says through the ``observer`` session.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg import sql as pgsql

import pgsolo
from pgsolo import (
    ConnectionStateError,
    Key,
    TransactionFailedError,
    UsageError,
)

# -- sync connections ----------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS


def pid_of(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


def backend_state(observer: Any, pid: int) -> tuple[str | None, str | None] | None:
    """(state, query) of a backend in pg_stat_activity, or None when it is gone."""
    row = observer.conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (row[0], row[1]) if row else None


@pytest.fixture
def table(observer: Any) -> Iterator[str]:
    """A real (not temporary) table, so the observer session can see what was committed."""
    name = f"pgsolo_work_{uuid.uuid4().hex[:12]}"
    observer.conn.execute(
        pgsql.SQL("CREATE TABLE {} (note text NOT NULL)").format(pgsql.Identifier(name))
    )
    yield name
    observer.conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(name)))


def insert_note(conn: psycopg.Connection, table: str, note: str) -> None:
    conn.execute(pgsql.SQL("INSERT INTO {} VALUES (%s)").format(pgsql.Identifier(table)), (note,))


def notes(observer: Any, table: str) -> list[str]:
    rows = observer.conn.execute(
        pgsql.SQL("SELECT note FROM {} ORDER BY note").format(pgsql.Identifier(table))
    ).fetchall()
    return [r[0] for r in rows]


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


class JobFailedError(Exception):
    pass


def test_rollback_releases_xact_lock(connect: Connect, observer: Any, key: Key) -> None:
    conn, other = connect(autocommit=False), connect()
    assert pgsolo.xact_lock(conn, key).acquire() is True
    assert observer.holders(key) == {pid_of(conn)}
    conn.rollback()
    assert observer.holders(key) == set()
    with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


def test_exception_in_xact_block_rolls_back_and_releases(
    connect: Connect, observer: Any, key: Key, table: str
) -> None:
    conn, other = connect(), connect()

    # The happy path commits, so the row check below can tell a rollback from a no-op.
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        insert_note(conn, table, "committed")
    assert notes(observer, table) == ["committed"]

    failure = JobFailedError("the job broke")

    def job() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            insert_note(conn, table, "rolled back")
            assert observer.holders(key) == {pid_of(conn)}
            raise failure

    with pytest.raises(JobFailedError) as raised:
        job()
    assert raised.value is failure
    assert notes(observer, table) == ["committed"]
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


def test_caught_database_error_in_xact_block_commits_nothing(
    connect: Connect, observer: Any, key: Key, table: str
) -> None:
    conn = connect()

    def job() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            insert_note(conn, table, "must not commit")
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")  # caught here, and not re-raised

    with pytest.raises(TransactionFailedError):
        job()
    assert notes(observer, table) == []
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


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


def test_xact_context_on_non_autocommit_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect(autocommit=False)
    assert conn.info.transaction_status is IDLE
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(key) == {pid_of(conn)}
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == set()
    assert backend_state(observer, pid_of(conn))[0] == "idle"  # type: ignore[index]
    # A busy try on the same kind of connection ends idle too.
    other = connect()
    with pgsolo.session_lock(other, key):
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired is False
        assert conn.info.transaction_status is IDLE


def test_xact_plain_acquire_on_non_autocommit_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect(autocommit=False)
    lock = pgsolo.xact_lock(conn, key)
    assert lock.acquire() is True
    assert conn.info.transaction_status is INTRANS
    assert observer.holders(key) == {pid_of(conn)}
    conn.commit()
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is IDLE


def second_key(key: Key) -> Key:
    assert isinstance(key.value, tuple)
    return Key((key.value[0], key.value[1] + 500_000))


def test_nested_xact_blocks_in_one_thread(connect: Connect, observer: Any, key: Key) -> None:
    """The other side of refusing another thread's xact block on a shared connection: nested
    blocks in one thread are not refused; the inner one joins the outer transaction and its
    lock lasts until that ends."""
    conn = connect()
    pid = pid_of(conn)
    inner_key = second_key(key)
    with pgsolo.xact_lock(conn, key) as outer:
        assert outer.acquired
        with pgsolo.xact_lock(conn, inner_key) as inner:
            assert inner.acquired
            assert observer.holders(key) == {pid}
            assert observer.holders(inner_key) == {pid}
        # The inner block joined the outer transaction: its lock lasts until that ends.
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(inner_key) == {pid}
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == set()
    assert observer.holders(inner_key) == set()


# -- async connections ---------------------------------------------------------------------

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]

BOUND = 10.0  # seconds: an upper bound for things that should take milliseconds


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
            await asyncio.wait_for(b_checked.wait(), BOUND)
            seen["holders_while_a"] = observer.holders(key)
        seen["holders_after_a"] = observer.holders(key)
        a_done.set()

    async def session_b() -> None:
        await asyncio.wait_for(a_holds.wait(), BOUND)
        async with b.transaction():  # BEGIN; try; ROLLBACK, as in the article
            seen["b_first"] = await pgsolo.xact_lock(b, key).acquire()
            raise psycopg.Rollback()
        b_checked.set()
        await asyncio.wait_for(a_done.wait(), BOUND)
        async with pgsolo.xact_lock(b, key) as lock:
            seen["b_second"] = lock.acquired
            seen["holders_while_b"] = observer.holders(key)

    await asyncio.wait_for(asyncio.gather(session_a(), session_b()), BOUND)

    assert seen["a_acquired"] is True
    assert seen["a_status"] is pq.TransactionStatus.INTRANS
    assert seen["b_first"] is False
    assert seen["holders_while_a"] == {pid_of(a)}
    assert seen["holders_after_a"] == set()
    assert seen["b_second"] is True
    assert seen["holders_while_b"] == {pid_of(b)}
    await assert_clean(a, observer)
    await assert_clean(b, observer)


async def test_xact_block_exception_rolls_back_work_and_releases(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    table = f"pgsolo_async_work_{uuid.uuid4().hex[:12]}"
    await conn.execute(f"CREATE TABLE {table} (n int)")
    try:
        error = RuntimeError("job failed")

        async def job() -> None:
            async with pgsolo.xact_lock(conn, key) as lock:
                assert lock.acquired
                await conn.execute(f"INSERT INTO {table} VALUES (1)")
                assert observer.holders(key) == {pid_of(conn)}
                raise error

        with pytest.raises(RuntimeError, match="job failed") as caught:
            await job()
        assert caught.value is error
        assert observer.holders(key) == set()
        assert observer.conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        await assert_clean(conn, observer)

        # The happy path commits the work (so the count above could have been 1).
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            await conn.execute(f"INSERT INTO {table} VALUES (2)")
        assert observer.conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
        assert observer.holders(key) == set()
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")


async def test_xact_block_swallowed_db_error_is_transaction_failed(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()

    async def job() -> None:
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            # Caught and not re-raised: the transaction is aborted all the same.
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1/0")

    with pytest.raises(pgsolo.TransactionFailedError, match="rolled back"):
        await job()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_implicit_transaction_connection_xact_block(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect(autocommit=False)
    async with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert conn.info.transaction_status is pq.TransactionStatus.INTRANS
        assert observer.holders(key) == {pid_of(conn)}
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_plain_xact_acquire_needs_a_transaction(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    with pytest.raises(pgsolo.ConnectionStateError):
        await pgsolo.xact_lock(conn, key).acquire()
    await assert_clean(conn, observer)

    implicit = await aconnect(autocommit=False)
    assert await pgsolo.xact_lock(implicit, key).acquire() is True
    assert implicit.info.transaction_status is pq.TransactionStatus.INTRANS
    assert observer.holders(key) == {pid_of(implicit)}
    await implicit.commit()
    assert observer.holders(key) == set()


def other_key(key: Key) -> Key:
    assert isinstance(key.value, tuple)
    return Key((key.value[0], key.value[1] + 500_000))


async def test_nested_xact_blocks_in_one_task(aconnect: AConnect, observer: Any, key: Key) -> None:
    """The other side of refusing another task's xact block on a shared connection: nested
    blocks in one task are not refused; the inner one joins the outer transaction and its
    lock lasts until that ends."""
    conn = await aconnect()
    pid = pid_of(conn)
    key2 = other_key(key)
    async with pgsolo.xact_lock(conn, key) as outer:
        assert outer.acquired
        async with pgsolo.xact_lock(conn, key2) as inner:
            assert inner.acquired
            assert observer.holders(key) == {pid}
            assert observer.holders(key2) == {pid}
        # The inner block joined the outer transaction: its lock lasts until that ends.
        assert conn.info.transaction_status is pq.TransactionStatus.INTRANS
        assert observer.holders(key2) == {pid}
    assert observer.holders(key) == set()
    assert observer.holders(key2) == set()
    await assert_clean(conn, observer)
