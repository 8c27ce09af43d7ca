"""One connection shared by threads or tasks: pgsolo's book of what each connection holds.

PostgreSQL grants a key again to the session that holds it; pgsolo refuses a second
holder on the same connection (busy, or "already held on this connection"), keeps a
transaction it opened to the thread or task that opened it, and never lets a session
lock ride on an xact claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    IDLE,
    AConnect,
    Connect,
    Critical,
    assert_clean,
    backend_state,
    eventually,
    other_key,
    pid_of,
    run_threads,
)
from pgsolo import (
    ConnectionStateError,
    Key,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
)
from pgsolo.drivers._sync.psycopg_driver import PsycopgDriver
from pgsolo.locking import holdings

# -- sync connections ----------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_a_connection_dropped_after_its_locks_is_freed_at_once(
    dsn: str, connect: Connect, key: Key, lifetime: str
) -> None:
    """Guards against a reference cycle between a lock and the books it keeps its key in:
    a connection its caller let go of would live on, its server session and its locks
    with it, until Python's cycle collector happened to run."""
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    holder = connect()
    gc.disable()
    try:
        conn = psycopg.connect(dsn, autocommit=True)
        with make(conn, key) as lock:
            assert lock.acquired
        with make(holder, key) as held, make(conn, key) as busy:
            assert held.acquired
            assert not busy.acquired
        gone = weakref.ref(conn)
        del conn, lock, busy
        assert gone() is None
    finally:
        gc.enable()


def test_a_connection_dropped_with_its_session_lock_held_ends_its_session(
    dsn: str, observer: Any, key: Key
) -> None:
    """Regression: the books of a connection kept the lock that holds a key, and so its
    driver and the connection itself: a connection its caller dropped without releasing
    or closing lived on, and its server session kept the key, until the process ended.
    Without pgsolo, psycopg closes a connection nobody refers to, and the key goes."""

    def take_and_drop() -> weakref.ref[psycopg.Connection[Any]]:
        conn = psycopg.connect(dsn, autocommit=True)
        assert pgsolo.session_lock(conn, key).acquire()
        assert observer.holders(key) == {pid_of(conn)}
        return weakref.ref(conn)

    gone = take_and_drop()
    gc.collect()
    assert gone() is None
    eventually(lambda: observer.holders(key) == set(), "the dropped connection's key to go")


def test_second_thread_on_same_connection_is_refused(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    held = threading.Event()
    finish = threading.Event()
    first: dict[str, object] = {}

    def first_thread() -> None:
        lock = pgsolo.session_lock(conn, key)
        first["acquired"] = lock.acquire()
        held.set()
        assert finish.wait(DEADLINE)
        lock.release()

    thread = threading.Thread(target=first_thread, daemon=True)
    thread.start()
    try:
        assert held.wait(DEADLINE)
        assert first["acquired"] is True
        assert observer.holders(key) == {pid_of(conn)}

        # PostgreSQL itself would grant the key again to this session...
        k1, k2 = key.value  # type: ignore[misc]
        assert conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (k1, k2)).fetchone() == (True,)
        assert conn.execute("SELECT pg_advisory_unlock(%s, %s)", (k1, k2)).fetchone() == (True,)
        # ...but pgsolo refuses a second holder on the same connection.
        second = pgsolo.session_lock(conn, key)
        assert second.acquire() is False
        assert second.acquired is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, wait=5).acquire()
        assert not isinstance(raised.value, LockTimeoutError)
        assert raised.value.key == key
        assert "already held on this connection" in str(raised.value)
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired is False
        # The first thread's hold is untouched.
        assert observer.holders(key) == {pid_of(conn)}
        assert pgsolo.held_session_locks(conn) == [key]
    finally:
        finish.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_busy_answer_while_the_holder_runs_statements_on_the_shared_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    """The holder's work keeps the connection busy; a second thread still gets "busy"."""
    conn = connect()
    pid = pid_of(conn)
    held = threading.Event()

    def holder() -> None:
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            held.set()
            with contextlib.suppress(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(60)")  # the protected work, until cancelled

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert held.wait(DEADLINE)
        eventually(
            lambda: (backend_state(observer, pid) or ("", ""))[0] == "active",
            "the holder's statement to run",
        )
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.ACTIVE
        assert pgsolo.session_lock(conn, key).acquire() is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, wait=5).acquire()
        assert not isinstance(raised.value, LockTimeoutError)
        assert observer.holders(key) == {pid}
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.ACTIVE
    finally:
        observer.conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert observer.holders(key) == set()


def test_threads_sharing_one_connection_never_hold_together(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    n_threads = 4
    start = threading.Barrier(n_threads)
    critical = Critical()
    in_flight: list[ConnectionStateError] = []

    def worker() -> None:
        start.wait(DEADLINE)
        for _ in range(15):
            try:
                with pgsolo.session_lock(conn, key) as lock:
                    if lock.acquired:
                        critical.enter()
            except ConnectionStateError as exc:
                # A new attempt that meets another thread's unlock on the wire is refused
                # rather than guessed at; it holds nothing.
                in_flight.append(exc)

    assert run_threads([worker] * n_threads) == []
    assert critical.max_inside == 1
    assert critical.entries >= 1
    assert all("running another statement" in str(e) for e in in_flight)
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_two_threads_letting_go_of_a_reentrant_key_at_once_leave_it_unlocked(
    connect: Connect, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards against a key left held by the session with nothing on the books: two
    threads released the two holds of one re-entrant key at once, each asked whether
    its hold was the last before either had dropped its own, both heard no, and neither
    sent the unlock."""
    conn = connect()
    first = pgsolo.session_lock(conn, key, reentrant=True)
    second = pgsolo.session_lock(conn, key, reentrant=True)
    assert first.acquire()
    assert second.acquire()
    both_dropping = threading.Barrier(2)
    drop = holdings.drop

    def drop_with_the_other(held: holdings.Held, holder: object) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            both_dropping.wait(1.0)  # until the other thread drops its hold too, if it does
        drop(held, holder)

    monkeypatch.setattr(holdings, "drop", drop_with_the_other)
    assert run_threads([first.release, second.release]) == []
    assert not first.acquired
    assert not second.acquired
    assert observer.holders(key) == set()
    assert_clean(conn, observer)


def test_threads_sharing_one_connection_cannot_both_enter_an_xact_block(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A transaction pgsolo opened is tracked like a session lock: a second thread on the
    same connection would otherwise join it and PostgreSQL would grant the key again."""
    conn = connect()
    with pgsolo.xact_lock(conn, key) as first:
        assert first.acquired
        outcome: list[object] = []

        def second() -> None:
            try:
                outcome.append(pgsolo.xact_lock(conn, key).acquire())
            except pgsolo.PgsoloError as exc:
                outcome.append(exc)
            try:
                with pgsolo.xact_lock(conn, key, wait=5):
                    outcome.append("entered")
            except pgsolo.LockUnavailableError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=second)
        worker.start()
        worker.join(30)
        assert not worker.is_alive()
    assert outcome[0] is False
    assert isinstance(outcome[1], pgsolo.LockUnavailableError)
    assert "already held on this connection" in str(outcome[1])
    assert observer.holders(key) == set()
    # Once the block is over the key is free for the connection again.
    with pgsolo.xact_lock(conn, key) as again:
        assert again.acquired


def test_reentrant_session_lock_does_not_ride_on_an_xact_claim(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A key taken by xact_lock is not a session hold: "re-entering" it as a session lock
    would send no SQL and leave a session lock that vanishes at COMMIT."""
    conn = connect()
    pid = pid_of(conn)
    with pgsolo.xact_lock(conn, key) as xact:
        assert xact.acquired
        session = pgsolo.session_lock(conn, key, reentrant=True)
        assert session.acquire() is False  # busy: held by this connection, not re-entered
        assert session.acquired is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, reentrant=True, wait=5).acquire()
        assert "already held on this connection" in str(raised.value)
        assert pgsolo.held_session_locks(conn) == []
        assert observer.holders(key) == {pid}
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    with pytest.raises(LockNotHeldError):
        session.release()
    # The key is free again, for this connection as a session lock too.
    again = pgsolo.session_lock(conn, key, reentrant=True)
    assert again.acquire() is True
    assert observer.holders(key) == {pid}
    again.release()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_second_thread_cannot_join_an_xact_block_for_another_key(
    connect: Connect, observer: Any, key: Key
) -> None:
    """Thread A is inside ``with xact_lock(conn, k1)`` (pgsolo opened the transaction);
    thread B's ``with xact_lock(conn, k2)`` would join A's transaction and be committed
    by A: refused. A's block then ends normally."""
    conn = connect()
    pid = pid_of(conn)
    key2 = other_key(key)
    inside = threading.Event()
    finish = threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            seen["a_acquired"] = lock.acquired
            inside.set()
            assert finish.wait(DEADLINE)
            seen["a_select"] = conn.execute("SELECT 1").fetchone()
        seen["a_status"] = conn.info.transaction_status

    def thread_b() -> None:
        assert inside.wait(DEADLINE)
        try:
            try:
                with pgsolo.xact_lock(conn, key2) as lock:
                    seen["b_entered"] = lock.acquired
            except ConnectionStateError as exc:
                seen["b_context"] = exc
            seen["b_holders"] = observer.holders(key2)
            try:
                seen["b_plain"] = pgsolo.xact_lock(conn, key2).acquire()
            except ConnectionStateError as exc:
                seen["b_plain"] = exc
        finally:
            finish.set()

    assert run_threads([thread_a, thread_b]) == []
    assert seen["a_acquired"] is True
    assert "b_entered" not in seen
    assert isinstance(seen["b_context"], ConnectionStateError)
    assert "another thread or task" in str(seen["b_context"])
    assert isinstance(seen["b_plain"], ConnectionStateError)
    assert seen["b_holders"] == set()
    assert seen["a_select"] == (1,)
    assert seen["a_status"] is IDLE
    assert observer.holders(key) == set()
    assert observer.holders(key2) == set()
    assert observer.advisory(pid=pid) == set()
    # Once A's block is over, the connection is free for any thread.
    with pgsolo.xact_lock(conn, key2) as lock:
        assert lock.acquired


# -- async connections ---------------------------------------------------------------------


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
        await asyncio.wait_for(pgsolo.session_lock(conn, key, wait=30).acquire(), DEADLINE)
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

    outcomes = await asyncio.wait_for(
        asyncio.gather(job(1), job(2), return_exceptions=True), DEADLINE
    )
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

    await asyncio.wait_for(asyncio.gather(job(), job()), DEADLINE)
    assert most_inside == 1


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


async def test_reentrant_never_joins_a_hold_whose_unlock_is_in_flight(
    aconnect: AConnect, connect: Any, observer: Any, key: Key
) -> None:
    """Guards mutual exclusion on a shared connection: task B re-entered the key while
    task A's release, the last hold's, was sending its unlock; B then believed it held a
    key the server had let go (another session took it), and B's release raised
    LockNotHeldError. The same as for the first acquisition: B is busy meanwhile."""
    conn, other = await aconnect(), connect()
    first = pgsolo.session_lock(conn, key, reentrant=True)
    assert await first.acquire()
    second = pgsolo.session_lock(conn, key, reentrant=True)
    # The second starts while the first's unlock is on its way to the server.
    _, joined = await asyncio.gather(first.release(), second.acquire())
    assert joined is False
    assert observer.holders(key) == set()
    for _ in range(20):  # and never, however the two interleave
        assert await first.acquire()

        async def reenter() -> bool:
            await asyncio.sleep(0)
            again = pgsolo.session_lock(conn, key, reentrant=True)
            if not await again.acquire():
                return False
            held_elsewhere = pgsolo.session_lock(other, key)
            assert not held_elsewhere.acquire(), "another session took a key held here"
            await again.release()
            return True

        await asyncio.gather(first.release(), reenter())
        assert observer.holders(key) == set()
    await assert_clean(conn, observer)


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
            await asyncio.wait_for(finish_a.wait(), DEADLINE)
            cur = await conn.execute("SELECT 1")
            seen["a_select"] = await cur.fetchone()
        seen["a_status"] = conn.info.transaction_status

    async def task_b() -> None:
        await asyncio.wait_for(inside.wait(), DEADLINE)
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

    await asyncio.wait_for(asyncio.gather(task_a(), task_b()), DEADLINE * 2)
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


def _paused_before_sending(
    monkeypatch: pytest.MonkeyPatch, thread: str, needle: str
) -> tuple[threading.Event, threading.Event]:
    """Holds the round trip of ``thread``'s whose statements contain ``needle`` just
    before it goes out: (reached, go on)."""
    original = PsycopgDriver.fetch_value
    reached, go_on = threading.Event(), threading.Event()

    def fetch_value(driver: PsycopgDriver, statements: Any, *args: Any) -> object:
        mine = threading.current_thread().name == thread and not reached.is_set()
        if mine and any(needle in statement for statement in statements):
            reached.set()
            assert go_on.wait(DEADLINE)
        return original(driver, statements, *args)

    monkeypatch.setattr(PsycopgDriver, "fetch_value", fetch_value)
    return reached, go_on


def _run_named(**targets: Callable[[], None]) -> None:
    """Run each target in a thread of its name (``thread_a`` as "thread-a") to its end."""
    threads = [
        threading.Thread(target=target, name=name.replace("_", "-"))
        for name, target in targets.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive()


@pytest.mark.parametrize("second", ["xact", "session-try", "session-wait"])
def test_a_second_thread_that_read_the_connection_idle_cannot_join_the_first_ones_transaction(
    connect: Connect, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """Thread A claimed its key and is about to send the BEGIN of pgsolo's transaction,
    so thread B still reads the connection idle. Before: B's xact lock took A's
    transaction over as its own (both sent BEGIN into one transaction, and the first
    COMMIT released the other's lock: two holders of one key at once), and B's session
    wait sent its own BEGIN ... COMMIT into A's transaction. Now B is refused."""
    conn = connect()
    pid = pid_of(conn)
    key2 = other_key(key)
    reached, go_on = _paused_before_sending(monkeypatch, "thread-a", "advisory_xact_lock")
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            seen["a_acquired"] = lock.acquired
            seen["a_holders"] = observer.holders(key)
        seen["a_status"] = conn.info.transaction_status

    def thread_b() -> None:
        try:
            assert reached.wait(DEADLINE)
            assert conn.info.transaction_status is IDLE  # what B reads
            make = pgsolo.xact_lock if second == "xact" else pgsolo.session_lock
            wait = 5.0 if second == "session-wait" else None
            try:
                with make(conn, key2, wait=wait) as lock:  # type: ignore[operator]
                    seen["b_entered"] = lock.acquired
            except ConnectionStateError as exc:
                seen["b_refused"] = exc
        finally:
            go_on.set()

    _run_named(thread_a=thread_a, thread_b=thread_b)
    assert "b_entered" not in seen
    assert "another thread or task" in str(seen["b_refused"])
    assert seen["a_acquired"] is True
    assert seen["a_holders"] == {pid}
    assert seen["a_status"] is IDLE
    assert observer.advisory(pid=pid) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_a_session_lock_released_as_another_threads_transaction_ends_is_released(
    connect: Connect, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread B holds a session lock; thread A's xact block (pgsolo's transaction) is
    open as B releases, and commits just before B's unlock goes out. Before: B read the
    transaction open and sent its unlock in a savepoint of it, which then ran outside
    any transaction and failed (InvalidSavepointSpecification / NoActiveSqlTransaction),
    leaving the key held and on the books. Now the unlock goes alone."""
    conn = connect()
    pid = pid_of(conn)
    key2 = other_key(key)
    session = pgsolo.session_lock(conn, key2)
    assert session.acquire() is True
    reached, go_on = _paused_before_sending(monkeypatch, "thread-b", "pg_advisory_unlock")
    a_inside, a_done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            seen["a_acquired"] = lock.acquired
            a_inside.set()
            assert reached.wait(DEADLINE)  # B read the transaction open
        a_done.set()
        go_on.set()

    def thread_b() -> None:
        assert a_inside.wait(DEADLINE)
        try:
            session.release()
            seen["b_released"] = True
        except pgsolo.PgsoloError as exc:
            seen["b_failed"] = exc
        finally:
            go_on.set()

    _run_named(thread_a=thread_a, thread_b=thread_b)
    assert seen.get("b_released") is True, seen.get("b_failed")
    assert seen["a_acquired"] is True
    assert session.acquired is False
    assert observer.advisory(pid=pid) == set()
    assert pgsolo.held_session_locks(conn) == []
    assert conn.info.transaction_status is IDLE
