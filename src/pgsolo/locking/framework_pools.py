"""The pool hook of SQLAlchemy's engines: no connection goes back to an engine's pool
holding a session lock (see :func:`pgsolo.sqlalchemy.install`). SQLAlchemy's own reset
is a rollback, which leaves session locks held: the next user of the pooled connection
would hold them, and nobody would release them."""

from __future__ import annotations

from ..drivers import adapt, as_sync, is_async
from ._async.drive import adrive
from ._sync.drive import drive
from .pools import reset_plan

__all__ = ["install"]


def install(engine: object) -> None:
    """Make ``engine`` (a SQLAlchemy ``Engine`` or ``AsyncEngine``) release every session
    lock still held on a connection that goes back to its pool, with a warning naming the
    key, as :func:`~pgsolo.pool_reset` does for psycopg_pool. Call it once per engine."""
    from ..drivers._sqlalchemy import listen_for_returns  # noqa: PLC0415 - on use only

    listen_for_returns(engine, _reset)


def _reset(driver_connection: object) -> object:
    """Release what is left on ``driver_connection`` (an awaitable for an async one)."""
    driver = adapt(driver_connection)
    if is_async(driver):
        return adrive(reset_plan(driver), driver)
    sync = as_sync(driver)
    drive(reset_plan(sync), sync)
    return None
