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

import contextlib
from collections.abc import AsyncIterator, Iterator
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


def dbapi_state(raw: Any) -> Fingerprint:
    """A psycopg 3 or psycopg2 connection's books and session; the transaction a read
    in autocommit-off mode opens is rolled back, so that it is left as it was."""
    if raw.closed or getattr(raw, "broken", False):
        raise Dead
    status = int(raw.info.transaction_status)
    state: Fingerprint = {"autocommit": bool(raw.autocommit), "status": status}
    if status not in (_IDLE, _INTRANS):  # busy or failed: nothing can be read, and it shows
        return state
    try:
        cur = raw.cursor()
        try:
            cur.execute(CHECK)
            row = cur.fetchone()
        finally:
            cur.close()
        if status == _IDLE and int(raw.info.transaction_status) != _IDLE:
            raw.rollback()
    except Exception as exc:
        if raw.closed or getattr(raw, "broken", False):
            raise Dead from exc
        return {**state, "error": f"{type(exc).__name__}: {exc}"}
    return _read(state, row)


async def async_state(raw: Any) -> Fingerprint:
    """:func:`dbapi_state` for psycopg 3's ``AsyncConnection`` or an asyncpg connection."""
    if hasattr(raw, "get_server_pid"):  # asyncpg: its books are whether it is in a transaction
        if raw.is_closed():
            raise Dead
        state: Fingerprint = {"driver_in_transaction": raw.is_in_transaction()}
        try:
            row = await raw.fetchrow(CHECK)
        except Exception as exc:
            if raw.is_closed():
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
    calls: ClassVar[tuple[str, ...]] = ("xact_lock", "session_lock", "run_once")
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
            return dbapi_state(conn)
        except Dead:
            self.discard()
            raise

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
    calls = ("job_xact", "job_session", "xact_lock", "session_lock", "run_once", "cli")

    def open(self) -> Any:
        return _psycopg_connect(self.dsn, autocommit=True)


class Psycopg2(_Held):
    """psycopg2 with its default, ``autocommit=False``: the driver opens the transaction
    a transaction lock joins, and the caller commits it."""

    name = "psycopg2"

    def open(self) -> Any:
        import psycopg2  # noqa: PLC0415

        return psycopg2.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT_S)


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
                pool_pre_ping=True,
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
            return {**books, **dbapi_state(conn.connection.driver_connection)}
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
            return {**books, **dbapi_state(conn.connection)}
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
        PsycopgPool,
        AlchemyPsycopg,
        AlchemyPsycopg2,
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
