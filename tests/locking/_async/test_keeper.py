"""The keeper of an async session lock: ``session_lock(conn, key, keep=...)``, the tests that
read the same in both flavours.

A terminated backend and a lock released behind pgsolo's back on the same session are
losses that release() raises; the keeper skips its beats while the user's transaction is
open and resumes after; an xact lock has no keeper; notifications are not swallowed by
beats. Losses are real, and ``pg_locks`` / ``pg_stat_activity`` are read from another
session (the ``observer`` fixture). Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``. The tests of one flavour only (threads and tasks,
``cancel=True``, relays, descriptors...) are in ``tests/locking/test_keeper.py`` and
``tests/locking/test_keeper_async.py``.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import (
    INTERVAL,
    WATCHED_INTERVAL,
    AConnect,
    OnLost,
    activity,
    aeventually,
    asleep,
    assert_still_usable,
    terminate,
    wait_for_beat,
    wait_until_lost,
)
from pgsolo import Keep, Key, LockLostError


async def beats_after_now(observer: Any, pid: int, count: int) -> None:
    """Until backend ``pid`` has started ``count`` more statements (beats, when nobody
    else uses its connection)."""
    query = "SELECT query_start FROM pg_stat_activity WHERE pid = %s"
    for _ in range(count):
        before = observer.conn.execute(query, (pid,)).fetchone()
        await aeventually(
            lambda before=before: observer.conn.execute(query, (pid,)).fetchone() != before,
            f"another statement on backend {pid}",
        )


async def received(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    return [n.payload async for n in conn.notifies(timeout=2.0, stop_after=1)]


def unread_input(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server sent something on ``conn`` that nobody has read yet."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


# -- loss: the backend is terminated -----------------------------------------------------


async def test_terminated_backend_is_lost_and_release_raises_it(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn = await aconnect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, on_lost=on_lost))
    assert await lock.acquire() is True
    pid = lock.backend_pid
    assert pid is not None
    terminate(observer, pid)
    await wait_until_lost(lock, poll=aeventually)
    loss = lock.loss
    assert loss is not None
    assert loss.reason == "connection-lost"
    with pytest.raises(LockLostError) as released:
        await lock.release()
    assert released.value is loss
    assert on_lost.errors == [loss]
    assert pgsolo.held_session_locks(conn) == []
    other = await aconnect()
    async with pgsolo.session_lock(other, key) as taken:
        assert taken.acquired
        assert observer.holders(key) == {other.info.backend_pid}


async def test_terminated_backend_is_seen_on_the_socket_before_the_first_beat(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """The server says FATAL and closes the socket when it terminates a backend: the
    keeper, waiting on the socket between beats, reports the loss then, not at its next
    beat (the first one is due an hour after the lock was taken)."""
    conn = await aconnect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=WATCHED_INTERVAL, on_lost=on_lost))
    assert await lock.acquire() is True
    pid = lock.backend_pid
    assert pid is not None
    terminate(observer, pid)
    await wait_until_lost(lock, poll=aeventually)  # within DEADLINE: no beat comes by then
    loss = lock.loss
    assert loss is not None
    assert loss.reason == "connection-lost"
    assert on_lost.errors == [loss]
    with pytest.raises(LockLostError) as released:
        await lock.release()
    assert released.value is loss


# -- loss: released behind pgsolo's back on the same session ------------------------------


@pytest.mark.parametrize(
    "statement",
    ["SELECT pg_advisory_unlock_all()", "SELECT pg_advisory_unlock({args})"],
    ids=["unlock-all", "unlock-key"],
)
async def test_released_behind_pgsolos_back_is_lock_released(
    aconnect: AConnect, observer: Any, key: Key, statement: str
) -> None:
    conn = await aconnect()
    pid = conn.info.backend_pid
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))

    async def block() -> None:
        async with lock:
            assert observer.holders(key) == {pid}
            await conn.execute(statement.format(args=key.sql_args))
            assert observer.holders(key) == set()
            await wait_until_lost(lock, poll=aeventually)

    with pytest.raises(LockLostError) as at_exit:
        await block()
    loss = lock.loss
    assert loss is not None
    assert at_exit.value is loss
    assert loss.reason == "lock-released"
    assert on_lost.errors == [loss]
    # The session itself is fine: only the lock went.
    assert conn.info.backend_pid == pid
    await assert_still_usable(conn)
    assert pgsolo.held_session_locks(conn) == []
    async with pgsolo.session_lock(conn, key) as again:
        assert again.acquired


@pytest.mark.parametrize(
    "statement",
    ["SELECT pg_advisory_unlock_all()", "SELECT pg_advisory_unlock({args})"],
    ids=["unlock-all", "unlock-key"],
)
async def test_released_behind_pgsolos_back_then_release_raises_the_loss(
    aconnect: AConnect, observer: Any, key: Key, statement: str
) -> None:
    conn = await aconnect()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL))
    assert await lock.acquire()
    await conn.execute(statement.format(args=key.sql_args))
    await wait_until_lost(lock, poll=aeventually)
    with pytest.raises(LockLostError) as released:
        await lock.release()
    assert released.value is lock.loss
    assert lock.loss is not None
    assert lock.loss.reason == "lock-released"
    assert observer.holders(key) == set()
    await assert_still_usable(conn)


# -- the user's transaction: skipped, then resumed ------------------------------------------


@pytest.mark.parametrize("explicit", [True, False], ids=["transaction", "implicit-begin"])
async def test_keeper_skips_during_a_user_transaction_and_resumes_after(
    aconnect: AConnect, observer: Any, key: Key, explicit: bool
) -> None:
    conn = await aconnect(autocommit=explicit)
    pid = conn.info.backend_pid
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))
    marker = "SELECT 'the user is in a transaction'"

    async def work_in_a_transaction() -> None:
        await conn.execute("SET LOCAL application_name = 'pgsolo-in-xact'")
        await conn.execute(marker)
        # Many beats are due while the transaction is open: none runs inside it.
        for _ in range(20):
            assert activity(observer, pid) == ("idle in transaction", marker)
            await asleep(INTERVAL)
        cur = await conn.execute("SHOW application_name")
        assert await cur.fetchone() == ("pgsolo-in-xact",)
        await conn.execute("CREATE TEMP TABLE pgsolo_keeper_skip (n int)")
        await conn.execute("INSERT INTO pgsolo_keeper_skip VALUES (1)")

    async def block() -> None:
        async with lock:
            await wait_for_beat(observer, pid, key, poll=aeventually)
            if explicit:
                async with conn.transaction():
                    await work_in_a_transaction()
            else:
                await work_in_a_transaction()  # in psycopg's implicit transaction
                await conn.commit()
            cur = await conn.execute("SELECT count(*) FROM pgsolo_keeper_skip")
            assert await cur.fetchone() == (1,)
            if not explicit:
                await conn.commit()
            assert not lock.lost
            assert conn.info.transaction_status is pq.TransactionStatus.IDLE
            # Resumed: it beats again, and so it sees the next loss.
            await wait_for_beat(observer, pid, key, poll=aeventually)
            terminate(observer, pid)
            await wait_until_lost(lock, poll=aeventually)

    with pytest.raises(LockLostError):
        await block()
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"
    assert on_lost.errors == [lock.loss]


# -- an xact lock has none -------------------------------------------------------------


async def test_xact_lock_has_no_keeper(aconnect: AConnect, observer: Any, key: Key) -> None:
    conn = await aconnect()
    with pytest.raises(TypeError, match="keep"):
        pgsolo.xact_lock(conn, key, keep=True)  # type: ignore[call-arg]
    assert activity(observer, conn.info.backend_pid) == ("idle", "")


# -- sharing the connection: regressions -------------------------------------------------


async def test_notifications_are_not_swallowed_by_beats(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """A notification that arrives between the user's reads of notifications must reach
    the next read (it does without a keeper: see the first half); the keeper's round trips
    must not consume it."""
    conn, sender = await aconnect(), await aconnect()
    await conn.execute("LISTEN pgsolo_keeper_test")
    pid = conn.info.backend_pid
    async with pgsolo.session_lock(conn, key):  # no keeper: the notification is there at once
        await sender.execute("NOTIFY pgsolo_keeper_test, 'unwatched'")
        await asleep(0.3)
        unwatched = await received(conn)
    assert unwatched == ["unwatched"]
    async with pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL)):
        await wait_for_beat(observer, pid, key, poll=aeventually)
        await sender.execute("NOTIFY pgsolo_keeper_test, 'watched'")
        await beats_after_now(observer, pid, 2)  # the notification reached the socket by then
        watched = await received(conn)
    assert watched == ["watched"]


# -- the socket watched between beats: what is no loss -----------------------------------


async def test_a_notification_on_the_watched_connection_is_no_loss_and_stays_for_notifies(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    conn, sender = await aconnect(), await aconnect()
    await conn.execute("LISTEN pgsolo_keeper_watch")
    pid = conn.info.backend_pid
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=WATCHED_INTERVAL, on_lost=on_lost))
    async with lock:
        await sender.execute("NOTIFY pgsolo_keeper_watch, 'watched'")
        await asleep(0.3)  # it reaches the socket by then, and wakes the keeper
        # Nobody else reads an idle connection: the keeper read the notification...
        assert not unread_input(conn)
        assert not lock.lost
        # ...and left it for the caller's notifies().
        assert await received(conn) == ["watched"]
        assert observer.holders(key) == {pid}
    assert on_lost.errors == []


async def test_the_callers_statements_on_the_watched_connection_are_left_to_it(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """The socket turns readable while the caller's statement is in flight (its answer, a
    notice halfway, a long answer in pieces): those bytes are the caller's, and the
    keeper, waiting on the same socket, leaves them alone."""
    conn = await aconnect()
    pid = conn.info.backend_pid
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=WATCHED_INTERVAL, on_lost=on_lost))
    async with lock:
        cur = await conn.execute("SELECT 'slept' FROM pg_sleep(1)")
        assert await cur.fetchone() == ("slept",)
        await conn.execute("DO $$ BEGIN RAISE NOTICE 'halfway'; PERFORM pg_sleep(0.5); END $$")
        cur = await conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 5000)")
        assert len(await cur.fetchall()) == 5000
        assert notices == ["halfway"]
        assert not lock.lost
        assert observer.holders(key) == {pid}
    assert on_lost.errors == []
    await assert_still_usable(conn)
