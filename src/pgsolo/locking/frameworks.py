"""What happens to a framework's connection at the end of a unit of work (a Django
request): the session locks pgsolo still holds on it are released, with a warning, so
that a persistent connection never carries a lock into the next request. Registered in
:data:`pgsolo.drivers.REQUEST_END_HOOKS`, which the framework's adapter calls."""

from __future__ import annotations

from .. import sql
from .._logging import logger
from ..drivers import REQUEST_END_HOOKS, SyncDriver, TxStatus
from . import holdings
from ._sync.drive import drive
from .placement import in_savepoint
from .plans import Plan

__all__ = ["release_at_request_end", "request_end_plan"]


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
        )
        while holdings.unclaim(conn, key) > 0:
            pass
    status = driver.transaction_status()
    if driver.is_closed() or status not in (TxStatus.IDLE, TxStatus.INTRANS):
        return
    yield in_savepoint(driver, status, [sql.UNLOCK_ALL])


def release_at_request_end(driver: SyncDriver) -> None:
    drive(request_end_plan(driver), driver)


REQUEST_END_HOOKS.append(release_at_request_end)
