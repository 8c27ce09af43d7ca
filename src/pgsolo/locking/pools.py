"""What a pooled connection goes through before it goes back to its pool, so that it never
goes back with a session lock still held. The hooks themselves are
:func:`~pgsolo.async_pool_reset` (``_async/pools.py``) and its generated twin
:func:`~pgsolo.pool_reset`."""

from __future__ import annotations

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import DriverBase, TxStatus
from . import holdings
from .events import let_go_for_its_holder
from .placement import in_savepoint, outside_transaction
from .plans import Plan

__all__ = ["reset_plan"]


def reset_plan(driver: DriverBase) -> Plan[None]:
    """Release every session lock on ``driver``'s connection, as it goes back to its pool,
    and end the transaction pgsolo opened there, if one is open. A transaction pgsolo did
    not open is the pool's to end as it was told (SQLAlchemy's ``reset_on_return``:
    commit, roll back or leave it), so the unlock runs in a savepoint of it; only a failed
    one, where nothing runs and which can commit nothing, is rolled back first."""
    conn = driver.connection
    # Read before the books close: whether the transaction open is pgsolo's own.
    owned = holdings.transaction_owner(conn, driver.backend_pid()) is not None
    forgotten = holdings.forget_all(conn)
    if driver.is_closed():
        return  # its locks went with it: off the books, nothing to release or warn of
    for held in forgotten:
        extra = let_go_for_its_holder(held.key, held.lifetime, "released-at-check-in")
        if held.lifetime == "xact":
            logger.warning(
                "pgsolo: transaction lock %s was still held when its connection went back"
                " to the pool; %s",
                held.key,
                "rolling its transaction back"
                if owned
                else "it is released when the transaction it joined ends",
                extra=extra,
            )
        else:
            logger.warning(
                "pgsolo: session lock %s was still held when its connection went back to"
                " the pool; releasing it",
                held.key,
                extra=extra,
            )
    status = driver.transaction_status()
    if status is TxStatus.INERROR or (status is TxStatus.INTRANS and owned):
        yield outside_transaction(driver, [sql.ROLLBACK, sql.UNLOCK_ALL], status)
    else:
        yield in_savepoint(driver, status, [sql.UNLOCK_ALL])
