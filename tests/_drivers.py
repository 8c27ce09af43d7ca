"""Every kind of connection pgsolo takes, opened the way its users open it, for the
conformance suite (``tests/drivers/_async/test_conformance.py`` and its sync twin).

A kind opens a :class:`Handle` (or :class:`AHandle`): the object handed to pgsolo
(``conn``), and the caller's own moves on it through its library or framework (begin,
execute, roll back), so that a test can check that pgsolo follows the transaction the
caller believes it is in. Each library is imported when its kind opens, so a missing
extra fails that kind's tests with an ImportError naming it, never the whole suite.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from psycopg.conninfo import conninfo_to_dict

import pgsolo
from _support import WORK
from pgsolo import Key

__all__ = [
    "ASYNC_KINDS",
    "SYNC_KINDS",
    "AHandle",
    "AKind",
    "Handle",
    "Kind",
    "acheck_next_user",
    "check_next_user",
    "django_settings",
    "sqlalchemy_fingerprint",
    "sqlalchemy_insert",
    "sqlalchemy_pid",
    "sqlalchemy_raw",
    "sqlalchemy_raw_status",
    "sqlalchemy_url",
]


class Handle(Protocol):
    conn: object

    def execute(self, statement: str) -> None: ...
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def savepoint(self) -> contextlib.AbstractContextManager[None]:
        """A savepoint through the library's own API, rolled back by an exception."""

    def in_transaction(self) -> bool: ...
    def pid(self) -> int: ...
    def fingerprint(self) -> dict[str, object]:
        """Everything a caller could notice about the connection: its library's and its
        framework's books, the transaction at the server and the session's settings
        (read so that the transaction is left as it was)."""

    def next_user(self) -> contextlib.AbstractContextManager[Handle]:
        """The connection as the next user gets it: given back to its pool (or, for
        Django, through the end of a request) and taken out again; the same handle where
        nothing sits between the caller and the connection."""


class AHandle(Protocol):
    conn: object

    async def execute(self, statement: str) -> None: ...
    async def begin(self) -> None: ...
    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...
    def savepoint(self) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def in_transaction(self) -> bool: ...
    async def pid(self) -> int: ...
    async def fingerprint(self) -> dict[str, object]: ...
    def next_user(self) -> contextlib.AbstractAsyncContextManager[AHandle]: ...


@dataclass(frozen=True)
class Kind:
    name: str
    open: Callable[[str], contextlib.AbstractContextManager[Handle]]
    implicit: bool = False
    """The library opens a transaction by itself (DBAPI ``autocommit`` off, no framework
    on top): the caller is always in one, so a transaction lock joins it."""
    session_locks: bool = True
    """False for an ORM Session, which gives its connection back at each commit: pgsolo
    refuses session locks on it (tests/drivers/test_sqlalchemy.py)."""
    keeper: bool = True
    """False where a heartbeat cannot share the connection with the caller's statements
    (psycopg2, asyncpg): ``keep=`` is refused."""
    pooled: bool = False
    """The connection comes from a pool (or a framework's persistent connection): after a
    failure its next user gets a working one (``Handle.next_user``)."""
    opens: str | None = None
    """How its user opens a transaction, in its library's words: what pgsolo must advise
    when it refuses a transaction lock outside one (None where the library opens one by
    itself)."""
    per_thread: bool = False
    """Every ``open`` in one thread hands out the same connection (Django's): two holders
    opened so in one test are one session."""

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class AKind:
    name: str
    open: Callable[[str], contextlib.AbstractAsyncContextManager[AHandle]]
    implicit: bool = False
    session_locks: bool = True
    keeper: bool = True
    pooled: bool = False
    opens: str | None = None
    per_thread: bool = False

    def __str__(self) -> str:
        return self.name


# -- what a caller could notice ------------------------------------------------------------

# The session's own settings (SET, SET LOCAL, set_config, and what the client sent when it
# connected): pg_settings lists every setting with where its value came from.
SETTINGS = (
    "SELECT coalesce(json_object_agg(name, setting ORDER BY name), '{}')::text"
    " FROM pg_settings WHERE source IN ('session', 'client')"
)
_IDLE, _INTRANS = 0, 2  # psycopg's and psycopg2's TransactionStatus values


def raw_state(raw: Any) -> dict[str, object]:
    """The books of a psycopg 3, psycopg2 or pg8000 connection, and its session's settings
    (read only where a statement can run, and the transaction that read opened rolled
    back)."""
    if _is_pg8000(raw):
        return _Pg8000(raw).fingerprint()
    closed = bool(raw.closed)
    status = int(raw.info.transaction_status)
    state: dict[str, object] = {"autocommit": bool(raw.autocommit), "status": status}
    if closed or status not in (_IDLE, _INTRANS):
        return {**state, "closed": closed}
    cur = raw.cursor()
    try:
        cur.execute(SETTINGS)
        state["settings"] = cur.fetchone()[0]
    finally:
        cur.close()
    if status == _IDLE and int(raw.info.transaction_status) != _IDLE:
        raw.rollback()  # the driver began a transaction for the read
    return state


async def araw_state(raw: Any) -> dict[str, object]:
    """:func:`raw_state` for an async connection: psycopg 3's, or asyncpg's (its books are
    whether it is in a transaction; a failed one refuses the read and stays failed)."""
    if hasattr(raw, "get_server_pid"):  # asyncpg
        import asyncpg  # noqa: PLC0415

        state: dict[str, object] = {"in_transaction": raw.is_in_transaction()}
        if raw.is_closed():
            return {**state, "closed": True}
        with contextlib.suppress(asyncpg.InFailedSQLTransactionError):
            state["settings"] = await raw.fetchval(SETTINGS)
        return state
    closed = bool(raw.closed)
    status = int(raw.info.transaction_status)
    state = {"autocommit": bool(raw.autocommit), "status": status}
    if closed or status not in (_IDLE, _INTRANS):
        return {**state, "closed": closed}
    async with raw.cursor() as cur:
        await cur.execute(SETTINGS)
        row = await cur.fetchone()
        state["settings"] = row[0]
    if status == _IDLE and int(raw.info.transaction_status) != _IDLE:
        await raw.rollback()
    return state


# -- bare DBAPI connections --------------------------------------------------------------


class _Dbapi:
    """A psycopg 3 or psycopg2 connection: transactions by statement (the libraries
    track them from the server's answers) or, with autocommit off, by themselves."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, statement: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(statement)

    def begin(self) -> None:
        if self.conn.autocommit:
            self.execute("BEGIN")

    def commit(self) -> None:
        if self.conn.autocommit:
            self.execute("COMMIT")
        else:
            self.conn.commit()

    def rollback(self) -> None:
        if self.conn.autocommit:
            self.execute("ROLLBACK")
        else:
            self.conn.rollback()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        if hasattr(self.conn, "transaction"):  # psycopg 3
            with self.conn.transaction():
                yield
            return
        self.execute("SAVEPOINT callers")  # psycopg2 has no API for one
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK TO SAVEPOINT callers")
            raise
        finally:
            self.execute("RELEASE SAVEPOINT callers")

    def in_transaction(self) -> bool:
        return int(self.conn.info.transaction_status) != 0  # 0: IDLE in both libraries

    def pid(self) -> int:
        return int(self.conn.info.backend_pid)

    def fingerprint(self) -> dict[str, object]:
        return raw_state(self.conn)

    def next_user(self) -> contextlib.AbstractContextManager[Handle]:
        return contextlib.nullcontext(self)


def _psycopg(*, autocommit: bool) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        import psycopg  # noqa: PLC0415

        # Closed, not left through ``with`` (which would commit what a test left open,
        # and fail on a connection a test killed).
        with contextlib.closing(psycopg.connect(dsn, autocommit=autocommit)) as conn:
            yield _Dbapi(conn)

    return opening


def _psycopg2(*, autocommit: bool) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        import psycopg2  # noqa: PLC0415

        conn = psycopg2.connect(dsn)
        conn.autocommit = autocommit
        try:
            yield _Dbapi(conn)
        finally:
            conn.close()

    return opening


class _Pg8000(_Dbapi):
    """A pg8000 DB-API connection: as psycopg2's, but its books are the server's status as
    pg8000 last read it, and its pid what the server said at connection time (pg8000 has
    no public API for either; pgsolo's adapter reads the same)."""

    def execute(self, statement: str) -> None:
        cur = self.conn.cursor()  # no context manager in pg8000
        try:
            cur.execute(statement)
        finally:
            cur.close()

    def in_transaction(self) -> bool:
        return self.conn._transaction_status in (b"T", b"E")

    def pid(self) -> int:
        return int.from_bytes(self.conn._backend_key_data[:4], "big", signed=True)

    def fingerprint(self) -> dict[str, object]:
        closed = self.conn._usock is None
        status = self.conn._transaction_status or b"I"  # None: idle, no statement yet
        state: dict[str, object] = {"autocommit": self.conn.autocommit, "status": status}
        if closed or status == b"E":
            return {**state, "closed": closed}
        cur = self.conn.cursor()
        try:
            cur.execute(SETTINGS)
            state["settings"] = cur.fetchone()[0]
        finally:
            cur.close()
        if status == b"I" and self.conn._transaction_status == b"T":
            self.conn.rollback()  # the driver began a transaction for the read
        return state


def pg8000_options(dsn: str) -> dict[str, Any]:
    """pg8000's keywords for a libpq connection string (a socket directory for a host is
    a socket path to pg8000)."""
    params = conninfo_to_dict(dsn)
    options: dict[str, Any] = {"user": params.get("user"), "password": params.get("password")}
    options["database"] = params.get("dbname")
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    if host.startswith("/"):
        options["unix_sock"] = f"{host}/.s.PGSQL.{port}"
    else:
        options.update(host=host, port=port)
    return options


def _pg8000(*, autocommit: bool) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        import pg8000.dbapi  # noqa: PLC0415

        conn = pg8000.dbapi.connect(**pg8000_options(dsn))
        conn.autocommit = autocommit
        try:
            yield _Pg8000(conn)
        finally:
            with contextlib.suppress(pg8000.dbapi.InterfaceError):  # closed by a test
                conn.close()

    return opening


class _Pooled(_Dbapi):
    """A connection of a psycopg_pool pool of one, as ``with pool.connection()`` hands
    it out, its reset hook ``pgsolo.pool_reset``."""

    def __init__(self, pool: Any, conn: Any) -> None:
        super().__init__(conn)
        self._pool = pool

    @contextlib.contextmanager
    def next_user(self) -> Iterator[Handle]:
        self._pool.putconn(self.conn)
        self.conn = self._pool.getconn()
        yield self


@contextlib.contextmanager
def _psycopg_pool(dsn: str) -> Iterator[Handle]:
    from psycopg_pool import ConnectionPool  # noqa: PLC0415

    import pgsolo  # noqa: PLC0415

    with ConnectionPool(dsn, min_size=1, max_size=1, reset=pgsolo.pool_reset, open=True) as pool:
        handle = _Pooled(pool, pool.getconn())
        try:
            yield handle
        finally:
            pool.putconn(handle.conn)


class _APsycopg:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def execute(self, statement: str) -> None:
        await self.conn.execute(statement)

    async def begin(self) -> None:
        await self.conn.execute("BEGIN")

    async def commit(self) -> None:
        await self.conn.execute("COMMIT")

    async def rollback(self) -> None:
        await self.conn.execute("ROLLBACK")

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        async with self.conn.transaction():
            yield

    async def in_transaction(self) -> bool:
        return int(self.conn.info.transaction_status) != 0

    async def pid(self) -> int:
        return int(self.conn.info.backend_pid)

    async def fingerprint(self) -> dict[str, object]:
        return await araw_state(self.conn)

    def next_user(self) -> contextlib.AbstractAsyncContextManager[AHandle]:
        return contextlib.nullcontext(self)


@contextlib.asynccontextmanager
async def _apsycopg(dsn: str) -> AsyncIterator[AHandle]:
    import psycopg  # noqa: PLC0415

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield _APsycopg(conn)


class _Asyncpg:
    """An asyncpg connection: transactions through ``conn.transaction()``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._transaction: Any = None

    async def execute(self, statement: str) -> None:
        await self.conn.execute(statement)

    async def begin(self) -> None:
        self._transaction = self.conn.transaction()
        await self._transaction.start()

    async def commit(self) -> None:
        await self._transaction.commit()

    async def rollback(self) -> None:
        await self._transaction.rollback()

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        async with self.conn.transaction():  # nested: a savepoint
            yield

    async def in_transaction(self) -> bool:
        return bool(self.conn.is_in_transaction())

    async def pid(self) -> int:
        return int(self.conn.get_server_pid())

    async def fingerprint(self) -> dict[str, object]:
        return await araw_state(self.conn)

    def next_user(self) -> contextlib.AbstractAsyncContextManager[AHandle]:
        return contextlib.nullcontext(self)


class _AsyncpgPooled(_Asyncpg):
    """A connection of an asyncpg pool of one: its next user gets it after
    ``pool.release()`` (which resets the session) and ``pool.acquire()``."""

    def __init__(self, pool: Any, conn: Any) -> None:
        super().__init__(conn)
        self._pool = pool

    @contextlib.asynccontextmanager
    async def next_user(self) -> AsyncIterator[AHandle]:
        await self._pool.release(self.conn)
        self.conn = await self._pool.acquire()
        yield self


def asyncpg_options(dsn: str) -> dict[str, Any]:
    """asyncpg's keywords for a libpq connection string (asyncpg parses URLs only)."""
    params = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    options: dict[str, Any] = {names[k]: v for k, v in params.items() if k in names}
    if "dbname" in params:
        options["database"] = params["dbname"]
    return options


@contextlib.asynccontextmanager
async def _asyncpg(dsn: str) -> AsyncIterator[AHandle]:
    import asyncpg  # noqa: PLC0415

    conn = await asyncpg.connect(**asyncpg_options(dsn))
    try:
        yield _Asyncpg(conn)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _asyncpg_pool(dsn: str) -> AsyncIterator[AHandle]:
    import asyncpg  # noqa: PLC0415

    async with asyncpg.create_pool(min_size=1, max_size=1, **asyncpg_options(dsn)) as pool:
        handle = _AsyncpgPooled(pool, await pool.acquire())
        try:
            yield handle
        finally:
            await pool.release(handle.conn)


# -- SQLAlchemy ------------------------------------------------------------------------


def _raw_pid(raw: Any) -> int:
    """The backend pid of a DBAPI-level connection of any of the four libraries."""
    if hasattr(raw, "get_server_pid"):  # asyncpg
        return int(raw.get_server_pid())
    if _is_pg8000(raw):
        return _Pg8000(raw).pid()
    return int(raw.info.backend_pid)


def _is_pg8000(raw: Any) -> bool:
    return type(raw).__module__.partition(".")[0] == "pg8000"


def _engine(dsn: str, dialect: str) -> Any:
    import sqlalchemy  # noqa: PLC0415

    if dialect == "psycopg":
        import psycopg  # noqa: PLC0415

        return sqlalchemy.create_engine(
            "postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), pool_size=1
        )
    if dialect == "pg8000":
        import pg8000.dbapi  # noqa: PLC0415

        options = pg8000_options(dsn)
        return sqlalchemy.create_engine(
            "postgresql+pg8000://", creator=lambda: pg8000.dbapi.connect(**options), pool_size=1
        )
    import psycopg2  # noqa: PLC0415

    return sqlalchemy.create_engine(
        "postgresql+psycopg2://", creator=lambda: psycopg2.connect(dsn), pool_size=1
    )


def _async_engine(dsn: str, dialect: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    if dialect == "psycopg":
        import psycopg  # noqa: PLC0415

        async def psycopg_connection() -> Any:
            return await psycopg.AsyncConnection.connect(dsn)

        return create_async_engine(
            "postgresql+psycopg://", async_creator=psycopg_connection, pool_size=1
        )
    import asyncpg  # noqa: PLC0415

    async def asyncpg_connection() -> Any:
        return await asyncpg.connect(**asyncpg_options(dsn))

    return create_async_engine(
        "postgresql+asyncpg://", async_creator=asyncpg_connection, pool_size=1
    )


def sqlalchemy_url(dsn: str, dialect: str) -> Any:
    """The SQLAlchemy URL of the libpq connection string ``dsn`` for ``dialect``
    (``psycopg``, ``psycopg2``, ``asyncpg``); a unix socket directory goes in the query."""
    from sqlalchemy.engine import URL  # noqa: PLC0415

    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "")
    query = {"host": host} if host.startswith("/") else {}
    return URL.create(
        f"postgresql+{dialect}",
        username=params.get("user"),
        password=params.get("password"),
        host=None if query else host or None,
        port=int(params["port"]) if params.get("port") and not query else None,
        database=params.get("dbname"),
        query=query,
    )


class _Alchemy:
    """A SQLAlchemy Connection or Session: SQLAlchemy's own transactions."""

    def __init__(self, conn: Any, engine: Any = None) -> None:
        self.conn = conn
        self._engine = engine

    def fingerprint(self) -> dict[str, object]:
        from sqlalchemy.orm import Session  # noqa: PLC0415

        conn = self.conn
        books: dict[str, object] = {
            "in_transaction": conn.in_transaction(),
            "in_nested_transaction": conn.in_nested_transaction(),
        }
        if isinstance(conn, Session):  # no connection of its own outside a transaction
            return books
        books.update(closed=conn.closed, invalidated=conn.invalidated)
        if conn.closed or conn.invalidated:
            return books
        return {**books, "driver": raw_state(conn.connection.driver_connection)}

    @contextlib.contextmanager
    def next_user(self) -> Iterator[Handle]:
        """Back to the engine's pool (its reset runs) and out again: a pool of one
        connection hands out the same one."""
        from sqlalchemy.orm import Session  # noqa: PLC0415

        self.conn.close()
        if isinstance(self.conn, Session):
            with Session(self._engine) as session:
                yield _Alchemy(session, self._engine)
            return
        with self._engine.connect() as conn:
            yield _Alchemy(conn, self._engine)

    def execute(self, statement: str) -> None:
        from sqlalchemy import text  # noqa: PLC0415

        self.conn.execute(text(statement))

    def begin(self) -> None:
        self.conn.begin()

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.conn.begin_nested():
            yield

    def in_transaction(self) -> bool:
        return bool(self.conn.in_transaction())

    def pid(self) -> int:
        from sqlalchemy.orm import Session  # noqa: PLC0415

        if not isinstance(self.conn, Session):
            return _raw_pid(self.conn.connection.driver_connection)
        # A Session has a connection only in a transaction: borrow one, and give it back
        # (the pool hands the same one out next, in a single-threaded test).
        was_in_transaction = self.conn.in_transaction()
        pid = _raw_pid(self.conn.connection().connection.driver_connection)
        if not was_in_transaction:
            self.conn.rollback()
        return pid


def _alchemy(
    dialect: str, *, session: bool = False
) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        from sqlalchemy.orm import Session  # noqa: PLC0415

        engine = _engine(dsn, dialect)
        try:
            if session:
                with Session(engine) as orm_session:
                    yield _Alchemy(orm_session, engine)
            else:
                with engine.connect() as conn:
                    yield _Alchemy(conn, engine)
        finally:
            engine.dispose()

    return opening


class _AAlchemy:
    """A SQLAlchemy AsyncConnection or AsyncSession."""

    def __init__(self, conn: Any, engine: Any = None) -> None:
        self.conn = conn
        self._engine = engine

    async def fingerprint(self) -> dict[str, object]:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415

        conn = self.conn
        books: dict[str, object] = {
            "in_transaction": conn.in_transaction(),
            "in_nested_transaction": conn.in_nested_transaction(),
        }
        if isinstance(conn, AsyncSession):
            return books
        core = conn.sync_connection
        if core is None:
            return {**books, "started": False}
        books.update(closed=core.closed, invalidated=core.invalidated)
        if core.closed or core.invalidated:
            return books
        return {**books, "driver": await araw_state(core.connection.driver_connection)}

    @contextlib.asynccontextmanager
    async def next_user(self) -> AsyncIterator[AHandle]:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415

        await self.conn.close()
        if isinstance(self.conn, AsyncSession):
            async with AsyncSession(self._engine) as session:
                yield _AAlchemy(session, self._engine)
            return
        async with self._engine.connect() as conn:
            yield _AAlchemy(conn, self._engine)

    async def execute(self, statement: str) -> None:
        from sqlalchemy import text  # noqa: PLC0415

        await self.conn.execute(text(statement))

    async def begin(self) -> None:
        await self.conn.begin()

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        await self.conn.rollback()

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        async with self.conn.begin_nested():
            yield

    async def in_transaction(self) -> bool:
        return bool(self.conn.in_transaction())

    async def pid(self) -> int:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415

        if not isinstance(self.conn, AsyncSession):
            return _raw_pid((await self.conn.get_raw_connection()).driver_connection)
        was_in_transaction = self.conn.in_transaction()
        connection = await self.conn.connection()
        pid = _raw_pid((await connection.get_raw_connection()).driver_connection)
        if not was_in_transaction:
            await self.conn.rollback()
        return pid


def _aalchemy(
    dialect: str, *, session: bool = False
) -> Callable[[str], contextlib.AbstractAsyncContextManager[AHandle]]:
    @contextlib.asynccontextmanager
    async def opening(dsn: str) -> AsyncIterator[AHandle]:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415

        engine = _async_engine(dsn, dialect)
        try:
            if session:
                async with AsyncSession(engine) as orm_session:
                    yield _AAlchemy(orm_session, engine)
            else:
                async with engine.connect() as conn:
                    yield _AAlchemy(conn, engine)
        finally:
            await engine.dispose()

    return opening


# -- a SQLAlchemy connection as its caller and its pool's next user see it ----------------


def sqlalchemy_raw(conn: Any) -> Any:
    """The driver connection under a SQLAlchemy ``Connection``."""
    return conn.connection.driver_connection


def sqlalchemy_raw_status(conn: Any) -> str:
    """The server's transaction status of the driver connection under ``conn``."""
    raw = sqlalchemy_raw(conn)
    if hasattr(raw, "is_in_transaction"):  # asyncpg
        return "intrans" if raw.is_in_transaction() else "idle"
    if _is_pg8000(raw):
        return {b"T": "intrans", b"E": "inerror"}.get(raw._transaction_status, "idle")
    return {0: "idle", 2: "intrans", 3: "inerror"}.get(int(raw.info.transaction_status), "?")


def sqlalchemy_fingerprint(conn: Any) -> tuple[object, ...]:
    """What the caller sees of a SQLAlchemy ``Connection``: SQLAlchemy's books, the
    server's transaction status, the driver's autocommit."""
    return (
        conn.in_transaction(),
        sqlalchemy_raw_status(conn),
        conn.connection.dbapi_connection.autocommit,
    )


def sqlalchemy_pid(conn: Any) -> int:
    return _raw_pid(sqlalchemy_raw(conn))


def sqlalchemy_insert(conn: Any, job: str, note: str) -> Any:
    """A work row through SQLAlchemy (awaitable on an AsyncConnection)."""
    from sqlalchemy import text  # noqa: PLC0415

    statement = text(f"INSERT INTO {WORK} (job, note) VALUES (:job, :note)")
    return conn.execute(statement, {"job": job, "note": note})


def _rows_with(observer: Any, note: str) -> int:
    found = observer.conn.execute(f"SELECT count(*) FROM {WORK} WHERE note = %s", (note,))
    return int(found.fetchone()[0])


def check_next_user(conn: Any, observer: Any, key: Key) -> None:
    """The pool's next user of a SQLAlchemy ``Connection``: a rollback undoes its row,
    and a transaction lock is held at the server until its commit."""
    note = uuid.uuid4().hex
    sqlalchemy_insert(conn, "next-user", note)
    conn.rollback()
    assert _rows_with(observer, note) == 0, "a rolled-back row was committed"
    with conn.begin():
        assert pgsolo.xact_lock(conn, key).acquire()
        assert observer.holders(key) == {sqlalchemy_pid(conn)}, "the xact lock is not held"
    assert observer.holders(key) == set()
    assert sqlalchemy_raw_status(conn) == "idle"


async def acheck_next_user(conn: Any, observer: Any, key: Key) -> None:
    """:func:`check_next_user` for an ``AsyncConnection``."""
    note = uuid.uuid4().hex
    await sqlalchemy_insert(conn, "next-user", note)
    await conn.rollback()
    assert _rows_with(observer, note) == 0, "a rolled-back row was committed"
    async with conn.begin():
        assert await pgsolo.xact_lock(conn, key).acquire()
        pid = await conn.run_sync(sqlalchemy_pid)
        assert observer.holders(key) == {pid}, "the xact lock is not held"
    assert observer.holders(key) == set()
    assert await conn.run_sync(sqlalchemy_raw_status) == "idle"


# -- Django ------------------------------------------------------------------------------


def _database_settings(dsn: str) -> dict[str, str]:
    """Django's names for where ``dsn`` goes (the embedded server's DSN has a socket
    directory for its host)."""
    params = conninfo_to_dict(dsn)
    return {
        "NAME": str(params.get("dbname", "postgres")),
        "USER": str(params.get("user", "")),
        "PASSWORD": str(params.get("password", "")),
        "HOST": str(params.get("host", "")),
        "PORT": str(params.get("port", "")),
    }


def django_settings(dsn: str) -> None:
    """Configure Django once per process, for the test database at ``dsn`` (its settings
    can be configured only once; every test module that uses Django calls this):
    ``default`` (persistent connections, what pgsolo's release at the end of a request is
    for), ``closing`` (closed at the end of each request) and ``lite`` (sqlite, which
    pgsolo refuses)."""
    import django  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    if settings.configured:
        return
    database = {
        "ENGINE": "django.db.backends.postgresql",
        **_database_settings(dsn),
        "CONN_MAX_AGE": None,
    }
    settings.configure(
        DATABASES={
            "default": database,
            "closing": {**database, "CONN_MAX_AGE": 0},
            "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        },
        USE_TZ=True,
    )
    if DJANGO_DRIVER == "psycopg2":
        _django_backend_on_psycopg2()
    django.setup()


# Django's postgresql backend takes psycopg 3 when it can import it, else psycopg2; the
# suite runs Django on psycopg2 in a process of its own (tests/drivers/test_django_psycopg2.py)
# with this set, so that every Django test there goes through psycopg2.
DJANGO_DRIVER = os.environ.get("PGSOLO_TEST_DJANGO_DRIVER", "psycopg")


def _django_backend_on_psycopg2() -> None:
    """Import Django's postgresql backend while psycopg 3 cannot be imported, so that it
    binds psycopg2; psycopg 3 is back for everything else (pgsolo's own use) afterwards."""
    hidden = {
        name: module for name, module in sys.modules.items() if name.split(".")[0] == "psycopg"
    }
    sys.modules.update(dict.fromkeys(hidden))  # None: an import of it raises ImportError
    try:
        import django.db.backends.postgresql.base  # noqa: F401, PLC0415
    finally:
        sys.modules.update(hidden)


class _Django:
    """Django's connection: transactions through ``transaction.atomic()``."""

    def __init__(self) -> None:
        from django.db import connection  # noqa: PLC0415

        self.conn = connection
        self._atomic: Any = None

    def execute(self, statement: str) -> None:
        with self.conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(statement)

    def begin(self) -> None:
        from django.db import transaction  # noqa: PLC0415

        self._atomic = transaction.atomic()
        self._atomic.__enter__()

    def commit(self) -> None:
        self._atomic.__exit__(None, None, None)

    def rollback(self) -> None:
        from django.db import transaction  # noqa: PLC0415

        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        from django.db import transaction  # noqa: PLC0415

        with transaction.atomic():  # nested in begin()'s: a savepoint
            yield

    def in_transaction(self) -> bool:
        return bool(self.conn.in_atomic_block)  # type: ignore[attr-defined]

    def pid(self) -> int:
        self.conn.ensure_connection()  # type: ignore[attr-defined]
        return _raw_pid(self.conn.connection)  # type: ignore[attr-defined]

    def fingerprint(self) -> dict[str, object]:
        wrapper: Any = self.conn
        books: dict[str, object] = {
            "in_atomic_block": wrapper.in_atomic_block,
            "needs_rollback": wrapper.needs_rollback,
            "savepoints": len(wrapper.savepoint_ids),
            "on_commit": len(wrapper.run_on_commit),
            "autocommit": wrapper.autocommit,
            "errors_occurred": wrapper.errors_occurred,
        }
        if wrapper.connection is None:
            return {**books, "connected": False}
        return {**books, "driver": raw_state(wrapper.connection)}

    @contextlib.contextmanager
    def next_user(self) -> Iterator[Handle]:
        """Through the end of a request and the start of the next (Django's signals:
        an unusable connection is closed there, and opened anew at the next statement)."""
        from django.core import signals  # noqa: PLC0415

        signals.request_finished.send(sender=type(self))
        signals.request_started.send(sender=type(self))
        yield self


_DJANGO_OPEN = [0]  # handles open now: Django gives every one the same connection


@contextlib.contextmanager
def _django(dsn: str) -> Iterator[Handle]:
    """Django's ``connection``, pointed at ``dsn`` for as long as a handle is open (the
    settings say the test database; a test may give a standby's DSN)."""
    from django.db import connection  # noqa: PLC0415

    django_settings(dsn)
    if not _DJANGO_OPEN[0]:
        connection.close()
        given = _database_settings(dsn)
        before = {name: connection.settings_dict[name] for name in given}
        connection.settings_dict.update(given)
    handle = _Django()
    _DJANGO_OPEN[0] += 1
    try:
        yield handle
    finally:
        _DJANGO_OPEN[0] -= 1
        if not _DJANGO_OPEN[0]:  # as at the end of a request: not under an outer handle
            connection.close()
            connection.settings_dict.update(before)


SYNC_KINDS = [
    Kind("psycopg", _psycopg(autocommit=True), opens="with conn.transaction():"),
    Kind("psycopg-implicit", _psycopg(autocommit=False), implicit=True),
    Kind("psycopg2", _psycopg2(autocommit=False), implicit=True, keeper=False),
    Kind(
        "psycopg2-autocommit",
        _psycopg2(autocommit=True),
        keeper=False,
        opens="conn.autocommit = False",
    ),
    Kind("pg8000", _pg8000(autocommit=False), implicit=True, keeper=False),
    Kind(
        "pg8000-autocommit",
        _pg8000(autocommit=True),
        keeper=False,
        opens="conn.autocommit = False",
    ),
    Kind("psycopg-pool", _psycopg_pool, implicit=True, pooled=True),
    Kind("sqlalchemy-psycopg", _alchemy("psycopg"), pooled=True, opens="with conn.begin():"),
    Kind(
        "sqlalchemy-psycopg2",
        _alchemy("psycopg2"),
        keeper=False,
        pooled=True,
        opens="with conn.begin():",
    ),
    Kind(
        "sqlalchemy-pg8000",
        _alchemy("pg8000"),
        keeper=False,
        pooled=True,
        opens="with conn.begin():",
    ),
    Kind(
        "sqlalchemy-session",
        _alchemy("psycopg", session=True),
        session_locks=False,
        pooled=True,
        opens="with session.begin():",
    ),
    Kind(
        "django" if DJANGO_DRIVER == "psycopg" else "django-psycopg2",
        _django,
        keeper=DJANGO_DRIVER == "psycopg",  # a psycopg2 connection takes no keeper
        pooled=True,
        opens="with transaction.atomic():",
        per_thread=True,
    ),
]

ASYNC_KINDS = [
    AKind("psycopg-async", _apsycopg, opens="async with conn.transaction():"),
    AKind("asyncpg", _asyncpg, keeper=False, opens="async with conn.transaction():"),
    AKind(
        "asyncpg-pool",
        _asyncpg_pool,
        keeper=False,
        pooled=True,
        opens="async with conn.transaction():",
    ),
    AKind(
        "sqlalchemy-async-psycopg",
        _aalchemy("psycopg"),
        pooled=True,
        opens="async with conn.begin():",
    ),
    AKind(
        "sqlalchemy-async-asyncpg",
        _aalchemy("asyncpg"),
        keeper=False,
        pooled=True,
        opens="async with conn.begin():",
    ),
    AKind(
        "sqlalchemy-asyncsession",
        _aalchemy("asyncpg", session=True),
        session_locks=False,
        pooled=True,
        opens="async with session.begin():",
    ),
]


# -- SQLAlchemy engines with pgsolo's pool hook (fixtures, imported by conftest.py) ----------


@pytest.fixture(params=["psycopg", "psycopg2"])
def engine(request: pytest.FixtureRequest, db: str) -> Iterator[Any]:
    """An engine of one pooled connection, so the next checkout is the connection the
    last user had, with ``pgsolo.sqlalchemy.install``'s hook."""
    from sqlalchemy import create_engine  # noqa: PLC0415

    import pgsolo.sqlalchemy  # noqa: PLC0415

    made = create_engine(sqlalchemy_url(db, request.param), pool_size=1, max_overflow=0)
    pgsolo.sqlalchemy.install(made)
    yield made
    made.dispose()


@pytest.fixture(params=["psycopg", "asyncpg"])
async def aengine(request: pytest.FixtureRequest, db: str) -> AsyncIterator[Any]:
    """:func:`engine` for async code."""
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    import pgsolo.sqlalchemy  # noqa: PLC0415

    made = create_async_engine(sqlalchemy_url(db, request.param), pool_size=1, max_overflow=0)
    pgsolo.sqlalchemy.install(made)
    yield made
    await made.dispose()
