"""When a framework takes a connection back, no session lock goes with it.

- SQLAlchemy's pool resets a returned connection with a rollback, which leaves session
  locks held: the next user of the pooled connection would hold them, and nobody would
  release them. :func:`install` (``pgsolo.sqlalchemy.install``) hooks the engine's
  returns to the pool reset plan of :mod:`pgsolo.locking.pools`.
- Django keeps a connection across requests (``CONN_MAX_AGE``): at the end of each
  request, the session locks pgsolo still holds on it are released with a warning
  (:func:`release_at_request_end`, registered in :data:`pgsolo.drivers.REQUEST_END_HOOKS`,
  which the Django adapter calls).
"""

from __future__ import annotations

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import REQUEST_END_HOOKS, SyncDriver, TxStatus, adapt, as_sync, is_async
from . import holdings
from ._async.drive import adrive
from ._sync.drive import drive
from .events import let_go_for_its_holder
from .placement import in_savepoint
from .plans import Plan
from .pools import reset_plan

__all__ = ["install", "release_at_request_end", "request_end_plan"]


def install(engine: object) -> None:
    """Make ``engine`` (a SQLAlchemy ``Engine`` or ``AsyncEngine``) release every session
    lock still held on a connection that goes back to its pool, with a warning naming the
    key, as :func:`~pgsolo.pool_reset` does for psycopg_pool. Call it once per engine."""
    from ..drivers._sqlalchemy import listen_for_returns  # noqa: PLC0415 - on use only

    listen_for_returns(engine, _reset, _forget)


def _reset(driver_connection: object) -> object:
    """Release what is left on ``driver_connection`` (an awaitable for an async one)."""
    driver = adapt(driver_connection)
    if is_async(driver):
        return adrive(reset_plan(driver), driver)
    sync = as_sync(driver)
    drive(reset_plan(sync), sync)
    return None


def _forget(driver_connection: object) -> None:
    """Take what ``driver_connection`` held off the books: it is closed, not reset."""
    holdings.forget_all(adapt(driver_connection).connection)


def request_end_plan(driver: SyncDriver) -> Plan[None]:
    """Take pgsolo's session locks on ``driver``'s connection off the books and release
    them (with any other session lock on it, as a pool reset does). Nothing is sent when
    pgsolo holds none, and nothing on a closed connection, whose locks went with it. A
    later ``release()`` of one of them reports it lost."""
    conn = driver.connection
    keys = holdings.session_keys(conn)
    if not keys:
        return
    for key in keys:
        logger.warning(
            "pgsolo: session lock %s was still held at the end of the request that took"
            " it; releasing it",
            key,
            extra=let_go_for_its_holder(key, "session", "released-at-request-end"),
        )
        holdings.drop_all(conn, key)
    status = driver.transaction_status()
    if driver.is_closed() or status not in (TxStatus.IDLE, TxStatus.INTRANS):
        return
    yield in_savepoint(driver, status, [sql.UNLOCK_ALL])


def release_at_request_end(driver: SyncDriver) -> None:
    drive(request_end_plan(driver), driver)


REQUEST_END_HOOKS.append(release_at_request_end)
