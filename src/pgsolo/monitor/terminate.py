"""Ending a lock holder: :func:`terminate_backend` (``pgsolo terminate`` asks first)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import sql
from .._types import DAY
from ..drivers import adapt_sync
from ..errors import InvalidArgumentError
from ..locking.placement import outside_transaction

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike
from .snapshot import check_positive

__all__ = ["terminate_backend"]


def terminate_backend(conn: SyncConnectionLike, pid: int, *, wait_ms: int = 5000) -> bool:
    """End backend ``pid`` (its session, its transaction and every lock it holds) and wait
    up to ``wait_ms`` (at most a day) for it to be gone: True if it is. Shows nothing and
    asks nothing; ``pgsolo terminate`` is the careful way."""
    check_positive(pid, "pid")
    check_positive(wait_ms, "wait_ms", int(DAY * 1000))
    driver = adapt_sync(conn)
    if pid == driver.backend_pid():
        raise InvalidArgumentError(f"pid {pid} is this connection's own backend")
    return (
        driver.fetch_value(
            outside_transaction(driver, [sql.terminate_backend(pid, wait_ms=wait_ms)])
        )
        is True
    )
