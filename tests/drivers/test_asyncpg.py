"""pgsolo on asyncpg connections, against a real server: plain connections and ones
acquired from an ``asyncpg.Pool``, the transaction rule (a lock joins
``conn.transaction()``), the pool's reset on release, cancellation, and the statements
the adapter sends through COPY (one round trip per call)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
import warnings
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import pgsolo
from _drivers import asyncpg_options
from _support import DEADLINE, WORK, activity, aeventually, terminate, unique_name
from pgsolo import (
    Key,
    LockLostError,
    LockTimeoutError,
    TransactionFailedError,
    UnsafeConnectionError,
    UnsupportedConnectionError,
    UsageError,
    sql,
    testing,
)
from pgsolo.drivers import TxStatus, adapt
from pgsolo.drivers import _asyncpg_private as private

asyncpg = pytest.importorskip("asyncpg")


@pytest.fixture
async def apg(db: str) -> AsyncIterator[Callable[..., Any]]:
    """Open asyncpg connections to the test database; all closed afterwards."""
    opened: list[Any] = []

    async def _open(**kwargs: Any) -> Any:
        conn = await asyncpg.connect(db, **kwargs)
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        await conn.close()


@pytest.fixture
async def pool(db: str) -> AsyncIterator[Any]:
    async with asyncpg.create_pool(db, min_size=1, max_size=1) as created:
        yield created


async def rows_of(conn: Any, job: str) -> list[str]:
    rows = await conn.fetch(f"SELECT note FROM {WORK} WHERE job = $1 ORDER BY note", job)
    return [r[0] for r in rows]


# - the adapter and the values it reads -


async def test_values_come_back_as_psycopg_reads_them(apg: Any) -> None:
    """The COPY round trip reads each type pgsolo's statements return as psycopg would."""
    driver = adapt(await apg())
    assert driver.is_async
    fetch = driver.fetch_value  # type: ignore[union-attr]
    assert await fetch(["SELECT true"]) is True
    assert await fetch(["SELECT false"]) is False
    assert await fetch(["SELECT 9223372036854775807::bigint"]) == 2**63 - 1
    assert await fetch(["SELECT NULL::int"]) is None
    assert await fetch(["SELECT convert_to(E'gr\\u00fc\\u00dfe\\t\\\\\\n', 'UTF8')"]) == (
        "grüße\t\\\n".encode()
    )
    assert await fetch(["SELECT E'a\\tb\\\\c'"]) == "a\tb\\c"
    # The last SELECT's value; statements after it go in the same message.
    assert await fetch(["SELECT 1", "BEGIN", "SELECT 2", "SET LOCAL lock_timeout = '5s'"]) == 2
    assert await fetch(["COMMIT"]) is None


async def test_a_truth_value_comes_back_by_row_count_and_its_statement_runs_once(
    apg: Any, key: Key
) -> None:
    """Guards the row-count path of a statement marked ``sql.Truth`` (the lock statements):
    each of true, false and NULL comes back as itself, a lock function in it runs once
    (locked once, unlocked once), and statements before it go in the same message."""
    conn, other = await apg(), await apg()
    fetch = adapt(conn).fetch_value  # type: ignore[union-attr]
    assert await fetch([sql.Truth("SELECT true")]) is True
    assert await fetch([sql.Truth("SELECT false")]) is False
    assert await fetch([sql.Truth("SELECT NULL::boolean")]) is None
    take = sql.acquire(key, "session", wait=False, shared=False)
    assert isinstance(take, sql.Truth)
    assert await fetch(["SELECT 1", take]) is True
    assert await adapt(other).fetch_value([take]) is False  # type: ignore[union-attr]
    release = sql.unlock(key, shared=False)
    assert await fetch([release]) is True
    assert await fetch([release]) is False  # held once: the first unlock released it
    wait = sql.acquire(key, "session", wait=True, shared=False)
    assert isinstance(wait, sql.Truth)
    assert await fetch([wait]) is True
    assert await fetch([release, release]) is False  # the wait took it once, too
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        == 0
    )
    # Not a truth: a fencing token is a number, read through COPY.
    assert not isinstance(
        sql.acquire(key, "session", wait=False, shared=False, fencing=True), sql.Truth
    )


PGSOLOS_PREPARED = (
    "SELECT statement FROM pg_prepared_statements"
    " WHERE statement LIKE 'SELECT pg_%advisory%' ORDER BY 1"
)


async def _pgsolos_prepared(conn: Any) -> list[tuple[str]]:
    # A new text each time: asyncpg's own cache of the question breaks at DEALLOCATE ALL.
    rows = await conn.fetch(f"{PGSOLOS_PREPARED} -- {unique_name('ask')}")
    return [tuple(r) for r in rows]


async def test_a_session_locks_calls_are_prepared_after_a_few_runs_and_survive_a_deallocate(
    apg: Any, observer: Any, key: Key
) -> None:
    """Guards the prepared path of a session lock's try and unlock on asyncpg
    (``_asyncpg._lock_call``): as written for the first ``PREPARE_AFTER`` runs, then by
    name; a caller's ``DEALLOCATE ALL`` between a lock and its release, or between two
    locks, loses nothing; none where the caller turned asyncpg's statement cache off."""
    from pgsolo.drivers._asyncpg import PREPARE_AFTER  # noqa: PLC0415 - the adapter's

    conn, other = await apg(), await apg()

    async def lock_and_release(on: Any) -> None:
        async with pgsolo.session_lock(on, key) as lock:
            assert lock.acquired
            async with pgsolo.session_lock(other, key) as busy:
                assert not busy.acquired
        assert observer.holders(key) == set()

    for _ in range(PREPARE_AFTER):
        await lock_and_release(conn)
    assert await _pgsolos_prepared(conn) == []
    await lock_and_release(conn)
    prepared = await _pgsolos_prepared(conn)
    assert prepared == [
        ("SELECT pg_advisory_unlock($1::integer, $2::integer)",),
        ("SELECT pg_try_advisory_lock($1::integer, $2::integer)",),
    ]
    lock = pgsolo.session_lock(conn, key)
    assert await lock.acquire()
    await conn.execute("DEALLOCATE ALL")
    await lock.release()  # its statement is gone: sent as written
    assert observer.holders(key) == set()
    await conn.execute("DEALLOCATE ALL")
    for _ in range(PREPARE_AFTER + 1):
        await lock_and_release(conn)  # as written, then prepared again
    assert await _pgsolos_prepared(conn) == prepared
    # Run by name once more, a call is ready to be sent alone (Checkout.send): each one
    # whose statement is gone is sent again, as written (Checkout.resend).
    await lock_and_release(conn)
    await conn.execute("DEALLOCATE ALL")
    await lock_and_release(conn)  # the try's
    for _ in range(PREPARE_AFTER + 2):
        await lock_and_release(conn)
    lock = pgsolo.session_lock(conn, key)
    assert await lock.acquire()
    await conn.execute("DEALLOCATE ALL")
    await lock.release()  # the unlock's
    assert observer.holders(key) == set()
    await lock_and_release(conn)

    uncached = await apg(statement_cache_size=0)
    for _ in range(PREPARE_AFTER + 2):
        await lock_and_release(uncached)
    assert await _pgsolos_prepared(uncached) == []


async def test_a_connection_with_prepared_lock_calls_is_not_kept_alive(
    db: str, apg: Any, observer: Any, key: Key
) -> None:
    """Regression: pgsolo kept asyncpg's ``PreparedStatement`` of each prepared lock call,
    which refers to its connection, in books kept by connection: a connection that had
    taken a few session locks lived on once its caller dropped it, its server session and
    any key it held with it, until the process ended. The calls stay prepared, and
    usable, once the garbage collector has been through."""
    from pgsolo.drivers._asyncpg import PREPARE_AFTER  # noqa: PLC0415 - the adapter's

    conn = await apg()
    for _ in range(PREPARE_AFTER + 1):
        async with pgsolo.session_lock(conn, key):
            pass
    gc.collect()
    for _ in range(2):  # asyncpg closes what it let go of at the next statement
        async with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
    assert len(await _pgsolos_prepared(conn)) == 2

    async def take_and_drop() -> weakref.ref[Any]:
        dropped = await asyncpg.connect(db)
        for _ in range(PREPARE_AFTER + 1):
            async with pgsolo.session_lock(dropped, key):
                pass
        assert await pgsolo.session_lock(dropped, key).acquire()
        return weakref.ref(dropped)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # asyncpg's: not closed
        gone = await take_and_drop()
        gc.collect()
    assert gone() is None
    await aeventually(lambda: observer.holders(key) == set(), "the dropped session's key to go")


async def test_a_pooled_connections_prepared_lock_calls_serve_every_checkout(
    pool: Any, apg: Any, observer: Any, key: Key
) -> None:
    """Guards the prepared lock calls across a pool's checkouts of one connection: the
    server session keeps them, and asyncpg's ``PreparedStatement`` refuses to run once
    the pool took the connection back (every session lock of a later checkout raised
    InterfaceError, from the third checkout on)."""
    from pgsolo.drivers._asyncpg import PREPARE_AFTER  # noqa: PLC0415 - the adapter's

    other = await apg()
    for _ in range(4):
        async with pool.acquire() as conn:
            for _ in range(PREPARE_AFTER + 1):
                async with pgsolo.session_lock(conn, key) as lock:
                    assert lock.acquired
                    async with pgsolo.session_lock(other, key) as busy:
                        assert not busy.acquired
                assert observer.holders(key) == set()
            assert len(await _pgsolos_prepared(conn)) == 2


async def test_unsupported_objects_are_refused_by_name(apg: Any, pool: Any) -> None:
    record = await (await apg()).fetchrow("SELECT 1 AS a")
    with pytest.raises(UnsupportedConnectionError, match=r"supported|takes"):
        pgsolo.xact_lock(record, "k")
    with pytest.raises(UnsupportedConnectionError, match="Pool is not a connection"):
        pgsolo.session_lock(pool, "k")
    async with pool.acquire() as conn:
        proxy = conn
    with pytest.raises(UnsupportedConnectionError, match="released back to its pool"):
        pgsolo.session_lock(proxy, "k")


async def test_server_info_and_addresses(apg: Any) -> None:
    conn = await apg()
    driver = adapt(conn)
    info = driver.server_info()
    assert info.database
    assert info.user
    assert driver.backend_pid() == conn.get_server_pid()
    assert driver.transaction_status() is TxStatus.IDLE
    async with conn.transaction():
        assert driver.transaction_status() is TxStatus.INTRANS
    await conn.close()
    assert driver.is_closed()
    assert driver.transaction_status() is TxStatus.UNKNOWN


# - try, wait, busy, timeout -


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_try_wait_busy_and_timeout(apg: Any, observer: Any, key: Key, lifetime: str) -> None:
    a, b = await apg(), await apg()
    take = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
    async with take(a, key) as lock:
        assert lock.acquired
        assert observer.holders(key) == {a.get_server_pid()}
        async with take(b, key) as busy:
            assert not busy.acquired
        with pytest.raises(LockTimeoutError):
            async with take(b, key, wait=0.2):
                pass
        assert not b.is_in_transaction()
    assert observer.holders(key) == set()
    async with take(b, key, wait=5) as lock:
        assert lock.acquired
        assert observer.holders(key) == {b.get_server_pid()}
    assert observer.holders(key) == set()


async def test_shared_locks_share(apg: Any, observer: Any, key: Key) -> None:
    a, b, c = await apg(), await apg(), await apg()
    async with (
        pgsolo.session_lock(a, key, shared=True) as one,
        pgsolo.session_lock(b, key, shared=True) as two,
    ):
        assert one.acquired
        assert two.acquired
        assert not await pgsolo.session_lock(c, key).acquire()
    assert observer.holders(key) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_fencing_tokens_increase(apg: Any, key: Key, lifetime: str) -> None:
    conn = await apg()
    take = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
    tokens = []
    for wait in (None, 5):
        async with take(conn, key, wait=wait, fencing=True) as lock:
            assert lock.acquired
            tokens.append(lock.token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens[0] < tokens[1]


async def test_excludes_psycopg_holders_both_ways(
    apg: Any, aconnect: Any, observer: Any, key: Key
) -> None:
    """asyncpg and psycopg sessions contend for the same key on the server."""
    a, p = await apg(), await aconnect()
    async with pgsolo.session_lock(p, key):
        assert not await pgsolo.session_lock(a, key).acquire()
    async with pgsolo.xact_lock(a, key), pgsolo.xact_lock(p, key) as busy:
        assert not busy.acquired
    assert observer.holders(key) == set()


# - the transaction rule -


async def test_lock_joins_conn_transaction_and_its_rollback_undoes_the_rows(
    apg: Any, observer: Any, key: Key
) -> None:
    """Inside conn.transaction() the lock is the caller's: held until that transaction
    ends, and rolling it back undoes the block's rows (pgsolo commits nothing)."""
    conn = await apg()
    job = unique_name("apg-join")

    async def block() -> None:
        async with conn.transaction():
            async with pgsolo.xact_lock(conn, key, wait=5) as lock:
                assert lock.acquired
                await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES ($1, 'x')", job)
            assert observer.holders(key) == {conn.get_server_pid()}  # still the caller's
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        await block()
    assert observer.holders(key) == set()
    assert await rows_of(conn, job) == []


async def test_plain_acquire_without_transaction_is_refused(apg: Any, key: Key) -> None:
    conn = await apg()
    with pytest.raises(pgsolo.ConnectionStateError):
        await pgsolo.xact_lock(conn, key).acquire()
    async with conn.transaction():
        assert await pgsolo.xact_lock(conn, key).acquire()


async def test_conn_transaction_works_around_pgsolo_blocks(
    apg: Any, observer: Any, key: Key
) -> None:
    """asyncpg's own transaction books stay true: conn.transaction() after pgsolo's own
    transaction, and pgsolo's savepoints inside nested conn.transaction() blocks."""
    conn = await apg()
    job = unique_name("apg-books")
    async with pgsolo.xact_lock(conn, key):
        await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES ($1, 'own')", job)
    assert not conn.is_in_transaction()
    async with conn.transaction(), conn.transaction():  # the second one is a savepoint
        async with pgsolo.session_lock(conn, key, wait=5) as lock:
            assert lock.acquired
        async with pgsolo.xact_lock(conn, key, wait=5):
            await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES ($1, 'nested')", job)
    assert observer.holders(key) == set()
    assert await rows_of(conn, job) == ["nested", "own"]


async def test_swallowed_failure_in_own_transaction_commits_nothing(
    apg: Any, observer: Any, key: Key
) -> None:
    """asyncpg cannot tell an aborted transaction without a round trip: the COMMIT's
    answer tells, and the block's rows are not committed."""
    conn = await apg()
    job = unique_name("apg-failed")

    async def block() -> None:
        async with pgsolo.xact_lock(conn, key):
            await conn.execute(f"INSERT INTO {WORK} (job, note) VALUES ($1, 'x')", job)
            with pytest.raises(asyncpg.DivisionByZeroError):
                await conn.execute("SELECT 1/0")

    with pytest.raises(TransactionFailedError):
        await block()
    assert not conn.is_in_transaction()
    assert await rows_of(conn, job) == []
    assert observer.holders(key) == set()


# - pools -


async def test_pooled_connection_reset_loses_the_session_lock(
    pool: Any, observer: Any, key: Key
) -> None:
    """Pool.release() runs pg_advisory_unlock_all(): releasing the lock afterwards says it
    was lost, and the next checkout of the same connection can take the key again."""
    async with pool.acquire() as conn:
        lock, stale = pgsolo.session_lock(conn, key), pgsolo.session_lock(conn, key)
        assert await lock.acquire()
        pid = conn.get_server_pid()
    assert observer.holders(key) == set()
    with pytest.raises(LockLostError):
        await lock.release()
    async with pool.acquire() as again:
        assert again.get_server_pid() == pid  # the same connection (max_size=1)
        async with pgsolo.session_lock(again, key) as second:
            assert second.acquired
        # A lock of the earlier checkout cannot touch this one's books.
        third = pgsolo.session_lock(again, key)
        assert await third.acquire()
        with pytest.raises(UnsupportedConnectionError, match="released back to its pool"):
            pgsolo.session_lock(conn, key)
        with pytest.raises(pgsolo.LockNotHeldError):
            await stale.release()
        assert not await pgsolo.session_lock(again, key).acquire()  # still held here
        await third.release()


async def test_wait_is_bounded_on_a_pooled_connection(pool: Any, apg: Any, key: Key) -> None:
    """RESET ALL wipes a session-level lock_timeout: pgsolo's bound is SET LOCAL."""
    holder = await apg()
    assert await pgsolo.session_lock(holder, key).acquire()
    async with pool.acquire() as conn:
        with pytest.raises(LockTimeoutError):
            await pgsolo.session_lock(conn, key, wait=0.2).acquire()
        with pytest.raises(LockTimeoutError):
            async with pgsolo.xact_lock(conn, key, wait=0.2):
                pass
        assert await conn.fetchval("SHOW lock_timeout") == "0"


@pytest.mark.parametrize("ending", ["completed", "raised"])
async def test_a_block_whose_connection_went_back_to_its_pool_ends_nothing_of_the_next_borrowers(
    pool: Any, observer: Any, key: Key, ending: str
) -> None:
    """Guards the next borrower of a connection released inside ``async with
    xact_lock(conn)``: the block's end sent its COMMIT (or ROLLBACK) on the connection,
    and so committed (or rolled back) the borrower's transaction, asyncpg's books saying
    none was open. Nothing is sent; a block that completed learns nothing of it committed."""
    job = f"released-{uuid.uuid4().hex[:8]}"
    conn = await pool.acquire()
    handed: list[Any] = []

    async def the_block() -> None:
        async with pgsolo.xact_lock(conn, key):
            await conn.execute(f"INSERT INTO {WORK} VALUES ($1, 'the block')", job)
            await pool.release(conn)
            borrower = await pool.acquire()  # the same server session: a pool of one
            transaction = borrower.transaction()
            await transaction.start()
            await borrower.execute(f"INSERT INTO {WORK} VALUES ($1, 'the borrower')", job)
            handed.append((borrower, transaction))
            if ending == "raised":
                raise RuntimeError("the block failed")

    with pytest.raises(pgsolo.LockLostError if ending == "completed" else RuntimeError):
        await the_block()
    ((borrower, transaction),) = handed
    assert borrower.is_in_transaction()
    assert await rows_of(borrower, job) == ["the borrower"]  # its own, still uncommitted
    assert observer.conn.execute(
        f"SELECT count(*) FROM {WORK} WHERE job = %s", (job,)
    ).fetchone() == (0,)
    await transaction.rollback()
    await pool.release(borrower)
    assert observer.holders(key) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_wait_on_a_connection_released_to_its_pool_is_database_unavailable(
    pool: Any, apg: Any, observer: Any, key: Key, lifetime: str
) -> None:
    """Regression: ``pool.release()`` of a connection whose lock waits makes asyncpg
    abort it, and pgsolo's own error path then read the aborted connection and raised
    ``AttributeError: 'NoneType' object has no attribute 'is_in_transaction'``. Now it
    is :class:`~pgsolo.DatabaseUnavailableError` with asyncpg's error as its cause."""
    holder = await apg()
    assert await pgsolo.session_lock(holder, key).acquire()
    take = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
    conn = await pool.acquire()
    pid = conn.get_server_pid()

    async def wait_for_it() -> None:
        async with take(conn, key, wait=60):
            pass

    task = asyncio.create_task(wait_for_it())
    await aeventually(lambda: observer.waiters(key) == {pid}, "waiting")
    with contextlib.suppress(asyncpg.InterfaceError):  # asyncpg: "operation in progress"
        await pool.release(conn, timeout=1)
    with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
        await task
    assert isinstance(raised.value.__cause__, asyncpg.InterfaceError | asyncpg.PostgresError)
    assert "NoneType" not in str(raised.value)
    # asyncpg closed its socket; the backend notices once the wait ends and it answers.
    await holder.execute("SELECT pg_advisory_unlock_all()")
    await aeventually(lambda: observer.waiters(key) | observer.holders(key) == set(), "gone")
    async with (
        pool.acquire() as again,  # the pool hands out a working connection
        pgsolo.session_lock(again, pgsolo.Key(key.value[0] + 1)) as lock,
    ):
        assert lock.acquired


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_statement_timeout_shorter_than_the_wait_is_a_lock_timeout(
    apg: Any, observer: Any, key: Key, lifetime: str
) -> None:
    """Regression: a wait cut short by the connection's own ``statement_timeout`` raised
    asyncpg's raw ``QueryCanceledError``; now :class:`LockTimeoutError` naming it."""
    holder = await apg()
    assert await pgsolo.session_lock(holder, key).acquire()
    waiter = await apg(server_settings={"statement_timeout": "300ms"})
    take = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock

    async def wait_for_it() -> None:
        async with take(waiter, key, wait=30):
            pass

    with pytest.raises(LockTimeoutError, match="statement_timeout") as raised:
        await wait_for_it()
    assert isinstance(raised.value.__cause__, asyncpg.QueryCanceledError)
    assert not waiter.is_in_transaction()
    assert observer.advisory(pid=waiter.get_server_pid()) == set()
    assert await waiter.fetchval("SHOW statement_timeout") == "300ms"


# - cancellation -


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_cancelled_wait_leaves_nothing(
    apg: Any, observer: Any, key: Key, lifetime: str
) -> None:
    holder, waiter = await apg(), await apg()
    assert await pgsolo.session_lock(holder, key).acquire()
    take = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock

    async def wait_for_it() -> None:
        async with take(waiter, key, wait=60):
            pass

    task = asyncio.create_task(wait_for_it())
    await aeventually(lambda: observer.waiters(key) == {waiter.get_server_pid()}, "waiting")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await aeventually(lambda: observer.waiters(key) == set(), "no wait left")
    await holder.execute("SELECT pg_advisory_unlock_all()")
    await asyncio.sleep(0.1)
    assert observer.holders(key) == set()
    assert not waiter.is_in_transaction()
    assert await waiter.fetchval("SELECT 1") == 1


@pytest.mark.parametrize("call", ["try", "release"])
async def test_a_guarded_call_cancelled_on_the_wire_leaves_nothing_held(
    pgsolo_relay: Any, observer: Any, key: Key, call: str
) -> None:
    """Behind a relay (to the server, a proxy), a session lock's try and unlock run only on
    the backend the route was checked on (guarded by its pid), and are sent alone, as
    asyncpg's own round trip, outside pgsolo's shield. Guards that a task cancelled while
    either is held back on the wire ends cancelled, whatever the server did with the call
    (asyncpg's cancel request, held back too, reaches the server before or after it):
    nothing held, no transaction, and the connection usable."""
    conn = await asyncpg.connect(**asyncpg_options(pgsolo_relay.dsn))
    try:
        pid = conn.get_server_pid()
        for round_ in range(4):
            lock = pgsolo.session_lock(conn, key)
            assert await lock.acquire()
            assert f"pg_backend_pid() = {pid}" in str(activity(observer, pid)[1]), "unguarded"
            if call == "try":
                await lock.release()
            pending = lock.acquire() if call == "try" else lock.release()
            with pgsolo_relay.blackholed():
                task = asyncio.create_task(pending)
                await asyncio.sleep(0.05)  # the call sent, held back by the relay
                task.cancel()
                await asyncio.sleep(0.05)  # asyncpg's cancel request, held back too
            done, _ = await asyncio.wait({task}, timeout=DEADLINE)
            assert task in done, f"round {round_}: the cancelled task never ended"
            assert task.cancelled()
            assert not lock.acquired
            assert observer.holders(key) == set(), f"round {round_}: a lock was left held"
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_a_connection_moved_to_another_session_takes_and_releases_nothing_there(
    dsn: str, observer: Any, key: Key
) -> None:
    """Behind a relay that hands the connection another session (as transaction pooling
    does), the guarded try, sent as asyncpg's own round trip, takes nothing there and is
    refused; the guarded unlock of a lock taken before runs nowhere, and the error says
    which backend still holds it."""
    with testing.Relay(dsn) as relay:
        conn = await asyncpg.connect(**asyncpg_options(relay.dsn))
        other = await asyncpg.connect(**asyncpg_options(relay.dsn))
        try:
            holder = conn.get_server_pid()
            lock = pgsolo.session_lock(conn, key)
            assert await lock.acquire()
            ports = [adapt(c).client_address()[1] for c in (conn, other)]  # type: ignore[index]
            relay.swap(*ports)
            assert await conn.fetchval("SELECT pg_backend_pid()") == other.get_server_pid()
            elsewhere = Key.parse(f"moved-{uuid.uuid4()}", name=True)
            with pytest.raises(UnsafeConnectionError, match="moved to another server session"):
                await pgsolo.session_lock(conn, elsewhere).acquire()
            assert observer.holders(elsewhere) == set()
            with pytest.raises(UnsafeConnectionError, match="reached another server session") as e:
                await lock.release()
            assert f"pg_terminate_backend({holder})" in str(e.value)
            assert pgsolo.held_session_locks(conn) == []
            assert observer.holders(key) == {holder}
        finally:
            await other.close()
            await conn.close()
    await aeventually(lambda: observer.holders(key) == set(), "the holder's session ended")


# - jobs, once, keeper, proxies -


async def test_run_job_async_completes_and_skips_busy(apg: Any, key: Key) -> None:
    conn, other = await apg(), await apg()
    job = unique_name("apg-job")

    async def work(c: Any) -> str:
        await c.execute(f"INSERT INTO {WORK} (job, note) VALUES ($1, 'ran')", job)
        return "done"

    result = await pgsolo.run_job_async(conn, job, work)
    assert result.outcome == "completed"
    assert result.value == "done"
    assert await rows_of(other, job) == ["ran"]
    async with pgsolo.xact_lock(other, job):
        skipped = await pgsolo.run_job_async(conn, job, work)
    assert skipped.outcome == "skipped"


async def test_run_once_async_runs_once(apg: Any) -> None:
    conn = await apg()
    op = unique_name("apg-once")
    calls = []

    async def operation(ctx: Any) -> dict[str, int]:
        calls.append(ctx.idempotency_key)
        return {"n": 1}

    first = await pgsolo.run_once_async(conn, op, operation)
    second = await pgsolo.run_once_async(conn, op, operation)
    assert (first.outcome, second.outcome) == ("ran", "already-succeeded")
    assert second.result == {"n": 1}
    assert len(calls) == 1


async def test_keeper_is_refused_before_any_sql(apg: Any, observer: Any, key: Key) -> None:
    conn = await apg()
    with pytest.raises(UsageError, match="another operation is in progress"):
        pgsolo.session_lock(conn, key, keep=True)
    with pytest.raises(UsageError, match="another operation is in progress"):
        await pgsolo.run_job_async(
            conn, key, lambda c: asyncio.sleep(0), lifetime="session", keep=True
        )
    assert observer.holders(key) == set()


async def test_session_lock_through_transaction_pooling_is_refused(bouncer: Any, key: Key) -> None:
    """The proxy check is SQL: PgBouncer in transaction mode is found and refused."""
    conn = await asyncpg.connect(**asyncpg_options(bouncer.dsn), statement_cache_size=0)
    try:
        with pytest.raises(UnsafeConnectionError):
            await pgsolo.session_lock(conn, key).acquire()
        async with pgsolo.xact_lock(conn, key) as lock:  # a transaction lock is fine
            assert lock.acquired
    finally:
        await conn.close()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_lock_in_the_turn_after_the_server_ended_the_connection_finds_it_closed(
    apg: Any, observer: Any, key: Key, lifetime: str
) -> None:
    """Guards the turn of the event loop between the server's end reaching the socket and
    asyncpg taking it in, when asyncpg's protocol, busy with the server's last message,
    refuses a statement as an internal error ("cannot switch to state 18; another
    operation is in progress"). A lock's message sent in that turn (in the caller's own
    task, as pgsolo sends them) failed so, and a Locker took it for the statement's own
    failure and lent the dead connection again. It is a closed connection."""
    conn = await apg()
    terminate(observer, conn.get_server_pid())
    async with asyncio.timeout(5):
        while not private.transport_closing(conn):  # noqa: ASYNC110 - a turn at a time
            await asyncio.sleep(0)  # is the point: no turn may pass once the socket ended
    assert not conn.is_closed()  # the turn this guards: asyncpg has not heard yet
    lock = pgsolo.xact_lock(conn, key) if lifetime == "xact" else pgsolo.session_lock(conn, key)
    with pytest.raises(pgsolo.DatabaseUnavailableError, match="nothing is held"):
        async with lock:
            raise AssertionError("locked on a connection the server ended")
    assert conn.is_closed()
