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
from .placement import outside_transaction
from .plans import Plan

__all__ = ["reset_plan"]


def reset_plan(driver: DriverBase) -> Plan[None]:
    forgotten = holdings.forget_all(driver.connection)
    if driver.is_closed():
        return  # its locks went with it: off the books, nothing to release or warn of
    for held in forgotten:
        extra = let_go_for_its_holder(held.key, held.lifetime, "released-at-check-in")
        if held.lifetime == "xact":
            logger.warning(
                "pgsolo: transaction lock %s was still held when its connection went back"
                " to the pool; rolling its transaction back",
                held.key,
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
    statements = [sql.UNLOCK_ALL]
    if status in (TxStatus.INTRANS, TxStatus.INERROR):
        statements = [sql.ROLLBACK, *statements]
    yield outside_transaction(driver, statements)
