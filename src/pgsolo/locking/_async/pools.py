"""The pool hook for async connections; see :mod:`pgsolo.locking.pools`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...drivers import adapt_async
from ..pools import reset_plan
from .drive import adrive

if TYPE_CHECKING:
    import psycopg

__all__ = ["async_pool_reset"]


async def async_pool_reset(conn: psycopg.AsyncConnection[Any]) -> None:
    """A ``psycopg_pool.AsyncConnectionPool(reset=...)`` hook: no connection goes back to
    the pool holding a session lock, whether pgsolo or plain SQL took it."""
    driver = adapt_async(conn)
    await adrive(reset_plan(driver), driver)
