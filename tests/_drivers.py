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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg.conninfo import conninfo_to_dict

__all__ = ["ASYNC_KINDS", "SYNC_KINDS", "AHandle", "AKind", "Handle", "Kind", "django_settings"]


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


class AHandle(Protocol):
    conn: object

    async def execute(self, statement: str) -> None: ...
    async def begin(self) -> None: ...
    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...
    def savepoint(self) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def in_transaction(self) -> bool: ...
    async def pid(self) -> int: ...


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

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class AKind:
    name: str
    open: Callable[[str], contextlib.AbstractAsyncContextManager[AHandle]]
    implicit: bool = False
    session_locks: bool = True
    keeper: bool = True

    def __str__(self) -> str:
        return self.name


# -- bare DBAPI connections --------------------------------------------------------------


class _Dbapi:
    """A psycopg 3 or psycopg2 connection: transactions by statement (the libraries
    track them from the server's answers) or, with autocommit off, by themselves."""

    def __init__(self, conn: Any, pid: int) -> None:
        self.conn = conn
        self._pid = pid

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
        return self._pid


def _psycopg(*, autocommit: bool) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        import psycopg  # noqa: PLC0415

        with psycopg.connect(dsn, autocommit=autocommit) as conn:
            yield _Dbapi(conn, conn.info.backend_pid)

    return opening


def _psycopg2(*, autocommit: bool) -> Callable[[str], contextlib.AbstractContextManager[Handle]]:
    @contextlib.contextmanager
    def opening(dsn: str) -> Iterator[Handle]:
        import psycopg2  # noqa: PLC0415

        conn = psycopg2.connect(dsn)
        conn.autocommit = autocommit
        try:
            yield _Dbapi(conn, conn.get_backend_pid())
        finally:
            conn.close()

    return opening


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

    async with (
        asyncpg.create_pool(min_size=1, max_size=2, **asyncpg_options(dsn)) as pool,
        pool.acquire() as conn,
    ):
        yield _Asyncpg(conn)


# -- SQLAlchemy ------------------------------------------------------------------------


def _raw_pid(raw: Any) -> int:
    """The backend pid of a DBAPI-level connection of any of the three libraries."""
    if hasattr(raw, "get_server_pid"):  # asyncpg
        return int(raw.get_server_pid())
    return int(raw.info.backend_pid)


def _engine(dsn: str, dialect: str) -> Any:
    import sqlalchemy  # noqa: PLC0415

    if dialect == "psycopg":
        import psycopg  # noqa: PLC0415

        return sqlalchemy.create_engine(
            "postgresql+psycopg://", creator=lambda: psycopg.connect(dsn)
        )
    import psycopg2  # noqa: PLC0415

    return sqlalchemy.create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(dsn))


def _async_engine(dsn: str, dialect: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    if dialect == "psycopg":
        import psycopg  # noqa: PLC0415

        async def psycopg_connection() -> Any:
            return await psycopg.AsyncConnection.connect(dsn)

        return create_async_engine("postgresql+psycopg://", async_creator=psycopg_connection)
    import asyncpg  # noqa: PLC0415

    async def asyncpg_connection() -> Any:
        return await asyncpg.connect(**asyncpg_options(dsn))

    return create_async_engine("postgresql+asyncpg://", async_creator=asyncpg_connection)


class _Alchemy:
    """A SQLAlchemy Connection or Session: SQLAlchemy's own transactions."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

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
                    yield _Alchemy(orm_session)
            else:
                with engine.connect() as conn:
                    yield _Alchemy(conn)
        finally:
            engine.dispose()

    return opening


class _AAlchemy:
    """A SQLAlchemy AsyncConnection or AsyncSession."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

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
                    yield _AAlchemy(orm_session)
            else:
                async with engine.connect() as conn:
                    yield _AAlchemy(conn)
        finally:
            await engine.dispose()

    return opening


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
    django.setup()


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
    Kind("psycopg", _psycopg(autocommit=True)),
    Kind("psycopg-implicit", _psycopg(autocommit=False), implicit=True),
    Kind("psycopg2", _psycopg2(autocommit=False), implicit=True, keeper=False),
    Kind("psycopg2-autocommit", _psycopg2(autocommit=True), keeper=False),
    Kind("sqlalchemy-psycopg", _alchemy("psycopg")),
    Kind("sqlalchemy-psycopg2", _alchemy("psycopg2"), keeper=False),
    Kind("sqlalchemy-session", _alchemy("psycopg", session=True), session_locks=False),
    Kind("django", _django),
]

ASYNC_KINDS = [
    AKind("psycopg-async", _apsycopg),
    AKind("asyncpg", _asyncpg, keeper=False),
    AKind("asyncpg-pool", _asyncpg_pool, keeper=False),
    AKind("sqlalchemy-async-psycopg", _aalchemy("psycopg")),
    AKind("sqlalchemy-async-asyncpg", _aalchemy("asyncpg"), keeper=False),
    AKind("sqlalchemy-asyncsession", _aalchemy("asyncpg", session=True), session_locks=False),
]
