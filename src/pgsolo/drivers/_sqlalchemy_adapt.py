"""Which adapter a SQLAlchemy object gets (see :func:`pgsolo.drivers.adapt`): apart from
the adapters, which import their shared base, so that nothing imports in a circle."""

from __future__ import annotations

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from ..errors import UnsupportedConnectionError
from . import AsyncDriver, SyncDriver
from ._async.sqlalchemy_driver import AsyncSqlAlchemyDriver
from ._sync.sqlalchemy_driver import SqlAlchemyDriver

__all__ = ["adapt"]


def adapt(connection: object) -> SyncDriver | AsyncDriver | None:
    if isinstance(connection, Engine | AsyncEngine):
        raise UnsupportedConnectionError(
            "pgsolo takes a connection, not an Engine: pass one of its connections"
            " (`with engine.connect() as conn:`, `async with engine.connect() as conn:`)"
        )
    if isinstance(connection, Connection | Session):
        return SqlAlchemyDriver(connection)
    if isinstance(connection, AsyncConnection | AsyncSession):
        return AsyncSqlAlchemyDriver(connection)
    return None
