"""psycopg 3 connections as their owners set them up: pgsolo reads the server's answers
itself, so that what a caller registered on a connection for its own queries (a loader, a
row factory) never changes what a lock hears; and the transaction pgsolo begins on an
autocommit connection has the connection's isolation level, read-only and deferrable
settings, as ``conn.transaction()``'s would. Guards the direct reading of a boolean
answer (the cost of a Transformer per round trip was most of reading one), on both of
pgsolo's paths: a message sent to libpq directly, and one sent by a cursor (autocommit
off and no transaction open)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.adapt import Loader
from psycopg.rows import dict_row

import pgsolo
from _support import AConnect, Connect
from pgsolo import Key


class YesNoLoader(Loader):
    """A caller's own reading of a boolean: what it would turn pgsolo's answers into."""

    def load(self, data: bytes | bytearray | memoryview) -> str:
        return "yes" if bytes(data) == b"t" else "no"


def _owned_by_a_caller(conn: psycopg.Connection | psycopg.AsyncConnection) -> None:
    conn.adapters.register_loader("bool", YesNoLoader)
    conn.row_factory = dict_row  # type: ignore[assignment]


@pytest.mark.parametrize("autocommit", [True, False], ids=["direct", "by-cursor"])
def test_a_callers_loaders_and_row_factory_change_no_answer(
    connect: Connect, observer: Any, key: Key, autocommit: bool
) -> None:
    conn = connect(autocommit=autocommit)
    _owned_by_a_caller(conn)
    assert conn.execute("SELECT true AS v").fetchone() == {"v": "yes"}  # the caller's reading
    conn.rollback()
    with pgsolo.session_lock(conn, key) as lock:
        assert lock.acquired
        assert lock.is_held()
        assert observer.holders(key) == {conn.info.backend_pid}
        holder = connect()
        with pgsolo.session_lock(holder, key) as busy:
            assert not busy.acquired
    assert observer.holders(key) == set()
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert observer.holders(key) == {conn.info.backend_pid}
    conn.commit()  # autocommit off: the lock joined the transaction psycopg began
    assert observer.holders(key) == set()
    assert conn.execute("SELECT false AS v").fetchone() == {"v": "no"}  # still the caller's


@pytest.mark.parametrize("autocommit", [True, False], ids=["direct", "by-cursor"])
async def test_an_async_callers_loaders_change_no_answer(
    dsn: str, observer: Any, key: Key, autocommit: bool
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit) as conn:
        _owned_by_a_caller(conn)
        async with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            assert await lock.is_held()
            assert observer.holders(key) == {conn.info.backend_pid}
        assert observer.holders(key) == set()
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            assert observer.holders(key) == {conn.info.backend_pid}
        await conn.commit()
        assert observer.holders(key) == set()
        cur = await conn.execute("SELECT true AS v")
        assert await cur.fetchone() == {"v": "yes"}


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_a_notification_read_with_pgsolos_answer_reaches_the_callers_handler(
    dsn: str, key: Key, lifetime: str
) -> None:
    """pgsolo reads the answers of its direct messages itself (not through psycopg's
    generator, which costs more): a notification that came in with them must still go to
    the handler the caller added, as it would on the caller's own statement."""
    heard: list[str] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender,
    ):
        conn.add_notify_handler(lambda notification: heard.append(notification.payload))
        await conn.execute("LISTEN pgsolo_test_heard")
        await sender.execute("NOTIFY pgsolo_test_heard, 'before the lock'")
        # The notification is on conn's socket, unread, until a round trip reads it: wait
        # until the server has sent it (the sender's commit is done; give the socket time).
        await asyncio.sleep(0.2)
        assert heard == []
        lock = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
        async with lock(conn, key) as held:
            assert held.acquired
            assert heard == ["before the lock"]


CHARACTERISTICS = (
    "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only'),"
    " current_setting('transaction_deferrable')"
)


def test_pgsolos_own_transaction_has_the_connections_characteristics(
    connect: Connect, key: Key
) -> None:
    """Guards a read-only connection's promise: pgsolo's own transaction (a transaction
    lock on an autocommit connection, run_job's) began with a plain BEGIN, at read
    committed and read-write, where psycopg's own would have been serializable and read
    only, so a write the caller's connection forbids committed."""
    conn = connect()
    table = f"pgsolo_ro_{uuid.uuid4().hex[:12]}"  # not a temporary table: those take writes
    conn.execute(f"CREATE TABLE {table} (n int)")
    try:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        conn.read_only, conn.deferrable = True, True
        with conn.transaction():
            expected = conn.execute(CHARACTERISTICS).fetchone()
        assert expected == ("serializable", "on", "on")
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            assert conn.execute(CHARACTERISTICS).fetchone() == expected
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), pgsolo.xact_lock(conn, key):
            conn.execute(f"INSERT INTO {table} VALUES (1)")
        ran = pgsolo.run_job(conn, key, lambda c: c.execute(CHARACTERISTICS).fetchone())
        assert ran.value == expected
        conn.read_only = None  # the server's default again: read-write
        with pgsolo.xact_lock(conn, key):
            conn.execute(f"INSERT INTO {table} VALUES (2)")
        assert conn.execute(f"SELECT n FROM {table}").fetchall() == [(2,)]
    finally:
        conn.read_only = None
        conn.execute(f"DROP TABLE {table}")


async def test_pgsolos_own_async_transaction_has_the_connections_characteristics(
    aconnect: AConnect, key: Key
) -> None:
    conn = await aconnect()
    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
    await conn.set_read_only(True)
    async with conn.transaction():
        expected = await (await conn.execute(CHARACTERISTICS)).fetchone()
    assert expected == ("repeatable read", "on", "off")
    async with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert await (await conn.execute(CHARACTERISTICS)).fetchone() == expected


def test_a_lock_in_pipeline_mode_is_refused_before_any_sql_and_never_left_behind(
    connect: Connect, observer: Any, key: Key
) -> None:
    """Guards pipeline mode, whose answers come only at the pipeline's sync: a lock there
    read a missing answer as NULL ("the server is a standby") while its BEGIN and lock
    went out, a release there hung for ever waiting for an answer, or said "not held"
    and left the lock held on the session."""
    conn = connect()
    with conn.pipeline():
        with pytest.raises(pgsolo.ConnectionStateError, match="pipeline mode"):
            pgsolo.xact_lock(conn, key).__enter__()
        with pytest.raises(pgsolo.ConnectionStateError, match="pipeline mode"):
            pgsolo.session_lock(conn, key).acquire()
    assert observer.holders(key) == set()
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire()
    for pending in (False, True):
        with conn.pipeline():
            if pending:
                conn.execute("SELECT 1")  # an answer the pipeline's sync will bring
            with pytest.raises(pgsolo.ConnectionStateError, match="released there"):
                lock.release()
        assert lock.acquired  # still on the books, and held, for a release outside
        assert observer.holders(key) == {conn.info.backend_pid}
    lock.release()
    assert observer.holders(key) == set()
