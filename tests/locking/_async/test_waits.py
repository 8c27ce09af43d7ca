"""Bounded waits (``wait=``) on an async connection, the tests that read the same in both
flavours: a wait that times out inside the caller's transaction leaves it usable, with the
connection's own ``lock_timeout``. Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. The other wait tests are in ``tests/locking/test_waits.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    AConnect,
    assert_clean,
    insert_note,
    lock_factory,
    notes,
    pid_of,
    show_lock_timeout,
)
from pgsolo import Key, LockTimeoutError


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


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_a_statement_timeout_shorter_than_the_wait_is_a_lock_timeout(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str
) -> None:
    """Regression: a wait that the connection's own ``statement_timeout`` cut short raised
    the driver's raw ``QueryCanceled``. The caller's limit wins (it is the shorter), and
    the wait ends as any bound wait does: :class:`LockTimeoutError`, naming
    ``statement_timeout`` and its value, the driver's error as its cause, the connection
    as it was (its ``statement_timeout`` too). A cancel request is not this: Ctrl-C
    through psycopg2's ``wait_select`` stays ``QueryCanceled`` (tests/drivers/test_psycopg2.py)."""
    holder, waiter = await aconnect(), await aconnect()
    assert await pgsolo.session_lock(holder, key).acquire()
    await waiter.execute("SET statement_timeout = '300ms'")

    async def wait_for_it() -> None:
        async with lock_factory(lifetime)(waiter, key, wait=30):
            pass

    with pytest.raises(LockTimeoutError, match="statement_timeout") as raised:
        await wait_for_it()
    assert raised.value.timeout == 0.3  # the limit that ended it
    assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
    cur = await waiter.execute("SHOW statement_timeout")
    assert await cur.fetchone() == ("300ms",)
    await assert_clean(waiter, observer)
