"""Many session locks over few connections: ``pgsolo.AsyncLocker``, the tests that read the
same in both flavours.

What is asserted is what ``pg_locks`` and ``pg_stat_activity`` say through the
``observer`` session: how many backends hold the locks, that a key is never held twice,
that a connection killed under many locks reports each of them lost, that a wait polls
with tries (no backend waits on the server) and that a pool gets its connection back
holding nothing. Written once, under ``_async/``: scripts/unasync.py writes the twin
under ``_sync/``. Threads and tasks hammering one Locker, a release beside a waiter and
a forked child are in ``tests/locking/test_locker_concurrency.py``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import psycopg_pool
import pytest

import pgsolo
from _support import (
    OnLost,
    aeventually,
    app_name_of,
    asleep,
    backends_named,
    terminate,
    unique_name,
)
from pgsolo import Keep, Key, LockLostError
from pgsolo.locking._async import locker as locker_module


async def test_two_thousand_keys_are_held_at_once_by_four_backends(dsn: str, observer: Any) -> None:
    name = unique_name("locker-many")
    async with pgsolo.AsyncLocker(dsn, max_connections=4, application_name=name) as locker:
        locks = [locker.session_lock(f"{name}-{i}") for i in range(2000)]
        for lock in locks:
            assert await lock.acquire()
        held = observer.conn.execute(
            "SELECT count(*), count(DISTINCT pid), array_agg(DISTINCT pid) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted"
            " AND pid IN (SELECT pid FROM pg_stat_activity WHERE application_name = %s)",
            (name,),
        ).fetchone()
        assert held[0] == 2000
        assert held[1] == locker.connections == 4
        assert {lock.backend_pid for lock in locks} == set(held[2])
        for lock in locks:
            await lock.release()
            assert not lock.acquired
        for pid in held[2]:
            assert observer.advisory(pid=pid) == set()


async def test_a_key_held_through_the_locker_is_busy_to_its_next_asker(
    dsn: str, observer: Any, key: Key
) -> None:
    async with pgsolo.AsyncLocker(dsn, max_connections=1) as locker:
        first = locker.session_lock(key)
        assert await first.acquire()
        # One connection: PostgreSQL would grant the key to its session again.
        second = locker.session_lock(key)
        assert not await second.acquire()
        assert not second.acquired
        assert observer.holders(key) == {first.backend_pid}
        await first.release()
        assert await second.acquire()
        assert observer.holders(key) == {second.backend_pid}
        await second.release()


async def test_a_wait_polls_and_takes_the_key_once_another_session_frees_it(
    dsn: str, sync_connect: Any, observer: Any, key: Key
) -> None:
    holder = sync_connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    timer = threading.Timer(0.3, lambda: holder.execute("SELECT pg_advisory_unlock_all()"))
    async with pgsolo.AsyncLocker(dsn, max_connections=1) as locker:
        lock = locker.session_lock(key, wait=10)
        started = time.monotonic()
        timer.start()
        try:
            async with lock:
                waited = time.monotonic() - started
                assert lock.acquired
                assert observer.holders(key) == {lock.backend_pid}
        finally:
            timer.join()
        assert waited >= 0.3
        # Tries, not a wait on the server: the Locker's backend never queued for the key.
        assert observer.waiters(key) == set()


async def test_a_wait_that_runs_out_raises_lock_timeout_and_holds_nothing(
    dsn: str, sync_connect: Any, observer: Any, key: Key
) -> None:
    holder = sync_connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    async with pgsolo.AsyncLocker(dsn) as locker:
        lock = locker.session_lock(key, wait=0.2)
        with pytest.raises(pgsolo.LockTimeoutError) as raised:
            await lock.acquire()
        assert raised.value.key == key
        assert raised.value.timeout == 0.2
        assert not lock.acquired
        assert observer.holders(key) == {holder.info.backend_pid}
        # The connection is free for the next lock at once.
        other = locker.session_lock(f"{key.text}-other")
        assert await other.acquire()
        await other.release()


async def test_killing_a_connection_reports_each_of_its_locks_lost(dsn: str, observer: Any) -> None:
    losses = [OnLost() for _ in range(3)]
    async with pgsolo.AsyncLocker(dsn, max_connections=1) as locker:
        locks = [
            locker.session_lock(f"locker-lost-{i}", keep=Keep(interval=0.05, on_lost=losses[i]))
            for i in range(3)
        ]
        for lock in locks:
            assert await lock.acquire()
        pids = {lock.backend_pid for lock in locks}
        assert len(pids) == 1
        terminate(observer, pids.pop())
        await aeventually(lambda: all(lock.lost for lock in locks), "every lock lost")
        for lock, on_lost in zip(locks, losses, strict=True):
            assert lock.loss is not None
            assert lock.loss.reason == "connection-lost"
            assert lock.loss.key == lock.key
            assert [error.key for error in on_lost.errors] == [lock.key]
            with pytest.raises(LockLostError):
                lock.check()
            with pytest.raises(LockLostError):
                await lock.release()
            assert not lock.acquired
        # A fresh connection replaces the dead one.
        again = locker.session_lock("locker-lost-0")
        assert await again.acquire()
        assert observer.holders(again.key) == {again.backend_pid}
        await again.release()


async def test_a_key_released_behind_the_lockers_back_is_lost_alone(
    dsn: str, observer: Any
) -> None:
    on_lost = OnLost()
    async with pgsolo.AsyncLocker(dsn, max_connections=1) as locker:
        kept = locker.session_lock("locker-kept", keep=Keep(interval=0.05))
        gone = locker.session_lock("locker-gone", keep=Keep(interval=0.05, on_lost=on_lost))
        assert await kept.acquire()
        assert await gone.acquire()
        driver = pgsolo.drivers.adapt(locker._sessions[0].conn)  # behind the Locker's back
        await driver.fetch_value([f"SELECT pg_advisory_unlock({gone.key.sql_args})"])
        await aeventually(lambda: gone.lost, "the released key found gone")
        assert gone.loss is not None
        assert gone.loss.reason == "lock-released"
        assert [error.key for error in on_lost.errors] == [gone.key]
        assert not kept.lost
        assert observer.holders(kept.key) == {kept.backend_pid}
        await kept.release()


async def test_idle_connections_close_by_themselves_and_are_named(dsn: str, observer: Any) -> None:
    name = unique_name("locker-idle")
    async with pgsolo.AsyncLocker(
        dsn, max_connections=2, idle_timeout=0.2, application_name=name
    ) as locker:
        lock = locker.session_lock(f"{name}-1")
        assert await lock.acquire()
        pid = lock.backend_pid
        assert app_name_of(observer, pid) == name
        await asleep(0.5)
        assert app_name_of(observer, pid) == name  # holding a lock: never idle
        await lock.release()
        # Nothing else uses the Locker: its janitor closes the idle connection.
        await aeventually(lambda: app_name_of(observer, pid) is None, "the idle backend gone")
        assert locker.connections == 0
        other = locker.session_lock(f"{name}-2")
        assert await other.acquire()
        assert other.backend_pid != pid
        await other.release()


async def test_a_pool_gets_its_connection_back_holding_nothing(dsn: str, observer: Any) -> None:
    async with psycopg_pool.AsyncConnectionPool(
        dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    ) as pool:
        locker = pgsolo.AsyncLocker(pool, max_connections=2)
        held = locker.session_lock("locker-pooled")
        assert await held.acquire()
        pid = held.backend_pid
        await locker.close()  # with the lock still held: closing ends it
        assert observer.advisory(pid=pid) == set()
        async with pool.connection() as conn:
            assert pgsolo.held_session_locks(conn) == []
        with pytest.raises(pgsolo.UsageError, match="closed"):
            await locker.session_lock("locker-pooled").acquire()


async def test_bad_arguments_are_refused_before_any_connection(dsn: str) -> None:
    for options, error in [
        ({"max_connections": 0}, pgsolo.InvalidArgumentError),
        ({"max_connections": True}, pgsolo.InvalidArgumentError),
        ({"idle_timeout": -1}, pgsolo.InvalidArgumentError),
        ({"application_name": ""}, pgsolo.InvalidArgumentError),
    ]:
        with pytest.raises(error):
            pgsolo.AsyncLocker(dsn, **options)
    with pytest.raises(pgsolo.InvalidArgumentError, match="connection string or a connection pool"):
        pgsolo.AsyncLocker(42)  # type: ignore[arg-type]
    # A string libpq cannot read or use fails here, not at the first lock (regression).
    for malformed in ["mysql://user:secret@db/x", "host='unclosed", "host=h sslmode=requir"]:
        with pytest.raises(pgsolo.InvalidDsnError):
            pgsolo.AsyncLocker(malformed)
    locker = pgsolo.AsyncLocker(dsn)
    with pytest.raises(pgsolo.InvalidKeyError):
        locker.session_lock([1, 2])  # type: ignore[arg-type]
    with pytest.raises(pgsolo.InvalidArgumentError):
        locker.session_lock("k", wait=-1)
    with pytest.raises(pgsolo.UsageError):
        locker.session_lock("k", fencing=True, shared=True)
    with pytest.raises(pgsolo.InvalidArgumentError):
        locker.session_lock("k", keep="yes")  # type: ignore[arg-type]
    assert locker.connections == 0  # nothing was opened
    assert math.isinf(locker.session_lock("k", wait=math.inf)._request.wait or 0)


async def test_semaphores_and_leaders_are_taken_through_a_locker(dsn: str, observer: Any) -> None:
    name = unique_name("locker-sem")
    async with pgsolo.AsyncLocker(dsn, max_connections=2) as locker:
        holders = [pgsolo.semaphore(locker, name, limit=2) for _ in range(3)]
        assert [await holder.acquire() for holder in holders] == [True, True, False]
        assert {holder.slot for holder in holders[:2]} == {0, 1}
        for holder in holders[:2]:
            assert holder.key is not None
            assert len(observer.holders(holder.key)) == 1
        freed = holders[0].slot
        await holders[0].release()
        waiter = pgsolo.semaphore(locker, name, limit=2, wait=5)
        assert await waiter.acquire()  # the slot the first gave back
        assert waiter.slot == freed
        await waiter.release()
        await holders[1].release()

        async def second_leader() -> None:
            async with pgsolo.leader_async(locker, name, wait=0.2, fencing=False):
                pytest.fail("a second leader through the same Locker")

        async with pgsolo.leader_async(locker, name, wait=5, fencing=False) as term:
            assert observer.holders(term.key) == {term.backend_pid}
            assert not term.lost
            with pytest.raises(pgsolo.LockTimeoutError):
                await second_leader()
        assert observer.holders(term.key) == set()


async def test_a_lock_held_when_its_locker_closes_is_lost_and_never_touched_again(
    dsn: str, observer: Any
) -> None:
    async with psycopg_pool.AsyncConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    ) as pool:
        name = unique_name("locker-closed")
        locker = pgsolo.AsyncLocker(pool, max_connections=1)
        lock = locker.session_lock(name)
        assert await lock.acquire()
        await locker.close()
        async with pool.connection() as conn:  # the same connection, lent to another user
            other = pgsolo.session_lock(conn, name)
            assert await other.acquire()
            # The Locker's lock is gone with its close, and its release touches nothing.
            with pytest.raises(LockLostError, match="Locker was closed"):
                await lock.release()
            assert not lock.acquired
            assert not await lock.is_held()
            assert observer.holders(other.key) == {other.backend_pid}
            await other.release()


async def test_closing_the_locker_tells_each_lock_it_ends(dsn: str, observer: Any) -> None:
    """Guards close() ending a lock on the server only: a lock still held said it was
    acquired and not lost, its ``on_lost`` never ran, and ``check()`` passed while
    another session held its key."""
    on_lost = OnLost()
    name = unique_name("locker-close-tells")
    locker = pgsolo.AsyncLocker(dsn, max_connections=1, application_name=name)
    watched = locker.session_lock(f"{name}-watched", keep=Keep(interval=30, on_lost=on_lost))
    plain = locker.session_lock(f"{name}-plain")
    assert await watched.acquire()
    assert await plain.acquire()
    await locker.close()
    assert not watched.acquired
    assert not plain.acquired
    assert watched.lost
    assert watched.loss is not None
    assert watched.loss.reason == "connection-lost"
    assert "Locker was closed" in str(watched.loss)
    assert [error.key for error in on_lost.errors] == [watched.key]
    with pytest.raises(LockLostError):
        watched.check()
    for lock in (watched, plain):
        with pytest.raises(LockLostError, match="Locker was closed"):
            await lock.release()
    assert observer.advisory() & {watched.key, plain.key} == set()


async def test_a_connection_its_server_ended_while_idle_is_replaced_for_the_next_try(
    dsn: str, observer: Any
) -> None:
    """Guards a Locker's idle connection that the server ended (a terminated backend,
    idle_session_timeout): the next lock went to it and failed with
    DatabaseUnavailableError, though the Locker could open another."""
    name = unique_name("locker-dead-idle")
    async with pgsolo.AsyncLocker(dsn, max_connections=2, application_name=name) as locker:
        first = locker.session_lock(f"{name}-1")
        assert await first.acquire()
        dead = first.backend_pid
        await first.release()  # its connection stays open, idle
        assert dead is not None
        terminate(observer, dead)
        second = locker.session_lock(f"{name}-2")
        assert await second.acquire()
        assert second.backend_pid != dead
        assert observer.holders(second.key) == {second.backend_pid}
        await second.release()


async def test_a_wait_goes_on_when_the_connection_it_tries_on_is_ended(
    dsn: str, sync_connect: Any, observer: Any, key: Key
) -> None:
    """Guards a wait with no end (a standby's) that ended with DatabaseUnavailableError
    when the server ended the Locker's connection between two of its tries."""
    holder = sync_connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    name = unique_name("locker-dead-wait")
    async with pgsolo.AsyncLocker(dsn, max_connections=1, application_name=name) as locker:
        waiter = locker.session_lock(key, wait=math.inf)

        def end_its_connection_then_free_the_key() -> None:
            pids = set()
            deadline = time.monotonic() + 10
            while not pids and time.monotonic() < deadline:
                pids = backends_named(observer, name)
            for pid in pids:
                terminate(observer, pid)
            time.sleep(0.2)  # tries fail on the dead connection meanwhile
            holder.execute("SELECT pg_advisory_unlock_all()")

        timer = threading.Timer(0.1, end_its_connection_then_free_the_key)
        timer.start()
        try:
            assert await waiter.acquire()
        finally:
            timer.join()
        assert observer.holders(key) == {waiter.backend_pid}
        await waiter.release()


def _pool_of_one(dsn: str, *, timeout: float) -> psycopg_pool.AsyncConnectionPool:
    """A pool that lends one connection at most, waiting ``timeout`` seconds for it."""
    return psycopg_pool.AsyncConnectionPool(
        dsn, min_size=1, max_size=1, timeout=timeout, kwargs={"autocommit": True}, open=False
    )


async def test_a_lock_goes_on_an_open_connection_when_no_other_can_be_borrowed(
    dsn: str, observer: Any
) -> None:
    """Guards a try that failed (a raw psycopg_pool.PoolTimeout, after the pool's
    timeout) when the pool lent no more connections, though the Locker's open one could
    take the key."""
    async with (
        _pool_of_one(dsn, timeout=0.3) as pool,
        pgsolo.AsyncLocker(pool, max_connections=4) as locker,
    ):
        name = unique_name("locker-no-more")
        first = locker.session_lock(f"{name}-1")
        second = locker.session_lock(f"{name}-2")
        assert await first.acquire()
        assert await second.acquire()
        assert first.backend_pid == second.backend_pid
        assert observer.holders(second.key) == {second.backend_pid}
        await second.release()
        await first.release()


async def test_a_pool_that_lends_nothing_is_a_database_unavailable_error(dsn: str) -> None:
    async with (
        _pool_of_one(dsn, timeout=0.3) as pool,
        pool.connection(),
        pgsolo.AsyncLocker(pool) as locker,
    ):
        lock = locker.session_lock(unique_name("locker-none-lent"))
        with pytest.raises(pgsolo.DatabaseUnavailableError, match="borrow"):
            await lock.acquire()


async def test_a_pooled_connection_its_server_ended_goes_back_before_another_is_borrowed(
    dsn: str, observer: Any
) -> None:
    """Guards a pool of one whose connection the server ended under a held lock: the
    Locker kept the dead connection borrowed until its janitor ran (idle_timeout / 2,
    30 s by default), so each later try waited the pool's whole timeout for a connection,
    and then failed (here, with a timeout shorter than the janitor's period)."""
    async with (
        _pool_of_one(dsn, timeout=0.5) as pool,
        pgsolo.AsyncLocker(pool, max_connections=1) as locker,
    ):
        name = unique_name("locker-dead-loan")
        first = locker.session_lock(f"{name}-1")
        assert await first.acquire()
        dead = first.backend_pid
        assert dead is not None
        terminate(observer, dead)
        with pytest.raises(LockLostError):
            await first.release()
        second = locker.session_lock(f"{name}-2")
        assert await second.acquire()
        assert second.backend_pid != dead
        assert observer.holders(second.key) == {second.backend_pid}
        await second.release()


async def test_a_lock_seated_on_a_connection_found_closed_meanwhile_goes_to_another(
    dsn: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards a lock placed on a connection that looked alive, which another lock's
    statement found closed by its server before this one's turn: the lock was refused
    before any SQL with ConnectionStateError ("closed or broken"), where it goes to
    another connection."""
    name = unique_name("locker-found-closed")
    async with pgsolo.AsyncLocker(dsn, max_connections=2, application_name=name) as locker:
        first = locker.session_lock(f"{name}-1")
        assert await first.acquire()
        dead = first.backend_pid
        assert dead is not None
        await first.release()
        terminate(observer, dead)
        placed = locker_module.fewest_held
        found: list[Any] = []

        def placed_then_found_closed(tenants: Any, key: Key, limit: int) -> Any:
            best, open_new = placed(tenants, key, limit)
            if best is not None and not found:
                found.append(best)
                # Another lock's statement finds it dead (libpq's own call: in sync code).
                best.conn.pgconn.exec_(b"SELECT 1")
                assert best.driver.is_closed()
            return best, open_new

        monkeypatch.setattr(locker_module, "fewest_held", placed_then_found_closed)
        second = locker.session_lock(f"{name}-2")
        assert await second.acquire()
        assert found, "the lock was not placed on the dead connection"
        assert second.backend_pid != dead
        assert observer.holders(second.key) == {second.backend_pid}
        await second.release()
