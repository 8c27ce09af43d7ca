"""``pgsolo.semaphore()``: never more than ``limit`` holders among real concurrent
sessions (threads and tasks, each with its own connection), a waiter that takes whichever
slot frees first, bounded waits that hold nothing afterwards, and the connection given
back as it was found."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import AConnect, Connect, unique_name
from pgsolo.keys import semaphore_keys
from pgsolo.locking import TURN_SECONDS
from pgsolo.locking.session import SessionLockCore

Observer = Any


def held_slots(observer: Observer, name: str, limit: int) -> dict[int, set[int]]:
    """The holders of each slot of ``name``, as the server sees them."""
    return {slot: observer.holders(key) for slot, key in enumerate(semaphore_keys(name, limit))}


def test_never_more_than_limit_holders_among_threads(connect: Connect, observer: Observer) -> None:
    name, limit = unique_name("semaphore"), 3
    guard = threading.Lock()
    holding: list[int] = []
    most = [0]
    done: list[int] = []
    errors: list[BaseException] = []
    conns = [connect() for _ in range(7)]

    def worker(me: int) -> None:
        try:
            for _ in range(3):
                with pgsolo.semaphore(conns[me], name, limit=limit, wait=30) as held:
                    assert held.acquired
                    with guard:
                        holding.append(me)
                        most[0] = max(most[0], len(holding))
                    time.sleep(0.03)
                    with guard:
                        holding.remove(me)
            done.append(me)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(me,)) for me in range(7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(done) == list(range(7))
    assert 1 < most[0] <= limit  # several at once, never more than the limit
    assert all(not holders for holders in held_slots(observer, name, limit).values())


def test_a_try_with_every_slot_taken_holds_nothing(connect: Connect, observer: Observer) -> None:
    name = unique_name("semaphore")
    first, second, third = connect(), connect(), connect()
    with (
        pgsolo.semaphore(first, name, limit=2) as a,
        pgsolo.semaphore(second, name, limit=2) as b,
    ):
        assert a.acquired and b.acquired  # noqa: PT018 - the two slots, one each
        assert {a.slot, b.slot} == {0, 1}
        with pgsolo.semaphore(third, name, limit=2) as c:
            assert not c.acquired
            assert c.slot is None
            assert c.key is None
        assert observer.advisory(pid=third.info.backend_pid) == set()
        assert held_slots(observer, name, 2) == {
            a.slot: {first.info.backend_pid},
            b.slot: {second.info.backend_pid},
        }


def test_a_waiter_takes_whichever_slot_frees_first(connect: Connect, observer: Observer) -> None:
    name, limit = unique_name("semaphore"), 3
    holders = [pgsolo.semaphore(connect(), name, limit=limit) for _ in range(limit)]
    for holder in holders:
        assert holder.acquire()
    got: list[pgsolo.Semaphore] = []

    def waiter() -> None:
        held = pgsolo.semaphore(connect(), name, limit=limit, wait=30)
        assert held.acquire()
        got.append(held)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.6)  # several turns: the waiter waits on each slot in turn
    assert not got
    # The slot the waiter is not waiting on now may be any: free each in turn until one
    # frees the waiter; it must take it, whichever it is.
    freed = holders.pop(1)
    slot = freed.slot
    freed.release()
    thread.join(5)
    assert got, "the waiter did not take the slot that freed"
    assert got[0].slot == slot
    got[0].release()
    for holder in holders:
        holder.release()


def test_a_wait_that_runs_out_raises_and_holds_nothing(
    connect: Connect, observer: Observer
) -> None:
    name = unique_name("semaphore")
    with pgsolo.semaphore(connect(), name, limit=1) as held:
        assert held.acquired
        waiter = connect()
        started = time.monotonic()
        with pytest.raises(pgsolo.LockTimeoutError, match="no free slot of 1"):
            pgsolo.semaphore(waiter, name, limit=1, wait=0.6).acquire()
        assert time.monotonic() - started >= 0.6
        assert observer.advisory(pid=waiter.info.backend_pid) == set()
        assert observer.advisory(pid=waiter.info.backend_pid, granted=False) == set()


def test_a_waiter_sharing_a_connection_with_a_holder_waits_for_the_other_slots(
    connect: Connect, observer: Observer
) -> None:
    """Regression: a waiter whose connection already held one slot raised
    LockUnavailableError as soon as its turn came to that slot (PostgreSQL would grant it
    again on the same session), instead of waiting for the slots held elsewhere."""
    name, limit = unique_name("semaphore"), 2
    shared, other = connect(), connect()
    mine = pgsolo.semaphore(shared, name, limit=limit)
    theirs = pgsolo.semaphore(other, name, limit=limit)
    assert mine.acquire()
    assert theirs.acquire()
    # Every turn on each slot at least twice: a turn on the slot held here must be skipped.
    with pytest.raises(pgsolo.LockTimeoutError, match="no free slot of 2"):
        pgsolo.semaphore(shared, name, limit=limit, wait=4 * TURN_SECONDS).acquire()
    assert observer.advisory(pid=shared.info.backend_pid) == {mine.key}
    freeing = threading.Timer(0.3, theirs.release)
    freeing.start()
    second = pgsolo.semaphore(shared, name, limit=limit, wait=10)
    assert second.acquire()
    freeing.join()
    assert second.slot != mine.slot
    second.release()
    mine.release()


def test_a_wait_for_a_slot_when_this_connection_holds_all_of_them_is_refused(
    connect: Connect, observer: Observer
) -> None:
    name = unique_name("semaphore")
    conn = connect()
    held = [pgsolo.semaphore(conn, name, limit=2) for _ in range(2)]
    assert all(semaphore.acquire() for semaphore in held)
    assert not pgsolo.semaphore(conn, name, limit=2).acquire()  # a try: busy
    with pytest.raises(pgsolo.LockUnavailableError, match=r"every slot .* this connection"):
        pgsolo.semaphore(conn, name, limit=2, wait=30).acquire()
    assert observer.advisory(pid=conn.info.backend_pid) == {s.key for s in held}
    for semaphore in held:
        semaphore.release()


def test_a_slot_is_watched_and_fenced_as_a_session_lock(
    db: str, connect: Connect, observer: Observer
) -> None:
    name = unique_name("semaphore")
    seen: list[pgsolo.LockLostError] = []
    keep = pgsolo.Keep(interval=0.2, timeout=5, on_lost=seen.append)
    conn = connect()
    with (  # noqa: PT012 - the block's end, after the loss, is what raises
        pytest.raises(pgsolo.LockLostError),
        pgsolo.semaphore(conn, name, limit=2, keep=keep, fencing=True) as held,
    ):
        assert held.token is not None
        observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))
        deadline = time.monotonic() + 20
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.lost
        assert len(seen) == 1


def test_the_connection_goes_back_as_it_was_found(connect: Connect, observer: Observer) -> None:
    conn: psycopg.Connection[Any] = connect()
    name = unique_name("semaphore")
    for _ in range(2):
        with pgsolo.semaphore(conn, name, limit=2, wait=1) as held:
            assert held.acquired
        assert observer.advisory(pid=conn.info.backend_pid) == set()
        assert conn.autocommit
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


async def test_never_more_than_limit_holders_among_tasks(
    aconnect: AConnect, observer: Observer
) -> None:
    name, limit = unique_name("semaphore"), 2
    holding: list[int] = []
    most = 0
    conns = [await aconnect() for _ in range(5)]

    async def worker(me: int) -> None:
        nonlocal most
        for _ in range(3):
            async with pgsolo.semaphore(conns[me], name, limit=limit, wait=30) as held:
                assert held.acquired
                holding.append(me)
                most = max(most, len(holding))
                await asyncio.sleep(0.03)
                holding.remove(me)

    await asyncio.wait_for(asyncio.gather(*(worker(me) for me in range(5))), 60)
    assert most == limit
    assert all(not holders for holders in held_slots(observer, name, limit).values())


async def test_a_cancelled_waiter_holds_nothing(aconnect: AConnect, observer: Observer) -> None:
    name = unique_name("semaphore")
    holder, waiter = await aconnect(), await aconnect()
    async with pgsolo.semaphore(holder, name, limit=1) as held:
        assert held.acquired

        async def wait_for_a_slot() -> None:
            async with pgsolo.semaphore(waiter, name, limit=1, wait=30):
                pytest.fail("two holders of a semaphore of one")

        task = asyncio.create_task(wait_for_a_slot())
        await asyncio.sleep(0.4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert observer.advisory(pid=waiter.info.backend_pid) == set()
        assert observer.advisory(pid=waiter.info.backend_pid, granted=False) == set()
        assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


def test_an_acquire_that_failed_leaves_nothing_to_release(
    connect: Connect, observer: Observer
) -> None:
    """Guards a semaphore whose failed acquire() kept the slot's lock it had not taken: the
    caller's release() in its finally then raised LockNotHeldError over the real error."""
    conn = connect()
    held = pgsolo.semaphore(conn, unique_name("semaphore"), limit=2, wait=5)
    observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))
    with pytest.raises(pgsolo.PgsoloError):
        held.acquire()
    assert not held.acquired
    assert held.slot is None
    held.release()  # nothing to give back, and nothing raised


def test_a_second_acquire_of_one_semaphore_object_is_refused(
    connect: Connect, observer: Observer
) -> None:
    """Guards a second acquire() of an object that held a slot: it took another slot and
    orphaned the first, held by the session until it ended (for good, on a pooled
    connection), so the semaphore had a slot less for everyone."""
    name, limit = unique_name("semaphore-twice"), 3
    conn = connect()
    holder = pgsolo.semaphore(conn, name, limit=limit)
    assert holder.acquire()
    first = holder.slot
    with pytest.raises(pgsolo.UsageError, match="already acquired"):
        holder.acquire()
    with pytest.raises(pgsolo.UsageError, match="already acquired"), holder:
        pass
    assert holder.slot == first  # the refusal let go of nothing
    assert {slot for slot, pids in held_slots(observer, name, limit).items() if pids} == {first}
    holder.release()
    assert all(not pids for pids in held_slots(observer, name, limit).values())


async def test_nested_blocks_of_one_async_semaphore_object_are_refused(
    aconnect: AConnect, observer: Observer
) -> None:
    name, limit = unique_name("semaphore-nested"), 2
    holder = pgsolo.semaphore(await aconnect(), name, limit=limit)
    async with holder:
        with pytest.raises(pgsolo.UsageError, match="already acquired"):
            async with holder:
                pass
        assert len([p for p in held_slots(observer, name, limit).values() if p]) == 1
    assert all(not pids for pids in held_slots(observer, name, limit).values())


def _interrupt_once(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[str]:
    """A KeyboardInterrupt, once, as ``cls.name`` is next called (a Ctrl-C lands at any
    line: here, on the way in or out of the slot's lock)."""
    original = getattr(cls, name)
    fired: list[str] = []

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(name)
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, interrupted)
    return fired


@pytest.mark.parametrize("ending", ["release", "with"])
def test_a_release_cut_short_keeps_the_slot_to_release_again(
    connect: Connect, observer: Observer, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Guards a Ctrl-C inside the slot's release (release(), or a with block's end) that
    left the slot held on the server while the semaphore forgot it: acquired was False,
    release() again did nothing, and the slot stayed taken for the connection's life."""
    conn = connect()
    name = unique_name("semaphore")
    semaphore = pgsolo.semaphore(conn, name, limit=1)
    assert semaphore.acquire()
    # Inside the slot lock's release, before its unlock is sent: the first step it takes.
    fired = _interrupt_once(monkeypatch, SessionLockCore, "quick_release")
    end = semaphore.release if ending == "release" else lambda: semaphore.__exit__(None, None, None)
    with pytest.raises(KeyboardInterrupt):
        end()
    assert fired
    # Whatever the interrupted release did, the semaphore says it (before: released on
    # the books, held on the server).
    held = held_slots(observer, name, 1)[0]
    assert semaphore.acquired == (held == {conn.info.backend_pid})
    if ending == "release":
        assert semaphore.acquired  # the unlock never went out
    semaphore.release()
    assert not semaphore.acquired
    assert held_slots(observer, name, 1) == {0: set()}
    assert pgsolo.semaphore(conn, name, limit=1).acquire()


def test_an_acquire_cut_short_after_the_grant_holds_nothing(
    connect: Connect, observer: Observer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards a Ctrl-C in a plain acquire() just after a slot was granted (only a with
    block let it go then): acquire() raised, the slot stayed held, and acquired said so
    with no slot to release."""
    conn = connect()
    name = unique_name("semaphore")
    semaphore = pgsolo.semaphore(conn, name, limit=2)
    fired: list[str] = []
    original = pgsolo.Lock.__enter__

    def granted_then_interrupted(self: Any) -> Any:
        entered = original(self)
        if not fired:
            fired.append("after the grant")
            raise KeyboardInterrupt
        return entered

    monkeypatch.setattr(pgsolo.Lock, "__enter__", granted_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        semaphore.acquire()
    assert fired
    assert not semaphore.acquired
    assert semaphore.slot is None
    assert observer.advisory(pid=conn.info.backend_pid) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_a_wait_for_a_slot_over_a_slow_sweep_ends_when_its_seconds_do() -> None:
    """Guards a wait that ran far past wait= (1 s became 6.6 s for 1024 slots at 3 ms a
    round trip): its deadline was set after the first sweep of tries, and every turn was
    followed by a full sweep more."""
    from pgsolo.locking import slot_attempts  # noqa: PLC0415

    started = time.monotonic()
    attempts = 0
    for _slot, _wait in slot_attempts(1024, 0.3):
        attempts += 1
        time.sleep(0.003)  # each try a round trip on a slow link
    assert attempts < 1024  # not even the first sweep: the wait was over before
    assert time.monotonic() - started < 0.3 + 0.1


def test_a_limited_jobs_wait_skips_the_slot_its_own_connection_holds(
    connect: Connect, observer: Observer
) -> None:
    """Guards run_job(limit=N, wait=S) on a connection that holds one of the slots
    through a semaphore: it raised LockUnavailableError ("already held on this
    connection") on its turn at that slot, where a semaphore waits for the others."""
    name = unique_name("semaphore")
    conn, other = connect(), connect()
    mine = pgsolo.semaphore(conn, name, limit=2)
    theirs = pgsolo.semaphore(other, name, limit=2)
    assert mine.acquire()
    assert theirs.acquire()
    for lifetime in ("xact", "session"):
        freeing = threading.Timer(0.3, theirs.release)
        freeing.start()
        result = pgsolo.run_job(
            conn,
            name,
            lambda c: "ran",
            limit=2,
            wait=10,
            lifetime=lifetime,  # type: ignore[arg-type]
        )
        freeing.join()
        assert (result.outcome, result.value) == ("completed", "ran")
        assert theirs.acquire()
    mine.release()
    theirs.release()
