"""The connections pgsolo takes, as a type checker sees them: what picks ``Lock`` or
``AsyncLock`` in the signatures of the public API.

psycopg 3 is pgsolo's dependency and typed, so its classes are named. The other libraries
are optional, and most ship no types: they are recognised by a method or an attribute of
their own, as protocols, so that the signatures never depend on a library being
installed. (A connection of an untyped library is ``Any`` to a type checker anyway.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import psycopg

__all__ = ["AsyncConnectionLike", "SyncConnectionLike"]


class _Asyncpg(Protocol):
    """``asyncpg.Connection``, and the connection an ``asyncpg.Pool`` hands out."""

    def get_server_pid(self) -> int: ...


class _SqlalchemyAsyncConnection(Protocol):
    """SQLAlchemy's ``AsyncConnection``."""

    @property
    def sync_connection(self) -> Any: ...


class _SqlalchemyAsyncSession(Protocol):
    """SQLAlchemy's ``AsyncSession``."""

    @property
    def sync_session(self) -> Any: ...


class _Sqlalchemy(Protocol):
    """SQLAlchemy's ``Connection`` and ``Session``."""

    def in_transaction(self) -> bool: ...


class _Psycopg2(Protocol):
    """A psycopg2 connection."""

    def get_backend_pid(self) -> int: ...


class _Pg8000(Protocol):
    """A pg8000 DB-API connection."""

    @property
    def parameter_statuses(self) -> Any: ...


class _Django(Protocol):
    """Django's ``connection`` and ``connections[alias]``."""

    @property
    def in_atomic_block(self) -> bool: ...


AsyncConnectionLike: TypeAlias = (
    "psycopg.AsyncConnection[Any] | _Asyncpg | _SqlalchemyAsyncConnection | _SqlalchemyAsyncSession"
)
SyncConnectionLike: TypeAlias = (
    "psycopg.Connection[Any] | _Sqlalchemy | _Psycopg2 | _Pg8000 | _Django"
)
