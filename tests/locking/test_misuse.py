"""Bad keys, waits and options are refused before any SQL, and a lock of one flavour used
the other's way (``async with`` on a sync lock, ``with`` on an async one) acquires nothing.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from pgsolo import (
    InvalidKeyError,
    Key,
    UsageError,
)

# -- sync connections ----------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]


def pid_of(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


def backend_state(observer: Any, pid: int) -> tuple[str | None, str | None] | None:
    """(state, query) of a backend in pg_stat_activity, or None when it is gone."""
    row = observer.conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (row[0], row[1]) if row else None


def lock_factory(lifetime: str) -> Callable[..., pgsolo.Lock]:
    return pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock  # type: ignore[return-value]


BAD_KEYS = [True, 1.5, 2**63, "", "a\0b"]


@pytest.mark.parametrize("bad", BAD_KEYS, ids=repr)
@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_bad_key_refused_before_any_sql(connect: Connect, bad: object, lifetime: str) -> None:
    conn = connect()
    conn.close()  # a closed connection: anything that touched it would fail differently
    with pytest.raises(InvalidKeyError):
        lock_factory(lifetime)(conn, bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True], ids=repr)
@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_bad_wait_refused_before_any_sql(
    connect: Connect, key: Key, bad: object, lifetime: str
) -> None:
    conn = connect()
    conn.close()
    with pytest.raises(UsageError):
        lock_factory(lifetime)(conn, key, wait=bad)


def test_bad_options_leave_open_connection_untouched(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    marker = f"SELECT 'pgsolo-marker-{uuid.uuid4().hex}'"
    conn.execute(marker)
    for bad in BAD_KEYS:
        with pytest.raises(InvalidKeyError):
            pgsolo.session_lock(conn, bad).acquire()  # type: ignore[arg-type]
    for wait in (0, -1, math.nan, True):
        with pytest.raises(UsageError):
            pgsolo.xact_lock(conn, key, wait=wait)
    assert backend_state(observer, pid_of(conn)) == ("idle", marker)


# -- async connections ---------------------------------------------------------------------

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


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


def lock_for(conn: psycopg.AsyncConnection[Any], key: Key, lifetime: str, **kw: Any) -> Any:
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    return make(conn, key, **kw)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_async_with_on_a_sync_lock_acquires_nothing(
    connect: Callable[..., psycopg.Connection[Any]], observer: Any, key: Key, lifetime: str
) -> None:
    sync_conn = connect()
    lock = (pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock)(sync_conn, key)
    assert isinstance(lock, pgsolo.Lock)
    with pytest.raises((TypeError, AttributeError)):
        async with lock:  # type: ignore[attr-defined]
            pytest.fail("entered")
    assert observer.advisory(pid=pid_of(sync_conn)) == set()
    assert observer.holders(key) == set()
    assert sync_conn.info.transaction_status is pq.TransactionStatus.IDLE
    with pytest.raises(TypeError):
        await pgsolo.async_pool_reset(sync_conn)  # type: ignore[arg-type]


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_with_on_an_async_lock_acquires_nothing(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str
) -> None:
    conn = await aconnect()
    lock = lock_for(conn, key, lifetime)
    assert isinstance(lock, pgsolo.AsyncLock)
    with pytest.raises((TypeError, AttributeError)), lock:
        pytest.fail("entered")
    # A coroutine that is never awaited sends nothing either.
    forgotten = lock.acquire()
    forgotten.close()
    assert observer.advisory(pid=pid_of(conn)) == set()
    with pytest.raises(TypeError):
        pgsolo.pool_reset(conn)  # type: ignore[arg-type]
    await assert_clean(conn, observer)
