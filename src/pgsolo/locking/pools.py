"""Hooks that keep a pooled connection from going back to its pool with a session lock
still held."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import sql
from .._logging import logger
from ..drivers import DriverBase, TxStatus, adapt_async, adapt_sync
from . import holdings
from .plans import Plan, adrive, drive, outside_transaction

if TYPE_CHECKING:
    import psycopg

__all__ = ["async_pool_reset", "pool_reset"]


def _reset_plan(driver: DriverBase) -> Plan[None]:
    for key in holdings.forget_all(driver.connection):
        logger.warning(
            "pgsolo: session lock %s was still held when its connection went back to the"
            " pool; releasing it",
            key,
        )
    status = driver.transaction_status()
    statements = [sql.UNLOCK_ALL]
    if status in (TxStatus.INTRANS, TxStatus.INERROR):
        statements = [sql.ROLLBACK, *statements]
    yield outside_transaction(driver, statements)


def pool_reset(conn: psycopg.Connection[Any]) -> None:
    """A ``psycopg_pool.ConnectionPool(reset=...)`` hook: no connection goes back to the
    pool holding a session lock, whether pgsolo or plain SQL took it."""
    driver = adapt_sync(conn)
    drive(_reset_plan(driver), driver)


async def async_pool_reset(conn: psycopg.AsyncConnection[Any]) -> None:
    """The :func:`pool_reset` hook for ``psycopg_pool.AsyncConnectionPool``."""
    driver = adapt_async(conn)
    await adrive(_reset_plan(driver), driver)
