"""session_lock on an async connection, the tests that read the same in both flavours.

An exception in the block propagates unchanged and releases, re-entrant holds are counted
(one unlock for the last release), and a connection with autocommit off is never left idle
in transaction by the lock, held, released or busy. What is asserted is what ``pg_locks``
says through the ``observer`` session. Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. The tests of one flavour only (a holder that dies,
a killed process, a release after a loss) are in ``tests/locking/test_session.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import pgsolo
from _support import IDLE, AConnect, JobFailedError, assert_clean, backend_state, pid_of
from pgsolo import Key, LockNotHeldError


async def test_exception_in_session_block_releases_and_propagates_unchanged(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn, other = await aconnect(), await aconnect()
    failure = JobFailedError("upload failed")
    lock = pgsolo.session_lock(conn, key)

    async def job() -> None:
        async with lock:
            assert lock.acquired
            assert observer.holders(key) == {pid_of(conn)}
            assert pgsolo.held_session_locks(conn) == [key]
            raise failure

    with pytest.raises(JobFailedError, match="upload failed") as raised:
        await job()
    assert raised.value is failure
    assert type(raised.value) is JobFailedError
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    assert lock.acquired is False
    await assert_clean(conn, observer)
    assert await pgsolo.session_lock(other, key).acquire() is True


async def test_reentrant_holds_are_counted(aconnect: AConnect, observer: Any, key: Key) -> None:
    conn = await aconnect()
    outer = pgsolo.session_lock(conn, key, reentrant=True)
    inner = pgsolo.session_lock(conn, key, reentrant=True)
    assert await outer.acquire() is True
    assert await inner.acquire() is True
    assert await pgsolo.session_lock(conn, key).acquire() is False  # not re-entrant: refused
    assert observer.holders(key) == {pid_of(conn)}
    assert pgsolo.held_session_locks(conn) == [key]
    await inner.release()
    assert observer.holders(key) == {pid_of(conn)}  # the outer hold remains
    assert pgsolo.held_session_locks(conn) == [key]
    await outer.release()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    with pytest.raises(LockNotHeldError):
        await outer.release()
    # Only one unlock reached the server: a further raw unlock finds nothing held.
    k1, k2 = key.value  # type: ignore[misc]
    cur = await conn.execute("SELECT pg_advisory_unlock(%s, %s)", (k1, k2))
    assert await cur.fetchone() == (False,)
    await assert_clean(conn, observer)


@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
async def test_session_lock_on_non_autocommit_connection_stays_idle(
    aconnect: AConnect, observer: Any, key: Key, wait: float | None
) -> None:
    conn = await aconnect(autocommit=False)
    pid = pid_of(conn)
    lock = pgsolo.session_lock(conn, key, wait=wait)
    assert await lock.acquire() is True
    assert conn.info.transaction_status is IDLE  # not idle in transaction
    assert backend_state(observer, pid)[0] == "idle"  # type: ignore[index]
    assert observer.holders(key) == {pid}
    assert await lock.is_held() is True
    assert conn.info.transaction_status is IDLE
    await lock.release()
    assert conn.info.transaction_status is IDLE
    assert backend_state(observer, pid)[0] == "idle"  # type: ignore[index]
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)
    # A busy try leaves it idle as well.
    other = await aconnect()
    async with pgsolo.session_lock(other, key):
        assert await pgsolo.session_lock(conn, key).acquire() is False
        assert conn.info.transaction_status is IDLE


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_acquiring_a_held_lock_again_is_refused_and_leaves_it_held(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str
) -> None:
    """Guards the hold a refusal must not touch: a second acquire() of a held Lock raised
    UsageError and, on its way out, let the first acquisition's lock go."""
    conn = await aconnect()
    lock = pgsolo.session_lock(conn, key) if lifetime == "session" else pgsolo.xact_lock(conn, key)
    async with conn.transaction() if lifetime == "xact" else _nothing():
        assert await lock.acquire()
        for again in (lock.acquire, lock.__aenter__):
            with pytest.raises(pgsolo.UsageError, match="already acquired"):
                await again()
            assert lock.acquired
            assert observer.holders(key) == {pid_of(conn)}
        if lifetime == "session":
            await lock.release()
    assert observer.holders(key) == set()


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield
