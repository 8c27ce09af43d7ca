"""pgsolo on the connections users already have (psycopg2, asyncpg, SQLAlchemy, Django),
each against the article's recipe written by hand on the same connection: the
contenders that :func:`benchmarks.bench_locks.lineup` adds for every library installed.

A recipe is what a careful user writes with that library's own idioms: the framework's
transaction for a transaction lock (``conn.begin()``, ``transaction.atomic()``), an
autocommit connection for a session lock, parameters bound the library's way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import pgsolo

if TYPE_CHECKING:
    from benchmarks.bench_locks import Target

__all__ = ["APgsoloOn", "DjangoRecipe", "PgsoloOn", "SqlalchemyRecipe", "opener"]

KEY = (42, 1001)

Opened = tuple[Any, Callable[[], None]]


class NotAcquired(RuntimeError):
    """The lock was busy: the benchmark would be timing the wrong path."""


def _check(acquired: object) -> None:
    if acquired is not True:
        raise NotAcquired("the lock was busy")


class PgsoloOn:
    """pgsolo's try-lock around a no-op, on a sync connection of some library."""

    def __init__(self, lifetime: str, connect: Callable[[Target], Opened]) -> None:
        self.lock = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
        self.connect = connect

    def open(self, target: Target) -> None:
        self.conn, self._close = self.connect(target)

    def op(self) -> None:
        with cast(pgsolo.Lock, self.lock(self.conn, KEY)) as lock:  # a sync connection
            _check(lock.acquired)

    def close(self) -> None:
        self._close()


class APgsoloOn:
    """The same on an async connection."""

    def __init__(
        self, lifetime: str, connect: Callable[[Target], Awaitable[tuple[Any, Any]]]
    ) -> None:
        self.lock = pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock
        self.connect = connect

    async def open(self, target: Target) -> None:
        self.conn, self._close = await self.connect(target)

    async def op(self) -> None:
        async with cast(pgsolo.AsyncLock, self.lock(self.conn, KEY)) as lock:  # an async one
            _check(lock.acquired)

    async def close(self) -> None:
        await self._close()


# -- how each library's users connect --------------------------------------------------


def psycopg2_autocommit(target: Target) -> Opened:
    import psycopg2  # noqa: PLC0415 - optional

    conn = psycopg2.connect(target.conninfo())
    conn.autocommit = True
    return conn, conn.close


async def asyncpg_connection(target: Target) -> tuple[Any, Any]:
    import asyncpg  # noqa: PLC0415 - optional

    conn = await asyncpg.connect(**target.asyncpg_kwargs())
    return conn, conn.close


def sqlalchemy_connection(target: Target, *, autocommit: bool = False) -> Opened:
    """A Connection of an Engine on the psycopg dialect; ``autocommit``: the
    ``AUTOCOMMIT`` isolation level, which a session-lock user picks."""
    import psycopg  # noqa: PLC0415
    import sqlalchemy  # noqa: PLC0415 - optional

    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(target.conninfo())
    )
    conn = engine.connect()
    if autocommit:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")

    def close() -> None:
        conn.close()
        engine.dispose()

    return conn, close


def django_connection(target: Target) -> Opened:
    """Django's ``connection``, pointed at ``target`` (settings are configured once per
    process; the connection's own settings then follow each target)."""
    import django  # noqa: PLC0415 - optional
    from django.conf import settings  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415

    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": target.dbname or "",
        "USER": target.user or "",
        "PASSWORD": target.password or "",
        "HOST": target.host,
        "PORT": str(target.port),
    }
    if not settings.configured:
        settings.configure(DATABASES={"default": database}, USE_TZ=True)
        django.setup()
    connection.close()
    connection.settings_dict.update(database)
    connection.ensure_connection()
    return connection, connection.close


def opener(connect: Callable[..., Opened], **options: Any) -> Callable[[Target], Opened]:
    return lambda target: connect(target, **options)


# -- the recipe by hand, the framework's way ---------------------------------------------


class SqlalchemyRecipe:
    """The article's recipe on a SQLAlchemy Connection: the lock in ``conn.begin()`` for a
    transaction lock; try and unlock on an AUTOCOMMIT connection for a session lock."""

    def __init__(self, lifetime: str) -> None:
        self.lifetime = lifetime

    def open(self, target: Target) -> None:
        self.conn, self._close = sqlalchemy_connection(
            target, autocommit=self.lifetime == "session"
        )

    def op(self) -> None:
        from sqlalchemy import text  # noqa: PLC0415

        conn, params = self.conn, {"a": KEY[0], "b": KEY[1]}
        if self.lifetime == "xact":
            with conn.begin():
                try_lock = text("SELECT pg_try_advisory_xact_lock(:a, :b)")
                _check(conn.execute(try_lock, params).scalar())
                # ... the protected work would run here ...
            return
        _check(conn.execute(text("SELECT pg_try_advisory_lock(:a, :b)"), params).scalar())
        try:
            pass  # ... the protected work would run here ...
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:a, :b)"), params)

    def close(self) -> None:
        self._close()


class DjangoRecipe:
    """The article's recipe on Django's connection: the lock in ``atomic()`` for a
    transaction lock; try and unlock in Django's autocommit for a session lock."""

    def __init__(self, lifetime: str) -> None:
        self.lifetime = lifetime

    def open(self, target: Target) -> None:
        self.conn, self._close = django_connection(target)

    def op(self) -> None:
        from django.db import transaction  # noqa: PLC0415

        if self.lifetime == "xact":
            with transaction.atomic(), self.conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", KEY)
                _check(cur.fetchone()[0])
                # ... the protected work would run here ...
            return
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", KEY)
            _check(cur.fetchone()[0])
            try:
                pass  # ... the protected work would run here ...
            finally:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", KEY)

    def close(self) -> None:
        self._close()
