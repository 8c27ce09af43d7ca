"""Bad keys, waits and options are refused before any SQL, and a lock of one flavour used
the other's way (``async with`` on a sync lock, ``with`` on an async one) acquires nothing.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import AConnect, Connect, assert_clean, backend_state, lock_factory, lock_for, pid_of
from pgsolo import (
    InvalidKeyError,
    Key,
    UsageError,
)

# -- sync connections ----------------------------------------------------------------------

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
