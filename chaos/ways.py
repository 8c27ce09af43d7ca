"""The ways in: every kind of connection pgsolo takes, opened the way its users open it,
and what the chaos worker needs of each: a connection to hand pgsolo, the work's clock
and ``run_once``'s effect through the library's own calls, and the connection's
fingerprint as its next user finds it.

A *pooled* way (psycopg_pool, an asyncpg pool, a SQLAlchemy engine, Django's persistent
connection) gives its connection back after each attempt and is checked out again for
the fingerprint: a pool of one hands out the same connection, so what pgsolo left on it
is what the next user gets. A *held* way keeps one connection and fingerprints it as is.

A fingerprint is everything a caller could notice: the driver's autocommit and
transaction status, the framework's books (SQLAlchemy's ``in_transaction()``, Django's
``in_atomic_block``, ``needs_rollback``...), and the session's own settings. It is read
with one statement that also names the backend and counts its advisory locks (compared
apart: a lock left is a leak, not a change). A connection that died under a fault is
*dead*, not changed: it is thrown away and the next one opened.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any, ClassVar

from psycopg.conninfo import conninfo_to_dict

import pgsolo

CLOCK = "SELECT clock_timestamp()"
# The backend, its advisory locks, and the session's own settings (SET, set_config, and
# what the client sent when it connected): pg_settings says where each value came from.
CHECK = (
    "SELECT pg_backend_pid(),"
    " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),"
    " (SELECT coalesce(json_object_agg(name, setting ORDER BY name), '{}')::text"
    " FROM pg_settings WHERE source IN ('session', 'client'))"
)
_IDLE, _INTRANS = 0, 2  # psycopg's and psycopg2's TransactionStatus values
CONNECT_TIMEOUT_S = 5
CHECKOUT_TIMEOUT_S = 10.0
GOODBYE_S = 1.0  # from a server's FATAL goodbye to the socket's end, as asyncpg sees it
# pg8000's one timeout bounds its connect and every answer alike: longer than any stall a
# fault makes (a blackhole of up to 4 s), shorter than a hang (chaos/suite.py HANG_S).
PG8000_TIMEOUT_S = 10.0


class Dead(Exception):
    """The connection died (a fault did it): not a change pgsolo made."""


Fingerprint = dict[str, object]


def without_identity(fingerprint: Fingerprint) -> Fingerprint:
    """What must be as found: all but the backend (a new one after a reconnect) and its
    advisory locks (judged apart, as leaks)."""
    return {k: v for k, v in fingerprint.items() if k not in ("pid", "locks")}


def _read(state: Fingerprint, row: Any) -> Fingerprint:
    pid, locks, settings = row
    return {**state, "pid": int(pid), "locks": int(locks), "settings": settings}


def _read_books(
    raw: Any, state: Fingerprint, left_idle: Callable[[], bool], dead: Callable[[Exception], bool]
) -> Fingerprint:
    """``state`` with the session's settings and locks read over ``raw`` (a DB-API
    connection): a transaction the read opened (autocommit off, ``left_idle()`` false
    after it) is rolled back, so that it is left as it was; an error the connection died
    of (``dead``) is :class:`Dead`, any other is part of the fingerprint."""
    was_idle = left_idle()
    try:
        cur = raw.cursor()
        try:
            cur.execute(CHECK)
            row = cur.fetchone()
        finally:
            cur.close()
        if was_idle and not left_idle():
            raw.rollback()
    except Exception as exc:
        if dead(exc):
            raise Dead from exc
        return {**state, "error": f"{type(exc).__name__}: {exc}"}
    return _read(state, row)


def dbapi_state(raw: Any) -> Fingerprint:
    """A psycopg 3 or psycopg2 connection's books and session."""
    if raw.closed or getattr(raw, "broken", False):
        raise Dead
    status = int(raw.info.transaction_status)
    state: Fingerprint = {"autocommit": bool(raw.autocommit), "status": status}
    if status not in (_IDLE, _INTRANS):  # busy or failed: nothing can be read, and it shows
        return state
    return _read_books(
        raw,
        state,
        lambda: int(raw.info.transaction_status) == _IDLE,
        lambda _: bool(raw.closed) or bool(getattr(raw, "broken", False)),
    )


def pg8000_state(raw: Any) -> Fingerprint:
    """:func:`dbapi_state` for a pg8000 DB-API connection. pg8000 has no public API for
    the transaction status: it keeps the byte of the server's last ReadyForQuery
    (``_transaction_status``, None before the first statement, when the server was idle),
    read here rather than through pgsolo's adapter, which is what is judged. A closed
    connection has no socket; one whose socket failed says so when used (InterfaceError,
    or the socket's own OSError, which pg8000 lets through)."""
    import pg8000.exceptions  # noqa: PLC0415

    if raw._usock is None:
        raise Dead
    status = (raw._transaction_status or b"I").decode()
    state: Fingerprint = {"autocommit": bool(raw.autocommit), "status": status}
    if status not in ("I", "T"):  # a failed transaction: nothing can be read, and it shows
        return state
    return _read_books(
        raw,
        state,
        lambda: (raw._transaction_status or b"I") == b"I",
        lambda exc: isinstance(exc, pg8000.exceptions.InterfaceError | OSError),
    )


def pg8000_options(dsn: str) -> dict[str, Any]:
    """pg8000's keywords for a libpq connection string (a socket directory for a host is
    a socket path to pg8000)."""
    params = conninfo_to_dict(dsn)
    options: dict[str, Any] = {
        "user": params.get("user"),
        "password": params.get("password"),
        "database": params.get("dbname"),
        "timeout": PG8000_TIMEOUT_S,
    }
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    if host.startswith("/"):
        return {**options, "unix_sock": f"{host}/.s.PGSQL.{port}"}
    return {**options, "host": host, "port": port}


def _pg8000_connect(dsn: str) -> Any:
    import pg8000.dbapi  # noqa: PLC0415

    return pg8000.dbapi.connect(**pg8000_options(dsn))


async def _closing(raw: Any) -> bool:
    """Whether an asyncpg connection that failed the check is closed, or closes within
    :data:`GOODBYE_S`. A server that ends a session (a terminated holder, a restart)
    sends its FATAL error, then closes the socket; asyncpg reads them in turn, and a
    statement sent in between fails with "another operation is in progress" on a
    connection not yet closed (the 200,000-attempt run counted 3 such as changed; traced,
    each closed 12 to 21 ms later). Dead, then, not changed; one still open is changed."""
    closed = asyncio.Event()

    def on_closed(_: object) -> None:
        closed.set()

    raw.add_termination_listener(on_closed)
    try:
        if not raw.is_closed():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), GOODBYE_S)
    finally:
        raw.remove_termination_listener(on_closed)
    return bool(raw.is_closed())


async def async_state(raw: Any) -> Fingerprint:
    """:func:`dbapi_state` for psycopg 3's ``AsyncConnection`` or an asyncpg connection."""
    if hasattr(raw, "get_server_pid"):  # asyncpg: its books are whether it is in a transaction
        if raw.is_closed():
            raise Dead
        state: Fingerprint = {"driver_in_transaction": raw.is_in_transaction()}
        try:
            row = await raw.fetchrow(CHECK)
        except Exception as exc:
            if await _closing(raw):
                raise Dead from exc
            return {**state, "error": f"{type(exc).__name__}: {exc}"}
        return _read(state, tuple(row))
    if raw.closed or raw.broken:
        raise Dead
    status = int(raw.info.transaction_status)
    state = {"autocommit": bool(raw.autocommit), "status": status}
    if status not in (_IDLE, _INTRANS):
        return state
    try:
        async with raw.cursor() as cur:
            await cur.execute(CHECK)
            row = await cur.fetchone()
        if status == _IDLE and int(raw.info.transaction_status) != _IDLE:
            await raw.rollback()
    except Exception as exc:
        if raw.closed or raw.broken:
            raise Dead from exc
        return {**state, "error": f"{type(exc).__name__}: {exc}"}
    return _read(state, row)


def asyncpg_options(dsn: str) -> dict[str, Any]:
    """asyncpg's keywords for a libpq connection string (asyncpg parses URLs only)."""
    params = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    options: dict[str, Any] = {names[k]: v for k, v in params.items() if k in names}
    if "dbname" in params:
        options["database"] = params["dbname"]
    return {**options, "timeout": CONNECT_TIMEOUT_S}


def _psycopg_connect(dsn: str, **options: Any) -> Any:
    import psycopg  # noqa: PLC0415

    return psycopg.connect(
        dsn, connect_timeout=CONNECT_TIMEOUT_S, prepare_threshold=None, **options
    )


# -- the ways ------------------------------------------------------------------------------


class Way:
    """A sync way in. ``calls`` are the pgsolo calls an attempt through it makes."""

    name: ClassVar[str]
    calls: ClassVar[tuple[str, ...]] = (
        "xact_lock",
        "session_lock",
        "run_once",
        "leader",
        "semaphore",
    )
    is_async: ClassVar[bool] = False
    pooled: ClassVar[bool] = False
    placeholder: ClassVar[str] = "%s"  # how run_once's effect takes its parameters

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def checkout(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def clock(self, conn: Any) -> datetime:
        cur = conn.cursor()
        try:
            cur.execute(CLOCK)
            return cur.fetchone()[0]  # type: ignore[no-any-return]
        finally:
            cur.close()

    def effect(self, conn: Any, sql: str, params: tuple[object, ...]) -> bool:
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
            return cur.fetchone() is not None
        finally:
            cur.close()

    def fingerprint(self) -> Fingerprint:
        """The connection as its next user finds it."""
        with self.checkout() as conn:
            return self.fingerprint_of(conn)

    def fingerprint_of(self, conn: Any) -> Fingerprint:
        try:
            return self.state(conn)
        except Dead:
            self.discard()
            raise

    def state(self, raw: Any) -> Fingerprint:
        """The books and session of the driver's connection under ``conn``."""
        return dbapi_state(raw)

    def end(self, conn: Any, *, failed: bool) -> None:
        """The caller's own end of an attempt: nothing for a connection in autocommit, or
        one whose pool or framework ends the transaction."""

    def discard(self) -> None:
        """Throw the connection away (its session, and any lock on it, ends)."""

    def close(self) -> None:
        self.discard()


class _Held(Way):
    """One connection, kept across attempts and opened again when it dies."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn: Any = None

    def open(self) -> Any:
        raise NotImplementedError

    def dead(self, conn: Any) -> bool:
        return bool(conn.closed) or bool(getattr(conn, "broken", False))

    @contextlib.contextmanager
    def checkout(self) -> Iterator[Any]:
        if self.conn is None or self.dead(self.conn):
            self.discard()
            self.conn = self.open()
        yield self.conn

    def discard(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


class Psycopg(_Held):
    """psycopg 3, ``autocommit=True`` (also what ``run_job`` and ``pgsolo run`` use)."""

    name = "psycopg"
    calls = (
        "job_xact",
        "job_session",
        "xact_lock",
        "session_lock",
        "run_once",
        "leader",
        "semaphore",
        "cli",
    )

    def open(self) -> Any:
        return _psycopg_connect(self.dsn, autocommit=True)


class _CallerEnds(_Held):
    """A connection with its driver's default, ``autocommit=False``: the driver opens the
    transaction a transaction lock joins, and the caller commits it (rolls it back after
    a failure)."""

    def end(self, conn: Any, *, failed: bool) -> None:
        if not failed:
            conn.commit()
        elif not self.dead(conn):
            conn.rollback()


class Psycopg2(_CallerEnds):
    """psycopg2, ``autocommit=False`` (its default)."""

    name = "psycopg2"

    def open(self) -> Any:
        import psycopg2  # noqa: PLC0415

        return psycopg2.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT_S)


class Pg8000(_CallerEnds):
    """A pg8000 DB-API connection, ``autocommit=False`` (its default). pg8000 cannot be
    interrupted in the middle of an exchange: a caller's own statement that an exception
    cuts short (a Ctrl-C, a network error) leaves the rest of the server's answer unread
    and the connection unusable, so the caller closes it, as a careful pg8000 user must
    (pgsolo's own round trips hold a Ctrl-C until they end)."""

    name = "pg8000"

    def open(self) -> Any:
        return _pg8000_connect(self.dsn)

    def dead(self, conn: Any) -> bool:
        return conn._usock is None  # closed: pg8000 drops its socket

    def state(self, raw: Any) -> Fingerprint:
        return pg8000_state(raw)

    @contextlib.contextmanager
    def _own(self, conn: Any) -> Iterator[None]:
        """The caller's own statement: the connection closed if it is cut short."""
        import pg8000.exceptions  # noqa: PLC0415

        try:
            yield
        except pg8000.exceptions.DatabaseError:
            raise  # the server's error: pg8000 read its answer to the end
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise

    def clock(self, conn: Any) -> datetime:
        with self._own(conn):
            return super().clock(conn)

    def effect(self, conn: Any, sql: str, params: tuple[object, ...]) -> bool:
        with self._own(conn):
            return super().effect(conn, sql, params)

    def end(self, conn: Any, *, failed: bool) -> None:
        with self._own(conn):
            super().end(conn, failed=failed)


class PsycopgPool(Way):
    """A psycopg_pool pool of one, its reset hook ``pgsolo.pool_reset``; connections with
    psycopg's default ``autocommit=False``, committed by ``pool.connection()``."""

    name = "psycopg-pool"
    pooled = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.pool: Any = None

    @contextlib.contextmanager
    def checkout(self) -> Iterator[Any]:
        from psycopg_pool import ConnectionPool  # noqa: PLC0415

        if self.pool is None:
            self.pool = ConnectionPool(
                self.dsn,
                min_size=1,
                max_size=1,
                kwargs={"connect_timeout": CONNECT_TIMEOUT_S, "prepare_threshold": None},
                reset=pgsolo.pool_reset,
                check=ConnectionPool.check_connection,
                timeout=CHECKOUT_TIMEOUT_S,
                reconnect_timeout=30,
                open=True,
            )
        with self.pool.connection() as conn:
            yield conn

    def discard(self) -> None:
        if self.pool is not None:
            with contextlib.suppress(Exception):
                self.pool.close(timeout=1)
            self.pool = None


class _Alchemy(Way):
    """A SQLAlchemy ``Connection`` from an engine with a pool of one, with
    ``pgsolo.sqlalchemy.install(engine)``."""

    pooled = True
    placeholder = ":p"
    dialect: ClassVar[str]
    pre_ping: ClassVar[bool] = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.engine: Any = None

    def _creator(self) -> Any:
        raise NotImplementedError

    @contextlib.contextmanager
    def checkout(self) -> Iterator[Any]:
        import sqlalchemy  # noqa: PLC0415

        import pgsolo.sqlalchemy  # noqa: PLC0415

        if self.engine is None:
            self.engine = sqlalchemy.create_engine(
                f"postgresql+{self.dialect}://",
                creator=self._creator,
                pool_size=1,
                max_overflow=0,
                pool_timeout=CHECKOUT_TIMEOUT_S,
                pool_pre_ping=self.pre_ping,
            )
            pgsolo.sqlalchemy.install(self.engine)
        with self.engine.connect() as conn:
            yield conn

    def clock(self, conn: Any) -> datetime:
        from sqlalchemy import text  # noqa: PLC0415

        return conn.execute(text(CLOCK)).scalar_one()  # type: ignore[no-any-return]

    def effect(self, conn: Any, sql: str, params: tuple[object, ...]) -> bool:
        from sqlalchemy import text  # noqa: PLC0415

        named = {f"p{i}": value for i, value in enumerate(params)}
        return conn.execute(text(sql), named).first() is not None

    def fingerprint_of(self, conn: Any) -> Fingerprint:
        books: Fingerprint = {
            "in_transaction": conn.in_transaction(),
            "in_nested_transaction": conn.in_nested_transaction(),
            "invalidated": conn.invalidated,
        }
        try:
            return {**books, **self.state(conn.connection.driver_connection)}
        except Dead:
            conn.invalidate()
            raise

    def discard(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.dispose()
            self.engine = None


class AlchemyPsycopg(_Alchemy):
    name = "sqlalchemy-psycopg"
    dialect = "psycopg"

    def _creator(self) -> Any:
        return _psycopg_connect(self.dsn)


class AlchemyPsycopg2(_Alchemy):
    name = "sqlalchemy-psycopg2"
    dialect = "psycopg2"

    def _creator(self) -> Any:
        import psycopg2  # noqa: PLC0415

        return psycopg2.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT_S)


class AlchemyPg8000(_Alchemy):
    """pg8000 under SQLAlchemy, opened as its dialect opens it (``pg8000.connect``). No
    pre-ping: SQLAlchemy's (its default ``do_ping``, a ``SELECT 1`` with pg8000's
    autocommit off) leaves the transaction pg8000 began open at every checkout, which
    SQLAlchemy's books do not show; every later fingerprint would differ from the fresh
    one, and ``run_once`` refuses such a connection. A connection a fault killed is found
    by the next statement instead."""

    name = "sqlalchemy-pg8000"
    dialect = "pg8000"
    pre_ping = False

    def _creator(self) -> Any:
        import pg8000  # noqa: PLC0415

        return pg8000.connect(**pg8000_options(self.dsn))

    def state(self, raw: Any) -> Fingerprint:
        return pg8000_state(raw)


class Django(Way):
    """Django's ``connection``, persistent (``CONN_MAX_AGE=None``, health checks on): its
    next user is the next request, after Django's end-of-request signals."""

    name = "django"
    pooled = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        configure_django(dsn)

    @contextlib.contextmanager
    def checkout(self) -> Iterator[Any]:
        from django.core import signals  # noqa: PLC0415
        from django.db import connection  # noqa: PLC0415

        signals.request_started.send(sender=type(self))
        try:
            yield connection
        finally:
            signals.request_finished.send(sender=type(self))

    def fingerprint_of(self, conn: Any) -> Fingerprint:
        try:
            conn.ensure_connection()  # what the next request's first statement does
        except Exception as exc:  # Django could not connect: the server is away
            raise Dead from exc
        books: Fingerprint = {
            "in_atomic_block": conn.in_atomic_block,
            "needs_rollback": conn.needs_rollback,
            "savepoints": len(conn.savepoint_ids),
            "on_commit": len(conn.run_on_commit),
            "django_autocommit": conn.autocommit,
            "errors_occurred": conn.errors_occurred,
        }
        try:
            return {**books, **self.state(conn.connection)}
        except Dead:
            self.discard()
            raise

    def discard(self) -> None:
        from django.db import connection  # noqa: PLC0415

        with contextlib.suppress(Exception):
            connection.close()


def configure_django(dsn: str) -> None:
    """Django's settings for this worker process, once: its ``default`` database at
    ``dsn`` (a process has one set of settings, so one route for Django)."""
    import django  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    if settings.configured:
        return
    params = conninfo_to_dict(dsn)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": str(params.get("dbname", "postgres")),
                "USER": str(params.get("user", "")),
                "PASSWORD": str(params.get("password", "")),
                "HOST": str(params.get("host", "")),
                "PORT": str(params.get("port", "")),
                "CONN_MAX_AGE": None,
                "CONN_HEALTH_CHECKS": True,
                "OPTIONS": {"connect_timeout": CONNECT_TIMEOUT_S},
            }
        },
        USE_TZ=True,
    )
    django.setup()


# -- async ways ----------------------------------------------------------------------------


class AsyncWay(Way):
    is_async = True

    def acheckout(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def aclock(self, conn: Any) -> datetime:
        return await conn.fetchval(CLOCK)  # type: ignore[no-any-return]

    async def aeffect(self, conn: Any, sql: str, params: tuple[object, ...]) -> bool:
        return await conn.fetchval(sql, *params) is not None

    async def afingerprint(self) -> Fingerprint:
        async with self.acheckout() as conn:
            return await self.afingerprint_of(conn)

    async def afingerprint_of(self, conn: Any) -> Fingerprint:
        try:
            return await async_state(conn)
        except Dead:
            await self.adiscard()
            raise

    async def adiscard(self) -> None:
        """Throw the connection away."""


class Asyncpg(AsyncWay):
    """A bare asyncpg connection, kept across attempts."""

    name = "asyncpg"
    placeholder = "$"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn: Any = None

    @contextlib.asynccontextmanager
    async def acheckout(self) -> AsyncIterator[Any]:
        import asyncpg  # noqa: PLC0415

        if self.conn is None or self.conn.is_closed():
            await self.adiscard()
            self.conn = await asyncpg.connect(**asyncpg_options(self.dsn))
        yield self.conn

    async def adiscard(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None


class AsyncpgPool(AsyncWay):
    """An asyncpg pool of one: ``async with pool.acquire()``, and its own reset on
    release."""

    name = "asyncpg-pool"
    placeholder = "$"
    pooled = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.pool: Any = None

    @contextlib.asynccontextmanager
    async def acheckout(self) -> AsyncIterator[Any]:
        import asyncpg  # noqa: PLC0415

        if self.pool is None:
            self.pool = await asyncpg.create_pool(
                min_size=1, max_size=1, **asyncpg_options(self.dsn)
            )
        async with self.pool.acquire(timeout=CHECKOUT_TIMEOUT_S) as conn:
            yield conn

    async def adiscard(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None


class _AsyncAlchemy(AsyncWay):
    """A SQLAlchemy ``AsyncConnection`` from an engine with a pool of one, with
    ``pgsolo.sqlalchemy.install(engine)``."""

    pooled = True
    placeholder = ":p"
    dialect: ClassVar[str]

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.engine: Any = None

    async def _creator(self) -> Any:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def acheckout(self) -> AsyncIterator[Any]:
        from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

        import pgsolo.sqlalchemy  # noqa: PLC0415

        if self.engine is None:
            self.engine = create_async_engine(
                f"postgresql+{self.dialect}://",
                async_creator=self._creator,
                pool_size=1,
                max_overflow=0,
                pool_timeout=CHECKOUT_TIMEOUT_S,
                pool_pre_ping=True,
            )
            pgsolo.sqlalchemy.install(self.engine)
        async with self.engine.connect() as conn:
            yield conn

    async def aclock(self, conn: Any) -> datetime:
        from sqlalchemy import text  # noqa: PLC0415

        return (await conn.execute(text(CLOCK))).scalar_one()  # type: ignore[no-any-return]

    async def aeffect(self, conn: Any, sql: str, params: tuple[object, ...]) -> bool:
        from sqlalchemy import text  # noqa: PLC0415

        named = {f"p{i}": value for i, value in enumerate(params)}
        return (await conn.execute(text(sql), named)).first() is not None

    async def afingerprint_of(self, conn: Any) -> Fingerprint:
        books: Fingerprint = {
            "in_transaction": conn.in_transaction(),
            "in_nested_transaction": conn.in_nested_transaction(),
            "invalidated": conn.invalidated,
        }
        raw = (await conn.get_raw_connection()).driver_connection
        try:
            return {**books, **(await async_state(raw))}
        except Dead:
            await conn.invalidate()
            raise

    async def adiscard(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):
                await self.engine.dispose()
            self.engine = None


class AsyncAlchemyPsycopg(_AsyncAlchemy):
    name = "sqlalchemy-async-psycopg"
    dialect = "psycopg"

    async def _creator(self) -> Any:
        import psycopg  # noqa: PLC0415

        return await psycopg.AsyncConnection.connect(
            self.dsn, connect_timeout=CONNECT_TIMEOUT_S, prepare_threshold=None
        )


class AsyncAlchemyAsyncpg(_AsyncAlchemy):
    name = "sqlalchemy-async-asyncpg"
    dialect = "asyncpg"

    async def _creator(self) -> Any:
        import asyncpg  # noqa: PLC0415

        return await asyncpg.connect(**asyncpg_options(self.dsn))


WAYS: dict[str, type[Way]] = {
    way.name: way
    for way in (
        Psycopg,
        Psycopg2,
        Pg8000,
        PsycopgPool,
        AlchemyPsycopg,
        AlchemyPsycopg2,
        AlchemyPg8000,
        Django,
        Asyncpg,
        AsyncpgPool,
        AsyncAlchemyPsycopg,
        AsyncAlchemyAsyncpg,
    )
}
# Every (way, call) an attempt can make, in a fixed order: the counters' layout.
COMBOS = tuple((name, call) for name, way in WAYS.items() for call in way.calls)


def effect_sql(template: str, placeholder: str) -> str:
    """``template`` (``%s`` placeholders) in the way's own parameter style."""
    parts = template.split("%s")
    if placeholder == "%s":
        return template
    marks = [f"{placeholder}{i + (placeholder == '$')}" for i in range(len(parts) - 1)]
    return "".join(p + m for p, m in zip(parts, [*marks, ""], strict=True))
