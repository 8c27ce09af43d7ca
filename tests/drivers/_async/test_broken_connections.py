"""A caller's connection that breaks under one of pgsolo's statements, on every kind of
connection (``tests/_drivers.py``): the error is pgsolo's, with the driver's (or the
framework's) error as its cause, never the driver's own error or one of pgsolo's own
code paths failing on the dead connection; the caller's own statements fail as the
caller's library makes them fail.

The backend is terminated for real, from another session (``pg_terminate_backend``),
while the lock waits for a key another session holds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AKind
from _support import Connect, eventually, key_of, new_job, new_op, row_of, terminate
from pgsolo import Key
from pgsolo.once.operation import lock_key_for

# The backend writing an attempt's 'started' row ends itself there (PostgreSQL signals its
# own backend; the statement fails at its next check for interrupts).
DIE_AT_START = """
CREATE OR REPLACE FUNCTION pgsolo_test_die() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END$$;
CREATE OR REPLACE TRIGGER pgsolo_test_die_at_start BEFORE INSERT ON pgsolo.operations
FOR EACH ROW WHEN (NEW.op_key LIKE 'once-die-at-start%') EXECUTE FUNCTION pgsolo_test_die();
"""
# The table a job's period check reads becomes a view that ends its reader's backend (a
# one-time filter: evaluated once, before any row, even from an empty table).
DIE_AT_PERIOD_CHECK = """
ALTER TABLE pgsolo.job_periods RENAME TO job_periods_kept;
CREATE VIEW pgsolo.job_periods AS SELECT * FROM pgsolo.job_periods_kept
WHERE (SELECT pg_terminate_backend(pg_backend_pid()));
"""

LIFETIMES = [
    (kind, lifetime)
    for kind in ASYNC_KINDS
    for lifetime in ("session", "xact")
    if kind.session_locks or lifetime == "xact"
]


@contextmanager
def terminating_the_waiter(observer: Any, key: Key) -> Iterator[None]:
    """Terminate the backend that waits for ``key``, once one does (from a thread: the
    wait blocks the test's own)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            waiters = eventually(lambda: observer.waiters(key), "a backend waits for the key")
            terminate(observer, next(iter(waiters)))
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    assert not failures, failures


def causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while error.__cause__ is not None:
        error = error.__cause__
        chain.append(error)
    return chain


@pytest.mark.parametrize(("kind", "lifetime"), LIFETIMES, ids=str)
async def test_a_wait_whose_backend_is_terminated_is_database_unavailable(
    kind: AKind, lifetime: str, db: str, observer: Any, key: Key, sync_connect: Connect
) -> None:
    """Regression: a wait cut by the end of its backend raised the driver's own error
    (psycopg's ``AdminShutdown``, asyncpg's ``ConnectionDoesNotExistError``, SQLAlchemy's
    asyncpg adapter's ``InterfaceError``), or ``AttributeError`` from pgsolo's own error
    path on asyncpg. Now it is :class:`~pgsolo.DatabaseUnavailableError`, caused by the
    driver's error, and nothing is held."""
    factory = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock

    async def wait_for_it(conn: Any) -> None:
        async with factory(conn, key, wait=30):
            pass

    with pgsolo.session_lock(sync_connect(), key) as held:
        assert held.acquired
        async with kind.open(db) as conn:
            with (
                terminating_the_waiter(observer, key),
                pytest.raises(pgsolo.DatabaseUnavailableError) as raised,
            ):
                await wait_for_it(conn.conn)
            assert causes(raised.value), "the driver's error is the cause"
        assert observer.holders(key) == {held.backend_pid}
    assert observer.waiters(key) == set()


@pytest.mark.parametrize(("kind", "lifetime"), LIFETIMES, ids=str)
async def test_a_lock_in_a_transaction_whose_backend_died_is_database_unavailable(
    kind: AKind, lifetime: str, db: str, observer: Any, key: Key
) -> None:
    """Regression: the first of pgsolo's statements on a connection whose backend died
    while idle (a transaction lock's, or a session lock's check of what answers the
    connection) raised the driver's error (on SQLAlchemy's asyncpg dialect its adapter's
    ``InterfaceError``, neither a ``SQLAlchemyError`` nor a pgsolo error). Now it is
    :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's error."""
    factory = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    async with kind.open(db) as conn:
        await conn.begin()
        await conn.execute("SELECT 1")
        terminate(observer, await conn.pid())
        with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
            await factory(conn.conn, key).acquire()
        assert causes(raised.value), "the driver's error is the cause"
        with contextlib.suppress(Exception):  # the caller's own clean-up, as it may
            await conn.rollback()
    assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if not k.implicit], ids=str)
async def test_the_commit_of_pgsolos_transaction_on_a_dead_connection_is_a_lost_lock(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """Regression: a block of ``with xact_lock(conn, key)`` (pgsolo's own transaction)
    whose backend died before the commit raised the driver's error from pgsolo's COMMIT.
    Now it is :class:`~pgsolo.LockLostError` (``connection-lost``), caused by the
    driver's error: the lock ended with its session, before the work committed."""

    async def die_in_the_block(conn: Any) -> None:
        async with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            (pid,) = observer.holders(key)
            terminate(observer, pid)

    async with kind.open(db) as conn:
        with pytest.raises(pgsolo.LockLostError) as raised:
            await die_in_the_block(conn.conn)
        assert raised.value.reason == "connection-lost"
        assert causes(raised.value), "the driver's error is the cause"
    assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if not k.implicit], ids=str)
async def test_the_works_own_error_on_a_dead_connection_passes_through_untouched(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """Guards the other half of the rule: pgsolo's statements fail as pgsolo, the
    caller's own never do. A statement of the block that finds the connection dead raises
    what the caller's library raises, not a pgsolo error, and pgsolo's clean-up at the
    block's end adds nothing to it."""
    seen: list[BaseException] = []

    async def work_in_the_block(conn: Any) -> None:
        async with pgsolo.xact_lock(conn.conn, key) as lock:
            assert lock.acquired
            (pid,) = observer.holders(key)
            terminate(observer, pid)
            try:
                await conn.execute("SELECT 1")
            except Exception as exc:
                seen.append(exc)
                raise

    raised: BaseException | None = None
    async with kind.open(db) as conn:
        try:
            await work_in_the_block(conn)
        except Exception as exc:  # whatever the caller's library raises
            raised = exc
    assert raised is not None, "the block's statement on a dead connection raised nothing"
    assert seen == [raised]
    assert not isinstance(raised, pgsolo.PgsoloError)
    assert observer.holders(key) == set()


# -- run_once and jobs: pgsolo's statements around the work ------------------------------

# run_once and jobs take a connection, not an ORM Session (its transaction is the caller's).
CONNECTION_KINDS = [kind for kind in ASYNC_KINDS if kind.session_locks]


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_run_once_on_a_connection_whose_backend_died_is_database_unavailable(
    kind: AKind, db: str, observer: Any
) -> None:
    """Regression (issue 21): run_once on a connection whose backend died while idle
    raised the driver's error from pgsolo's first statement (reading the operation's
    row). Now it is :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's
    error, and the operation never ran."""
    calls: list[object] = []

    async def operation(ctx: Any) -> str:
        calls.append(ctx)
        return "ran"

    async with kind.open(db) as conn:
        terminate(observer, await conn.pid())
        with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
            await pgsolo.run_once_async(conn.conn, new_op(), operation)
        assert causes(raised.value), "the driver's error is the cause"
        assert not isinstance(causes(raised.value)[-1], pgsolo.PgsoloError)
    assert calls == []


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_run_once_whose_backend_died_as_the_attempt_began_is_database_unavailable(
    kind: AKind, db: str, observer: Any
) -> None:
    """Regression (issue 21): the backend ended under pgsolo's write of the attempt's
    'started' row (a trigger on pgsolo's table terminates its own backend there, after
    the read and the lock went through): the driver's error came out raw. Now it is
    :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's error; the
    operation never ran and nothing is held."""
    op = new_op("once-die-at-start")
    calls: list[object] = []

    async def operation(ctx: Any) -> str:
        calls.append(ctx)
        return "ran"

    observer.conn.execute(DIE_AT_START)
    try:
        async with kind.open(db) as conn:
            with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
                await pgsolo.run_once_async(conn.conn, op, operation)
            assert causes(raised.value), "the driver's error is the cause"
    finally:
        observer.conn.execute("DROP TRIGGER pgsolo_test_die_at_start ON pgsolo.operations")
    assert calls == []
    assert row_of(observer, op) is None
    assert observer.holders(lock_key_for(op)) == set()


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_run_once_whose_backend_died_in_the_operation_is_a_lost_lock(
    kind: AKind, db: str, observer: Any
) -> None:
    """Guards: the operation ran, but pgsolo's record of its success failed with the
    connection: :class:`~pgsolo.LockLostError` (``connection-lost``), caused by the
    driver's error, and the next call runs the operation again."""
    op = new_op()

    async with kind.open(db) as conn:
        pid = await conn.pid()

        async def operation(ctx: Any) -> str:
            terminate(observer, pid)
            return "ran, unrecorded"

        with pytest.raises(pgsolo.LockLostError) as raised:
            await pgsolo.run_once_async(conn.conn, op, operation)
        assert raised.value.reason == "connection-lost"
        assert causes(raised.value), "the driver's error is the cause"
    row = row_of(observer, op)
    assert row is not None
    # Not succeeded: the next call runs it again (Django, which reconnected, records the
    # attempt failed through its new connection; the others leave it started).
    assert row["state"] != "succeeded"
    assert observer.holders(lock_key_for(op)) == set()


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_a_job_on_a_connection_whose_backend_died_is_database_unavailable(
    kind: AKind, db: str, observer: Any
) -> None:
    """Regression (issue 21): a job with a period on a connection whose backend died
    while idle raised the driver's error from pgsolo's check of its tables. Now it is
    :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's error, and the work
    never ran."""
    calls: list[object] = []

    async def work(conn: Any) -> None:
        calls.append(conn)

    async with kind.open(db) as conn:
        terminate(observer, await conn.pid())
        with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
            await pgsolo.run_job_async(conn.conn, new_job(), work, period="day")
        assert causes(raised.value), "the driver's error is the cause"
    assert calls == []


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_a_job_whose_period_could_not_be_recorded_on_a_dead_connection_is_lost(
    kind: AKind, db: str, observer: Any
) -> None:
    """Regression (issue 21): the work of a session-lock job with a period ran, and its
    backend died before pgsolo recorded the period: the driver's error came back (as the
    result's error, and raised). Now it is :class:`~pgsolo.LockLostError`
    (``connection-lost``), caused by the driver's error; the work's own errors are never
    wrapped (``test_xact_connection_killed_under_the_work_is_lost_not_failed``)."""
    job = new_job()

    async with kind.open(db) as conn:
        pid = await conn.pid()

        async def work(conn: Any) -> str:
            terminate(observer, pid)
            return "done, period unrecorded"

        with pytest.raises(pgsolo.LockLostError) as raised:
            await pgsolo.run_job_async(conn.conn, job, work, lifetime="session", period="day")
        assert raised.value.reason == "connection-lost"
        assert causes(raised.value), "the driver's error is the cause"
        assert not isinstance(causes(raised.value)[-1], pgsolo.PgsoloError)
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_a_job_whose_backend_died_at_its_period_check_is_database_unavailable(
    kind: AKind, fresh_db: str, observer: Any
) -> None:
    """Regression (issue 21): the backend ended under pgsolo's check of a job's period,
    with the lock held and before the work ran (here the table the check reads is a view
    whose one-time filter terminates its own backend): the driver's error came back. Now
    it is :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's error; the
    work never ran and nothing is held."""
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        pgsolo.migrate(admin)
        admin.execute(DIE_AT_PERIOD_CHECK)
    job = new_job()
    calls: list[object] = []

    async def work(conn: Any) -> None:
        calls.append(conn)

    async with kind.open(fresh_db) as conn:
        with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
            await pgsolo.run_job_async(conn.conn, job, work, period="day")
        assert causes(raised.value), "the driver's error is the cause"
        assert not isinstance(causes(raised.value)[-1], pgsolo.PgsoloError)
    assert calls == []
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("kind", CONNECTION_KINDS, ids=str)
async def test_a_jobs_work_whose_connection_died_is_lost_with_its_own_error(
    kind: AKind, db: str, observer: Any
) -> None:
    """Guards both halves of the rule for jobs: the work's own statement that finds the
    connection dead raises what the caller's library raises, untouched, and the attempt
    is ``lost`` (``connection-lost``), not ``failed``. Regression on Django, which
    reconnects as it closes its books on the failure: the open connection looked alive,
    and the attempt was ``failed``."""
    seen: list[BaseException] = []

    async def work(conn: Any) -> None:
        (pid,) = observer.holders(key_of(job))
        terminate(observer, pid)
        try:
            await handle.execute("SELECT 1")
        except Exception as exc:
            seen.append(exc)
            raise

    job = new_job()
    async with kind.open(db) as handle:
        result = await pgsolo.run_job_async(handle.conn, job, work, raise_errors=False)
    assert (result.outcome, result.reason) == ("lost", "connection-lost")
    assert seen == [result.error]
    assert not isinstance(result.error, pgsolo.PgsoloError)
    assert observer.holders(key_of(job)) == set()
