"""SQLAlchemy's Connection, AsyncConnection, Session and AsyncSession in every lock API, on
a real server: the transaction SQLAlchemy believes in is the one a lock follows, and
nothing is left open behind SQLAlchemy's back.

The psycopg 3 dialect runs everywhere; the psycopg2 and asyncpg dialects run once pgsolo
has an adapter for that library (``pgsolo.drivers._psycopg2`` / ``._asyncpg``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgsolo
import pgsolo.sqlalchemy
from _drivers import (
    acheck_next_user,
    check_next_user,
    sqlalchemy_fingerprint,
    sqlalchemy_pid,
    sqlalchemy_raw,
)
from _drivers import sqlalchemy_url as url_of
from _support import DEADLINE, WORK, Boom, aeventually, eventually
from pgsolo.drivers import _sqlalchemy
from pgsolo.errors import (
    ConnectionStateError,
    LockTimeoutError,
    UnsupportedConnectionError,
)
from pgsolo.keys import Key
from pgsolo.testing import Relay

SYNC_DIALECTS = ["psycopg", "psycopg2"]
ASYNC_DIALECTS = ["psycopg", "asyncpg"]
_ADAPTER = {"psycopg": "_psycopg", "psycopg2": "_psycopg2", "asyncpg": "_asyncpg"}


def _need_adapter(dialect: str) -> None:
    """Skip only while pgsolo has no adapter for the dialect's library (being written)."""
    module = f"pgsolo.drivers.{_ADAPTER[dialect]}"
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet: no pgsolo adapter for {dialect}")


@pytest.fixture(params=SYNC_DIALECTS)
def engine(request: pytest.FixtureRequest, db: str) -> Iterator[Engine]:
    _need_adapter(request.param)
    made = create_engine(url_of(db, request.param), pool_size=2)
    yield made
    made.dispose()


@pytest.fixture
def pg_engine(db: str) -> Iterator[Engine]:
    made = create_engine(url_of(db, "psycopg"), pool_size=1, max_overflow=0)
    yield made
    made.dispose()


@pytest.fixture(params=ASYNC_DIALECTS)
async def aengine(request: pytest.FixtureRequest, db: str) -> AsyncIterator[AsyncEngine]:
    _need_adapter(request.param)
    made = create_async_engine(url_of(db, request.param), pool_size=2)
    yield made
    await made.dispose()


def raw_status(conn: Connection) -> str:
    """The server's transaction status of the driver connection under ``conn``."""
    raw: Any = conn.connection.driver_connection
    if hasattr(raw, "is_in_transaction"):  # asyncpg
        return "intrans" if raw.is_in_transaction() else "idle"
    status = raw.info.transaction_status
    return {0: "idle", 2: "intrans", 3: "inerror"}.get(int(status), str(status))


def assert_left_alone(conn: Connection) -> None:
    """SQLAlchemy has no transaction open and neither has the server, and the driver runs
    as SQLAlchemy set it up (autocommit off)."""
    assert not conn.in_transaction()
    assert raw_status(conn) == "idle"
    assert conn.connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]


def rows(observer: Any, note: str) -> int:
    """How many rows the work wrote with ``note``, as another session sees them."""
    found = observer.conn.execute(f"SELECT count(*) FROM {WORK} WHERE note = %s", (note,))
    return int(found.fetchone()[0])


INSERT = text(f"INSERT INTO {WORK} (job, note) VALUES ('sqlalchemy', :note)")


def insert(conn: Connection | Session, note: str) -> None:
    conn.execute(INSERT, {"note": note})


def fail_in_lock(conn: Connection, key: Key, note: str) -> None:
    with pgsolo.xact_lock(conn, key, wait=5):
        insert(conn, note)
        raise Boom


def pid_of(conn: Connection) -> int:
    return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def hold(connect: Any, key: Key) -> psycopg.Connection[Any]:
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    return holder


# -- transaction locks ----------------------------------------------------------------


def test_xact_lock_joins_sqlalchemy_transaction_and_its_rollback_undoes_the_block(
    engine: Engine, observer: Any, key: Key
) -> None:
    """The reported bug: inside conn.begin(), the lock joins SQLAlchemy's transaction;
    pgsolo neither commits nor rolls it back, so the caller's rollback undoes the rows
    written in the block, and the lock goes with the transaction."""
    note = uuid.uuid4().hex
    with engine.connect() as conn:
        trans = conn.begin()
        with pgsolo.xact_lock(conn, key, wait=5):
            insert(conn, note)
        assert conn.in_transaction()
        assert observer.holders(key) == {pid_of(conn)}
        trans.rollback()
        assert rows(observer, note) == 0
        assert observer.holders(key) == set()
        assert_left_alone(conn)


def test_xact_lock_joins_an_autobegun_transaction(engine: Engine, observer: Any, key: Key) -> None:
    """A Connection that autobegan (any statement) is in SQLAlchemy's transaction: a
    plain acquire joins it and conn.rollback() undoes the block."""
    note = uuid.uuid4().hex
    with engine.connect() as conn:
        insert(conn, note)
        assert pgsolo.xact_lock(conn, key).acquire()
        conn.rollback()
        assert rows(observer, note) == 0
        assert observer.holders(key) == set()


def test_xact_lock_outside_a_transaction_opens_and_ends_its_own(
    engine: Engine, observer: Any, key: Key
) -> None:
    """Outside SQLAlchemy's transaction the block runs in pgsolo's own, opened with
    conn.begin(): it commits with the block, rolls back with a failing one, and leaves
    SQLAlchemy and the server with no transaction open."""
    kept, undone = uuid.uuid4().hex, uuid.uuid4().hex
    with engine.connect() as conn:
        with pgsolo.xact_lock(conn, key):
            assert conn.in_transaction()
            insert(conn, kept)
        assert_left_alone(conn)
        with pytest.raises(Boom):
            fail_in_lock(conn, key, undone)
        assert_left_alone(conn)
    assert rows(observer, kept) == 1
    assert rows(observer, undone) == 0
    assert observer.holders(key) == set()


@pytest.mark.parametrize("ends", ["commit", "rollback", "commit-and-go-on", "rollback-and-go-on"])
def test_xact_lock_block_that_ends_its_transaction_leaves_the_pool_as_found(
    engine: Engine, observer: Any, key: Key, ends: str
) -> None:
    """Issue 21: a ``with xact_lock(conn)`` block that ends pgsolo's own transaction itself
    (and may begin another, autobegun by SQLAlchemy) still leaves the connection as found
    (SQLAlchemy's books, the server, the driver's autocommit), no lock held, and the
    pool's next user of the connection real transactions and real locks."""
    note = uuid.uuid4().hex
    small = create_engine(engine.url, pool_size=1, max_overflow=0)
    try:
        with small.connect() as conn:
            raw, pid = sqlalchemy_raw(conn), sqlalchemy_pid(conn)
            found = sqlalchemy_fingerprint(conn)
            with pgsolo.xact_lock(conn, key, wait=5):
                insert(conn, note)
                conn.commit() if ends.startswith("commit") else conn.rollback()
                if ends.endswith("go-on"):
                    insert(conn, note)  # a transaction SQLAlchemy begins: committed with the block
            assert sqlalchemy_fingerprint(conn) == found
            assert observer.advisory(pid=pid) == set()
        committed = int(ends.startswith("commit")) + int(ends.endswith("go-on"))
        assert rows(observer, note) == committed
        with small.connect() as conn:
            assert sqlalchemy_raw(conn) is raw
            assert sqlalchemy_fingerprint(conn) == found
            check_next_user(conn, observer, key)
    finally:
        small.dispose()


def test_plain_xact_acquire_outside_a_transaction_is_refused(engine: Engine, key: Key) -> None:
    with engine.connect() as conn:
        with pytest.raises(ConnectionStateError):
            pgsolo.xact_lock(conn, key).acquire()
        assert_left_alone(conn)


def test_xact_try_busy_and_timeout(engine: Engine, connect: Any, key: Key) -> None:
    """Another session's lock: a try says busy, a wait times out; the caller's
    transaction stays usable (the wait ran in a savepoint)."""
    holder = hold(connect, key)
    with engine.connect() as conn, conn.begin():
        assert pgsolo.xact_lock(conn, key).acquire() is False
        with pytest.raises(LockTimeoutError):
            pgsolo.xact_lock(conn, key, wait=0.2).acquire()
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    holder.execute(f"SELECT pg_advisory_unlock({key.sql_args})")
    with engine.connect() as conn:
        with pgsolo.xact_lock(conn, key, wait=5) as lock:
            assert lock.acquired
        assert_left_alone(conn)


# -- session locks ------------------------------------------------------------------------


def test_session_lock_try_wait_busy_timeout_leave_no_transaction(
    engine: Engine, connect: Any, observer: Any, key: Key
) -> None:
    """Session locks outside SQLAlchemy's transaction leave none open, neither in
    SQLAlchemy's books nor at the server, after every operation."""
    with engine.connect() as conn:
        pid = pid_of(conn)
        conn.commit()
        lock = pgsolo.session_lock(conn, key)
        assert lock.acquire()
        assert_left_alone(conn)
        assert observer.holders(key) == {pid}
        assert lock.is_held()
        assert_left_alone(conn)
        lock.release()
        assert_left_alone(conn)
        with pgsolo.session_lock(conn, key, wait=5):
            assert_left_alone(conn)
            assert observer.holders(key) == {pid}
        assert_left_alone(conn)
        holder = hold(connect, key)
        assert pgsolo.session_lock(conn, key).acquire() is False
        assert_left_alone(conn)
        with pytest.raises(LockTimeoutError):
            pgsolo.session_lock(conn, key, wait=0.2).acquire()
        assert_left_alone(conn)
        assert pid not in observer.holders(key)
        holder.close()
        # the holder's backend ends after its client has gone: not at once
        eventually(lambda: observer.holders(key) == set(), "the holder's lock to go")


def test_ctrl_c_while_pgsolo_switches_autocommit_back_leaves_it_off(
    engine: Engine, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (found by the chaos suite's SIGINTs, on the psycopg dialect): a Ctrl-C
    landing after pgsolo had decided to switch the driver's autocommit back off, and before
    it had, left the connection in autocommit with nothing left to switch it back: the
    caller's next "transaction" committed each statement, so its rollback kept its row.
    Now the switch back is finished before the Ctrl-C goes on."""
    original = _sqlalchemy._to_switch_back
    cut: list[str] = []

    def interrupted_once(*args: Any) -> Any:
        raw = original(*args)
        if raw is not None and not cut:
            cut.append("interrupted")
            raise KeyboardInterrupt
        return raw

    with engine.connect() as conn:
        pid = pid_of(conn)
        conn.commit()
        lock = pgsolo.session_lock(conn, key)
        monkeypatch.setattr(_sqlalchemy, "_to_switch_back", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
        monkeypatch.undo()
        assert cut == ["interrupted"]
        assert_left_alone(conn)
        # acquire() raised: it let go of what the server granted (docs/locks.md)
        assert not lock.acquired
        assert pid not in observer.holders(key)
        insert(conn, "rolled back")
        conn.rollback()
        assert rows(observer, "rolled back") == 0
        assert_left_alone(conn)


def test_session_lock_inside_a_transaction_outlives_its_rollback(
    engine: Engine, observer: Any, key: Key
) -> None:
    with engine.connect() as conn:
        trans = conn.begin()
        lock = pgsolo.session_lock(conn, key, wait=5)
        assert lock.acquire()
        trans.rollback()
        assert observer.holders(key) == {pid_of(conn)}
        lock.release()
        conn.commit()
        assert observer.holders(key) == set()
        assert_left_alone(conn)


def test_fencing_tokens_through_sqlalchemy(engine: Engine, key: Key) -> None:
    with engine.connect() as conn:
        with pgsolo.xact_lock(conn, key, wait=5, fencing=True) as first:
            assert first.token is not None
        with pgsolo.session_lock(conn, key, wait=5, fencing=True) as second:
            assert second.token is not None
            assert second.token > first.token
        assert_left_alone(conn)


def test_excludes_a_psycopg_holder_and_the_other_way_round(
    engine: Engine, connect: Any, key: Key
) -> None:
    plain = connect()
    with pgsolo.session_lock(plain, key), engine.connect() as conn:
        assert pgsolo.session_lock(conn, key).acquire() is False
    with engine.connect() as conn, pgsolo.session_lock(conn, key):
        assert pgsolo.session_lock(plain, key).acquire() is False


# -- the ORM session -------------------------------------------------------------------


def test_session_xact_lock_own_and_joined(engine: Engine, observer: Any, key: Key) -> None:
    """A fresh Session: the block runs in pgsolo's own transaction (session.begin()),
    committed with it; inside session.begin() the lock joins and the rollback undoes it."""
    kept, undone = uuid.uuid4().hex, uuid.uuid4().hex
    with Session(engine) as session:
        with pgsolo.xact_lock(session, key):
            insert(session, kept)
        assert not session.in_transaction()
        with session.begin():
            with pgsolo.xact_lock(session, key, wait=5):
                insert(session, undone)
            session.rollback()
        assert not session.in_transaction()
    assert rows(observer, kept) == 1
    assert rows(observer, undone) == 0
    assert observer.holders(key) == set()


def test_session_lock_on_a_bare_orm_session_is_refused(engine: Engine, key: Key) -> None:
    """Trap 2: a Session hands its connection back to the pool when its transaction ends,
    so a session lock on it would be stranded there; refused before any SQL."""
    with Session(engine) as session:
        with pytest.raises(UnsupportedConnectionError, match=r"engine\.connect\(\)"):
            pgsolo.session_lock(session, key).acquire()
        assert not session.in_transaction()


# -- jobs -----------------------------------------------------------------------------


def test_run_job_on_a_sqlalchemy_connection(engine: Engine, observer: Any, key: Key) -> None:
    note = uuid.uuid4().hex
    with engine.connect() as conn:
        result = pgsolo.run_job(conn, key, lambda c: insert(c, note))  # type: ignore[arg-type]
        assert result.outcome == "completed"
        assert_left_alone(conn)
    assert rows(observer, note) == 1


# -- the pool: trap 1 -----------------------------------------------------------------


def test_session_lock_survives_return_to_the_pool_without_install(
    pg_engine: Engine, observer: Any, key: Key
) -> None:
    """The documented trap: SQLAlchemy's reset is a rollback, which keeps session locks."""
    with pg_engine.connect() as conn:
        pid = pid_of(conn)
        conn.commit()
        assert pgsolo.session_lock(conn, key).acquire()
    assert observer.holders(key) == {pid}
    pg_engine.dispose()
    # closing the pooled connection ends its backend a little later, and the lock with it
    eventually(lambda: observer.holders(key) == set(), "the closed connection's lock to go")


def test_install_releases_what_is_left_on_return(
    pg_engine: Engine, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    """With install(), a session lock left on a Connection that goes back to the pool is
    released with a warning naming its key, and pgsolo's books forget it: the next user
    of the pooled connection holds nothing and can take the key."""
    pgsolo.sqlalchemy.install(pg_engine)
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        with pg_engine.connect() as conn:
            raw = conn.connection.driver_connection
            forgotten = pgsolo.session_lock(conn, key)
            assert forgotten.acquire()
            assert_left_alone(conn)
        assert observer.holders(key) == set()
    assert any(key.text in record.getMessage() for record in caplog.records)
    # Its late release is reported, as after pgsolo.pool_reset: it returned in silence.
    with pytest.raises(pgsolo.LockNotHeldError, match="went back to its pool"):
        forgotten.release()
    assert pgsolo.held_session_locks(raw) == []
    with pg_engine.connect() as conn:  # the same pooled connection, usable and clean
        assert conn.connection.driver_connection is raw
        assert_left_alone(conn)
        with pgsolo.session_lock(conn, key):
            assert observer.holders(key) == {pid_of(conn)}


@pytest.mark.parametrize("reset", ["commit", None])
def test_install_leaves_a_transaction_it_did_not_open_to_the_pools_reset(
    db: str, observer: Any, key: Key, reset: str | None
) -> None:
    """Regression: install()'s hook rolled back whatever transaction a connection came
    back with, before the pool's own reset: with ``reset_on_return="commit"`` the
    caller's rows were lost, and with None a transaction the pool leaves open was ended.
    The session lock left is still released, in a savepoint of that transaction."""
    made = create_engine(
        url_of(db, "psycopg"), pool_size=1, max_overflow=0, pool_reset_on_return=reset
    )
    pgsolo.sqlalchemy.install(made)
    note = f"reset-{reset}-{uuid.uuid4().hex}"
    try:
        raw = made.raw_connection()
        with raw.cursor() as cur:
            cur.execute(f"INSERT INTO {WORK} (job, note) VALUES ('sqlalchemy', %s)", (note,))
        assert pgsolo.session_lock(raw.driver_connection, key).acquire()
        raw.close()  # back to the pool, in the caller's transaction
        assert observer.holders(key) == set()
        again = made.raw_connection()
        try:
            with again.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {WORK} WHERE note = %s", (note,))
                assert cur.fetchone() == (1,)  # committed, or still in the open transaction
            assert rows(observer, note) == (1 if reset == "commit" else 0)
        finally:
            again.rollback()
            again.close()
    finally:
        made.dispose()


# -- what is not taken ---------------------------------------------------------------


def test_an_engine_is_refused_naming_its_connection(pg_engine: Engine, key: Key) -> None:
    with pytest.raises(UnsupportedConnectionError, match=r"engine\.connect\(\)"):
        pgsolo.session_lock(pg_engine, key)


def test_a_sqlite_connection_is_refused_naming_the_dialect(key: Key) -> None:
    sqlite = create_engine("sqlite://")
    with sqlite.connect() as conn, pytest.raises(UnsupportedConnectionError, match="sqlite"):
        pgsolo.session_lock(conn, key)


# -- async -------------------------------------------------------------------------------


async def test_async_connection_join_own_and_session_lock(
    aengine: AsyncEngine, observer: Any, key: Key
) -> None:
    note, kept = uuid.uuid4().hex, uuid.uuid4().hex
    async with aengine.connect() as conn:
        lock = pgsolo.xact_lock(conn, key, wait=5)
        assert isinstance(lock, pgsolo.AsyncLock)
        trans = await conn.begin()
        async with lock:  # asyncpg: the lock runs in SQLAlchemy's asyncpg transaction
            assert len(observer.holders(key)) == 1
            await conn.execute(INSERT, {"note": note})
        assert len(observer.holders(key)) == 1
        await trans.rollback()
        assert rows(observer, note) == 0
        assert observer.holders(key) == set()
        async with pgsolo.xact_lock(conn, key):
            assert conn.in_transaction()
            await conn.execute(INSERT, {"note": kept})
        assert not conn.in_transaction()
        async with pgsolo.session_lock(conn, key, wait=5):
            assert not conn.in_transaction()
            assert len(observer.holders(key)) == 1
        assert await conn.run_sync(raw_status) == "idle"
        assert observer.holders(key) == set()
    assert rows(observer, kept) == 1


async def test_async_session_own_transaction(aengine: AsyncEngine, observer: Any, key: Key) -> None:
    kept = uuid.uuid4().hex
    async with AsyncSession(aengine) as session:
        async with pgsolo.xact_lock(session, key):
            await session.execute(INSERT, {"note": kept})
        assert not session.in_transaction()
        with pytest.raises(UnsupportedConnectionError):
            await pgsolo.session_lock(session, key).acquire()
    assert rows(observer, kept) == 1


async def test_run_job_async_on_an_async_connection(
    aengine: AsyncEngine, observer: Any, key: Key
) -> None:
    note = uuid.uuid4().hex

    async def work(conn: Any) -> None:
        await conn.execute(INSERT, {"note": note})

    async with aengine.connect() as conn:
        result = await pgsolo.run_job_async(conn, key, work)
        assert result.outcome == "completed"
        assert not conn.in_transaction()
    assert rows(observer, note) == 1


async def test_install_on_an_async_engine(aengine: AsyncEngine, observer: Any, key: Key) -> None:
    pgsolo.sqlalchemy.install(aengine)
    async with aengine.connect() as conn:
        assert await pgsolo.session_lock(conn, key).acquire()
        assert len(observer.holders(key)) == 1
    assert observer.holders(key) == set()


async def test_install_sends_nothing_for_a_connection_the_garbage_collector_found(
    aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: an async connection never given back is dropped by SQLAlchemy when the
    garbage collector finds it, with no event loop to run anything on; install()'s hook
    still tried to reset it, and SQLAlchemy logged its ``MissingGreenlet`` at ERROR."""
    pgsolo.sqlalchemy.install(aengine)

    async def leak() -> None:
        conn = await aengine.connect()
        await conn.execute(text("SELECT 1"))

    with caplog.at_level(logging.ERROR, logger="sqlalchemy"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's own warning of the leak
        await leak()
        gc.collect()
    failures = [r for r in caplog.records if r.exc_info is not None]
    assert failures == [], [r.getMessage() for r in failures]
    async with aengine.connect() as conn:  # the pool goes on
        assert (await conn.execute(text("SELECT 1"))).scalar() == 1


async def test_install_forgets_quietly_what_a_closed_asyncpg_connection_held(
    db: str, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 21): a session lock lost with its asyncpg connection (the backend
    terminated) leaves nothing to release when the connection goes back to the pool: the
    hook takes it off pgsolo's books quietly (it used to raise ``InterfaceError('connection
    is closed')``, which SQLAlchemy logged at ERROR with a traceback)."""
    made = create_async_engine(
        url_of(db, "asyncpg"), pool_size=1, max_overflow=0, pool_pre_ping=True
    )
    pgsolo.sqlalchemy.install(made)
    try:
        with caplog.at_level(logging.DEBUG):
            async with made.connect() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
                assert await pgsolo.session_lock(conn, key).acquire()
                pid = raw.get_server_pid()
                observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
                await aeventually(raw.is_closed, "asyncpg to see its connection closed")
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert pgsolo.held_session_locks(raw) == []
        # the pool (pre-ping) replaces the dead connection with one that takes the key
        async with made.connect() as conn, pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
    finally:
        await made.dispose()


@pytest.mark.parametrize("lock", [pgsolo.xact_lock, pgsolo.session_lock], ids=["xact", "session"])
@pytest.mark.parametrize("dialect", ASYNC_DIALECTS)
async def test_a_task_cancelled_at_any_step_of_a_lock_gives_the_connection_back_as_found(
    db: str, observer: Any, key: Key, dialect: str, lock: Any
) -> None:
    """Regression (issue 21): a task cancelled while pgsolo started SQLAlchemy's asyncpg
    transaction (``async with xact_lock(conn, key)`` outside one) left BEGIN done at the
    server and asyncpg's ``Transaction`` on the connection, but nothing on SQLAlchemy's
    books: neither its rollback nor the pool's reset ended it, so the pool's next user
    ran inside it (``in_transaction()`` False) and its first statement failed with
    ``SAVEPOINT can only be used in transaction blocks``. The task is cancelled after
    each number of event-loop steps in turn, from before it starts until it completes
    (the server's answer is in before each step, so every suspension is one step); each
    time, the next checkout must find the connection as the first one did, and no lock
    held. The session lock's run is a guard: its statements outside SQLAlchemy's transaction
    switch the driver's autocommit on and back, and no cancellation may leave it on."""
    _need_adapter(dialect)
    made = create_async_engine(url_of(db, dialect), pool_size=1, max_overflow=0)
    pgsolo.sqlalchemy.install(made)

    async def attempt() -> None:
        async with made.connect() as conn, lock(conn, key):
            await conn.execute(text("SELECT 1"))
            await conn.execute(text("SELECT 2"))

    try:
        async with made.connect() as conn:
            found = await conn.run_sync(sqlalchemy_fingerprint)
        cancelled = 0
        for steps in range(1000):
            task = asyncio.create_task(attempt())
            for _ in range(steps):
                time.sleep(0.001)  # noqa: ASYNC251 - let the server answer before the step
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, DEADLINE)
            if not task.cancelled():
                break  # it completed: every moment before has had its cancellation
            cancelled += 1
            # A connection SQLAlchemy invalidated (its own statement was cancelled) is
            # closed: its lock goes with its backend, a moment later.
            await aeventually(
                lambda: observer.holders(key) == set(), f"no lock held after {steps} steps"
            )
            async with made.connect() as conn:
                after = await conn.run_sync(sqlalchemy_fingerprint)
                assert after == found, f"cancelled after {steps} steps"
                await acheck_next_user(conn, observer, key)
        # The sweep reached past the lock: a suspension at least in each round trip (the
        # lock's, two SELECTs, the end), however few a driver version makes in each.
        assert cancelled >= 4
    finally:
        await made.dispose()


async def test_a_cancelled_start_that_the_server_never_answers_is_given_up(
    db: str, key: Key
) -> None:
    """The start of SQLAlchemy's asyncpg transaction runs to its end after a
    cancellation (above), but not forever: when the server does not answer BEGIN, the
    cancellation goes on after a bound, with the connection closed (its state is
    unknown) and invalidated, and the pool's next checkout gets a working connection."""
    _need_adapter("asyncpg")
    with Relay(db) as proxy:
        made = create_async_engine(url_of(proxy.dsn, "asyncpg"), pool_size=1, max_overflow=0)
        pgsolo.sqlalchemy.install(made)

        async def attempt() -> None:
            async with made.connect() as conn, pgsolo.xact_lock(conn, key):
                pass

        try:
            async with made.connect() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
            proxy.freeze()
            task = asyncio.create_task(attempt())
            await aeventually(lambda: raw._top_xact is not None, "BEGIN to be sent")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, DEADLINE)
            assert raw.is_closed()
            async with made.connect() as conn, pgsolo.xact_lock(conn, key) as lock:
                assert lock.acquired
                assert (await conn.get_raw_connection()).driver_connection is not raw
        finally:
            await made.dispose()


# - a connection that died under pgsolo's statement -


def _backend_pid(raw: Any) -> int:
    return int(raw.get_server_pid()) if hasattr(raw, "get_server_pid") else raw.info.backend_pid


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_a_connection_found_dead_is_invalidated_as_sqlalchemy_would(
    engine: Engine, observer: Any, key: Key, lifetime: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a driver connection pgsolo found dead was handed back to the pool as
    if alive: SQLAlchemy's reset at checkin failed on it and logged an ERROR with a
    traceback ("Exception during reset or similar"). pgsolo now invalidates it, as
    SQLAlchemy does when its own statement finds a connection dead: the error is pgsolo's,
    the pool discards the connection quietly, and the next checkout works."""
    factory = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    with caplog.at_level(logging.WARNING, logger="sqlalchemy"), engine.connect() as conn:
        conn.begin()
        pid = _backend_pid(conn.connection.driver_connection)
        observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        with pytest.raises(pgsolo.DatabaseUnavailableError):
            factory(conn, key).acquire()
        assert conn.invalidated
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    with engine.connect() as again, factory(again, key, wait=5) as lock:
        assert lock.acquired
        assert _backend_pid(again.connection.driver_connection) != pid


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_an_async_connection_found_dead_is_invalidated_as_sqlalchemy_would(
    aengine: AsyncEngine, observer: Any, key: Key, lifetime: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same as above, on an AsyncConnection (psycopg and asyncpg dialects)."""
    factory = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    with caplog.at_level(logging.WARNING, logger="sqlalchemy"):
        async with aengine.connect() as conn:
            await conn.begin()
            pid = _backend_pid((await conn.get_raw_connection()).driver_connection)
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            with pytest.raises(pgsolo.DatabaseUnavailableError):
                await factory(conn, key).acquire()
            assert conn.invalidated
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    async with aengine.connect() as again, factory(again, key, wait=5) as lock:
        assert lock.acquired


@pytest.mark.parametrize("lifetime", ["session", "xact"])
async def test_a_connection_that_died_under_a_held_lock_goes_back_to_be_replaced(
    aengine: AsyncEngine, observer: Any, key: Key, lifetime: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: asyncpg notices a closed socket by itself, so a lock whose backend was
    terminated while it was held found its connection closed without a statement of
    pgsolo's, raised LockLostError, and left SQLAlchemy's books as they were: the pool
    gave the dead connection to the next checkout, whose first statement failed. It is
    marked for the pool to replace now, as a failed statement of SQLAlchemy's would have it
    (psycopg's connection learns of it only from a statement: the same ending)."""
    factory = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    with caplog.at_level(logging.WARNING, logger="sqlalchemy"):
        async with aengine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            pid = _backend_pid(raw)

            async def held_while_its_backend_ends() -> None:
                async with factory(conn, key) as lock:
                    assert lock.acquired
                    observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
                    if hasattr(raw, "get_server_pid"):  # asyncpg: its protocol hears of it
                        await aeventually(raw.is_closed, "asyncpg to see its connection closed")

            with pytest.raises(pgsolo.LockLostError) as lost:
                await held_while_its_backend_ends()
            assert lost.value.reason == "connection-lost"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    async with aengine.connect() as again:
        assert _backend_pid((await again.get_raw_connection()).driver_connection) != pid
        async with factory(again, key) as lock:
            assert lock.acquired
        assert (await again.exec_driver_sql("SELECT 1")).scalar() == 1


@pytest.mark.parametrize("dialect", ["psycopg", "psycopg2"])
def test_a_connection_given_back_with_autocommit_still_switched_on_is_switched_back(
    db: str, dialect: str
) -> None:
    """Regression (issue 21, found by the chaos suite): pgsolo runs its statements outside
    SQLAlchemy's transaction with the driver's autocommit switched on, and switches it back
    once the connection is idle; a transaction of its own left open (its round trip
    interrupted, and the recovery that would end it interrupted too) keeps it switched. A
    connection given back to the pool so went to the next user in autocommit: with
    ``install()``, the pool's reset ends that transaction and switches autocommit back."""
    from pgsolo.drivers import adapt  # noqa: PLC0415
    from pgsolo.drivers._sqlalchemy import autocommitting  # noqa: PLC0415

    made = create_engine(url_of(db, dialect), pool_size=1, max_overflow=0)
    pgsolo.sqlalchemy.install(made)
    try:
        with made.connect() as conn:
            raw = conn.connection.driver_connection
            inner = adapt(raw)
            with autocommitting(conn, inner):
                assert raw.autocommit
                raw.cursor().execute("BEGIN")  # pgsolo's own, left open by an interruption
            assert raw.autocommit  # kept switched while that transaction is open
        with made.connect() as conn:
            raw = conn.connection.driver_connection
            assert not raw.autocommit
            assert int(raw.info.transaction_status) == 0  # idle
            assert not conn.in_transaction()
    finally:
        made.dispose()


def test_under_autocommit_a_transaction_lock_leaves_sqlalchemys_books_as_found(
    engine: Engine, observer: Any, key: pgsolo.Key
) -> None:
    """Guards a Connection at isolation_level AUTOCOMMIT whose transaction SQLAlchemy had
    begun already (any statement autobegins one): pgsolo's own transaction went through
    conn.begin(), which SQLAlchemy refuses then (a raw InvalidRequestError), and the
    failure ended the caller's transaction on SQLAlchemy's books. Under AUTOCOMMIT that
    transaction opens none at the server: pgsolo's goes to the driver connection alone."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("SELECT 1"))  # autobegun
        assert conn.in_transaction()
        for wait in (None, 5.0):
            with pgsolo.xact_lock(conn, key, wait=wait) as lock:
                assert lock.acquired
                assert observer.holders(key) == {sqlalchemy_pid(conn)}
                assert raw_status(conn) == "intrans"  # pgsolo's own, at the server
            assert observer.holders(key) == set()
            assert conn.in_transaction()  # the caller's, as it was
            assert raw_status(conn) == "idle"
        # conn.begin() opens nothing at the server here: a plain acquire() is refused, and
        # the advice says how to open a transaction that holds the lock.
        with pytest.raises(ConnectionStateError, match="READ COMMITTED"):
            pgsolo.xact_lock(conn, key).acquire()
        assert observer.holders(key) == set()
