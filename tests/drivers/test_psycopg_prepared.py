"""A session lock's try and unlock, and a transaction lock's wait (run by ``EXECUTE``
after the BEGIN in its message), prepared once per session on psycopg 3
(:mod:`pgsolo.drivers.prepared`), as psycopg prepares its caller's statements: once a call
ran ``prepare_threshold`` times on a connection, and never with ``prepare_threshold=None``
or inside a transaction. Guards the ways the server's statements and pgsolo's books of
them can part: the caller drops them all (``DEALLOCATE ALL`` or ``DISCARD ALL`` between
locks, ``DEALLOCATE ALL`` between a lock and its release), or the session has pgsolo's
statement already (a pooled session used before); and a lock still excludes every other
session throughout."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import Connect
from pgsolo import Key, sql

# The test's own statements go unprepared: psycopg 3.2 prepares them (prepare_threshold=0)
# and does not see a DEALLOCATE ALL drop them.
PGSOLOS = "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'pgsolo%' ORDER BY 1"
CALLERS_LOCK_TIMEOUT = ("4321ms",)
PREPARED_PAIR = [
    ("SELECT pg_advisory_unlock($1::integer, $2::integer)",),
    ("SELECT pg_try_advisory_lock($1::integer, $2::integer)",),
]


def _pair(connect: Connect, threshold: int | None) -> tuple[psycopg.Connection, psycopg.Connection]:
    """A connection that prepares after ``threshold`` runs, with a lock_timeout of its own
    that no lock may change, and another to find its key busy."""
    conn, other = connect(), connect()
    conn.prepare_threshold = threshold
    conn.execute(f"SET lock_timeout = '{CALLERS_LOCK_TIMEOUT[0]}'", prepare=False)
    return conn, other


def _lock_and_release(
    conn: psycopg.Connection, other: psycopg.Connection, observer: Any, key: Key
) -> None:
    with pgsolo.session_lock(conn, key) as lock:
        assert lock.acquired
        assert observer.holders(key) == {conn.info.backend_pid}
        with pgsolo.session_lock(other, key) as busy:
            assert not busy.acquired
    assert observer.holders(key) == set()


@pytest.mark.parametrize("threshold", [0, 1, 5])
def test_a_session_locks_calls_are_prepared_after_the_connections_threshold(
    connect: Connect, observer: Any, key: Key, threshold: int
) -> None:
    conn, other = connect(), connect()
    conn.prepare_threshold = threshold
    for _ in range(threshold):
        _lock_and_release(conn, other, observer, key)
    assert conn.execute(PGSOLOS, prepare=False).fetchall() == []  # as written so far
    for _ in range(3):
        _lock_and_release(conn, other, observer, key)
        assert conn.execute(PGSOLOS, prepare=False).fetchall() == PREPARED_PAIR


def test_no_statement_is_prepared_where_the_caller_wants_none_or_in_a_transaction(
    connect: Connect, observer: Any, key: Key
) -> None:
    unprepared, other = connect(), connect()
    unprepared.prepare_threshold = None  # as behind a transaction-pooling proxy
    in_transaction = connect()
    in_transaction.prepare_threshold = 0
    for _ in range(8):
        _lock_and_release(unprepared, other, observer, key)
        with in_transaction.transaction():
            _lock_and_release(in_transaction, other, observer, key)
    assert unprepared.execute(PGSOLOS, prepare=False).fetchall() == []
    assert in_transaction.execute(PGSOLOS, prepare=False).fetchall() == []


@pytest.mark.parametrize("drop", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_a_caller_dropping_every_statement_loses_no_lock_and_no_release(
    connect: Connect, observer: Any, key: Key, drop: str
) -> None:
    conn, other = connect(), connect()
    conn.prepare_threshold = 0
    _lock_and_release(conn, other, observer, key)
    conn.execute(drop, prepare=False)
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire()  # prepared by pgsolo, dropped by the caller: sent as written
    assert observer.holders(key) == {conn.info.backend_pid}
    conn.execute("DEALLOCATE ALL", prepare=False)  # DISCARD ALL would release the lock
    lock.release()  # the unlock's statement is gone
    assert observer.holders(key) == set()
    for _ in range(2):  # prepared again
        _lock_and_release(conn, other, observer, key)
    assert conn.execute(PGSOLOS, prepare=False).fetchall() == PREPARED_PAIR


def test_a_session_that_has_pgsolos_statement_already_runs_it(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn, other = connect(), connect()
    conn.prepare_threshold = 0
    take = sql.acquire(key, "session", wait=False, shared=False)
    assert isinstance(take, sql.LockCall)
    form = take.prepared
    conn.pgconn.prepare(form.name, form.template)  # left by a connection object before
    _lock_and_release(conn, other, observer, key)
    _lock_and_release(conn, other, observer, key)
    assert conn.execute(PGSOLOS, prepare=False).fetchall() == PREPARED_PAIR
    runs = "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE name = %s"
    assert conn.execute(runs, [form.name.decode()], prepare=False).fetchone() == (
        2,
    )  # taken as it was


async def test_an_async_session_locks_calls_are_prepared_and_survive_a_discard(
    dsn: str, observer: Any, key: Key
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other,
    ):
        for drop in ("", "DISCARD ALL", "DEALLOCATE ALL"):
            if drop:
                await conn.execute(drop, prepare=False)
            async with pgsolo.session_lock(conn, key) as lock:
                assert lock.acquired
                assert observer.holders(key) == {conn.info.backend_pid}
                async with pgsolo.session_lock(other, key) as busy:
                    assert not busy.acquired
                if drop:
                    await conn.execute("DEALLOCATE ALL", prepare=False)  # the unlock's goes
            assert observer.holders(key) == set()
        async with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
        assert await (await conn.execute(PGSOLOS, prepare=False)).fetchall() == PREPARED_PAIR


# A transaction lock's wait on a pair key, as prepared: its runs by name are counted by
# the server (each EXECUTE is a plan, custom or generic).
WAIT_RUNS = (
    "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE name LIKE 'pgsolo%'"
    " AND statement LIKE '%pg_advisory_xact_lock($1::integer, $2::integer)%'"
)


def _wait_runs(conn: psycopg.Connection) -> int | None:
    row = conn.execute(WAIT_RUNS, prepare=False).fetchone()
    return None if row is None else int(row[0])


def _wait_and_commit(
    conn: psycopg.Connection, other: psycopg.Connection, observer: Any, key: Key
) -> None:
    """A transaction lock that waits, held by ``conn`` alone, with the connection's own
    lock_timeout for the block's statements, and gone with the block."""
    with pgsolo.xact_lock(conn, key, wait=5) as lock:
        assert lock.acquired
        assert observer.holders(key) == {conn.info.backend_pid}
        with pgsolo.xact_lock(other, key) as busy:
            assert not busy.acquired
        assert conn.execute("SHOW lock_timeout", prepare=False).fetchone() == CALLERS_LOCK_TIMEOUT
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize("threshold", [0, 1, 5])
def test_a_transaction_locks_wait_runs_by_name_after_the_connections_threshold(
    connect: Connect, observer: Any, key: Key, threshold: int
) -> None:
    conn, other = _pair(connect, threshold)
    runs_seen = []
    for _ in range(threshold + 3):
        _wait_and_commit(conn, other, observer, key)
        runs_seen.append(_wait_runs(conn))
    # As written up to the threshold, then each by name: EXECUTE after the BEGIN.
    assert runs_seen == [None] * threshold + [1, 2, 3]


def test_a_wait_by_name_waits_for_the_holder_and_times_out_with_nothing_held(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn, holder = connect(), connect()
    conn.prepare_threshold = 0
    conn.execute(f"SET lock_timeout = '{CALLERS_LOCK_TIMEOUT[0]}'", prepare=False)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", key.value, prepare=False)
    with pytest.raises(pgsolo.LockTimeoutError), pgsolo.xact_lock(conn, key, wait=0.2):
        pytest.fail("the block ran without the lock")
    assert observer.holders(key) == {holder.info.backend_pid}
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SHOW lock_timeout", prepare=False).fetchone() == CALLERS_LOCK_TIMEOUT
    runs = _wait_runs(conn)
    assert runs is not None  # the slice that ran out was the prepared one
    assert runs >= 1

    def let_go_soon() -> None:
        time.sleep(0.3)
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", key.value, prepare=False)

    releasing = threading.Thread(target=let_go_soon)
    releasing.start()
    try:
        with pgsolo.xact_lock(conn, key, wait=10) as lock:
            assert lock.acquired
            assert observer.holders(key) == {conn.info.backend_pid}
    finally:
        releasing.join()
    assert _wait_runs(conn) == runs + 1
    assert observer.holders(key) == set()


@pytest.mark.parametrize("drop", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_a_caller_dropping_every_statement_loses_no_wait(
    connect: Connect, observer: Any, key: Key, drop: str
) -> None:
    conn, other = _pair(connect, 0)
    _wait_and_commit(conn, other, observer, key)
    assert _wait_runs(conn) == 1
    conn.execute(drop, prepare=False)
    conn.execute(f"SET lock_timeout = '{CALLERS_LOCK_TIMEOUT[0]}'", prepare=False)
    # The EXECUTE finds its statement gone: the transaction its BEGIN opened is rolled
    # back, and the wait sent as written.
    _wait_and_commit(conn, other, observer, key)
    assert _wait_runs(conn) is None
    _wait_and_commit(conn, other, observer, key)  # prepared again
    assert _wait_runs(conn) == 1


def test_no_wait_runs_by_name_where_the_caller_wants_none_or_in_a_transaction(
    connect: Connect, observer: Any, key: Key
) -> None:
    unprepared, other = connect(), connect()
    unprepared.prepare_threshold = None  # as behind a transaction-pooling proxy
    unprepared.execute(f"SET lock_timeout = '{CALLERS_LOCK_TIMEOUT[0]}'", prepare=False)
    in_transaction = connect()
    in_transaction.prepare_threshold = 0
    for _ in range(8):
        _wait_and_commit(unprepared, other, observer, key)
        # The lock is the caller's transaction's.
        with in_transaction.transaction(), pgsolo.xact_lock(in_transaction, key, wait=5) as lock:
            assert lock.acquired
    assert _wait_runs(unprepared) is None
    assert _wait_runs(in_transaction) is None


async def test_an_async_transaction_locks_wait_runs_by_name_and_survives_a_deallocate(
    dsn: str, observer: Any, key: Key
) -> None:
    connections = [
        await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=threshold)
        for threshold in (0, 5)
    ]
    async with contextlib.AsyncExitStack() as closing:
        conn, other = [await closing.enter_async_context(c) for c in connections]
        runs_seen = []
        for drop in ("", "", "DEALLOCATE ALL", ""):
            if drop:
                await conn.execute(drop, prepare=False)
            async with pgsolo.xact_lock(conn, key, wait=5) as lock:
                assert lock.acquired
                assert observer.holders(key) == {conn.info.backend_pid}
                async with pgsolo.xact_lock(other, key) as busy:
                    assert not busy.acquired
            assert observer.holders(key) == set()
            row = await (await conn.execute(WAIT_RUNS, prepare=False)).fetchone()
            runs_seen.append(None if row is None else int(row[0]))
        # By name twice; after the drop, as written; then prepared again.
        assert runs_seen == [1, 2, None, 1]


MARKED_WAIT_RUNS = (
    "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE name LIKE 'pgsolo%'"
    " AND statement LIKE '%xact_lock_marker'', $4::text%'"
)


def test_a_jobs_wait_marks_its_transaction_and_runs_by_name(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A job's wait sets the marker its COMMIT checks in the same statement (one
    statement less for the server), run by name once prepared: the marker is there for
    the work, a fresh one each run, and the work commits."""
    conn = connect()
    conn.prepare_threshold = 1
    markers = []

    def work(c: psycopg.Connection) -> None:
        assert observer.holders(key) == {c.info.backend_pid}
        row = c.execute("SELECT current_setting('pgsolo.xact_lock_marker')", prepare=False)
        markers.append(row.fetchone())

    for _ in range(4):
        assert pgsolo.run_job(conn, key, work, wait=5).completed
    row = conn.execute(MARKED_WAIT_RUNS, prepare=False).fetchone()
    assert row == (3,)  # the first as written, then prepared and by name
    assert len({marker for marker in markers if marker and marker[0]}) == 4
    assert observer.holders(key) == set()
