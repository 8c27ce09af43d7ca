"""The keeper on async connections: ``session_lock(aconn, key, keep=...)`` watched by a task.

The tests that read the same in both flavours are written once, async, in
``_async/test_keeper.py``; here is what only async code has: ``cancel=True``
cancels the task that took the lock, and its ``async with`` block then ends with the
:class:`~pgsolo.LockLostError`. Every test runs against a real PostgreSQL; losses are real
(``pg_terminate_backend``, an unlock on the same session, a relay that stops passing the
server's answers on), and ``pg_locks`` / ``pg_stat_activity`` are read from another
session (the ``observer`` fixture).

The last section: the keeper's task is finished when an event loop closes right after the
block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    INTERVAL,
    WATCHED_INTERVAL,
    AConnect,
    OnLost,
    activity,
    aeventually,
    assert_still_usable,
    terminate,
    wait_for_beat,
    wait_until_lost,
)
from pgsolo import Keep, Key, LockLostError, UsageError, session_lock
from pgsolo.testing import Relay

# -- helpers -----------------------------------------------------------------------------


def keeper_tasks(key: Key) -> list[asyncio.Task[Any]]:
    return [
        t for t in asyncio.all_tasks() if t.get_name() == f"pgsolo-keeper {key}" and not t.done()
    ]


# -- loss: the backend is terminated -----------------------------------------------------


async def test_terminated_backend_is_lost_in_an_async_with_block(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, on_lost=on_lost))

    async def block() -> None:
        async with lock:
            pid = lock.backend_pid
            assert pid is not None
            assert observer.holders(key) == {pid}
            assert len(keeper_tasks(key)) == 1
            lock.check()
            terminate(observer, pid)
            await wait_until_lost(lock, poll=aeventually)
            with pytest.raises(LockLostError) as checked:
                lock.check()
            assert checked.value is lock.loss

    with pytest.raises(LockLostError) as at_exit:
        await block()
    loss = lock.loss
    assert loss is not None
    assert at_exit.value is loss
    assert loss.reason == "connection-lost"
    assert loss.key == key
    assert on_lost.errors == [loss]
    assert on_lost.tasks == [f"pgsolo-keeper {key}"]
    assert keeper_tasks(key) == []
    assert observer.holders(key) == set()
    other = await aconnect()
    assert await pgsolo.session_lock(other, key).acquire() is True
    assert observer.holders(key) == {other.info.backend_pid}


# -- no false alarms, no disturbance ---------------------------------------------------


async def test_the_keeper_beats_while_the_loops_default_executor_is_full(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """Guards the holder's statements and the keeper's deadline: a beat's blocking call
    went to the loop's default executor, which the application's to_thread calls had
    filled; queued there, the beat held the connection's lock, so the holder's own
    statements waited for a worker too, and a loss was found seconds late."""
    conn = await aconnect()
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    gate = threading.Event()
    busy = asyncio.ensure_future(asyncio.to_thread(gate.wait, DEADLINE))  # the only worker
    try:
        async with session_lock(conn, key, keep=Keep(interval=INTERVAL)) as lock:
            assert lock.backend_pid is not None
            await conn.execute("SELECT 1")
            await wait_for_beat(observer, lock.backend_pid, key, poll=aeventually)
            await conn.execute("SELECT 2")  # its own statement, between beats
            assert not busy.done()  # the default executor was full all along
    finally:
        gate.set()
        await busy
        executor.shutdown()


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-xact"])
async def test_no_false_alarm_while_tasks_work_on_the_connection(
    aconnect: AConnect, observer: Any, key: Key, autocommit: bool
) -> None:
    """The holder's task and another task run statements and transactions on the lock's
    connection for many beats: no loss, every answer right, and the keeper never leaves a
    transaction open (psycopg's implicit BEGIN included)."""
    conn = await aconnect(autocommit=autocommit)
    on_lost = OnLost()
    loop = asyncio.get_running_loop()

    async def other_task(stop: asyncio.Event) -> int:
        i = 0
        while not stop.is_set():
            i += 1
            cur = await conn.execute("SELECT %s::int * 2", (i,))
            assert await cur.fetchone() == (2 * i,)
            await asyncio.sleep(0.005)
        return i

    async with pgsolo.session_lock(
        conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost)
    ) as lock:
        pid = conn.info.backend_pid
        stop = asyncio.Event()
        worker = asyncio.create_task(other_task(stop))
        deadline = loop.time() + 1.0  # about twenty beats
        i = 0
        while loop.time() < deadline:
            i += 1
            cur = await conn.execute("SELECT g FROM generate_series(1, %s) AS g", (i,))
            assert await cur.fetchall() == [(g,) for g in range(1, i + 1)]
            async with conn.transaction():
                await conn.execute("SET LOCAL application_name = 'pgsolo-keeper-test'")
                await asyncio.sleep(INTERVAL)  # a beat is due meanwhile: it must wait
                cur = await conn.execute("SHOW application_name")
                assert await cur.fetchone() == ("pgsolo-keeper-test",)
            if not autocommit:
                await conn.commit()
        stop.set()
        assert await asyncio.wait_for(worker, DEADLINE) > 0
        if not autocommit:
            await conn.commit()
        # Now only the keeper uses the connection: it beats, and never in a transaction.
        await conn.execute("SELECT 'before the keeper alone'")
        if not autocommit:
            await conn.commit()
        await wait_for_beat(observer, pid, key, poll=aeventually)
        states, statuses = set(), set()
        for _ in range(25):
            states.add(activity(observer, pid)[0])
            statuses.add(conn.info.transaction_status)  # ACTIVE while a beat is out
            await asyncio.sleep(INTERVAL / 2)
        assert statuses <= {pq.TransactionStatus.IDLE, pq.TransactionStatus.ACTIVE}
        assert "idle in transaction" not in states
        assert states <= {"idle", "active"}
        assert not lock.lost
        assert observer.holders(key) == {pid}
    assert on_lost.errors == []
    assert lock.loss is None
    assert observer.holders(key) == set()
    assert activity(observer, pid)[0] == "idle"
    await assert_still_usable(conn)


# -- the keeper's lifetime -------------------------------------------------------------


async def test_keep_true_watches_with_the_defaults_and_keep_false_does_not(
    aconnect: AConnect, key: Key
) -> None:
    conn = await aconnect()
    async with pgsolo.session_lock(conn, key, keep=True) as lock:
        assert len(keeper_tasks(key)) == 1
        assert lock.loss is None
        lock.check()
    assert keeper_tasks(key) == []
    async with pgsolo.session_lock(conn, key, keep=False) as unwatched:
        assert unwatched.acquired
        assert keeper_tasks(key) == []


async def test_no_keeper_when_the_lock_was_not_acquired(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    holder, conn = await aconnect(), await aconnect()
    await holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    keep = Keep(interval=INTERVAL, cancel=True)
    async with pgsolo.session_lock(conn, key, keep=keep) as lock:
        assert not lock.acquired
        assert keeper_tasks(key) == []
    with pytest.raises(pgsolo.LockTimeoutError):
        await pgsolo.session_lock(conn, key, wait=0.2, keep=keep).acquire()
    assert keeper_tasks(key) == []
    assert observer.holders(key) == {holder.info.backend_pid}


@pytest.mark.parametrize("how", ["with", "release"])
async def test_keeper_stops_on_release_and_reports_nothing_later(
    aconnect: AConnect, observer: Any, key: Key, how: str
) -> None:
    conn = await aconnect()
    on_lost = OnLost()
    keep = Keep(interval=INTERVAL, on_lost=on_lost, cancel=True)
    lock = pgsolo.session_lock(conn, key, keep=keep)
    pid = conn.info.backend_pid
    if how == "with":
        async with lock:
            assert len(keeper_tasks(key)) == 1
            await wait_for_beat(observer, pid, key, poll=aeventually)
    else:
        assert await lock.acquire()
        assert len(keeper_tasks(key)) == 1
        await wait_for_beat(observer, pid, key, poll=aeventually)
        await lock.release()
    assert keeper_tasks(key) == []  # stopped, not merely told to stop
    await conn.execute("SELECT 'released'")
    terminate(observer, pid)
    await asyncio.sleep(10 * INTERVAL)  # ten beats would have been due: none may run
    assert not lock.lost
    assert on_lost.errors == []
    lock.check()  # and this task was not cancelled either (we are still here)


# -- cancel=True: the holder's task is cancelled ---------------------------------------------


@pytest.mark.parametrize(
    "interval", [INTERVAL, WATCHED_INTERVAL], ids=["short-interval", "long-interval"]
)
async def test_cancel_true_cancels_the_holder_and_the_block_raises_the_loss(
    aconnect: AConnect, observer: Any, key: Key, interval: float
) -> None:
    """With the long interval (an hour), only the watch of the socket between beats can
    explain a cancellation within the test's deadline: the holder stops while the next one
    may start."""
    conn = await aconnect()
    on_lost = OnLost()
    started = asyncio.Event()
    reached_the_end = False
    lock = pgsolo.session_lock(
        conn, key, keep=Keep(interval=interval, on_lost=on_lost, cancel=True)
    )

    async def work() -> None:
        nonlocal reached_the_end
        async with lock:
            started.set()
            await asyncio.sleep(30)
            reached_the_end = True

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), DEADLINE)
    assert lock.backend_pid is not None
    terminate(observer, lock.backend_pid)
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done, "the holder's task was not cancelled"
    assert not task.cancelled()  # it ended with the loss, not with CancelledError
    error = task.exception()
    assert isinstance(error, LockLostError)
    assert error is lock.loss
    assert error.reason == "connection-lost"
    assert isinstance(error.__cause__, asyncio.CancelledError)
    assert not reached_the_end
    assert on_lost.errors == [error]
    assert keeper_tasks(key) == []
    assert observer.holders(key) == set()


async def test_cancel_true_after_unlock_all_keeps_the_connection_usable(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    started = asyncio.Event()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, cancel=True))

    async def work() -> None:
        async with lock:
            await conn.execute("SELECT pg_advisory_unlock_all()")
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), DEADLINE)
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done, "the holder's task was not cancelled"
    assert not task.cancelled()
    assert isinstance(task.exception(), LockLostError)
    assert lock.loss is not None
    assert lock.loss.reason == "lock-released"
    assert observer.holders(key) == set()
    await assert_still_usable(conn)


async def test_cancel_false_does_not_cancel_the_holder(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    on_lost = OnLost()
    steps: list[str] = []

    async def work(lock: pgsolo.AsyncLock) -> None:
        async with lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            # sleeps through several beats, never cancelled
            await wait_until_lost(lock, poll=aeventually)
            await asyncio.sleep(5 * INTERVAL)
            steps.append("finished its work")

    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))
    task = asyncio.create_task(work(lock))
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done
    assert not task.cancelled()
    assert steps == ["finished its work"]
    assert isinstance(task.exception(), LockLostError)  # raised at the end of the block
    assert task.exception() is lock.loss
    assert lock.lost
    assert on_lost.errors == [lock.loss]


async def test_outside_cancellation_is_still_a_cancellation(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    started = asyncio.Event()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, cancel=True))

    async def work() -> None:
        async with lock:
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), DEADLINE)
    await wait_for_beat(observer, conn.info.backend_pid, key, poll=aeventually)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done
    assert task.cancelled()
    assert not lock.lost
    assert keeper_tasks(key) == []
    assert observer.holders(key) == set()
    await assert_still_usable(conn)


async def test_outside_cancellation_during_a_loss_is_still_a_cancellation(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """Someone else cancels the task just as the keeper does (here: from ``on_lost``,
    right before the keeper's own cancel): that cancellation must not be swallowed."""
    conn = await aconnect()
    started = asyncio.Event()
    holder: list[asyncio.Task[Any]] = []

    def cancel_it_too(error: LockLostError) -> None:
        holder[0].cancel()

    lock = pgsolo.session_lock(
        conn, key, keep=Keep(interval=INTERVAL, on_lost=cancel_it_too, cancel=True)
    )

    async def work() -> None:
        async with lock:
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(work())
    holder.append(task)
    await asyncio.wait_for(started.wait(), DEADLINE)
    assert lock.backend_pid is not None
    terminate(observer, lock.backend_pid)
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done
    assert task.cancelled()
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"


async def test_keepers_cancel_inside_asyncio_timeout_is_the_loss_not_a_timeout(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, cancel=True))

    async def block() -> None:
        async with asyncio.timeout(DEADLINE), lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            await asyncio.sleep(30)

    with pytest.raises(LockLostError) as raised:
        await block()
    assert raised.value is lock.loss
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


# -- on_lost that raises ---------------------------------------------------------------------


async def test_on_lost_that_raises_is_logged_and_stays_in_the_keeper(
    aconnect: AConnect, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    caplog.set_level(logging.INFO, logger="pgsolo")
    conn = await aconnect()
    on_lost = OnLost(fail=RuntimeError("the callback broke"))
    lock = pgsolo.session_lock(
        conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost, cancel=True)
    )

    async def block() -> None:
        async with lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            await asyncio.sleep(30)  # cancelled by the keeper all the same

    try:
        with pytest.raises(LockLostError) as at_exit:
            await block()
    finally:
        loop.set_exception_handler(None)
    assert at_exit.value is lock.loss
    assert on_lost.errors == [lock.loss]
    assert unhandled == []
    failures = [r for r in caplog.records if "on_lost" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)


# -- an unresponsive server (half-open connection) --------------------------------------------


async def test_unresponsive_server_is_lost_and_the_connection_shut_down(
    dsn: str, observer: Any, key: Key
) -> None:
    on_lost = OnLost()
    with Relay(dsn) as proxy:
        conn = await psycopg.AsyncConnection.connect(proxy.dsn, autocommit=True)
        try:
            keep = Keep(interval=0.2, timeout=1.0, on_lost=on_lost, cancel=True)
            lock = pgsolo.session_lock(conn, key, keep=keep)

            async def block() -> None:
                async with lock:
                    cur = await conn.execute("SELECT pg_backend_pid()")
                    row = await cur.fetchone()
                    assert row is not None
                    assert observer.holders(key) == {row[0]}
                    proxy.freeze()  # from now on the server's answers never arrive
                    await asyncio.sleep(30)  # cancelled by the keeper

            with pytest.raises(LockLostError) as at_exit:
                await block()
            loss = lock.loss
            assert at_exit.value is loss
            assert loss is not None
            assert loss.reason == "connection-unresponsive"
            assert on_lost.errors == [loss]
            # Dead for every later use, at once, instead of hanging.
            if not conn.closed:
                with pytest.raises(psycopg.OperationalError):
                    await asyncio.wait_for(conn.execute("SELECT 1"), DEADLINE)
            await aeventually(lambda: observer.holders(key) == set(), "the lock to go")
        finally:
            await conn.close()


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", ["yes", 1, {"cancel": True}], ids=["str", "int", "dict"])
async def test_bad_keep_is_refused_before_any_sql(
    aconnect: AConnect, observer: Any, key: Key, keep: Any
) -> None:
    conn = await aconnect()
    with pytest.raises(UsageError):
        pgsolo.session_lock(conn, key, keep=keep)
    assert activity(observer, conn.info.backend_pid) == ("idle", "")
    assert observer.holders(key) == set()
    assert keeper_tasks(key) == []


# -- sharing the connection: regressions -------------------------------------------------


async def test_other_locks_on_the_connection_are_not_refused_during_a_beat(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """The user takes other locks on the kept lock's connection just while a beat is out
    (found by watching the connection's status turn ACTIVE with nothing else running):
    pgsolo must wait for the beat as psycopg does, not refuse."""
    conn = await aconnect()
    other = pgsolo.as_key(f"pgsolo-keeper-test-{uuid.uuid4().hex}")
    loop = asyncio.get_running_loop()
    refused: list[str] = []
    attempts = 0
    async with pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL)) as kept:
        # Up to 10 attempts, each while a beat is out; a busy host gets more time to
        # catch one (a beat is out for a moment, once per interval).
        deadline = loop.time() + 15.0
        while loop.time() < deadline and attempts < 10:
            await asyncio.sleep(0)
            if conn.info.transaction_status is not pq.TransactionStatus.ACTIVE:
                continue  # spin: a beat is out only for a moment
            attempts += 1
            try:
                async with pgsolo.xact_lock(conn, other) as xact:
                    assert xact.acquired
            except pgsolo.ConnectionStateError as exc:
                refused.append(str(exc))
        assert not kept.lost
    assert attempts > 0
    assert refused == []
    assert observer.holders(other) == set()


# -- a keeper task when the event loop closes ----------------------------------------------


def test_async_keeper_task_is_finished_when_a_manual_loop_closes(db: str, key: Any) -> None:
    """The keeper's task, stopped at the end of the ``async with`` block, must be finished
    when the event loop closes right afterwards, not left pending for asyncio to report as a
    task destroyed while pending."""
    destroyed: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: destroyed.append(context))
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        try:
            async with session_lock(conn, key, keep=Keep(interval=0.01)):
                await asyncio.sleep(0.1)
        finally:
            await conn.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()
    gc.collect()
    assert pending == []
    assert destroyed == []


def test_async_keeper_task_finished_when_the_block_closes_its_connection(db: str, key: Any) -> None:
    """The block closes the lock's connection itself, so the release has no round trip left to
    await after the keeper is told to stop: its task must still be finished before the loop
    closes, with nothing reported to the loop's exception handler."""
    destroyed: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: destroyed.append(context))
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        with contextlib.suppress(LockLostError):
            async with session_lock(conn, key, keep=Keep(interval=5)):
                await conn.close()  # release has no I/O left: no await after stop()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()
    gc.collect()
    assert pending == [], pending
    assert destroyed == []
