"""Connection pools (psycopg_pool, sync and async): ``pool_reset`` / ``async_pool_reset``
release a session lock leaked into the pool, without them the lock leaks, and an exhausted
pool times out instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

import pgsolo
from _support import DEADLINE, AConnect, aeventually, pid_of
from pgsolo import (
    Key,
)

# -- sync connections ----------------------------------------------------------------------


def test_pool_reset_hook_releases_leaked_session_lock(
    dsn: str, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgsolo")
    with ConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.pool_reset,
        kwargs={"autocommit": True},
        open=True,
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn:
            pid = pid_of(conn)
            assert pgsolo.session_lock(conn, key).acquire() is True  # never released
            assert observer.holders(key) == {pid}
            assert pgsolo.held_session_locks(conn) == [key]
        # The reset hook runs in a pool worker; the only connection comes back after it.
        with pool.connection(timeout=DEADLINE) as again:
            assert pid_of(again) == pid  # the same session: nothing was reconnected
            assert observer.holders(key) == set()
            assert pgsolo.held_session_locks(again) == []
            retaken = pgsolo.session_lock(again, key)
            assert retaken.acquire() is True
            retaken.release()
    warnings = [
        r for r in caplog.records if r.name == "pgsolo.locks" and key.text in r.getMessage()
    ]
    assert warnings, "the reset hook should warn about the leaked lock"
    # With its fields, as every lock event (for --log-format json): it had none.
    assert warnings[0].pgsolo == {  # type: ignore[attr-defined]
        "event": "released-at-check-in",
        "key": key.text,
        "name": key.name,
        "lifetime": "session",
    }


def test_a_late_release_of_a_lock_the_reset_let_go_never_touches_the_next_borrowers(
    dsn: str, observer: Any, key: Key
) -> None:
    """Guards mutual exclusion across borrowers of one pooled session: the reset let the
    first borrower's lock go (with a warning), the next borrower took the same key on
    the same session, and the first one's late release() unlocked it, so that a third
    session took a key the next borrower still believed it held."""
    with ConnectionPool(
        dsn, min_size=1, max_size=1, reset=pgsolo.pool_reset, kwargs={"autocommit": True}
    ) as pool:
        with pool.connection(timeout=DEADLINE) as first:
            stale = pgsolo.session_lock(first, key)
            assert stale.acquire() is True  # and never released before the check-in
        with pool.connection(timeout=DEADLINE) as second:
            assert second is first  # the same connection object, the same session
            mine = pgsolo.session_lock(second, key)
            assert mine.acquire() is True
            assert stale.is_held() is False  # its session let it go: nothing is asked
            with pytest.raises(pgsolo.LockNotHeldError, match="went back to its pool"):
                stale.release()
            assert observer.holders(key) == {pid_of(second)}
            mine.release()
    assert observer.holders(key) == set()


def test_the_late_end_of_a_transaction_lock_the_reset_rolled_back_commits_nothing_of_anyones(
    dsn: str, observer: Any, key: Key
) -> None:
    """Guards the next borrower's transaction: the block of a transaction lock left open
    across the check-in ended later, and its COMMIT ended the next borrower's
    transaction, which held the connection then."""
    with ConnectionPool(
        dsn, min_size=1, max_size=1, reset=pgsolo.pool_reset, kwargs={"autocommit": True}
    ) as pool:
        with pool.connection(timeout=DEADLINE) as first:
            stale = pgsolo.xact_lock(first, key)
            stale.__enter__()  # a block left open as the connection goes back
        with pool.connection(timeout=DEADLINE) as second, second.transaction():
            second.execute("CREATE TEMP TABLE pgsolo_borrower (n int)")
            with pytest.raises(pgsolo.LockLostError, match="nothing of the block committed"):
                stale.__exit__(None, None, None)
            assert second.info.transaction_status is pq.TransactionStatus.INTRANS
            assert observer.holders(key) == set()
            stale.__exit__(RuntimeError, RuntimeError("the block failed"), None)  # quietly


def test_pool_without_reset_hook_leaks_session_lock(dsn: str, observer: Any, key: Key) -> None:
    with ConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn:
            pid = pid_of(conn)
            assert pgsolo.session_lock(conn, key).acquire() is True
        with pool.connection(timeout=DEADLINE) as again:
            assert pid_of(again) == pid
            # Leaked: the observer still sees the returned connection holding it.
            assert observer.holders(key) == {pid}
            assert pgsolo.held_session_locks(again) == [key]
            again.execute("SELECT pg_advisory_unlock_all()")
    assert observer.holders(key) == set()


def test_pool_exhaustion_times_out_instead_of_hanging(dsn: str, observer: Any, key: Key) -> None:
    with ConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.pool_reset,
        kwargs={"autocommit": True},
        open=True,
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn, pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            started = time.monotonic()
            with pytest.raises(PoolTimeout):
                pool.connection(timeout=0.5).__enter__()
            assert time.monotonic() - started < DEADLINE
            assert observer.holders(key) == {pid_of(conn)}
        assert observer.holders(key) == set()


# -- async connections ---------------------------------------------------------------------


async def test_async_pool_reset_releases_a_leaked_session_lock(
    dsn: str, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    pool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.async_pool_reset,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open()
    try:
        with caplog.at_level(logging.WARNING, logger="pgsolo"):
            async with pool.connection() as conn:
                pid = pid_of(conn)
                # The plain call, never released: the bug the article warns about.
                assert await pgsolo.session_lock(conn, key).acquire() is True
                assert observer.holders(key) == {pid}
            # The pool resets in a worker; with one connection, getting it back means
            # the reset has run.
            async with pool.connection(timeout=DEADLINE) as again:
                assert pid_of(again) == pid  # the same session: nothing was reconnected
                assert observer.holders(key) == set()
                assert observer.advisory(pid=pid) == set()
                assert pgsolo.held_session_locks(again) == []
                assert again.info.transaction_status is pq.TransactionStatus.IDLE
                assert await pgsolo.session_lock(again, key).acquire() is True
        assert "still held when its connection went back to the pool" in caplog.text
        assert key.text in caplog.text
        async with pool.connection(timeout=DEADLINE):
            assert observer.holders(key) == set()
    finally:
        await pool.close()


async def test_async_pool_without_reset_leaks_the_session_lock(
    dsn: str, aconnect: AConnect, observer: Any, key: Key
) -> None:
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)
    await pool.open()
    try:
        async with pool.connection() as conn:
            pid = pid_of(conn)
            assert await pgsolo.session_lock(conn, key).acquire() is True
        async with pool.connection(timeout=DEADLINE) as again:
            assert pid_of(again) == pid
            assert observer.holders(key) == {pid}  # leaked: "the lock always returns false"
            other = await aconnect()
            assert await pgsolo.session_lock(other, key).acquire() is False
            # pgsolo still knows this connection object holds it, so a new try refuses too.
            assert pgsolo.held_session_locks(again) == [key]
            assert await pgsolo.session_lock(again, key).acquire() is False
    finally:
        await pool.close()
    await aeventually(lambda: observer.holders(key) == set(), "closing the pool ends the leak")


async def test_async_pool_exhaustion_is_a_bounded_pool_timeout(
    dsn: str, observer: Any, key: Key
) -> None:
    pool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.async_pool_reset,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open()
    try:
        async with pool.connection() as busy, pgsolo.session_lock(busy, key) as lock:
            assert lock.acquired
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(PoolTimeout):
                async with pool.connection(timeout=0.5):
                    pytest.fail("a pool of one handed out its only, busy connection")
            assert loop.time() - started < DEADLINE
            assert observer.holders(key) == {pid_of(busy)}
        async with pool.connection(timeout=DEADLINE) as conn:
            assert observer.holders(key) == set()
            assert await pgsolo.session_lock(conn, key).acquire() is True
    finally:
        await pool.close()
