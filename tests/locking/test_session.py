"""session_lock: a lock held until it is released, or until its session ends.

A holder whose backend is terminated or whose process is killed, an error in the block
that wins over the loss, a release that finds nothing held, and (async) a release after
the connection was closed and a busy try with autocommit off. What is asserted is what
``pg_locks`` says through the ``observer`` session. The tests that read the same in both
flavours (an exception in the block, re-entrant holds, autocommit off) are written once,
async, in ``_async/test_session.py``; scripts/unasync.py generates
``_sync/test_session.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    AConnect,
    Child,
    Connect,
    JobFailedError,
    aeventually,
    assert_clean,
    backend_state,
    eventually,
    hold_session_lock,
    pid_of,
)
from pgsolo import (
    Key,
    LockLostError,
    LockNotHeldError,
)

# -- sync connections ----------------------------------------------------------------------


def backend_gone(observer: Any, pid: int) -> bool:
    return backend_state(observer, pid) is None


def terminate(observer: Any, pid: int) -> None:
    row = observer.conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row == (True,)
    eventually(lambda: backend_gone(observer, pid), f"backend {pid} to exit")


def test_terminated_session_holder_loses_lock(connect: Connect, observer: Any, key: Key) -> None:
    holder, other = connect(), connect()
    lock = pgsolo.session_lock(holder, key)
    assert lock.acquire() is True
    pid = pid_of(holder)
    assert observer.holders(key) == {pid}
    assert pgsolo.session_lock(other, key).acquire() is False

    terminate(observer, pid)
    assert observer.holders(key) == set()
    theirs = pgsolo.session_lock(other, key)
    assert theirs.acquire() is True
    assert observer.holders(key) == {pid_of(other)}

    with pytest.raises(LockLostError) as raised:
        lock.release()
    assert raised.value.key == key
    assert pgsolo.held_session_locks(holder) == []
    # The holder's failed release did not disturb the new owner.
    assert observer.holders(key) == {pid_of(other)}
    theirs.release()


def test_terminated_holder_with_block_leaves_nothing_held(
    connect: Connect, observer: Any, key: Key
) -> None:
    holder, other = connect(), connect()

    def job() -> None:
        with pgsolo.session_lock(holder, key) as lock:
            assert lock.acquired
            terminate(observer, pid_of(holder))

    with pytest.raises(LockLostError):
        job()
    assert pgsolo.held_session_locks(holder) == []
    assert observer.holders(key) == set()
    assert pgsolo.session_lock(other, key).acquire() is True


def test_terminated_holder_with_failing_block_raises_the_block_error(
    connect: Connect, observer: Any, key: Key
) -> None:
    holder, other = connect(), connect()
    failure = JobFailedError("work failed while the connection died")

    def job() -> None:
        with pgsolo.session_lock(holder, key):
            terminate(observer, pid_of(holder))
            raise failure

    with pytest.raises(JobFailedError) as raised:
        job()
    assert raised.value is failure
    assert pgsolo.held_session_locks(holder) == []
    assert pgsolo.session_lock(other, key).acquire() is True


CHILD_HOLDS_LOCK = r"""
import sys, time
import psycopg
import pgsolo

dsn, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = psycopg.connect(dsn, autocommit=True)
lock = pgsolo.session_lock(conn, (a, b))
if not lock.acquire():
    print("busy", flush=True)
    sys.exit(3)
print("held", conn.info.backend_pid, flush=True)
time.sleep(120)
"""


def test_sigkilled_holder_process_releases(
    connect: Connect, observer: Any, key: Key, dsn: str, children: Callable[..., Child]
) -> None:
    assert isinstance(key.value, tuple)
    child = children(CHILD_HOLDS_LOCK, dsn, *key.value)
    word, child_pid = child.readline().split()
    assert word == "held"
    backend = int(child_pid)
    assert observer.holders(key) == {backend}
    other = connect()
    assert pgsolo.session_lock(other, key).acquire() is False

    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait(DEADLINE)
    assert child.proc.returncode == -signal.SIGKILL
    eventually(lambda: backend not in observer.holders(key), "the killed child's lock to go")
    assert pgsolo.session_lock(other, key).acquire() is True
    assert observer.holders(key) == {pid_of(other)}


def test_release_of_never_acquired_session_lock(connect: Connect, key: Key) -> None:
    conn = connect()
    with pytest.raises(LockNotHeldError) as raised:
        pgsolo.session_lock(conn, key).release()
    assert raised.value.key == key


def test_unlock_all_behind_pgsolos_back_is_reported_on_release(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True
    conn.execute("SELECT pg_advisory_unlock_all()")
    assert observer.holders(key) == set()
    assert lock.is_held() is False
    with pytest.raises(LockNotHeldError) as raised:
        lock.release()
    assert raised.value.key == key
    assert pgsolo.held_session_locks(conn) == []


# -- async connections ---------------------------------------------------------------------


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
    await aeventually(lambda: observer.holders(key) == set(), "the killed session's lock is gone")


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
    taker = pgsolo.session_lock(other, key, wait=DEADLINE)
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
    await aeventually(lambda: observer.holders(key) == set(), "the killed session's lock is gone")


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
        line = await asyncio.wait_for(child.stdout.readline(), DEADLINE)
        child_pid = int(line)
        assert observer.holders(key) == {child_pid}
        other = await aconnect()
        assert await pgsolo.session_lock(other, key).acquire() is False
        child.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(child.wait(), DEADLINE) == -signal.SIGKILL
        # The server notices the dead socket and ends the session: the lock goes with it.
        taker = pgsolo.session_lock(other, key, wait=DEADLINE)
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
    await aeventually(lambda: observer.holders(key) == set(), "the closed session's lock is gone")


async def test_implicit_transaction_connection_busy_try_stays_idle(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    holder_conn = await aconnect()
    conn = await aconnect(autocommit=False)
    holder = await hold_session_lock(holder_conn, key)
    assert await pgsolo.session_lock(conn, key).acquire() is False
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE
    await holder.release()
    await assert_clean(conn, observer)
