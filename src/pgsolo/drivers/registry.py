"""The libraries pgsolo adapts, one row each: everything else about a library is derived
from its row (which module adapts its connections, what :func:`~pgsolo.drivers.adapt`
says it takes, which of its exceptions are a database's errors, the extra that installs
it, and the table of drivers in ``docs/connections.md``, which a test checks against
these rows).

Pure data: importing this module imports no driver library. A row names classes and
modules by their dotted names; they are looked up only once the library is imported
(a connection of it can exist only then).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LIBRARIES", "Library"]


@dataclass(frozen=True, slots=True)
class Library:
    package: str
    """The top-level package its connection types live in: what picks the row."""
    adapter: str
    """pgsolo's module that adapts its connections (relative to ``pgsolo.drivers``): its
    ``adapt(connection)`` returns a driver (checked statically against
    :class:`~pgsolo.drivers.SyncDriver` or :class:`~pgsolo.drivers.AsyncDriver`) or None for
    an object of the library it does not take (a cursor, an engine)."""
    extra: str | None
    """The extra that installs it (``pgsolo[extra]``); None for pgsolo's own dependency."""
    takes: str
    """The connections it takes, as an error and the docs say it."""
    typing: tuple[str, ...]
    """What stands for its connections in the public signatures
    (:mod:`pgsolo.drivers.kinds`): its classes, or protocols of that module."""
    errors: tuple[str, ...]
    """Its base classes of what a statement raises when the server refuses it or the
    connection fails."""
    unavailable: tuple[str, ...]
    """Those of its classes that say the connection failed or the server cannot be
    reached, rather than that a statement was refused."""
    keeper: str
    """Whether ``keep=`` can watch a lock on its connections, and why not (the adapter's
    ``heartbeat()`` is what decides; this is what the docs say)."""
    interruption: str
    """What Ctrl-C or a cancelled task does to a statement in flight on it."""
    required: bool = False
    """pgsolo's own dependency: always importable, so its errors always count."""


LIBRARIES = (
    Library(
        package="psycopg",
        adapter="._psycopg_adapt",
        extra=None,
        takes="a psycopg 3 Connection or AsyncConnection",
        typing=("psycopg.Connection", "psycopg.AsyncConnection"),
        errors=("psycopg.Error",),
        unavailable=("psycopg.OperationalError",),
        keeper="yes: beats between the caller's statements, watches the socket",
        interruption="cancelled on the server at once",
        required=True,
    ),
    Library(
        package="psycopg2",
        adapter="._psycopg2",
        extra="psycopg2",
        takes="a psycopg2 connection",
        typing=("_Psycopg2",),
        errors=("psycopg2.Error",),
        unavailable=("psycopg2.OperationalError",),
        keeper="refused: its connection lock cannot be tried without waiting",
        interruption="raised once the statement ends (a wait: when granted or timed out)",
    ),
    Library(
        package="asyncpg",
        adapter="._asyncpg",
        extra="asyncpg",
        takes="an asyncpg Connection (also one acquired from a Pool)",
        typing=("_Asyncpg",),
        errors=("asyncpg.PostgresError", "asyncpg.InterfaceError"),
        unavailable=("asyncpg.PostgresConnectionError",),
        keeper="refused: a second operation while one runs is an error",
        interruption="cancelled on the server, the exchange let end",
    ),
    Library(
        package="pg8000",
        adapter="._pg8000",
        extra="pg8000",
        takes="a pg8000 DB-API connection (pg8000.connect, pg8000.dbapi.connect)",
        typing=("_Pg8000",),
        errors=("pg8000.exceptions.Error",),
        unavailable=("pg8000.exceptions.InterfaceError",),
        keeper="refused: its connection cannot be shared between threads",
        interruption="no cancellation: raised once the statement ends (a wait: at its slice's end)",
    ),
    Library(
        package="sqlalchemy",
        adapter="._sqlalchemy_adapt",
        extra="sqlalchemy",
        takes="a SQLAlchemy Connection, AsyncConnection, Session or AsyncSession",
        typing=("_Sqlalchemy", "_SqlalchemyAsyncConnection", "_SqlalchemyAsyncSession"),
        errors=("sqlalchemy.exc.DBAPIError",),
        unavailable=("sqlalchemy.exc.OperationalError",),
        keeper="as the driver under it",
        interruption="as the driver under it",
    ),
    Library(
        package="django",
        adapter="._django",
        extra="django",
        takes="a Django connection (django.db.connection, connections[alias])",
        typing=("_Django",),
        errors=("django.db.utils.Error",),
        unavailable=("django.db.utils.OperationalError",),
        keeper="as the driver under it",
        interruption="as the driver under it",
    ),
)
