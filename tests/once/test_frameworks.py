"""``run_once`` / ``run_once_async`` on a framework's connection: SQLAlchemy's
``Connection`` and ``AsyncConnection`` (psycopg, psycopg2, asyncpg dialects) and Django's.

The connection is the caller's, and so is its pool: at every ending (ran, the operation
raised, interrupted, ended its own transaction, swallowed a database error, superseded,
found already succeeded after a wait) the connection comes back as found (the driver's
autocommit, SQLAlchemy's ``in_transaction()``, the server's transaction status, no
advisory lock), and the pool's next user of the same connection gets a working one: a
rollback rolls back, and a transaction lock is really held at the server.

Guards issue 21: the operation's transaction used to be a raw ``BEGIN`` sent with the
driver switched to autocommit and never switched back (the pool's next user then ran in
autocommit: rolled-back rows stayed, and an xact lock was "acquired" while the server held
nothing); on the asyncpg dialect the operation's first statement failed; on Django an
``atomic()`` inside the operation failed and ``on_commit`` callbacks ran at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

import pgsolo
import pgsolo.sqlalchemy
from _drivers import (
    acheck_next_user,
    check_next_user,
    django_settings,
    sqlalchemy_fingerprint,
    sqlalchemy_insert,
    sqlalchemy_pid,
    sqlalchemy_raw,
)
from _support import DEADLINE, WORK, Boom, Connect, eventually, new_op, row_of, work_rows
from pgsolo import Key, LockLostError, OnceResult, TransactionFailedError
from pgsolo.once.operation import lock_key_for

ENDINGS = ["ran", "raised", "interrupted", "commits-itself", "swallowed", "superseded"]


class Ending:
    """An operation that ends one way, on a connection of any kind; ``take_over`` runs
    the same operation key to success elsewhere (for ``superseded``)."""

    def __init__(self, how: str, op: str, take_over: Callable[[], object]) -> None:
        self.how = how
        self.op = op
        self.take_over = take_over

    def expected(self) -> tuple[type[BaseException] | None, list[str], str]:
        """What run_once raises, the work rows committed for the operation, and the state
        its row is left in."""
        return {
            "ran": (None, ["ran"], "succeeded"),
            "raised": (Boom, [], "failed"),
            "interrupted": (KeyboardInterrupt, [], "started"),
            "commits-itself": (None, ["commits-itself", "commits-itself"], "succeeded"),
            "swallowed": (TransactionFailedError, [], "failed"),
            "superseded": (LockLostError, ["taken over"], "succeeded"),
        }[self.how]


def operation_for(ending: Ending) -> Callable[[Any], object]:
    def operation(ctx: Any) -> object:
        conn: Connection = ctx.conn
        sqlalchemy_insert(conn, ending.op, ending.how)
        if ending.how == "raised":
            raise Boom
        if ending.how == "interrupted":
            raise KeyboardInterrupt
        if ending.how == "commits-itself":
            conn.commit()
            sqlalchemy_insert(conn, ending.op, ending.how)
        if ending.how == "swallowed":
            with contextlib.suppress(DBAPIError):
                conn.execute(text("SELECT 1 / 0"))
        if ending.how == "superseded":
            conn.execute(text("SELECT pg_advisory_unlock_all()"))
            ending.take_over()
        return "done"

    return operation


def aoperation_for(ending: Ending) -> Callable[[Any], object]:
    async def operation(ctx: Any) -> object:
        conn: AsyncConnection = ctx.conn
        await sqlalchemy_insert(conn, ending.op, ending.how)
        if ending.how == "raised":
            raise Boom
        if ending.how == "interrupted":
            raise KeyboardInterrupt
        if ending.how == "commits-itself":
            await conn.commit()
            await sqlalchemy_insert(conn, ending.op, ending.how)
        if ending.how == "swallowed":
            with contextlib.suppress(DBAPIError):
                await conn.execute(text("SELECT 1 / 0"))
        if ending.how == "superseded":
            await conn.execute(text("SELECT pg_advisory_unlock_all()"))
            ending.take_over()
        return "done"

    return operation


def taking_over(connect: Connect, op: str) -> Callable[[], object]:
    """Another caller (a bare psycopg connection, in a thread) that runs ``op`` to
    success: the attempt under test is then superseded."""

    def insert(ctx: Any) -> str:
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'taken over')", (op,))
        return "taker"

    def take_over() -> None:
        results: list[OnceResult] = []
        thread = threading.Thread(
            target=lambda: results.append(pgsolo.run_once(connect(), op, insert))
        )
        thread.start()
        thread.join(DEADLINE)
        assert [r.outcome for r in results] == ["ran"]

    return take_over


@pytest.mark.parametrize("how", ENDINGS)
def test_run_once_on_a_sqlalchemy_connection_leaves_it_and_its_pool_as_found(
    engine: Engine, connect: Connect, observer: Any, key: Key, how: str
) -> None:
    """Regression (issue 21): at every ending the Connection comes back as found, the
    operation's work is committed or rolled back as the ending says, no advisory lock is
    left, and the pool's next user gets a connection whose transactions are real."""
    op = new_op(f"sqlalchemy-{how}")
    ending = Ending(how, op, taking_over(connect, op))
    raises, committed, state = ending.expected()
    with engine.connect() as conn:
        raw, pid, found = sqlalchemy_raw(conn), sqlalchemy_pid(conn), sqlalchemy_fingerprint(conn)
        if raises is None:
            assert pgsolo.run_once(conn, op, operation_for(ending)).outcome == "ran"
        else:
            with pytest.raises(raises):
                pgsolo.run_once(conn, op, operation_for(ending))
        assert sqlalchemy_fingerprint(conn) == found
        assert observer.advisory(pid=pid) == set()
    assert work_rows(observer, op) == committed
    assert (row_of(observer, op) or {}).get("state") == state
    assert observer.holders(lock_key_for(op)) == set()
    with engine.connect() as conn:
        assert sqlalchemy_raw(conn) is raw
        assert sqlalchemy_fingerprint(conn) == found
        check_next_user(conn, observer, key)


def test_a_sqlalchemy_waiter_that_finds_the_operation_succeeded_leaves_it_as_found(
    engine: Engine, connect: Connect, observer: Any, key: Key
) -> None:
    """The already-succeeded race on a SQLAlchemy Connection: it reads 'started', waits for
    the lock, and gets it after the holder succeeded; it opens no transaction for the
    operation, and the connection and its pool come back as found."""
    op = new_op("sqlalchemy-waiter")
    holder_conn = connect()
    running, finish = threading.Event(), threading.Event()
    results: list[OnceResult] = []

    def slow(ctx: Any) -> str:
        running.set()
        assert finish.wait(DEADLINE)
        return "charged"

    holder = threading.Thread(target=lambda: results.append(pgsolo.run_once(holder_conn, op, slow)))
    holder.start()
    try:
        assert running.wait(DEADLINE)
        with engine.connect() as conn:
            pid, found = sqlalchemy_pid(conn), sqlalchemy_fingerprint(conn)

            def finish_once_it_waits() -> None:
                eventually(lambda: pid in observer.waiters(lock_key_for(op)), "the waiter")
                finish.set()

            threading.Thread(target=finish_once_it_waits, daemon=True).start()
            waited = pgsolo.run_once(conn, op, lambda ctx: "ran twice", wait=DEADLINE)
            assert (waited.outcome, waited.result) == ("already-succeeded", "charged")
            assert sqlalchemy_fingerprint(conn) == found
            assert observer.advisory(pid=pid) == set()
        with engine.connect() as conn:
            check_next_user(conn, observer, key)
    finally:
        finish.set()
        holder.join(DEADLINE)
    assert [r.outcome for r in results] == ["ran"]


@pytest.mark.parametrize("how", ENDINGS)
async def test_run_once_async_on_an_async_connection_leaves_it_and_its_pool_as_found(
    aengine: AsyncEngine, connect: Connect, observer: Any, key: Key, how: str
) -> None:
    """Regression (issue 21): as the sync test, for AsyncConnection; on asyncpg the
    operation's first statement used to fail and the row stayed ``started``."""
    op = new_op(f"asqlalchemy-{how}")
    ending = Ending(how, op, taking_over(connect, op))
    raises, committed, state = ending.expected()
    async with aengine.connect() as conn:
        raw = await conn.run_sync(sqlalchemy_raw)
        pid, found = (
            await conn.run_sync(sqlalchemy_pid),
            await conn.run_sync(sqlalchemy_fingerprint),
        )
        if raises is None:
            result = await pgsolo.run_once_async(conn, op, aoperation_for(ending))
            assert result.outcome == "ran"
        else:
            with pytest.raises(raises):
                await pgsolo.run_once_async(conn, op, aoperation_for(ending))
        assert await conn.run_sync(sqlalchemy_fingerprint) == found
        assert observer.advisory(pid=pid) == set()
    assert work_rows(observer, op) == committed
    assert (row_of(observer, op) or {}).get("state") == state
    assert observer.holders(lock_key_for(op)) == set()
    async with aengine.connect() as conn:
        assert await conn.run_sync(sqlalchemy_raw) is raw
        assert await conn.run_sync(sqlalchemy_fingerprint) == found
        await acheck_next_user(conn, observer, key)


# -- Django ------------------------------------------------------------------------------


@pytest.fixture
def django_conn(db: str) -> Iterator[Any]:
    """``django.db.connection`` on the test database, out of any atomic block after."""
    django_settings(db)
    from django.db import connection  # noqa: PLC0415

    yield connection
    assert not connection.in_atomic_block
    connection.close()


def django_insert(op: str, note: str) -> None:
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", [op, note])


DJANGO_ENDINGS = {
    "ran": None,
    "raised": Boom,
    "interrupted": KeyboardInterrupt,
    "swallowed": TransactionFailedError,
}


@pytest.mark.parametrize("ends", list(DJANGO_ENDINGS))
def test_run_once_on_django_is_an_atomic_block_of_djangos(
    django_conn: Any, observer: Any, ends: str
) -> None:
    """Regression (issue 21): the operation's transaction is a durable ``atomic`` of
    Django's, so an ``atomic()`` inside the operation is a savepoint (it used to fail with
    "can't change 'autocommit' now"), and ``on_commit`` callbacks run after the
    operation's commit, never after its rollback (they used to run at once); at every
    ending Django's books are as found."""
    from django.db import DatabaseError, transaction  # noqa: PLC0415

    op = new_op(f"django-{ends}")
    sent: list[str] = []
    raises = DJANGO_ENDINGS[ends]

    def operation(ctx: Any) -> str:
        assert ctx.conn.in_atomic_block
        django_insert(op, "outer")
        transaction.on_commit(lambda: sent.append("e-mail"))
        with transaction.atomic():
            django_insert(op, "inner")
        with contextlib.suppress(Boom), transaction.atomic():  # a savepoint, undone alone
            django_insert(op, "undone")
            raise Boom
        assert sent == []
        if ends == "swallowed":
            with contextlib.suppress(DatabaseError), ctx.conn.cursor() as cur:
                cur.execute("SELECT 1 / 0")
        if raises is not None and ends != "swallowed":
            raise raises
        return "done"

    if raises is None:
        assert pgsolo.run_once(django_conn, op, operation).outcome == "ran"
        assert sent == ["e-mail"]
        assert sorted(work_rows(observer, op)) == ["inner", "outer"]
    else:
        with pytest.raises(raises):
            pgsolo.run_once(django_conn, op, operation)
        assert sent == []
        assert work_rows(observer, op) == []
    assert not django_conn.in_atomic_block
    assert not django_conn.needs_rollback
    assert django_conn.get_autocommit()
    assert django_conn.run_on_commit == []
    assert observer.advisory(pid=django_conn.connection.info.backend_pid) == set()
    with django_conn.cursor() as cur:  # usable, in autocommit again
        cur.execute("SELECT 42")
        assert cur.fetchone() == (42,)
    assert django_conn.connection.info.transaction_status == 0


def test_run_once_inside_djangos_atomic_is_refused_naming_non_atomic_requests(
    django_conn: Any, observer: Any
) -> None:
    """Regression (issue 21): under ``ATOMIC_REQUESTS`` a view runs inside ``atomic()``,
    where run_once cannot commit its state: refused before any SQL, with the decorator
    that fixes it (it used to say only "status intrans")."""
    from django.db import transaction  # noqa: PLC0415

    op = new_op("django-atomic-request")
    with (
        transaction.atomic(),
        pytest.raises(pgsolo.ConnectionStateError, match="non_atomic_requests"),
    ):
        pgsolo.run_once(django_conn, op, lambda ctx: "never")
    assert row_of(observer, op) is None


# -- ORM sessions ------------------------------------------------------------------------


@pytest.mark.parametrize("in_transaction", [False, True], ids=["outside", "inside"])
def test_run_once_on_an_orm_session_is_refused_up_front(
    engine: Engine, observer: Any, in_transaction: bool
) -> None:
    """Regression (issue 21): an ORM Session gives its connection back at each commit, so
    run_once (which holds a session lock across its commits) refuses it before any SQL,
    with one error naming ``engine.connect()``, in or out of a transaction (it used to
    say "open a transaction" outside one, and "none may be open" inside)."""
    op = new_op("orm-session")
    with Session(engine) as session:
        if in_transaction:
            session.execute(text("SELECT 1"))
        with pytest.raises(pgsolo.UnsupportedConnectionError, match=r"engine\.connect\(\)"):
            pgsolo.run_once(session, op, lambda ctx: "never")  # type: ignore[arg-type]
        assert session.in_transaction() is in_transaction
    assert row_of(observer, op) is None


@pytest.mark.parametrize("in_transaction", [False, True], ids=["outside", "inside"])
async def test_run_once_async_on_an_async_session_is_refused_up_front(
    aengine: AsyncEngine, observer: Any, in_transaction: bool
) -> None:
    """Regression (issue 21): as for Session, on AsyncSession."""
    op = new_op("async-orm-session")

    async def never(ctx: Any) -> str:
        return "never"

    async with AsyncSession(aengine) as session:
        if in_transaction:
            await session.execute(text("SELECT 1"))
        with pytest.raises(pgsolo.UnsupportedConnectionError, match=r"engine\.connect\(\)"):
            await pgsolo.run_once_async(session, op, never)  # type: ignore[arg-type]
        assert session.in_transaction() is in_transaction
    assert row_of(observer, op) is None
