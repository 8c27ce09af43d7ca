"""A session lock inside the caller's transaction, and the caller's savepoints around it.

A session lock taken in the caller's transaction keeps a savepoint of pgsolo's (its hold)
open for its block, so that releasing it after the transaction failed in the block rolls
back to the hold, never further, and leaves the transaction failed, as it found it
(docs/locks.md, "Inside your transaction"). These tests look at the caller's side: its
rows, its savepoints, its transaction status, and what ``pg_locks`` says; every kind of
connection is in the conformance suite (tests/drivers/_async/test_conformance.py). Written
once, under ``_async/``: scripts/unasync.py writes the twin under ``_sync/``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg import errors
from psycopg.pq import TransactionStatus

import pgsolo
from _support import WORK, AConnect, Connect, has_savepoint, other_key, pid_of, work_rows
from pgsolo import Key, LockTimeoutError
from pgsolo.sql import hold_savepoint

INERROR, INTRANS, IDLE = (
    TransactionStatus.INERROR,
    TransactionStatus.INTRANS,
    TransactionStatus.IDLE,
)


def note(tag: str) -> str:
    return f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'written')"


async def test_a_failure_caught_in_the_block_leaves_the_transaction_failed_as_found(
    aconnect: AConnect, db: str, observer: Any, key: Key
) -> None:
    """A statement that failed in the block, its error caught there: the release rolls
    back to the lock's hold (the block's work only), unlocks, and leaves the transaction
    failed, as it would be without pgsolo, so the caller's own savepoint still recovers
    it. (The release once sent ROLLBACK: the caller's transaction ended, its savepoint
    with it, and what it ran next ran outside any transaction.)"""
    conn = await aconnect()
    before, inside, after = (str(uuid.uuid4()) for _ in range(3))
    await conn.execute("BEGIN")
    await conn.execute(note(before))
    await conn.execute("SAVEPOINT mine")
    async with pgsolo.session_lock(conn, key) as lock:
        assert lock.acquired
        await conn.execute(note(inside))
        with pytest.raises(errors.DivisionByZero):
            await conn.execute("SELECT 1/0")
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    assert conn.info.transaction_status is INERROR  # as the failure left it
    await conn.execute("ROLLBACK TO SAVEPOINT mine")
    await conn.execute(note(after))
    await conn.execute("COMMIT")
    assert work_rows(observer, before) == ["written"]
    assert work_rows(observer, inside) == []
    assert work_rows(observer, after) == ["written"]


async def test_a_busy_try_and_a_wait_that_runs_out_leave_no_savepoint(
    aconnect: AConnect, db: str, sync_connect: Connect, observer: Any, key: Key
) -> None:
    """The hold opens with the acquisition's first statement; a try that finds the key
    busy and a wait that times out leave it, and the caller's work stays."""
    conn, holder = await aconnect(), sync_connect()
    before = str(uuid.uuid4())
    assert pgsolo.session_lock(holder, key).acquire() is True
    await conn.execute("BEGIN")
    await conn.execute(note(before))
    assert await pgsolo.session_lock(conn, key).acquire() is False
    assert not await has_savepoint(conn, hold_savepoint(key))
    with pytest.raises(LockTimeoutError):
        await pgsolo.session_lock(conn, key, wait=0.1).acquire()
    assert conn.info.transaction_status is INTRANS
    assert not await has_savepoint(conn, hold_savepoint(key))
    await conn.execute("COMMIT")
    assert work_rows(observer, before) == ["written"]
    assert observer.holders(key) == {pid_of(holder)}


async def test_nested_locks_let_go_in_any_order_leave_no_savepoint(
    aconnect: AConnect, db: str, observer: Any, key: Key
) -> None:
    """Each lock has a hold of its own. Released out of order, the first release leaves
    the inner hold with the outer one, and the second finds its hold gone: it unlocks
    all the same, at no cost to the caller's transaction."""
    conn = await aconnect()
    inner_key, tag = other_key(key), str(uuid.uuid4())
    await conn.execute("BEGIN")
    outer = pgsolo.session_lock(conn, key, wait=5, fencing=True)
    inner = pgsolo.session_lock(conn, inner_key, shared=True)
    assert await outer.acquire() is True
    assert outer.token is not None
    assert await inner.acquire() is True
    await outer.release()
    assert observer.holders(key) == set()
    await inner.release()
    assert observer.holders(inner_key) == set()
    assert conn.info.transaction_status is INTRANS
    for name in (hold_savepoint(key), hold_savepoint(inner_key)):
        assert not await has_savepoint(conn, name)
    await conn.execute(note(tag))
    await conn.execute("COMMIT")
    assert work_rows(observer, tag) == ["written"]


async def test_a_failure_in_nested_blocks_is_rolled_back_to_the_inner_hold_only(
    aconnect: AConnect, db: str, observer: Any, key: Key
) -> None:
    """The inner block's release rolls back to its own hold; the outer block's work, done
    before the inner lock was taken, stays until the caller decides."""
    conn = await aconnect()
    inner_key = other_key(key)
    outer_work, inner_work = str(uuid.uuid4()), str(uuid.uuid4())
    await conn.execute("BEGIN")
    async with pgsolo.session_lock(conn, key, wait=5):
        await conn.execute(note(outer_work))

        async def inner_block() -> None:
            # In the caller's savepoint, which rolls back.
            async with conn.transaction(), pgsolo.session_lock(conn, inner_key, reentrant=True):
                await conn.execute(note(inner_work))
                await conn.execute("SELECT 1/0")

        with pytest.raises(errors.DivisionByZero):
            await inner_block()
        assert observer.holders(inner_key) == set()
        assert observer.holders(key) == {pid_of(conn)}
        assert conn.info.transaction_status is INTRANS
    assert observer.holders(key) == set()
    await conn.execute("COMMIT")
    assert work_rows(observer, outer_work) == ["written"]
    assert work_rows(observer, inner_work) == []


async def test_a_re_entrant_hold_let_go_last_rolls_back_to_the_first_holds_savepoint(
    aconnect: AConnect, db: str, observer: Any, key: Key
) -> None:
    """The hold belongs to the key on the connection's books: whichever re-entrant Lock
    lets go last rolls back to it and unlocks."""
    conn = await aconnect()
    first = pgsolo.session_lock(conn, key, reentrant=True)
    second = pgsolo.session_lock(conn, key, reentrant=True)
    await conn.execute("BEGIN")
    assert await first.acquire() is True
    assert await second.acquire() is True
    await first.release()
    with pytest.raises(errors.DivisionByZero):
        await conn.execute("SELECT 1/0")
    await second.release()
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is INERROR
    await conn.execute("ROLLBACK")


@pytest.mark.parametrize("ending", ["rolled back past", "released past", "committed"])
async def test_the_caller_ending_the_hold_in_the_block_costs_it_nothing(
    aconnect: AConnect, db: str, observer: Any, key: Key, ending: str
) -> None:
    """The caller rolled back or released a savepoint older than the hold, or committed
    and began another transaction, inside the block: the hold went with it. The release
    finds it gone, unlocks, and leaves the caller's transaction usable."""
    conn = await aconnect()
    tag = str(uuid.uuid4())
    await conn.execute("BEGIN")
    await conn.execute("SAVEPOINT mine")
    async with pgsolo.session_lock(conn, key) as lock:
        assert lock.acquired
        if ending == "committed":
            await conn.execute("COMMIT")
            await conn.execute("BEGIN")
        else:
            verb = "ROLLBACK TO" if ending == "rolled back past" else "RELEASE"
            await conn.execute(f"{verb} SAVEPOINT mine")
        await conn.execute(note(tag))
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is INTRANS
    await conn.execute("COMMIT")
    assert work_rows(observer, tag) == ["written"]


async def test_a_lock_taken_outside_a_transaction_that_failed_in_its_block_rolls_it_back(
    aconnect: AConnect, observer: Any, key: Key
) -> None:
    """What docs/locks.md says: a transaction that began in the block of a lock taken
    outside one, and failed there, can only be rolled back, and is; the key is let go."""
    conn = await aconnect()
    async with pgsolo.session_lock(conn, key):
        await conn.execute("BEGIN")
        with pytest.raises(errors.DivisionByZero):
            await conn.execute("SELECT 1/0")
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is IDLE
