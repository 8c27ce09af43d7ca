"""Task cancellation (``task.cancel()``, ``asyncio.timeout()``) of async lock calls while the
server really has the backend waiting in ``pg_locks``: at each point an acquisition or a
release yields, racing the holder's release, and on a connection shared with other tasks.
Nothing is left held or waiting, and the connection stays idle and usable.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    WORK,
    AConnect,
    assert_clean,
    has_savepoint,
    hold_session_lock,
    lock_for,
    pid_of,
    work_rows,
)
from pgsolo import Key
from pgsolo.sql import hold_savepoint

# -- async connections ---------------------------------------------------------------------


async def wait_until_waiting(observer: Any, key: Key, pid: int, task: asyncio.Task[Any]) -> None:
    """Poll pg_locks until backend ``pid`` is really queued on ``key`` (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while pid not in observer.waiters(key):
        if task.done():
            task.result()  # surface the task's own failure
            pytest.fail(f"the task finished before backend {pid} waited for {key}")
        assert loop.time() < deadline, f"backend {pid} never started waiting for {key}"
        await asyncio.sleep(0.005)


async def end_callers_transaction(
    conn: Any, lifetime: str, autocommit: bool, *, may_abort: bool = False
) -> None:
    """With autocommit off, a transaction lock joins psycopg's implicit transaction: that
    transaction is the caller's, still open and usable after the block or the cancelled
    wait, and only the caller ends it (pgsolo never commits or rolls back the caller's
    work). End it here, as the caller would.

    ``may_abort``: the cancellation may have reached the server before pgsolo's savepoint
    existed (while psycopg's own BEGIN was in flight), and aborted the caller's transaction
    as it would abort one of the caller's own statements; nothing is held either way."""
    if lifetime == "xact" and not autocommit:
        status = conn.info.transaction_status
        if may_abort and status is pq.TransactionStatus.INERROR:
            await conn.rollback()
            return
        assert status is pq.TransactionStatus.INTRANS
        cur = await conn.execute("SELECT 1")  # usable, not aborted
        assert await cur.fetchone() == (1,)
        await conn.rollback()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE


async def finish(task: asyncio.Task[Any]) -> None:
    """Wait (bounded) for ``task`` to end, whatever its outcome."""
    done, _ = await asyncio.wait({task}, timeout=DEADLINE)
    assert task in done, "the task did not finish after it was cancelled"


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
        done, _ = await asyncio.wait({other}, timeout=DEADLINE)
        assert other in done
        cur = other.result()  # not QueryCanceled: its statement ran to the end
        assert await cur.fetchone() == ("", "other")
        assert observer.holders(key) == set()
        await assert_clean(conn, observer)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_cancelled_wait_leaves_nothing_behind(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    pid = pid_of(conn)
    holder = await hold_session_lock(holder_conn, key)
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
    await end_callers_transaction(conn, lifetime, autocommit)

    await holder.release()
    assert observer.holders(key) == set()  # the abandoned wait was not granted later
    await assert_clean(conn, observer)
    # And the connection can take the lock normally now.
    async with lock_for(conn, key, lifetime, wait=DEADLINE) as lock:
        assert lock.acquired
        assert observer.holders(key) == {pid}
    if lifetime == "xact" and not autocommit:  # the caller's transaction holds it still
        assert observer.holders(key) == {pid}
    await end_callers_transaction(conn, lifetime, autocommit)
    await assert_clean(conn, observer)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_asyncio_timeout_around_a_wait(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=autocommit)
    holder = await hold_session_lock(holder_conn, key)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError) as caught:
        async with asyncio.timeout(0.3), lock_for(conn, key, lifetime, wait=30):
            pytest.fail("entered a block whose lock is held elsewhere")
    assert not isinstance(caught.value, pgsolo.LockTimeoutError)  # asyncio's, not the server's
    assert loop.time() - started < DEADLINE
    assert observer.waiters(key) == set()
    await end_callers_transaction(conn, lifetime, autocommit)
    await holder.release()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_cancelled_wait_inside_callers_transaction_keeps_it_usable(
    aconnect: AConnect, observer: Any, key: Key, lifetime: str
) -> None:
    holder_conn, conn = await aconnect(), await aconnect()
    pid = pid_of(conn)
    holder = await hold_session_lock(holder_conn, key)
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
        holder = await hold_session_lock(holder_conn, key)
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
        await asyncio.wait_for(release, DEADLINE)
        if cancel_first:
            assert task.cancelled(), "a cancel requested before the grant must win"
        else:
            assert task.cancelled() or task.exception() is None
        outcomes["cancelled" if task.cancelled() else "completed"] += 1
        outcomes["entered"] += entered.is_set()

        if entered.is_set() and lifetime == "xact" and not autocommit:
            assert observer.holders(key) == {pid}  # in the caller's transaction
        await end_callers_transaction(conn, lifetime, autocommit)
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
    holder = await hold_session_lock(holder_conn, key)
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
        assert loop.time() - started < DEADLINE
        assert task.cancelled(), f"step {steps}: the acquisition was not cancelled"
        assert observer.holders(key) == {pid_of(holder_conn)}
        assert observer.waiters(key) == set(), f"step {steps}: a wait was left running"
        if (
            lifetime == "xact"
            and not autocommit
            and conn.info.transaction_status is pq.TransactionStatus.IDLE
        ):
            continue  # cancelled before psycopg opened the caller's implicit transaction
        await end_callers_transaction(conn, lifetime, autocommit, may_abort=True)
        await assert_clean(conn, observer)
    await holder.release()
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


@pytest.mark.parametrize("keep", [False, True], ids=["no-keeper", "keeper"])
async def test_a_second_cancellation_at_the_exit_still_releases(
    aconnect: AConnect, observer: Any, key: Key, keep: bool
) -> None:
    """A task cancelled twice (TaskGroup / timeout / anyio cancel scopes re-cancel): the
    second cancellation lands in __aexit__. Without a keeper the release still completes
    (the round trip is shielded); with one, stopping the keeper is an unshielded await."""
    conn = await aconnect()
    entered = asyncio.Event()

    async def holder() -> None:
        async with pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=5) if keep else False):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(holder())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(0)  # the holder runs into __aexit__ and awaits there
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    await asyncio.sleep(0.1)
    assert observer.holders(key) == set(), "the session lock was left held"
    assert pgsolo.held_session_locks(conn) == []


async def test_a_cancelled_wait_in_the_callers_transaction_leaves_its_work_and_no_savepoint(
    aconnect: AConnect, db: str, observer: Any, key: Key
) -> None:
    """A session lock's wait in the caller's transaction opens the lock's own savepoint
    first (its hold, for the block); cancelled on the server, it aborts inside that
    savepoint, and pgsolo rolls back to it and leaves it: the caller's transaction is
    usable and keeps its work, and no savepoint of pgsolo's is left in it."""
    holder = await hold_session_lock(await aconnect(), key)
    conn, tag = await aconnect(), str(uuid.uuid4())
    await conn.execute("BEGIN")
    await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'written')")
    task = asyncio.create_task(pgsolo.session_lock(conn, key, wait=30).acquire())
    await wait_until_waiting(observer, key, pid_of(conn), task)
    task.cancel()
    await finish(task)
    assert task.cancelled()
    assert conn.info.transaction_status is pq.TransactionStatus.INTRANS
    assert not await has_savepoint(conn, hold_savepoint(key))
    await conn.execute("COMMIT")
    assert work_rows(observer, tag) == ["written"]
    await holder.release()
    assert observer.holders(key) == set()
    await assert_clean(conn, observer)
