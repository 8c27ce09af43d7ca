"""A session lock's try and unlock prepared once per session on psycopg 3
(:mod:`pgsolo.drivers.prepared`), as psycopg prepares its caller's statements: once a call
ran ``prepare_threshold`` times on a connection, and never with ``prepare_threshold=None``
or inside a transaction. Guards the ways the server's statements and pgsolo's books of
them can part: the caller drops them all (``DEALLOCATE ALL`` or ``DISCARD ALL`` between
locks, ``DEALLOCATE ALL`` between a lock and its release), or the session has pgsolo's
statement already (a pooled session used before); and a lock still excludes every other
session throughout."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgsolo
from _support import Connect
from pgsolo import Key, sql

# The test's own statements go unprepared: psycopg 3.2 prepares them (prepare_threshold=0)
# and does not see a DEALLOCATE ALL drop them.
PGSOLOS = "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'pgsolo%' ORDER BY 1"
PREPARED_PAIR = [
    ("SELECT pg_advisory_unlock($1::integer, $2::integer)",),
    ("SELECT pg_try_advisory_lock($1::integer, $2::integer)",),
]


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
