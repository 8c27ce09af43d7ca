"""Bounded waits (``wait=``): the timeout error, a wait that succeeds when the holder lets
go, and the connection's own ``lock_timeout``, which a wait never changes, inside or
outside the caller's transaction. A wait that times out inside the caller's transaction,
alike in both flavours, is written once, async, in ``_async/test_waits.py``;
scripts/unasync.py generates ``_sync/test_waits.py``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    HOLD,
    IDLE,
    INTRANS,
    SLICE_BOUND,
    AConnect,
    Connect,
    SnapshotWatch,
    assert_clean,
    eventually,
    hold,
    hold_session_lock,
    lock_factory,
    lock_for,
    new_job,
    pgsolo_in_background,
    pid_of,
    show_lock_timeout,
    unhold,
)
from pgsolo import (
    Key,
    LockTimeoutError,
)

# -- sync connections ----------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_wait_times_out_with_key_and_timeout_and_keeps_lock_timeout(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    holder, waiter = connect(), connect()
    assert pgsolo.session_lock(holder, key).acquire() is True
    waiter.execute("SET lock_timeout = '7s'")

    def attempt() -> None:
        if lifetime == "session":
            pgsolo.session_lock(waiter, key, wait=0.3).acquire()
        else:
            with pgsolo.xact_lock(waiter, key, wait=0.3):
                pytest.fail("the block must not run without the lock")

    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as raised:
        attempt()
    assert time.monotonic() - started < DEADLINE
    error = raised.value
    assert error.timeout == 0.3
    assert error.key == key
    assert key.text in str(error)
    assert "0.3s" in str(error)
    assert isinstance(error, TimeoutError)
    assert show_lock_timeout(waiter) == "7s"
    assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert observer.advisory(pid=pid_of(waiter)) == set()
    assert observer.waiters(key) == set()
    assert pgsolo.held_session_locks(waiter) == []


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_wait_succeeds_when_holder_releases_midway(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    holder, waiter = connect(), connect()
    holding = pgsolo.session_lock(holder, key)
    assert holding.acquire() is True
    waiter.execute("SET lock_timeout = '7s'")
    waiter_pid = pid_of(waiter)
    saw_waiting = threading.Event()

    def release_once_waiting() -> None:
        eventually(lambda: waiter_pid in observer.waiters(key), "the waiter to wait")
        saw_waiting.set()
        holding.release()

    releaser = threading.Thread(target=release_once_waiting, daemon=True)
    releaser.start()
    try:
        if lifetime == "session":
            lock = pgsolo.session_lock(waiter, key, wait=10)
            assert lock.acquire() is True
            releaser.join(DEADLINE)
            assert observer.holders(key) == {waiter_pid}
            lock.release()
        else:
            with pgsolo.xact_lock(waiter, key, wait=10) as lock:
                assert lock.acquired is True
                releaser.join(DEADLINE)
                assert observer.holders(key) == {waiter_pid}
    finally:
        releaser.join(DEADLINE)
    assert saw_waiting.is_set()
    assert observer.holders(key) == set()
    assert show_lock_timeout(waiter) == "7s"


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_successful_wait_inside_callers_transaction_keeps_its_lock_timeout(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    """The caller's later statements must not run under pgsolo's wait as lock_timeout."""
    conn = connect()
    before = show_lock_timeout(conn)
    assert before != "7s"
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '7s'")
        lock = lock_factory(lifetime)(conn, key, wait=0.5)
        assert lock.acquire() is True
        assert show_lock_timeout(conn) == "7s"
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(key) == {pid_of(conn)}
        # A pgsolo context joining the caller's transaction behaves the same.
        other_key = Key((key.value[0], key.value[1] + 500_000))  # type: ignore[index]
        with lock_factory(lifetime)(conn, other_key, wait=0.5) as inner:
            assert inner.acquired
            assert show_lock_timeout(conn) == "7s"
        assert show_lock_timeout(conn) == "7s"
    assert show_lock_timeout(conn) == before  # the SET LOCAL ended with the transaction
    if lifetime == "session":
        assert observer.holders(key) == {pid_of(conn)}  # a session lock outlives it
        lock.release()
    assert observer.holders(key) == set()
    assert observer.holders(other_key) == set()


@pytest.mark.parametrize("autocommit", [True, False])
def test_protected_block_runs_with_the_connections_own_lock_timeout(
    connect: Connect, observer: Any, key: Key, autocommit: bool
) -> None:
    """The wait's bound applies to the wait, not to the statements protected by it."""
    conn = connect(autocommit=autocommit)
    conn.execute("SET lock_timeout = '7s'")
    if not autocommit:
        conn.commit()
    with pgsolo.xact_lock(conn, key, wait=0.5) as lock:
        assert lock.acquired
        assert observer.holders(key) == {pid_of(conn)}
        assert show_lock_timeout(conn) == "7s"
    assert show_lock_timeout(conn) == "7s"
    if not autocommit:  # the lock joined the caller's implicit transaction, open still
        assert observer.holders(key) == {pid_of(conn)}
        conn.commit()
    assert observer.holders(key) == set()


def test_plain_xact_wait_timeout_on_non_autocommit_idle_connection_keeps_it_usable(
    connect: Connect, observer: Any, key: Key
) -> None:
    """psycopg begins the transaction implicitly: it is the caller's, and a timeout must
    not leave it aborted."""
    holder = connect()
    assert pgsolo.session_lock(holder, key).acquire() is True
    conn = connect(autocommit=False, options="-c lock_timeout=7s")
    assert conn.info.transaction_status is IDLE
    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as raised:
        pgsolo.xact_lock(conn, key, wait=0.3).acquire()
    assert time.monotonic() - started < DEADLINE
    assert raised.value.key == key
    assert raised.value.timeout == pytest.approx(0.3)
    assert conn.info.transaction_status is INTRANS  # not INERROR
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert show_lock_timeout(conn) == "7s"
    assert observer.advisory(pid=pid_of(conn)) == set()
    conn.rollback()
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == {pid_of(holder)}


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_run_job_long_wait_never_holds_an_old_snapshot(
    connect: Connect, observer: Any, short_slices: float, lifetime: str
) -> None:
    """Guards issue 22 for jobs: run_job(wait=) waits in slices like any lock (in a
    transaction of its own per slice, for lifetime="xact"), so its backend never holds a
    snapshot or a transaction older than about one slice, and it runs the job once the
    holder lets go, leaving nothing held."""
    job = new_job("long-wait")
    holder = hold(connect, job)
    conn = connect()
    conn.execute("SET lock_timeout = '7s'")
    ran: list[float] = []
    letting_go = threading.Timer(HOLD, unhold, (holder, job))
    started = time.monotonic()
    with SnapshotWatch(connect(), pid_of(conn)) as watch:
        letting_go.start()
        try:
            result = pgsolo.run_job(
                conn, job, lambda c: ran.append(time.monotonic()), wait=30, lifetime=lifetime
            )
        finally:
            letting_go.join(DEADLINE)
    assert result.completed
    assert len(ran) == 1
    assert ran[0] - started > HOLD * 0.9
    assert watch.saw_lock_wait
    assert watch.oldest_snapshot < SLICE_BOUND, f"a snapshot {watch.oldest_snapshot:.2f}s old"
    assert watch.oldest_transaction < SLICE_BOUND, (
        f"a transaction {watch.oldest_transaction:.2f}s old"
    )
    assert show_lock_timeout(conn) == "7s"
    assert observer.advisory(pid=pid_of(conn)) == set()
    assert conn.info.transaction_status is IDLE


def test_pgsolo_run_long_wait_never_holds_an_old_snapshot(
    dsn: str, connect: Connect, observer: Any
) -> None:
    """Guards issue 22 on the command line: ``pgsolo run --wait`` waits in pgsolo's own
    2 s slices, so a run that waits longer than two of them never shows a snapshot or a
    transaction older than about one, then runs COMMAND when the holder lets go. One
    statement for the whole wait held both for as long as it waited."""
    job = new_job("cli-long-wait")
    holder = hold(connect, job)
    held_for = 5.5  # more than two slices of 2 s
    with pgsolo_in_background(
        "run", "--key", job, "--wait", "60", "--dsn", dsn, "--", sys.executable, "-c", "pass"
    ) as run:  # fmt: skip
        pid = eventually(
            lambda: observer.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                (f"pgsolo:{job}",),
            ).fetchone(),
            "pgsolo run to connect",
        )[0]
        with SnapshotWatch(connect(), pid) as watch:
            time.sleep(held_for)
            unhold(holder, job)
            _, stderr = run.communicate(timeout=DEADLINE)
    assert run.returncode == 0, stderr
    assert watch.saw_lock_wait
    assert watch.oldest_snapshot < 3.0, f"a snapshot {watch.oldest_snapshot:.2f}s old"
    assert watch.oldest_transaction < 3.0, f"a transaction {watch.oldest_transaction:.2f}s old"


# -- async connections ---------------------------------------------------------------------


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_timeout_raises_and_keeps_lock_timeout(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    await conn.execute("SET lock_timeout = '7s'")
    if not autocommit:
        await conn.commit()
    holder = await hold_session_lock(holder_conn, key)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(pgsolo.LockTimeoutError) as caught:
        async with lock_for(conn, key, lifetime, wait=0.3):
            pytest.fail("entered a block whose lock is held elsewhere")
    assert loop.time() - started < DEADLINE
    assert caught.value.key == key
    assert caught.value.timeout == pytest.approx(0.3)
    assert "0.3s" in str(caught.value)
    # A transaction lock with autocommit off waited in the caller's implicit transaction,
    # which stays open and usable (the wait's savepoint was undone).
    joined = lifetime == "xact" and not autocommit
    assert conn.info.transaction_status is (
        pq.TransactionStatus.INTRANS if joined else pq.TransactionStatus.IDLE
    )
    cur = await conn.execute("SHOW lock_timeout")
    assert await cur.fetchone() == ("7s",)
    if not autocommit:
        await conn.rollback()
    assert observer.waiters(key) == set()
    await holder.release()
    await assert_clean(conn, observer)
