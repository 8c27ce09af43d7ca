"""Bounded waits (``wait=``) on an async connection, the tests that read the same in both
flavours: a wait that times out inside the caller's transaction leaves it usable, with the
connection's own ``lock_timeout``; a long wait, cut into slices, never holds a snapshot or
a transaction older than about one slice, and still gets the lock, or times out, when it
should. Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. The other wait tests are in ``tests/locking/test_waits.py``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    DEADLINE,
    HOLD,
    SLICE_BOUND,
    AConnect,
    Connect,
    SnapshotWatch,
    ainterrupted,
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


@pytest.mark.parametrize("place", ["own", "callers"], ids=["own-transaction", "in-callers"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_long_wait_never_holds_an_old_snapshot_and_gets_the_lock(
    aconnect: AConnect,
    sync_connect: Connect,
    observer: Any,
    key: Key,
    short_slices: float,
    lifetime: str,
    place: str,
) -> None:
    """Guards issue 22 (waits hold back VACUUM): a wait is cut into slices, so however long
    it waits its backend never holds a snapshot (backend_xmin), nor a transaction of
    pgsolo's (xact_start), older than about one slice; in the caller's transaction each
    slice is a savepoint (the transaction is the caller's). It still gets the lock when
    the holder lets go, with the connection's lock_timeout as it was and nothing left.
    One statement for the whole wait held both for as long as it waited."""
    waiter = await aconnect()
    await waiter.execute("SET lock_timeout = '7s'")
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire() is True
    letting_go = threading.Timer(HOLD, holder.release)
    started = time.monotonic()
    with SnapshotWatch(sync_connect(), pid_of(waiter)) as watch:
        letting_go.start()
        try:
            if place == "callers":
                async with waiter.transaction():
                    lock = lock_factory(lifetime)(waiter, key, wait=30)
                    assert await lock.acquire() is True
                    waited = time.monotonic() - started
                    assert observer.holders(key) == {pid_of(waiter)}
                    if lifetime == "session":
                        await lock.release()
            else:
                async with lock_factory(lifetime)(waiter, key, wait=30) as lock:
                    waited = time.monotonic() - started
                    assert observer.holders(key) == {pid_of(waiter)}
        finally:
            letting_go.join(DEADLINE)
    assert waited > HOLD * 0.9
    assert watch.saw_lock_wait
    assert watch.oldest_snapshot < SLICE_BOUND, f"a snapshot {watch.oldest_snapshot:.2f}s old"
    if place == "own":
        assert watch.oldest_transaction < SLICE_BOUND, (
            f"a transaction {watch.oldest_transaction:.2f}s old"
        )
    assert await show_lock_timeout(waiter) == "7s"
    await assert_clean(waiter, observer)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_of_many_slices_times_out_on_time(
    aconnect: AConnect,
    sync_connect: Connect,
    observer: Any,
    key: Key,
    short_slices: float,
    lifetime: str,
) -> None:
    """A wait longer than several slices still ends when ``wait=`` says, with the same
    LockTimeoutError as one statement's lock_timeout gave, and nothing left: no lock, no
    place in the queue, the connection's own lock_timeout."""
    waiter = await aconnect()
    await waiter.execute("SET lock_timeout = '7s'")
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire() is True

    async def attempt() -> None:
        async with lock_factory(lifetime)(waiter, key, wait=1.2):
            pytest.fail("the block must not run without the lock")

    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as raised:
        await attempt()
    took = time.monotonic() - started
    assert 1.2 * 0.95 < took < 1.2 + SLICE_BOUND
    assert raised.value.timeout == pytest.approx(1.2)
    assert "timed out after 1.2s" in str(raised.value)
    assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert await show_lock_timeout(waiter) == "7s"
    assert observer.waiters(key) == set()
    holder.release()
    await assert_clean(waiter, observer)


@pytest.mark.parametrize("place", ["own", "callers"], ids=["own-transaction", "in-callers"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_interrupted_after_several_slices_leaves_nothing(
    aconnect: AConnect,
    sync_connect: Connect,
    observer: Any,
    key: Key,
    table: str,
    short_slices: float,
    lifetime: str,
    place: str,
) -> None:
    """A wait interrupted after several slices (its task cancelled; a real SIGINT in the
    sync twin) leaves nothing behind: no lock, no place in the queue, no transaction of
    pgsolo's, the connection's own lock_timeout, and the caller's transaction usable."""
    waiter = await aconnect()
    await waiter.execute("SET lock_timeout = '7s'")
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire() is True
    pid = pid_of(waiter)
    started = time.monotonic()

    def several_slices_in() -> bool:
        return time.monotonic() - started > 2.5 * short_slices and pid in observer.waiters(key)

    async def wait() -> None:
        lock = lock_factory(lifetime)(waiter, key, wait=30)
        if place == "callers":
            await lock.acquire()
            return
        async with lock:
            pytest.fail("the block must not run without the lock")

    if place == "callers":
        async with waiter.transaction():
            await insert_note(waiter, table, "before the wait")
            outcome = await ainterrupted(wait, several_slices_in)
            assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
            await insert_note(waiter, table, "after the wait")
        assert notes(observer, table) == ["after the wait", "before the wait"]
    else:
        outcome = await ainterrupted(wait, several_slices_in)
    assert type(outcome).__name__ in ("CancelledError", "KeyboardInterrupt"), repr(outcome)
    assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert observer.waiters(key) == set()
    assert observer.advisory(pid=pid) == set()
    assert await show_lock_timeout(waiter) == "7s"
    holder.release()
    await assert_clean(waiter, observer)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_forever_waits_for_as_long_as_the_holder_holds(
    aconnect: AConnect,
    sync_connect: Connect,
    observer: Any,
    key: Key,
    short_slices: float,
    lifetime: str,
) -> None:
    """``wait=math.inf`` is a wait with no end (a standby that takes over when the holder
    dies): slice after slice until the holder lets go, never an old snapshot."""
    waiter = await aconnect()
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire() is True
    letting_go = threading.Timer(HOLD, holder.release)
    with SnapshotWatch(sync_connect(), pid_of(waiter)) as watch:
        letting_go.start()
        try:
            async with lock_factory(lifetime)(waiter, key, wait=math.inf) as lock:
                assert lock.acquired is True
                assert observer.holders(key) == {pid_of(waiter)}
        finally:
            letting_go.join(DEADLINE)
    assert watch.oldest_snapshot < SLICE_BOUND


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
