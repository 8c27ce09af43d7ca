"""The async twins of tests/test_locks.py: AsyncConnection, ``async with``, async pools.

Every test runs against a real PostgreSQL and checks what the server says (``pg_locks``
through the ``observer`` fixture), never only what pgsolo says about itself. Concurrency
is real: several connections (one per task) interleaved on one event loop, and
cancellation delivered with ``task.cancel()`` / ``asyncio.timeout()`` while the server
really has the backend waiting in ``pg_locks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import pgsolo
from pgsolo import Key

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]

BOUND = 10.0  # seconds: an upper bound for things that should take milliseconds


# -- helpers -----------------------------------------------------------------------------


def pid_of(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> int:
    return conn.info.backend_pid


async def wait_until_waiting(observer: Any, key: Key, pid: int, task: asyncio.Task[Any]) -> None:
    """Poll pg_locks until backend ``pid`` is really queued on ``key`` (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while pid not in observer.waiters(key):
        if task.done():
            task.result()  # surface the task's own failure
            pytest.fail(f"the task finished before backend {pid} waited for {key}")
        assert loop.time() < deadline, f"backend {pid} never started waiting for {key}"
        await asyncio.sleep(0.005)


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


async def finish(task: asyncio.Task[Any]) -> None:
    """Wait (bounded) for ``task`` to end, whatever its outcome."""
    done, _ = await asyncio.wait({task}, timeout=BOUND)
    assert task in done, "the task did not finish after it was cancelled"


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


# -- 1. the article's two-session scenario ----------------------------------------------


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


# -- 2. rollback and exceptions ------------------------------------------------------------


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


async def test_session_block_exception_propagates_unchanged_and_releases(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    error = ValueError("boom")
    lock = pgsolo.session_lock(conn, key)

    async def job() -> None:
        async with lock:
            assert lock.acquired
            assert observer.holders(key) == {pid_of(conn)}
            assert pgsolo.held_session_locks(conn) == [key]
            raise error

    with pytest.raises(ValueError, match="boom") as caught:
        await job()
    assert caught.value is error
    assert lock.acquired is False
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_session_block_error_wins_over_lost_lock(
    aconnect: AConnect, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    conn = await aconnect()
    error = ValueError("the job's own error")

    async def job() -> None:
        async with pgsolo.session_lock(conn, key):
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid_of(conn),))
            raise error

    with (
        caplog.at_level(logging.WARNING, logger="pgsolo"),
        pytest.raises(ValueError, match="own error") as caught,
    ):
        await job()
    assert caught.value is error
    assert "releasing" in caplog.text
    await wait_until(lambda: observer.holders(key) == set(), "the killed session's lock is gone")


# -- 3. a killed holder ----------------------------------------------------------------------


async def test_terminated_session_holder_loses_lock_to_another_session(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    holder, other = await aconnect(), await aconnect()
    lock = pgsolo.session_lock(holder, key)
    assert await lock.acquire() is True
    assert observer.holders(key) == {pid_of(holder)}
    assert await pgsolo.session_lock(other, key).acquire() is False

    kill = observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid_of(holder),))
    assert kill.fetchone() == (True,)
    taker = pgsolo.session_lock(other, key, wait=BOUND)
    assert await taker.acquire() is True  # granted once the killed backend has gone
    assert observer.holders(key) == {pid_of(other)}

    with pytest.raises(pgsolo.LockLostError) as caught:
        await lock.release()
    assert caught.value.key == key
    assert lock.acquired is False
    assert pgsolo.held_session_locks(holder) == []
    assert observer.holders(key) == {pid_of(other)}  # the survivor is untouched
    await taker.release()
    await assert_clean(other, observer)


async def test_terminated_holder_block_exit_raises_lock_lost(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    with pytest.raises(pgsolo.LockLostError) as caught:
        async with pgsolo.session_lock(conn, key):
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid_of(conn),))
    assert caught.value.key == key
    await wait_until(lambda: observer.holders(key) == set(), "the killed session's lock is gone")


_CHILD_HOLDER = """
import asyncio, sys
import psycopg, pgsolo

async def main():
    conn = await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True)
    lock = pgsolo.session_lock(conn, (int(sys.argv[2]), int(sys.argv[3])))
    if await lock.acquire():
        print(conn.info.backend_pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_killed_client_process_releases_its_lock(
    dsn: str, aconnect: AConnect, observer: Any, key: Key
) -> None:
    """The article's "abrupt client disconnect": SIGKILL the process holding the lock."""
    assert isinstance(key.value, tuple)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD_HOLDER,
        dsn,
        *map(str, key.value),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), BOUND)
        child_pid = int(line)
        assert observer.holders(key) == {child_pid}
        other = await aconnect()
        assert await pgsolo.session_lock(other, key).acquire() is False
        child.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(child.wait(), BOUND) == -signal.SIGKILL
        # The server notices the dead socket and ends the session: the lock goes with it.
        taker = pgsolo.session_lock(other, key, wait=BOUND)
        assert await taker.acquire() is True
        assert observer.holders(key) == {pid_of(other)}
        await taker.release()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_release_after_the_connection_was_closed_is_lock_lost(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    lock = pgsolo.session_lock(conn, key)
    assert await lock.acquire() is True
    await conn.close()
    with pytest.raises(pgsolo.LockLostError) as caught:
        await lock.release()
    assert caught.value.key == key
    assert lock.acquired is False
    await wait_until(lambda: observer.holders(key) == set(), "the closed session's lock is gone")


# -- 4. async pools ---------------------------------------------------------------------------


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
            async with pool.connection(timeout=BOUND) as again:
                assert pid_of(again) == pid  # the same session: nothing was reconnected
                assert observer.holders(key) == set()
                assert observer.advisory(pid=pid) == set()
                assert pgsolo.held_session_locks(again) == []
                assert again.info.transaction_status is pq.TransactionStatus.IDLE
                assert await pgsolo.session_lock(again, key).acquire() is True
        assert "still held when its connection went back to the pool" in caplog.text
        assert key.text in caplog.text
        async with pool.connection(timeout=BOUND):
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
        async with pool.connection(timeout=BOUND) as again:
            assert pid_of(again) == pid
            assert observer.holders(key) == {pid}  # leaked: "the lock always returns false"
            other = await aconnect()
            assert await pgsolo.session_lock(other, key).acquire() is False
            # pgsolo still knows this connection object holds it, so a new try refuses too.
            assert pgsolo.held_session_locks(again) == [key]
            assert await pgsolo.session_lock(again, key).acquire() is False
    finally:
        await pool.close()
    await wait_until(lambda: observer.holders(key) == set(), "closing the pool ends the leak")


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
            assert loop.time() - started < BOUND
            assert observer.holders(key) == {pid_of(busy)}
        async with pool.connection(timeout=BOUND) as conn:
            assert observer.holders(key) == set()
            assert await pgsolo.session_lock(conn, key).acquire() is True
    finally:
        await pool.close()


# -- 5. many tasks racing, one connection each --------------------------------------------

TASKS = 20


@pytest.mark.parametrize(
    ("lifetime", "wait", "rounds"),
    [
        ("xact", None, 6),
        ("session", None, 6),
        ("xact", 30, 2),
        ("session", 30, 2),
    ],
    ids=["xact-try", "session-try", "xact-wait", "session-wait"],
)
async def test_many_tasks_never_two_inside(
    aconnect: AConnect,
    observer: Any,
    key: Key,
    lifetime: str,
    wait: float | None,
    rounds: int,
) -> None:
    conns = await asyncio.gather(*(aconnect() for _ in range(TASKS)))
    start = asyncio.Barrier(TASKS)
    inside = 0
    most_inside = 0
    entries: Counter[int] = Counter()
    wrong_holders: list[set[int]] = []

    async def worker(i: int, conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal inside, most_inside
        await start.wait()
        for _ in range(rounds):
            async with lock_for(conn, key, lifetime, wait=wait) as lock:
                if not lock.acquired:
                    continue
                inside += 1
                try:
                    most_inside = max(most_inside, inside)
                    if (holders := observer.holders(key)) != {pid_of(conn)}:
                        wrong_holders.append(holders)
                    await asyncio.sleep(0.002)  # let every other task run meanwhile
                    entries[i] += 1
                finally:
                    inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(i, c) for i, c in enumerate(conns))), timeout=60)
    assert most_inside == 1
    assert wrong_holders == []
    assert sum(entries.values()) >= 1
    if wait is not None:
        assert sum(entries.values()) == TASKS * rounds  # every waiter got its turn
    assert observer.holders(key) == set()
    for conn in conns:
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        assert pgsolo.held_session_locks(conn) == []


# -- 6. tasks sharing one connection -----------------------------------------------------


async def test_tasks_sharing_one_connection_try_and_wait(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    first, second = pgsolo.session_lock(conn, key), pgsolo.session_lock(conn, key)
    # Both start together; PostgreSQL would grant the key twice to one session.
    results = await asyncio.gather(first.acquire(), second.acquire())
    assert results == [True, False]
    assert observer.holders(key) == {pid_of(conn)}

    with pytest.raises(pgsolo.LockUnavailableError) as caught:
        await asyncio.wait_for(pgsolo.session_lock(conn, key, wait=30).acquire(), BOUND)
    assert not isinstance(caught.value, pgsolo.LockTimeoutError)
    assert caught.value.key == key
    assert "already held on this connection" in str(caught.value)

    await first.release()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_tasks_sharing_one_connection_concurrent_blocks(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    inside: list[int] = []

    async def job(i: int) -> None:
        async with pgsolo.session_lock(conn, key, wait=30):
            inside.append(i)
            await asyncio.sleep(0.05)
            assert observer.holders(key) == {pid_of(conn)}

    outcomes = await asyncio.wait_for(asyncio.gather(job(1), job(2), return_exceptions=True), BOUND)
    assert len(inside) == 1
    errors = [o for o in outcomes if o is not None]
    assert len(errors) == 1
    assert isinstance(errors[0], pgsolo.LockUnavailableError)
    await assert_clean(conn, observer)


@pytest.mark.parametrize("wait", [None, 5], ids=["try", "wait"])
async def test_tasks_sharing_one_connection_xact_blocks_exclude_each_other(
    aconnect: AConnect, observer: Any, key: Key, wait: float | None
) -> None:
    conn = await aconnect()
    inside = 0
    most_inside = 0

    async def job() -> None:
        nonlocal inside, most_inside
        with contextlib.suppress(pgsolo.LockUnavailableError):
            async with pgsolo.xact_lock(conn, key, wait=wait) as lock:
                if lock.acquired:
                    inside += 1
                    most_inside = max(most_inside, inside)
                    await asyncio.sleep(0.05)
                    inside -= 1

    await asyncio.wait_for(asyncio.gather(job(), job()), BOUND)
    assert most_inside == 1


async def test_reentrant_holds_are_counted(aconnect: AConnect, observer: Any, key: Key) -> None:
    conn = await aconnect()
    pid = pid_of(conn)
    outer = pgsolo.session_lock(conn, key, reentrant=True)
    inner = pgsolo.session_lock(conn, key, reentrant=True)
    assert await outer.acquire() is True
    assert await inner.acquire() is True
    assert await pgsolo.session_lock(conn, key).acquire() is False  # not re-entrant: refused
    assert pgsolo.held_session_locks(conn) == [key]

    await inner.release()
    assert observer.holders(key) == {pid}  # one hold remains: no unlock sent yet
    assert pgsolo.held_session_locks(conn) == [key]
    await outer.release()
    assert observer.holders(key) == set()
    with pytest.raises(pgsolo.LockNotHeldError):
        await outer.release()
    await assert_clean(conn, observer)


async def test_reentrant_needs_the_first_acquisition_to_have_completed(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    first = pgsolo.session_lock(conn, key, reentrant=True)
    second = pgsolo.session_lock(conn, key, reentrant=True)
    # The second starts while the first is still on its way to the server.
    assert await asyncio.gather(first.acquire(), second.acquire()) == [True, False]
    assert observer.holders(key) == {pid_of(conn)}
    await first.release()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_cancelling_a_lock_queued_behind_another_task_spares_its_statement(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """One connection, two tasks: the lock call is queued behind the other task's
    statement when it is cancelled. Only the lock call may fail; the other task's
    statement must not be cancelled on the server in its place."""
    conn = await aconnect()
    for lifetime in ("session", "xact"):
        lock = lock_for(conn, key, lifetime, wait=30)
        # Run in this order: the lock call checks the connection (idle) and sends its
        # round trip on its way; the other task's statement gets the connection first.
        locker = asyncio.create_task(lock.__aenter__())
        other = asyncio.create_task(conn.execute("SELECT pg_sleep(0.3), 'other'"))
        await asyncio.sleep(0.05)  # the other task's statement now runs on the server
        locker.cancel()
        await finish(locker)
        if not locker.cancelled():  # the lock call won the connection and finished first
            assert locker.result() is lock
            await lock.__aexit__(None, None, None)
        done, _ = await asyncio.wait({other}, timeout=BOUND)
        assert other in done
        cur = other.result()  # not QueryCanceled: its statement ran to the end
        assert await cur.fetchone() == ("", "other")
        assert observer.holders(key) == set()
        await assert_clean(conn, observer)


# -- 7. cancellation -----------------------------------------------------------------------


async def _hold(conn: psycopg.AsyncConnection[Any], key: Key) -> pgsolo.AsyncLock:
    lock = pgsolo.session_lock(conn, key)
    assert await lock.acquire() is True
    return lock


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_cancelled_wait_leaves_nothing_behind(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    pid = pid_of(conn)
    holder = await _hold(holder_conn, key)
    entered = asyncio.Event()

    async def waiter() -> None:
        async with lock_for(conn, key, lifetime, wait=30):
            entered.set()

    task = asyncio.create_task(waiter())
    await wait_until_waiting(observer, key, pid, task)
    task.cancel()
    await finish(task)
    assert task.cancelled()  # CancelledError propagated out of the block
    assert not entered.is_set()
    # The server-side wait was cancelled, not left running behind the client's back.
    assert observer.waiters(key) == set()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE

    await holder.release()
    assert observer.holders(key) == set()  # the abandoned wait was not granted later
    await assert_clean(conn, observer)
    # And the connection can take the lock normally now.
    async with lock_for(conn, key, lifetime, wait=BOUND) as lock:
        assert lock.acquired
        assert observer.holders(key) == {pid}
    await assert_clean(conn, observer)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_asyncio_timeout_around_a_wait(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    holder = await _hold(holder_conn, key)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError) as caught:
        async with asyncio.timeout(0.3), lock_for(conn, key, lifetime, wait=30):
            pytest.fail("entered a block whose lock is held elsewhere")
    assert not isinstance(caught.value, pgsolo.LockTimeoutError)  # asyncio's, not the server's
    assert loop.time() - started < BOUND
    assert observer.waiters(key) == set()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    await holder.release()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_cancelled_wait_inside_callers_transaction_keeps_it_usable(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str
) -> None:
    holder_conn, conn = await aconnect(), await aconnect()
    pid = pid_of(conn)
    holder = await _hold(holder_conn, key)
    seen: dict[str, Any] = {}

    async def waiter() -> None:
        async with conn.transaction():
            await conn.execute("SET LOCAL application_name = 'inside-callers-tx'")
            try:
                await lock_for(conn, key, lifetime, wait=30).acquire()
            except asyncio.CancelledError:
                seen["status"] = conn.info.transaction_status
                cur = await conn.execute("SELECT current_setting('application_name')")
                seen["setting"] = await cur.fetchone()
                raise

    task = asyncio.create_task(waiter())
    await wait_until_waiting(observer, key, pid, task)
    task.cancel()
    await finish(task)
    assert task.cancelled()
    assert seen["status"] is pq.TransactionStatus.INTRANS  # not aborted: savepoint undone
    assert seen["setting"] == ("inside-callers-tx",)
    await holder.release()
    await assert_clean(conn, observer)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_cancel_racing_the_release_never_leaves_a_lock(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    """The holder lets go at about the moment the waiter is cancelled: whichever wins,
    the waiter must end up holding nothing, with an IDLE, usable connection."""
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    pid = pid_of(conn)
    rng = random.Random(f"{lifetime}-{autocommit}")
    outcomes: Counter[str] = Counter()

    for i in range(12):
        holder = await _hold(holder_conn, key)
        entered = asyncio.Event()

        async def waiter(event: asyncio.Event = entered) -> None:
            async with lock_for(conn, key, lifetime, wait=30):
                event.set()
                await asyncio.sleep(0)

        task = asyncio.create_task(waiter())
        await wait_until_waiting(observer, key, pid, task)
        cancel_first = i % 2 == 1
        if cancel_first:
            task.cancel()
        await asyncio.sleep(rng.uniform(0, 0.003))
        release = asyncio.create_task(holder.release())
        if not cancel_first:
            await asyncio.sleep(rng.uniform(0, 0.003))
            task.cancel()
        await finish(task)
        await asyncio.wait_for(release, BOUND)
        if cancel_first:
            assert task.cancelled(), "a cancel requested before the grant must win"
        else:
            assert task.cancelled() or task.exception() is None
        outcomes["cancelled" if task.cancelled() else "completed"] += 1
        outcomes["entered"] += entered.is_set()

        assert observer.holders(key) == set(), f"round {i}: a lock was left held"
        assert observer.waiters(key) == set(), f"round {i}: a wait was left running"
        await assert_clean(conn, observer)

    assert outcomes["cancelled"] >= 6


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_wait_cancelled_at_each_step_is_prompt_and_clean(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    """Cancel a waiting acquisition at each point where it yields to the event loop,
    not only once the server has it queued: the cancellation must take effect at once
    (not after the 30s wait), with nothing held and the connection usable."""
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    holder = await _hold(holder_conn, key)
    loop = asyncio.get_running_loop()
    for steps in range(1, 9):
        # A busy event loop (blocked on purpose): psycopg then yields at every step.
        time.sleep(0.01)  # noqa: ASYNC251
        task = asyncio.create_task(lock_for(conn, key, lifetime, wait=30).__aenter__())
        for _ in range(steps):
            await asyncio.sleep(0)
        started = loop.time()
        task.cancel()
        await finish(task)
        assert loop.time() - started < BOUND
        assert task.cancelled(), f"step {steps}: the acquisition was not cancelled"
        assert observer.holders(key) == {pid_of(holder_conn)}
        assert observer.waiters(key) == set(), f"step {steps}: a wait was left running"
        await assert_clean(conn, observer)
    await holder.release()
    await assert_clean(conn, observer)


# -- 8. bounded waits -------------------------------------------------------------------------


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
    holder = await _hold(holder_conn, key)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(pgsolo.LockTimeoutError) as caught:
        async with lock_for(conn, key, lifetime, wait=0.3):
            pytest.fail("entered a block whose lock is held elsewhere")
    assert loop.time() - started < BOUND
    assert caught.value.key == key
    assert caught.value.timeout == pytest.approx(0.3)
    assert "0.3s" in str(caught.value)
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    cur = await conn.execute("SHOW lock_timeout")
    assert await cur.fetchone() == ("7s",)
    if not autocommit:
        await conn.rollback()
    assert observer.waiters(key) == set()
    await holder.release()
    await assert_clean(conn, observer)


async def test_xact_wait_timeout_inside_callers_transaction(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    holder_conn, conn = await aconnect(), await aconnect()
    await conn.execute("SET lock_timeout = '7s'")
    holder = await _hold(holder_conn, key)
    async with conn.transaction():
        with pytest.raises(pgsolo.LockTimeoutError):
            await pgsolo.xact_lock(conn, key, wait=0.3).acquire()
        assert conn.info.transaction_status is pq.TransactionStatus.INTRANS
        cur = await conn.execute("SHOW lock_timeout")
        assert await cur.fetchone() == ("7s",)
    await holder.release()
    await assert_clean(conn, observer)


# -- 9. autocommit=False connections -----------------------------------------------------


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


@pytest.mark.parametrize("wait", [None, 5], ids=["try", "wait"])
async def test_implicit_transaction_connection_session_lock_stays_idle(
    aconnect: AConnect, observer: Any, key: Key, wait: float | None
) -> None:
    conn = await aconnect(autocommit=False)
    lock = pgsolo.session_lock(conn, key, wait=wait)
    assert await lock.acquire() is True
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE  # not idle in transaction
    assert observer.holders(key) == {pid_of(conn)}
    assert await lock.is_held() is True
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    await lock.release()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


async def test_implicit_transaction_connection_busy_try_stays_idle(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=False)
    holder = await _hold(holder_conn, key)
    assert await pgsolo.session_lock(conn, key).acquire() is False
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    await holder.release()
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


# -- 10. misuse ---------------------------------------------------------------------------


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


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
async def test_cancelled_release_leaves_no_lock_and_no_transaction(
    aconnect: AConnect, observer: Any, key: Key, autocommit: bool
) -> None:
    """A task cancelled while its release is on the wire, at each point it can yield."""
    conn = await aconnect(autocommit=autocommit)
    cancelled = 0
    for steps in range(1, 9):  # 1: the task has run up to its first suspension
        lock = pgsolo.session_lock(conn, key)
        assert await lock.acquire() is True
        # A busy event loop (blocked on purpose): psycopg then yields at every step.
        time.sleep(0.01)  # noqa: ASYNC251
        task = asyncio.create_task(lock.release())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        await finish(task)
        cancelled += task.cancelled()
        if not task.cancelled():
            assert task.exception() is None
        assert lock.acquired is False
        assert observer.holders(key) == set(), f"cancelled after {steps} steps: lock left"
        await assert_clean(conn, observer)
    assert cancelled >= 1


# -- regressions: a transaction pgsolo opened belongs to one task --------------------------


def other_key(key: Key) -> Key:
    assert isinstance(key.value, tuple)
    return Key((key.value[0], key.value[1] + 500_000))


async def test_second_task_cannot_join_an_xact_block_for_another_key(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """Task A is inside ``async with xact_lock(ac, k1)`` (pgsolo opened the transaction);
    task B's ``xact_lock(ac, k2)`` would join A's transaction (and be committed by A):
    refused. A's block then ends normally."""
    conn = await aconnect()
    pid = pid_of(conn)
    key2 = other_key(key)
    inside, finish_a = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    async def task_a() -> None:
        async with pgsolo.xact_lock(conn, key) as lock:
            seen["a_acquired"] = lock.acquired
            inside.set()
            await asyncio.wait_for(finish_a.wait(), BOUND)
            cur = await conn.execute("SELECT 1")
            seen["a_select"] = await cur.fetchone()
        seen["a_status"] = conn.info.transaction_status

    async def task_b() -> None:
        await asyncio.wait_for(inside.wait(), BOUND)
        try:
            with pytest.raises(pgsolo.ConnectionStateError) as raised:
                async with pgsolo.xact_lock(conn, key2):
                    seen["b_entered"] = True
            seen["b_context"] = raised.value
            seen["b_holders"] = observer.holders(key2)
            with pytest.raises(pgsolo.ConnectionStateError):
                await pgsolo.xact_lock(conn, key2).acquire()
        finally:
            finish_a.set()

    await asyncio.wait_for(asyncio.gather(task_a(), task_b()), BOUND * 2)
    assert seen["a_acquired"] is True
    assert "b_entered" not in seen
    assert "another thread or task" in str(seen["b_context"])
    assert seen["b_holders"] == set()
    assert seen["a_select"] == (1,)
    assert seen["a_status"] is pq.TransactionStatus.IDLE
    assert observer.holders(key) == set()
    assert observer.holders(key2) == set()
    await assert_clean(conn, observer)
    # Once A's block is over, any task may open one.
    async with pgsolo.xact_lock(conn, key2) as lock:
        assert lock.acquired
        assert observer.holders(key2) == {pid}
    await assert_clean(conn, observer)


async def test_nested_xact_blocks_in_one_task(aconnect: AConnect, observer: Any, key: Key) -> None:
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
